// Block-wise 8-bit quantization of optimizer state ("8-bit Optimizers via Block-wise
// Quantization", Dettmers et al.) and stochastic rounding to bf16: the pieces shared by host and
// device code (kept C++17-clean for nvcc).
#pragma once

#include <array>
#include <cstdint>
#include <cstring>

#include "core/rng.h"  // BRISK_HD

namespace brisk {

// The 256 values of the dynamic ("tree") quantization map in ascending order, as bitsandbytes
// builds it: for decades 10^-6 .. 10^0, the midpoints of an even split of [0.1, 1] into 2^i
// (signed, mirrored to negative values) or 2^(i+1) (unsigned) parts, plus 0 and 1.
std::array<float, 256> dynamic_quant_map(bool is_signed);

// The index of the map value nearest to x (map ascending, 256 values; a tie goes to the
// smaller value).
BRISK_HD uint8_t quantize_nearest(const float* map, float x) {
  if (!(x > map[0])) return 0;  // also NaN
  if (x >= map[255]) return 255;
  int lo = 0, hi = 255;  // map[lo] < x < map[hi]... narrowed to neighbours
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (map[mid] <= x)
      lo = mid;
    else
      hi = mid;
  }
  return static_cast<uint8_t>(x - map[lo] <= map[hi] - x ? lo : hi);
}

// x rounded to a bf16 value (returned as float): up in magnitude when the 16 low bits of `random`
// fall below x's 16 bits beyond bf16's precision, so the expected result is x. inf and NaN stay.
BRISK_HD float stochastic_round_bf16(float x, uint32_t random) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7fffffffu) >= 0x7f800000u) return x;
  u = (u + (random & 0xffffu)) & 0xffff0000u;
  float r;
  std::memcpy(&r, &u, 4);
  return r;
}

}  // namespace brisk
