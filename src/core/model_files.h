// The files of a transformers model folder besides its weights: what a saved or merged model
// copies beside model.safetensors and what a tokenization cache fingerprints.
#pragma once

#include <array>

namespace brisk {

// A tokenizer's files, as transformers reads them from a folder.
inline constexpr std::array<const char*, 8> kTokenizerFiles = {"tokenizer.json",
                                                               "tokenizer.model",
                                                               "vocab.txt",
                                                               "vocab.json",
                                                               "merges.txt",
                                                               "tokenizer_config.json",
                                                               "special_tokens_map.json",
                                                               "added_tokens.json"};

// The model's configs.
inline constexpr std::array<const char*, 2> kConfigFiles = {"config.json",
                                                            "generation_config.json"};

}  // namespace brisk
