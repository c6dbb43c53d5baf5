// RMSNorm forward and backward on the CPU (Llama's normalization), row-parallel; the gamma
// gradient column-blocked as LayerNorm's, so no per-thread buffers are needed; a row's sums are
// vector reductions, as LayerNorm's.
#include <algorithm>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_norm_rows.h"

namespace brisk {

void CpuBackend::rmsnorm_forward(const Tensor& x, const Tensor& gamma, float eps, const Tensor& y,
                                 const Tensor& rstd) {
  check_rmsnorm(x, gamma, rstd, y, "rmsnorm_forward", bf16_operands_);
  const int64_t C = cols_of(x), R = rows_of(x);
  const float *in = x.f32(), *g = gamma.f32();
  float* rs = rstd.f32();
  const bool bf16 = y.dtype() == DType::bf16;
  char* out = static_cast<char*>(y.data());
  const size_t row_bytes = static_cast<size_t>(C) * dtype_size(y.dtype());
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < R; ++r)
    rmsnorm_row(in + r * C, C, g, eps, out + r * row_bytes, bf16, rs + r);
}

void CpuBackend::rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma,
                                  const Tensor& rstd, const Tensor& dx, bool accumulate_dx,
                                  const Tensor& dgamma) {
  check_rmsnorm(x, gamma, rstd, dy, "rmsnorm_backward");
  check_rmsnorm(x, gamma, rstd, dx, "rmsnorm_backward");
  if (!dgamma.empty()) check_rmsnorm(x, dgamma, rstd, dy, "rmsnorm_backward dgamma");
  const int64_t C = cols_of(x), R = rows_of(x);
  const float *g = dy.f32(), *in = x.f32(), *gm = gamma.f32(), *rs = rstd.f32();
  // dgamma first: it reads dy, which dx may overwrite.
  if (!dgamma.empty()) {
    float* dg = dgamma.f32();
    constexpr int64_t kBlock = 64;
#pragma omp parallel for schedule(static)
    for (int64_t c0 = 0; c0 < C; c0 += kBlock) {
      const int64_t c1 = std::min(C, c0 + kBlock);
      float acc[kBlock] = {};
      for (int64_t r = 0; r < R; ++r) {
        const float *xr = in + r * C, *gr = g + r * C;
        for (int64_t c = c0; c < c1; ++c) acc[c - c0] += gr[c] * (xr[c] * rs[r]);
      }
      for (int64_t c = c0; c < c1; ++c) dg[c] += acc[c - c0];
    }
  }
  // dx = rstd * (dy*gamma - xhat * mean(dy*gamma*xhat)) with xhat = x * rstd: the gradient of
  // the normalization alone, whose centring term LayerNorm has and RMSNorm lacks.
  float* out = dx.f32();
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < R; ++r) {
    const float *xr = in + r * C, *gr = g + r * C;
    float* dr = out + r * C;
    const float s = rs[r];
    float sum_dx = 0.0f;
#pragma omp simd reduction(+ : sum_dx)
    for (int64_t c = 0; c < C; ++c) sum_dx += gr[c] * gm[c] * (xr[c] * s);
    const float mean_dx = sum_dx / C;
    for (int64_t c = 0; c < C; ++c) {
      const float v = s * (gr[c] * gm[c] - xr[c] * s * mean_dx);
      dr[c] = accumulate_dx ? dr[c] + v : v;
    }
  }
}

}  // namespace brisk
