// Global gradient norm and clipping over the flat gradient buffer.
#include "optim/grad_norm.h"

#include <cmath>

namespace brisk {

double clip_grad_norm(const Tensor& grads, double max_norm) {
  const float* g = grads.f32();
  const int64_t n = grads.numel();
  double sq = 0.0;
#pragma omp parallel for reduction(+ : sq) schedule(static)
  for (int64_t i = 0; i < n; ++i) sq += static_cast<double>(g[i]) * g[i];
  const double norm = std::sqrt(sq);
  if (max_norm > 0 && norm > max_norm) {
    const float f = static_cast<float>(max_norm / (norm + 1e-6));
    float* w = grads.f32();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) w[i] *= f;
  }
  return norm;
}

void scale_grads(const Tensor& grads, float factor) {
  float* w = grads.f32();
  const int64_t n = grads.numel();
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) w[i] *= factor;
}

}  // namespace brisk
