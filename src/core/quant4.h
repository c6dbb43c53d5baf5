// 4-bit block-wise quantization as bitsandbytes stores QLoRA's frozen weights (Dettmers et al.,
// "QLoRA"): values in blocks of `blocksize` (64) consecutive elements, each block scaled by its
// largest magnitude (absmax) and each value stored as the index of the nearest of 16 values (NF4,
// the normal distribution's quantiles, or FP4), two to a byte, the first in the high nibble. With
// nested ("double") quantization the float32 absmaxes, less their mean (the offset), are stored
// 8-bit in blocks of 256 with the dynamic map (core/quantization.h). Dequantization is
// value x absmax in float32, then rounded to the output's dtype. The element functions are shared
// by host and device code (C++17-clean for nvcc); the codes and the dequantized bits equal
// bitsandbytes' quantize_4bit and dequantize_4bit.
#pragma once

#include <cstdint>
#include <vector>

#include "core/rng.h"  // BRISK_HD

namespace brisk {

enum class Quant4Type : int { nf4 = 0, fp4 = 1 };

// Code `code`'s value (0..15), as bitsandbytes lists each type's 16 values.
BRISK_HD float quant4_value(Quant4Type t, int code) {
  constexpr float nf4[16] = {-1.0f,
                             -0.6961928009986877f,
                             -0.5250730514526367f,
                             -0.39491748809814453f,
                             -0.28444138169288635f,
                             -0.18477343022823334f,
                             -0.09105003625154495f,
                             0.0f,
                             0.07958029955625534f,
                             0.16093020141124725f,
                             0.24611230194568634f,
                             0.33791524171829224f,
                             0.44070982933044434f,
                             0.5626170039176941f,
                             0.7229568362236023f,
                             1.0f};
  constexpr float fp4[16] = {0.0f,
                             0.0052083334885537624f,
                             0.6666666865348816f,
                             1.0f,
                             0.3333333432674408f,
                             0.5f,
                             0.1666666716337204f,
                             0.25f,
                             0.0f,
                             -0.0052083334885537624f,
                             -0.6666666865348816f,
                             -1.0f,
                             -0.3333333432674408f,
                             -0.5f,
                             -0.1666666716337204f,
                             -0.25f};
  return t == Quant4Type::nf4 ? nf4[code & 15] : fp4[code & 15];
}

// The code of the value nearest to v (a value scaled into [-1, 1]): the values in ascending
// order split at their midpoints (computed in float32), a value on a midpoint taking the lower.
BRISK_HD uint8_t quant4_code(Quant4Type t, float v) {
  // FP4's codes in ascending order of their values (its two zeros: code 0, then 8).
  constexpr uint8_t fp4_order[16] = {11, 10, 13, 12, 15, 14, 9, 0, 8, 1, 6, 7, 4, 5, 2, 3};
  auto code_at = [&](int i) -> int { return t == Quant4Type::nf4 ? i : fp4_order[i]; };
  int i = 0;
  // The first midpoint at or above v (15 when none is, NaN included).
  while (i < 15 && !(v <= (quant4_value(t, code_at(i)) + quant4_value(t, code_at(i + 1))) / 2.0f))
    ++i;
  return static_cast<uint8_t>(code_at(i));
}

// A quantized tensor's layout: `numel` values in blocks of `blocksize`, nested or not.
struct Quant4Layout {
  int64_t numel = 0;
  int64_t blocksize = 64;
  Quant4Type type = Quant4Type::nf4;
  bool nested = false;
  int64_t blocks() const { return (numel + blocksize - 1) / blocksize; }
  int64_t packed_bytes() const { return (numel + 1) / 2; }
  static constexpr int64_t kNestedBlock = 256;
  int64_t nested_blocks() const { return (blocks() + kNestedBlock - 1) / kNestedBlock; }
};

// A quantized tensor on the host: packed codes, and the absmaxes (float32) or, nested, their
// 8-bit codes, the nested blocks' absmaxes and the offset.
struct Quant4Host {
  Quant4Layout layout;
  std::vector<uint8_t> packed;
  std::vector<float> absmax;     // not nested
  std::vector<uint8_t> qabsmax;  // nested
  std::vector<float> absmax2;    // nested
  float offset = 0;
};

// Quantizes x[0, layout.numel) as bitsandbytes' quantize_4bit (and, nested, its
// compress_statistics) does on the CPU. Non-finite values are refused (`what` names the tensor).
Quant4Host quantize_4bit(const float* x, const Quant4Layout& layout, const char* what);
// Block b's absmax as dequantization reads it (nested: the 8-bit code's value x its nested
// block's absmax, plus the offset, in float32).
float quant4_absmax(const Quant4Host& q, int64_t b);
// The float32 values dequantize_4bit computes (value x absmax), into out[0, numel).
void dequantize_4bit(const Quant4Host& q, float* out);

}  // namespace brisk
