// `brisk merge`: a LoRA adapter folded into its base model's weights, as PEFT's
// merge_and_unload() followed by save_pretrained() writes the model.
#pragma once

#include <string>

namespace brisk {

struct MergeArgs {
  std::string model_name_or_path;    // the base model's folder (config.json, its weights)
  std::string adapter_name_or_path;  // PEFT's adapter folder (adapter_config.json, weights)
  std::string output_dir;
};

// Writes output_dir/model.safetensors: every tensor of the base in its order and dtype, an
// adapted linear's weight W + scale B A (its transpose for a Conv1D), a module to save as the
// adapter holds it; and the base's config, generation config and tokenizer files beside it.
// One tensor at a time is read, merged and written (never the whole model in memory).
void merge_adapter(const MergeArgs& args);

}  // namespace brisk
