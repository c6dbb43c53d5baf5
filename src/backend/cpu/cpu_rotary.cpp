// Rotary position embedding on the CPU: the query and key heads of packed qkv rotated in place,
// pairs (i, i + D/2) of each head by the angle of their position (transformers' rotate_half form).
#include "backend/cpu/cpu_backend.h"

namespace brisk {

namespace {

// Rotates every query and key head of qkv by +angle (forward) or -angle (kInverse, backward: the
// transpose of a rotation is its inverse, so the gradient turns back by the same angle).
template <bool kInverse>
void rotate(const Tensor& qkv, const Tensor& cos, const Tensor& sin, int64_t first_position,
            const RotaryDims& d) {
  const int64_t half = d.D / 2, width = (d.H + 2 * d.K) * d.D, rotated = d.H + d.K;
  float* base = qkv.f32();
  const float *ct = cos.f32(), *st = sin.f32();
#pragma omp parallel for schedule(static)
  for (int64_t bt = 0; bt < d.B * d.T; ++bt) {
    const int64_t position = first_position + bt % d.T;
    const float *c = ct + position * half, *s = st + position * half;
    // Query heads come first, the key heads right after them: H + K heads of D in a row.
    float* row = base + bt * width;
    for (int64_t h = 0; h < rotated; ++h) {
      float* x = row + h * d.D;
      for (int64_t i = 0; i < half; ++i) {
        const float x1 = x[i], x2 = x[i + half];
        if constexpr (kInverse) {
          x[i] = x1 * c[i] + x2 * s[i];
          x[i + half] = x2 * c[i] - x1 * s[i];
        } else {
          // q * cos + rotate_half(q) * sin, rotate_half(q) = (-q2, q1).
          x[i] = x1 * c[i] - x2 * s[i];
          x[i + half] = x2 * c[i] + x1 * s[i];
        }
      }
    }
  }
}

}  // namespace

void CpuBackend::rotary_forward(const Tensor& qkv, int heads, int kv_heads, const Tensor& cos,
                                const Tensor& sin, int64_t first_position) {
  const RotaryDims d =
      check_rotary(qkv, heads, kv_heads, cos, sin, first_position, "rotary_forward");
  rotate<false>(qkv, cos, sin, first_position, d);
}

void CpuBackend::rotary_backward(const Tensor& dqkv, int heads, int kv_heads, const Tensor& cos,
                                 const Tensor& sin, int64_t first_position) {
  const RotaryDims d =
      check_rotary(dqkv, heads, kv_heads, cos, sin, first_position, "rotary_backward");
  rotate<true>(dqkv, cos, sin, first_position, d);
}

}  // namespace brisk
