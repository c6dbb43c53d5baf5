// A weights file's mixture-of-experts tensors checked against the config before any is read:
// every router, expert and shared-expert tensor belongs to a sparse layer the config has, names
// an expert below its count and a projection of its architecture, and each layer's experts come
// in one layout (per expert, or transformers 5's packed gate_up_proj / down_proj), whole. What
// the config does not have is refused, listed by name (a file of another model, a config edited
// apart from its weights), where it would otherwise be passed over or win silently.
#pragma once

#include "core/weight_files.h"
#include "models/config.h"

namespace brisk {

void check_expert_tensors(const ModelConfig& config, const WeightFiles& file);

}  // namespace brisk
