// exp for float32 that compilers vectorize (glibc's expf is a call per element unless the whole
// file is built with -ffast-math, which the softmax loops cannot take: their NaNs must survive).
// Cody-Waite range reduction by ln 2 and a degree-5 minimax polynomial for e^r on
// [-ln2/2, ln2/2] (the classic Cephes expf coefficients): within 2 ulp of the exact value over
// the normal range, exp(x) = 0 below -87.3, inf above 88.7, NaN stays NaN.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace brisk {

inline float vector_expf(float x) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
  constexpr float kMagic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const bool under = x<-87.3365f, over = x> 88.7228f;
  // max/min with x first keep a NaN.
  const float c = std::min(std::max(x, -87.3365f), 88.7228f);
  const float t = c * kLog2e + kMagic;
  const float n = t - kMagic;  // round(c / ln 2)
  float r = c - n * kLn2Hi;
  r = r - n * kLn2Lo;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float e = p * r * r + r + 1.0f;
  // 2^n from the integer in t's low mantissa bits, n in [-126, 128]: as 2^(n-1) * 2 for n > 0 so
  // that 2^128 needs no exponent beyond float's.
  int32_t bits;
  std::memcpy(&bits, &t, sizeof bits);
  const int32_t k = bits - 0x4B400000;
  const int32_t high = k > 0 ? 1 : 0;
  // Unsigned: a NaN's bits must not overflow a signed shift (its result is discarded below).
  const uint32_t scale_bits = static_cast<uint32_t>(k - high + 127) << 23;
  float scale;
  std::memcpy(&scale, &scale_bits, sizeof scale);
  const float y = e * scale * (high ? 2.0f : 1.0f);
  return under ? 0.0f : over ? __builtin_inff() : y;  // a NaN passes through e
}

}  // namespace brisk
