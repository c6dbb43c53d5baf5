// One row of LayerNorm or RMSNorm on the CPU: what layernorm_forward and rmsnorm_forward compute
// per row, shared with dropout_add_norm (which normalizes the rows it has just summed), so that
// the fused op gives the separate ops' bits.
#pragma once

#include <cmath>
#include <cstdint>

#include "backend/cpu/cpu_store.h"

namespace brisk {

// y's row (float32, or bf16 rounded as stored) = (x - mean) * rstd * gamma + beta over the C
// values of xr; returns the row's mean and rstd. A row's sums are vector reductions (lanes of
// partial sums, the same order on every run and thread count). y may alias x.
inline void layernorm_row(const float* xr, int64_t C, const float* g, const float* bt, float eps,
                          void* y_row, bool bf16, float* mean, float* rstd) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t c = 0; c < C; ++c) sum += xr[c];
  const float m = sum / C;
  float var = 0.0f;
#pragma omp simd reduction(+ : var)
  for (int64_t c = 0; c < C; ++c) var += (xr[c] - m) * (xr[c] - m);
  const float s = 1.0f / std::sqrt(var / C + eps);
  store_row(y_row, bf16, C, [&](float* yr, int64_t c0, int64_t n) {
    for (int64_t c = 0; c < n; ++c) yr[c] = (xr[c0 + c] - m) * s * g[c0 + c] + bt[c0 + c];
  });
  *mean = m;
  *rstd = s;
}

// y's row = (x * rstd) * gamma with rstd = 1 / sqrt(mean(x^2) + eps), in transformers' order;
// returns rstd. Element c is read before it is written, so y may alias x.
inline void rmsnorm_row(const float* xr, int64_t C, const float* g, float eps, void* y_row,
                        bool bf16, float* rstd) {
  float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
  for (int64_t c = 0; c < C; ++c) ss += xr[c] * xr[c];
  const float s = 1.0f / std::sqrt(ss / C + eps);
  store_row(y_row, bf16, C, [&](float* yr, int64_t c0, int64_t n) {
    for (int64_t c = 0; c < n; ++c) yr[c] = xr[c0 + c] * s * g[c0 + c];
  });
  *rstd = s;
}

}  // namespace brisk
