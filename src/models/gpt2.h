// GPT-2 causal language model with the output projection tied to the token embedding
// (GPT2LMHeadModel in transformers).
#pragma once

#include <memory>

#include "models/model.h"

namespace brisk {
std::unique_ptr<Model> make_gpt2(const ModelConfig& config);
}
