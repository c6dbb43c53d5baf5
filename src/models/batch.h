// Moving a batch from a safetensors file (input_ids, attention_mask, token_type_ids, labels as
// integer tensors) into a model's data buffers.
#pragma once

#include "core/safetensors.h"
#include "models/model.h"

namespace brisk {

// The [batch, seq] shape of input_ids in the file.
BatchShape batch_shape_of(const SafetensorsFile& file);
// Copies the file's tensors into the model's planned batch buffers; absent optional tensors
// keep their defaults (mask 1, token type 0, labels ignored).
void load_batch(const SafetensorsFile& file, Model& model, Backend& be);

}  // namespace brisk
