// GELU on the CPU, erf and tanh forms. This file is compiled with -ffast-math so that erf, exp
// and tanh vectorize through glibc's vector math library; NaN and inf still propagate through
// the arithmetic, which is all the overflow checks downstream rely on.
#include <cmath>

#include "backend/cpu/cpu_backend.h"

namespace brisk {

namespace {
constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kInvSqrt2 = 0.7071067811865476f;
constexpr float kInvSqrt2Pi = 0.3989422804014327f;
}  // namespace

void CpuBackend::gelu_forward(GeluKind kind, const Tensor& x, const Tensor& y) {
  check_same_numel(x, y, "gelu_forward");
  const float* in = x.f32();
  float* out = y.f32();
  const int64_t n = x.numel();
  if (kind == GeluKind::erf) {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) out[i] = 0.5f * in[i] * (1.0f + std::erf(in[i] * kInvSqrt2));
  } else {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const float v = in[i];
      out[i] = 0.5f * v * (1.0f + std::tanh(kSqrt2OverPi * (v + 0.044715f * v * v * v)));
    }
  }
}

void CpuBackend::gelu_backward(GeluKind kind, const Tensor& x, const Tensor& dy, const Tensor& dx) {
  check_same_numel(x, dy, "gelu_backward");
  check_same_numel(x, dx, "gelu_backward");
  const float *in = x.f32(), *g = dy.f32();
  float* out = dx.f32();
  const int64_t n = x.numel();
  if (kind == GeluKind::erf) {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const float v = in[i];
      const float cdf = 0.5f * (1.0f + std::erf(v * kInvSqrt2));
      out[i] = g[i] * (cdf + v * kInvSqrt2Pi * std::exp(-0.5f * v * v));
    }
  } else {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const float v = in[i];
      const float u = kSqrt2OverPi * (v + 0.044715f * v * v * v);
      const float t = std::tanh(u);
      const float du = kSqrt2OverPi * (1.0f + 3.0f * 0.044715f * v * v);
      out[i] = g[i] * (0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * du);
    }
  }
}

}  // namespace brisk
