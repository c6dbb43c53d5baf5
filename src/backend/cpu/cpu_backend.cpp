// CPU backend construction and the small ops that need no file of their own.
#include "backend/cpu/cpu_backend.h"

#include <cblas.h>

#include <cstring>
#include <mutex>
#include <vector>

namespace brisk {

namespace {
// OpenBLAS fills its per-thread packing buffers (tens of MiB) only when a product first needs
// them, which for a wide product (an LM head over 50k tokens) happens inside the first training
// step. One wide product at start-up puts them in the resident memory measured before the arena,
// with the other libraries, instead of in the run's peak beyond the plan.
void touch_blas_buffers() {
  static std::once_flag once;
  std::call_once(once, [] {
    const int m = 64, k = 512, n = 16384;
    std::vector<float> a(static_cast<size_t>(m) * k, 0.5f), b(static_cast<size_t>(k) * n, 0.5f),
        c(static_cast<size_t>(m) * n);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0f, a.data(), k, b.data(), n,
                0.0f, c.data(), n);
  });
}
}  // namespace

std::unique_ptr<Backend> make_cpu_backend() {
  touch_blas_buffers();
  return std::make_unique<CpuBackend>();
}

void check_same_numel(const Tensor& a, const Tensor& b, const char* op) {
  BRISK_CHECK(a.numel() == b.numel(), op, ": element counts differ (", a.shape().str(), " vs ",
              b.shape().str(), ")");
}

void CpuBackend::fill(const Tensor& t, float value) {
  float* p = t.f32();
  const int64_t n = t.numel();
#pragma omp parallel for schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) p[i] = value;
}

void CpuBackend::copy(const Tensor& src, const Tensor& dst) {
  BRISK_CHECK(src.dtype() == dst.dtype(), "copy: dtypes differ");
  check_same_numel(src, dst, "copy");
  if (src.data() != dst.data()) std::memmove(dst.data(), src.data(), src.bytes());
}

void CpuBackend::first_token(const Tensor& x, const Tensor& out) {
  const int64_t B = x.dim(0), T = x.dim(1), C = x.dim(2);
  expect(out, DType::f32, Shape{B, C}, "first_token output");
  for (int64_t b = 0; b < B; ++b)
    std::memcpy(out.f32() + b * C, x.f32() + b * T * C, C * sizeof(float));
}

void CpuBackend::first_token_backward(const Tensor& dout, const Tensor& dx) {
  const int64_t B = dx.dim(0), T = dx.dim(1), C = dx.dim(2);
  expect(dout, DType::f32, Shape{B, C}, "first_token_backward gradient");
  for (int64_t b = 0; b < B; ++b) {
    float* d = dx.f32() + b * T * C;
    const float* g = dout.f32() + b * C;
    for (int64_t c = 0; c < C; ++c) d[c] += g[c];
  }
}

}  // namespace brisk
