// Element types a Tensor can hold, their sizes and names, and fp32 <-> bf16/fp16 conversion.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace brisk {

enum class DType : uint8_t { f32, bf16, f16, i32, u8, i64, u16, f64 };

size_t dtype_size(DType t);
const char* dtype_name(DType t);
// Parses the safetensors spelling ("F32", "BF16", "F16", "I32", "U8", "I64", "U16", "F64").
DType dtype_from_safetensors(const std::string& s);
const char* dtype_to_safetensors(DType t);

// Round-to-nearest-even conversions; NaN stays NaN. Inline so that loops over them vectorize.
inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint16_t float_to_bf16(float f) {
  const uint32_t u = float_bits(f);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uint32_t nan = (u >> 16) | 0x40u;  // quiet NaN, sign and payload top kept
  return static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}
inline float bf16_to_float(uint16_t h) {
  return bits_float(static_cast<uint32_t>(h) << 16);
}
uint16_t float_to_fp16(float f);
float fp16_to_float(uint16_t h);

enum class Device : uint8_t { cpu, cuda };
const char* device_name(Device d);
// The device whose memory is the host's: host staging, host copies, communicators over host
// buffers. What else a device is, planning asks backend/device_traits.h.
inline constexpr Device kHostDevice = Device::cpu;

}  // namespace brisk
