// `brisk merge`: a LoRA adapter folded into its base model's weights, as PEFT's
// merge_and_unload() followed by save_pretrained() writes the model.
#pragma once

#include <string>

#include "backend/backend.h"
#include "models/model.h"

namespace brisk {

struct MergeArgs {
  std::string model_name_or_path;    // the base model's folder (config.json, its weights)
  std::string adapter_name_or_path;  // PEFT's adapter folder (adapter_config.json, weights)
  std::string output_dir;
};

// Writes output_dir/model.safetensors: every tensor of the base in its order and dtype, an
// adapted linear's weight W + scale B A (its transpose for a Conv1D), an adapted mixture's expert
// tensors (packed, or each expert's gate, up or down projection) W_e + scale B_e A_e in their
// rows, a module to save as the adapter holds it; and the base's config, generation config and
// tokenizer files beside it. One tensor at a time is read, merged and written (never the whole
// model in memory).
void merge_adapter(const MergeArgs& args);

// The adapter in `folder` merged into `model`'s loaded float32 weights in place, as merge_adapter
// merges each adapted linear and expert weight, and its modules to save copied over the base's:
// brisk generate with an adapter, as PEFT users generate after merge_and_unload(). `option`
// names the folder in messages.
void merge_adapter_into(Backend& be, const Model& model, const std::string& folder,
                        const std::string& option);

}  // namespace brisk
