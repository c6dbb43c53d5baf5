// LoRA applied to a model from outside: the adapters of a LoraConfig attached to the model's
// linears (before its plan), an adapter's weights (PEFT's adapter_model.safetensors) loaded into
// them (after its bind), and the trained adapter saved as PEFT's save_pretrained writes it.
#pragma once

#include <functional>
#include <string>

#include "adapters/lora.h"
#include "backend/backend.h"
#include "core/safetensors.h"
#include "models/model.h"

namespace brisk {

// The targets' A and B declared, the modules to save trained with them, every other parameter
// frozen. Refused by name where not built yet: a linear outside the blocks, a module to save that
// lies apart from the adapters (before the blocks' parameters).
LoraTargets attach_lora(Model& model, const LoraConfig& c);

// PEFT's adapter folder: its adapter_config.json read and checked, and the path of its
// adapter_model.safetensors (a missing file named with `option`, the user's name for the folder).
LoraConfig read_adapter_folder(const std::string& folder, const std::string& option);
std::string adapter_weights_path(const std::string& folder, const std::string& option);

// `c` for the model's task as PEFT's task models take it: task_type from the task, and for
// sequence classification the heads PEFT trains in full with the adapters (classifier and score
// added to modules_to_save; a name the model lacks is skipped), and a mixture's listed expert
// linears as PEFT converts them (with_fused_experts).
LoraConfig lora_for_task(LoraConfig c, const Model& model);

// The saved adapter's config: `c` for `model` (fan_in_fan_out where its targets are
// transposed, PEFT's default targets by name, the base's name).
LoraConfig saved_adapter_config(LoraConfig c, const Model& model, const std::string& base);

// Bytes [at, at + n) of trained parameter p's full float32 tensor into host memory `dst`: read
// from this process's run of the weights or of a master copy, or gathered from the ranks that
// each hold a part of it (ZeRO's runs, tensor ranks' shares).
using TrainedReader = std::function<void(const ParamInfo& p, size_t at, size_t n, void* dst)>;

// Writes adapter_config.json and adapter_model.safetensors (PEFT's keys) into `folder`: the
// trained parameters, read through `read`.
void save_adapter(const std::string& folder, const Model& model, const LoraConfig& c,
                  const TrainedReader& read);

// The adapters' A and B, and the modules to save, from PEFT's file (keys
// "base_model.model.<module>.lora_A.weight", "base_model.model.<parameter>"), each checked
// against its shape.
void load_adapter(Backend& be, const Model& model, const SafetensorsFile& f);

// Parameter i's values (float32, n of them) as PEFT's adapter file lays them out, into `out`: an
// expert adapter's B [E out, r] as PEFT's lora_B [out, r E] (B_e's column k at k E + e), any
// other as it is. Returns its shape there.
Shape to_peft_layout(const Model& model, int i, const float* values, float* out);

// PEFT's tensor `key` of `f` into parameter p's `dst` (on the model's device; a tensor-parallel
// share of it, where p is split), shapes checked.
void load_adapter_tensor(Backend& be, const SafetensorsFile& f, const std::string& key,
                         const ParamInfo& p, const Tensor& dst);

}  // namespace brisk
