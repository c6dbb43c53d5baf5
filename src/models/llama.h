// The llama family (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM in transformers): token
// embeddings, pre-RMSNorm blocks with rotary positions, grouped-query attention and the SwiGLU
// MLP, a final RMSNorm and a tied or untied LM head.
#pragma once

#include <memory>

#include "models/model.h"

namespace brisk {
std::unique_ptr<Model> make_llama(const ModelConfig& config);
}
