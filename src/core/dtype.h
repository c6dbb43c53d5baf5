// Element types a Tensor can hold, their sizes and names, and fp32 <-> bf16/fp16 conversion.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace brisk {

enum class DType : uint8_t { f32, bf16, f16, i32, u8, i64, u16, f64 };

size_t dtype_size(DType t);
const char* dtype_name(DType t);
// Parses the safetensors spelling ("F32", "BF16", "F16", "I32", "U8", "I64", "U16", "F64").
DType dtype_from_safetensors(const std::string& s);
const char* dtype_to_safetensors(DType t);

// Round-to-nearest-even conversions; NaN stays NaN.
uint16_t float_to_bf16(float f);
float bf16_to_float(uint16_t h);
uint16_t float_to_fp16(float f);
float fp16_to_float(uint16_t h);

enum class Device : uint8_t { cpu, cuda };
const char* device_name(Device d);

}  // namespace brisk
