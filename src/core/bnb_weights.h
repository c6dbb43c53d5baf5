// Weights bitsandbytes saved 4-bit: what transformers' save_pretrained writes for a model loaded
// with a BitsAndBytesConfig(load_in_4bit=True) (a QLoRA user's "-bnb-4bit" checkpoint). Each such
// weight is its packed codes (uint8 [(n + 1) / 2, 1]) under the weight's own name, with its state
// beside it: `<name>.absmax` (float32, or nested uint8 codes with `.nested_absmax` and
// `.nested_quant_map`), `.quant_map` (the 16 values) and `.quant_state.bitsandbytes__<nf4|fp4>`
// (JSON bytes: quant_type, blocksize, dtype, shape, and nested_blocksize and nested_offset).
// A linear's weight is quantized in nn.Linear's layout [out, in], a Conv1D's too (transposed).
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "core/quant4.h"
#include "core/safetensors.h"

namespace brisk {

struct Bnb4bitWeight {
  Quant4Layout layout;
  Shape shape;               // as quantized
  DType dtype = DType::f32;  // the values' type before quantization: dequantization rounds to it
  float offset = 0;          // nested: the absmaxes' mean
  const SafetensorsFile* file = nullptr;
};

// The 4-bit weights among a file's tensors, by the weight's name, their states read and checked:
// one clear error naming the tensor for a state brisk cannot read (another quant_type, a nested
// block other than 256, a packed layout other than uint8 codes, maps other than bitsandbytes').
std::map<std::string, Bnb4bitWeight> find_bnb_4bit(const SafetensorsFile& f);

// Whether `name` is part of a 4-bit weight's state (not a tensor of the model).
bool is_bnb_4bit_state(const std::string& name);

// The weight's values as bitsandbytes' dequantize_4bit gives them (rounded to its dtype),
// widened to float32, into out[0, numel) in the quantized layout.
void dequantize_bnb_4bit(const std::string& name, const Bnb4bitWeight& w, float* out);

}  // namespace brisk
