// Elementwise ops on the CPU: tanh, dropout from the counter-based RNG, residual adds.
#include <algorithm>
#include <cmath>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_dropout.h"
#include "backend/cpu/cpu_tiles.h"

namespace brisk {

namespace {
constexpr int64_t kDropoutChunk = 1 << 14;  // elements per parallel work item

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

void CpuBackend::dropout_add(const Tensor& x, const Tensor& r, float p, const RngKey& key,
                             const Tensor& y) {
  check_same_numel(x, r, "dropout_add");
  check_same_numel(x, y, "dropout_add");
  check_dropout_p(p);
  BRISK_CHECK(r.dtype() == DType::f32 || stores_product_output(r.dtype()), "dropout_add: a ",
              dtype_name(r.dtype()), " branch where float32 is expected");
  const float* a = x.f32();
  float* out = y.f32();
  const int64_t n = x.numel();
  // A bf16 branch (a product's output stored rounded) is widened a piece at a time: the same
  // values, and the same mask (keyed by the element's index), as the float32 branch holding them.
  const bool widen = r.dtype() == DType::bf16;
  const float* r32 = widen ? nullptr : r.f32();
  const uint16_t* r16 = widen ? r.as<uint16_t>() : nullptr;
  constexpr int64_t kPiece = 1024;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; i += kPiece) {
    const int64_t m = std::min(kPiece, n - i);
    float buf[kPiece];
    if (widen) bf16_widen_row(r16 + i, buf, m);
    const float* b = widen ? buf : r32 + i;
    if (p != 0.0f) {
      dropout_range(key, p, key.first_element + static_cast<uint64_t>(i), m, b, a + i, out + i);
      continue;
    }
#pragma omp simd
    for (int64_t j = 0; j < m; ++j) out[i + j] = a[i + j] + b[j];
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
