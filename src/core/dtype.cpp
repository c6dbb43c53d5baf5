// DType tables and 16-bit float conversions.
#include "core/dtype.h"

#include <cstring>

#include "core/error.h"

namespace brisk {

namespace {
struct DTypeInfo {
  DType type;
  size_t size;
  const char* name;
  const char* safetensors;
};
constexpr DTypeInfo kInfo[] = {
    {DType::f32, 4, "float32", "F32"}, {DType::bf16, 2, "bfloat16", "BF16"},
    {DType::f16, 2, "float16", "F16"}, {DType::i32, 4, "int32", "I32"},
    {DType::u8, 1, "uint8", "U8"},     {DType::i64, 8, "int64", "I64"},
    {DType::u16, 2, "uint16", "U16"},  {DType::f64, 8, "float64", "F64"},
};
const DTypeInfo& info(DType t) {
  for (const auto& i : kInfo)
    if (i.type == t) return i;
  BRISK_FAIL("unknown dtype code ", static_cast<int>(t));
}
}  // namespace

size_t dtype_size(DType t) {
  return info(t).size;
}
const char* dtype_name(DType t) {
  return info(t).name;
}
const char* dtype_to_safetensors(DType t) {
  return info(t).safetensors;
}

DType dtype_from_safetensors(const std::string& s) {
  for (const auto& i : kInfo)
    if (s == i.safetensors) return i.type;
  BRISK_FAIL("unsupported safetensors dtype '", excerpt(s), "'");
}

uint16_t float_to_fp16(float f) {
  uint32_t u = float_bits(f);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);   // NaN
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow -> inf
  if (abs < 0x38800000u) {
    // Subnormal or zero in fp16: scale into the integer range and round to nearest even.
    if (abs < 0x33000000u) return static_cast<uint16_t>(sign);
    uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    int shift = 113 - static_cast<int>(abs >> 23) + 13;  // 126 - 14 + 1 ... exponent shift
    uint32_t half = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1);
    uint32_t mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1u))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t r = abs + 0xfffu + ((abs >> 13) & 1u);
  return static_cast<uint16_t>(sign | ((r - 0x38000000u) >> 13));
}

float fp16_to_float(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    if (mant == 0) return bits_float(sign);
    float v = static_cast<float>(mant) * (1.0f / 16777216.0f);  // mant * 2^-24
    return sign ? -v : v;
  }
  if (exp == 31) return bits_float(sign | 0x7f800000u | (mant << 13));
  return bits_float(sign | ((exp + 112) << 23) | (mant << 13));
}

const char* device_name(Device d) {
  return d == Device::cpu ? "cpu" : "cuda";
}

}  // namespace brisk
