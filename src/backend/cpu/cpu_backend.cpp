// CPU backend construction and the small ops that need no file of their own.
#include "backend/cpu/cpu_backend.h"

#include <cstring>

namespace brisk {

std::unique_ptr<Backend> make_cpu_backend(const Switches& switches) {
  return std::make_unique<CpuBackend>(switches.cpu_products, switches.blocked_4bit_weights);
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

void CpuBackend::copy_rows(const Tensor& src, const Tensor& dst, const RowCopy& c) {
  const auto bytes = static_cast<size_t>(check_copy_rows(src, dst, c));
  const auto* from = static_cast<const char*>(src.data());
  auto* to = static_cast<char*>(dst.data());
  for (int64_t i = 0; i < c.rows; ++i)
    std::memcpy(to + static_cast<size_t>(c.dst_at + i * c.dst_pitch) * bytes,
                from + static_cast<size_t>(c.src_at + i * c.src_pitch) * bytes,
                static_cast<size_t>(c.count) * bytes);
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
