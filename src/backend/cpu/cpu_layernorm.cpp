// LayerNorm forward and backward on the CPU, row-parallel (a forward row: cpu_norm_rows.h);
// parameter gradients column-blocked so no per-thread buffers are needed. A row's sums are vector
// reductions (lanes of partial sums, the same order on every run and thread count).
#include <algorithm>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_norm_rows.h"

namespace brisk {

void CpuBackend::layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                   float eps, const Tensor& y, const Tensor& mean,
                                   const Tensor& rstd) {
  const int64_t C = cols_of(x), R = rows_of(x);
  check_output(y, x, "layernorm_forward");
  BRISK_CHECK(gamma.numel() == C && beta.numel() == C && mean.numel() == R && rstd.numel() == R,
              "layernorm_forward: parameter or statistics sizes do not match ", x.shape().str());
  const float *in = x.f32(), *g = gamma.f32(), *bt = beta.f32();
  float *mu = mean.f32(), *rs = rstd.f32();
  const bool bf16 = y.dtype() == DType::bf16;
  char* out = static_cast<char*>(y.data());
  const size_t row_bytes = static_cast<size_t>(C) * dtype_size(y.dtype());
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < R; ++r)
    layernorm_row(in + r * C, C, g, bt, eps, out + r * row_bytes, bf16, mu + r, rs + r);
}

void CpuBackend::layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma,
                                    const Tensor& mean, const Tensor& rstd, const Tensor& dx,
                                    bool accumulate_dx, const Tensor& dgamma, const Tensor& dbeta) {
  const int64_t C = cols_of(x), R = rows_of(x);
  check_same_numel(x, dy, "layernorm_backward");
  check_same_numel(x, dx, "layernorm_backward");
  const float *g = dy.f32(), *in = x.f32(), *gm = gamma.f32(), *mu = mean.f32(), *rs = rstd.f32();
  float* out = dx.f32();
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < R; ++r) {
    const float *xr = in + r * C, *gr = g + r * C;
    float* dr = out + r * C;
    float sum_d = 0.0f, sum_dx = 0.0f;
#pragma omp simd reduction(+ : sum_d, sum_dx)
    for (int64_t c = 0; c < C; ++c) {
      const float xhat = (xr[c] - mu[r]) * rs[r];
      const float d = gr[c] * gm[c];
      sum_d += d;
      sum_dx += d * xhat;
    }
    const float mean_d = sum_d / C, mean_dx = sum_dx / C;
    for (int64_t c = 0; c < C; ++c) {
      const float xhat = (xr[c] - mu[r]) * rs[r];
      const float v = rs[r] * (gr[c] * gm[c] - mean_d - xhat * mean_dx);
      dr[c] = accumulate_dx ? dr[c] + v : v;
    }
  }
  if (dgamma.empty() && dbeta.empty()) return;
  float* dg = dgamma.empty() ? nullptr : dgamma.f32();
  float* db = dbeta.empty() ? nullptr : dbeta.f32();
  constexpr int64_t kBlock = 64;
#pragma omp parallel for schedule(static)
  for (int64_t c0 = 0; c0 < C; c0 += kBlock) {
    const int64_t c1 = std::min(C, c0 + kBlock);
    float acc_g[kBlock] = {}, acc_b[kBlock] = {};
    for (int64_t r = 0; r < R; ++r) {
      const float *xr = in + r * C, *gr = g + r * C;
      for (int64_t c = c0; c < c1; ++c) {
        acc_g[c - c0] += gr[c] * (xr[c] - mu[r]) * rs[r];
        acc_b[c - c0] += gr[c];
      }
    }
    for (int64_t c = c0; c < c1; ++c) {
      if (dg) dg[c] += acc_g[c - c0];
      if (db) db[c] += acc_b[c - c0];
    }
  }
}

}  // namespace brisk
