// Elementwise ops on the CPU: tanh, dropout from the counter-based RNG, residual adds (and the
// residual add before a norm, a row at a time).
#include <algorithm>
#include <cmath>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_dropout.h"
#include "backend/cpu/cpu_norm_rows.h"

namespace brisk {

namespace {
constexpr int64_t kDropoutChunk = 1 << 14;  // elements per parallel work item

// Asks for the cache lines of [p, p + bytes) to be loaded ahead of their use.
void prefetch(const void* p, size_t bytes) {
  for (size_t o = 0; o < bytes; o += 64) __builtin_prefetch(static_cast<const char*>(p) + o);
}

void check_dropout_p(float p) {
  BRISK_CHECK(p >= 0.0f && p < 1.0f, "dropout probability ", p, " is outside [0, 1)");
}
}  // namespace

void CpuBackend::tanh_forward(const Tensor& x, const Tensor& y) {
  check_same_numel(x, y, "tanh_forward");
  const float* in = x.f32();
  float* out = y.f32();
  for (int64_t i = 0, n = x.numel(); i < n; ++i) out[i] = std::tanh(in[i]);
}

void CpuBackend::tanh_backward(const Tensor& y, const Tensor& dy, const Tensor& dx) {
  check_same_numel(y, dy, "tanh_backward");
  check_same_numel(y, dx, "tanh_backward");
  const float *out = y.f32(), *g = dy.f32();
  float* d = dx.f32();
  for (int64_t i = 0, n = y.numel(); i < n; ++i) d[i] = g[i] * (1.0f - out[i] * out[i]);
}

void CpuBackend::dropout_forward(const Tensor& x, float p, const RngKey& key, const Tensor& y) {
  check_same_numel(x, y, "dropout_forward");
  check_dropout_p(p);
  const float* in = x.f32();
  float* out = y.f32();
  const int64_t n = x.numel();
  if (p == 0.0f) {
    if (in != out) copy(x, y);
    return;
  }
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; i += kDropoutChunk)
    dropout_range(key, p, key.first_element + static_cast<uint64_t>(i),
                  std::min(kDropoutChunk, n - i), in + i, nullptr, out + i);
}

void CpuBackend::dropout_backward(const Tensor& dy, float p, const RngKey& key, const Tensor& dx) {
  // The mask and scale are the same as the forward's, so the backward is the same map.
  dropout_forward(dy, p, key, dx);
}

// A residual branch r to add to x through dropout p: as many elements, float32 or the dtype the
// products store.
void CpuBackend::check_residual_branch(const Tensor& x, const Tensor& r, float p,
                                       const char* op) const {
  check_same_numel(x, r, op);
  check_dropout_p(p);
  BRISK_CHECK(r.dtype() == DType::f32 || stores_product_output(r.dtype()), op, ": a ",
              dtype_name(r.dtype()), " branch where float32 is expected");
}

void CpuBackend::dropout_add(const Tensor& x, const Tensor& r, float p, const RngKey& key,
                             const Tensor& y) {
  check_residual_branch(x, r, p, "dropout_add");
  check_same_numel(x, y, "dropout_add");
  const float* a = x.f32();
  float* out = y.f32();
  const int64_t n = x.numel();
  constexpr int64_t kPiece = 1024;
  const bool widen = r.dtype() == DType::bf16;
  const size_t r_size = dtype_size(r.dtype());
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; i += kPiece)
    dropout_add_span(key, p, key.first_element + static_cast<uint64_t>(i), std::min(kPiece, n - i),
                     a + i, static_cast<const char*>(r.data()) + static_cast<size_t>(i) * r_size,
                     widen, out + i);
}

// Row by row: the row's sum (dropout_add_span, dropout_add's values and masks), then its norm
// while the row is in cache (cpu_norm_rows.h, the separate ops' code). bench_residual_norm
// measures it against the two passes.
void CpuBackend::dropout_add_norm(const Tensor& x, const Tensor& r, float p, const RngKey& key,
                                  const Tensor& sum, const Norm& norm, const Tensor& y) {
  check_residual_branch(x, r, p, "dropout_add_norm");
  check_norm(x, norm, sum, "dropout_add_norm", false);
  check_norm(x, norm, y, "dropout_add_norm", bf16_operands_);
  const int64_t C = cols_of(x), R = rows_of(x);
  const float *a = x.f32(), *g = norm.gamma.f32(), *bt = norm.rms ? nullptr : norm.beta.f32();
  float *s = sum.f32(), *mu = norm.rms ? nullptr : norm.mean.f32(), *rs = norm.rstd.f32();
  const bool widen = r.dtype() == DType::bf16, bf16 = y.dtype() == DType::bf16;
  const size_t x_row = static_cast<size_t>(C) * sizeof(float);
  const size_t r_row = static_cast<size_t>(C) * dtype_size(r.dtype());
  const size_t y_row = static_cast<size_t>(C) * dtype_size(y.dtype());
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < R; ++i) {
    const uint64_t first = key.first_element + static_cast<uint64_t>(i * C);
    if (i + 2 < R) {  // the inputs two rows on, while this one's dropout and norm compute
      prefetch(a + (i + 2) * C, x_row);
      prefetch(static_cast<const char*>(r.data()) + (i + 2) * r_row, r_row);
    }
    float* si = s + i * C;
    dropout_add_span(key, p, first, C, a + i * C, static_cast<const char*>(r.data()) + i * r_row,
                     widen, si);
    void* yi = static_cast<char*>(y.data()) + i * y_row;
    if (norm.rms)
      rmsnorm_row(si, C, g, norm.eps, yi, bf16, rs + i);
    else
      layernorm_row(si, C, g, bt, norm.eps, yi, bf16, mu + i, rs + i);
  }
}

void CpuBackend::add_inplace(const Tensor& y, const Tensor& x) {
  check_same_numel(x, y, "add_inplace");
  float* out = y.f32();
  const float* in = x.f32();
  const int64_t n = y.numel();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) out[i] += in[i];
}

}  // namespace brisk
