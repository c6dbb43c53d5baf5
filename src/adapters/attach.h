// LoRA applied to a model from outside: the adapters of a LoraConfig attached to the model's
// linears (before its plan), and an adapter's weights (PEFT's adapter_model.safetensors) loaded
// into them (after its bind).
#pragma once

#include "adapters/lora.h"
#include "backend/backend.h"
#include "core/safetensors.h"
#include "models/model.h"

namespace brisk {

// The targets' A and B declared, the modules to save trained with them, every other parameter
// frozen. Refused by name where not built yet: a linear outside the blocks.
LoraTargets attach_lora(Model& model, const LoraConfig& c);

// The adapters' A and B, and the modules to save, from PEFT's file (keys
// "base_model.model.<module>.lora_A.weight", "base_model.model.<parameter>"), each checked
// against its shape.
void load_adapter(Backend& be, const Model& model, const SafetensorsFile& f);

}  // namespace brisk
