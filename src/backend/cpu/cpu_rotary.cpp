// Rotary position embedding on the CPU: the query and key heads of packed qkv rotated in place,
// pairs (i, i + D/2) of each head by the angle of their position (transformers' rotate_half form;
// a packed batch's positions read from memory).
#include "backend/cpu/cpu_backend.h"

namespace brisk {

namespace {

// Rotates every query and key head of qkv by +angle (forward) or -angle (kInverse, backward: the
// transpose of a rotation is its inverse, so the gradient turns back by the same angle).
// Token bt's position: first_position + t, or positions[bt] where given.
template <bool kInverse>
void rotate(const Tensor& qkv, const Tensor& cos, const Tensor& sin, int64_t first_position,
            const int32_t* positions, const RotaryDims& d) {
  const int64_t half = d.D / 2, width = (d.H + 2 * d.K) * d.D, rotated = d.H + d.K;
  float* base = qkv.f32();
  const float *ct = cos.f32(), *st = sin.f32();
#pragma omp parallel for schedule(static)
  for (int64_t bt = 0; bt < d.B * d.T; ++bt) {
    const int64_t position = positions ? positions[bt] : first_position + bt % d.T;
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

// The positions given, each checked to be a row of the tables; null where none are.
const int32_t* checked_positions(const Tensor& positions, int64_t rows, const char* op) {
  if (positions.empty()) return nullptr;
  const int32_t* p = positions.i32();
  for (int64_t i = 0; i < positions.numel(); ++i)
    BRISK_CHECK(p[i] >= 0 && p[i] < rows, op, ": position ", p[i], " of token ", i,
                " lies outside tables of ", rows, " positions");
  return p;
}

}  // namespace

void CpuBackend::rotary_forward(const Tensor& qkv, int heads, int kv_heads, const Tensor& cos,
                                const Tensor& sin, int64_t first_position,
                                const Tensor& positions) {
  const char* op = "rotary_forward";
  const RotaryDims d = check_rotary(qkv, heads, kv_heads, cos, sin, first_position, positions, op);
  rotate<false>(qkv, cos, sin, first_position, checked_positions(positions, cos.dim(0), op), d);
}

void CpuBackend::rotary_backward(const Tensor& dqkv, int heads, int kv_heads, const Tensor& cos,
                                 const Tensor& sin, int64_t first_position,
                                 const Tensor& positions) {
  const char* op = "rotary_backward";
  const RotaryDims d = check_rotary(dqkv, heads, kv_heads, cos, sin, first_position, positions, op);
  rotate<true>(dqkv, cos, sin, first_position, checked_positions(positions, cos.dim(0), op), d);
}

}  // namespace brisk
