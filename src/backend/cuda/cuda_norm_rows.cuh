// One row of LayerNorm or RMSNorm on one warp: the forward kernels' row, shared with
// dropout_add_norm (which normalizes the rows it has just summed), so that the fused kernel gives
// the separate kernels' bits. Each lane owns the columns c = lane (mod 32) in every pass, so y may
// alias x. Y: float, or bf16 (rounded as stored).
#pragma once

#include "backend/cuda/cuda_elements.cuh"
#include "backend/cuda/cuda_launch.h"

namespace brisk::cuda {

// Two passes over the row as on the CPU (mean, then the biased variance about it), in float;
// rstd = 1 / sqrt(var + eps). Lane 0 writes the statistics where mean and rstd are not null.
template <typename Y>
__device__ __forceinline__ void layernorm_row(const float* xr, const float* gamma,
                                              const float* beta, float eps, Y* yr, int64_t C,
                                              float* mean, float* rstd) {
  const int lane = threadIdx.x & 31;
  const float cf = static_cast<float>(C);
  float sum = 0.0f;
  for (int64_t c = lane; c < C; c += 32) sum += xr[c];
  const float m = warp_reduce(sum, SumOp{}) / cf;
  float var = 0.0f;
  for (int64_t c = lane; c < C; c += 32) {
    const float d = xr[c] - m;
    var += d * d;
  }
  const float s = 1.0f / sqrtf(warp_reduce(var, SumOp{}) / cf + eps);
  for (int64_t c = lane; c < C; c += 32) put(yr + c, (xr[c] - m) * s * gamma[c] + beta[c]);
  if (lane == 0) {
    if (mean) *mean = m;
    if (rstd) *rstd = s;
  }
}

// rstd = 1 / sqrt(mean(x^2) + eps), y = (x * rstd) * gamma as the CPU; lane 0 writes rstd.
template <typename Y>
__device__ __forceinline__ void rmsnorm_row(const float* xr, const float* gamma, float eps, Y* yr,
                                            int64_t C, float* rstd) {
  const int lane = threadIdx.x & 31;
  float ss = 0.0f;
  for (int64_t c = lane; c < C; c += 32) ss += xr[c] * xr[c];
  const float s = 1.0f / sqrtf(warp_reduce(ss, SumOp{}) / static_cast<float>(C) + eps);
  for (int64_t c = lane; c < C; c += 32) put(yr + c, xr[c] * s * gamma[c]);
  if (lane == 0) *rstd = s;
}

}  // namespace brisk::cuda
