// CPU backend construction and the small ops that need no file of their own.
#include "backend/cpu/cpu_backend.h"

#include <algorithm>
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

namespace {
// Sequence b's first token among x's B * T (a packed batch's sample b's where `starts` is given,
// each start checked), or -1 past its samples.
struct FirstTokens {
  const int32_t* starts = nullptr;
  int64_t samples, T;
  FirstTokens(const Tensor& x, const Tensor& s, const char* op) : samples(x.dim(0)), T(x.dim(1)) {
    if (s.empty()) return;
    BRISK_CHECK(s.dtype() == DType::i32 && s.numel() >= 2 && s.numel() <= x.dim(0) + 1, op,
                ": starts must be int32 [samples + 1] of at most ", x.dim(0), " samples, got ",
                s.shape().str());
    starts = s.i32();
    samples = s.numel() - 1;
    for (int64_t b = 0; b < samples; ++b)
      BRISK_CHECK(starts[b] >= 0 && starts[b] < x.dim(0) * T, op, ": sample ", b, " starts at ",
                  starts[b], ", outside the ", x.dim(0) * T, " tokens");
  }
  int64_t operator[](int64_t b) const {
    if (b >= samples) return -1;
    return starts ? starts[b] : b * T;
  }
};
}  // namespace

void CpuBackend::first_token(const Tensor& x, const Tensor& out, const Tensor& starts) {
  const int64_t B = x.dim(0), C = x.dim(2);
  expect(out, DType::f32, Shape{B, C}, "first_token output");
  const FirstTokens first(x, starts, "first_token");
  for (int64_t b = 0; b < B; ++b) {
    float* o = out.f32() + b * C;
    if (first[b] < 0)
      std::fill(o, o + C, 0.0f);
    else
      std::memcpy(o, x.f32() + first[b] * C, C * sizeof(float));
  }
}

void CpuBackend::first_token_backward(const Tensor& dout, const Tensor& dx, const Tensor& starts) {
  const int64_t B = dx.dim(0), C = dx.dim(2);
  expect(dout, DType::f32, Shape{B, C}, "first_token_backward gradient");
  const FirstTokens first(dx, starts, "first_token_backward");
  for (int64_t b = 0; b < first.samples; ++b) {
    float* d = dx.f32() + first[b] * C;
    const float* g = dout.f32() + b * C;
    for (int64_t c = 0; c < C; ++c) d[c] += g[c];
  }
}

}  // namespace brisk
