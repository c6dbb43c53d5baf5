// brisk generate: text from a trained causal LM folder, token by token over a key/value cache
// (models/decoder.h), greedy or sampled as transformers' generate() chooses (temperature, top-k,
// top-p, seeded).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/switches.h"

namespace brisk {

class Backend;
class Model;

struct GenerateOptions {
  std::string model_name_or_path;  // a folder with config.json, model.safetensors, a tokenizer
  std::string prompt;
  int64_t max_new_tokens = 20;  // fewer when the context (max_position_embeddings) ends first
  bool do_sample = false;       // false: greedy
  double temperature = 1.0;
  int64_t top_k = 50;  // 0: no top-k filter (transformers' default is 50)
  double top_p = 1.0;
  uint64_t seed = 42;
  std::string device = "auto";
  Switches switches;  // the measurement switches the front door read (core/switches.h)
  // Applied to the model's weights once loaded, before decoding: the front door's way to merge a
  // LoRA adapter into them (adapters/merge.h), as PEFT users generate after merge_and_unload.
  std::function<void(Backend&, const Model&)> adjust_weights;
};

struct Generation {
  std::vector<int32_t> prompt_ids, new_ids;
  std::string text;          // prompt and continuation decoded, special tokens left out
  double seconds = 0;        // the decoding, prompt included
  size_t planned_bytes = 0;  // the whole plan: weights, caches, working buffers
  bool stopped_at_eos = false;
};

Generation generate(const GenerateOptions& options);

// The next token from logits [V]: the argmax (the first of equal maxima) unless do_sample; then a
// draw (`uniform` in [0, 1)) from softmax(logits / temperature) kept to the top_k most likely and
// then to the most likely tokens whose probabilities sum to top_p (transformers' warpers in that
// order; the most likely token always stays). `work` is scratch.
int32_t next_token(const float* logits, int64_t V, const GenerateOptions& o, double uniform,
                   std::vector<std::pair<float, int32_t>>& work);

// Throws naming the option unless the options are usable.
void validate_generate_options(const GenerateOptions& o);

}  // namespace brisk
