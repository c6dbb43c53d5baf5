// Global gradient norm and the clipping coefficient.
#include "optim/grad_norm.h"

#include <cmath>

namespace brisk {

double grad_l2_norm(const Tensor& grads) {
  const float* g = grads.f32();
  const int64_t n = grads.numel();
  double sq = 0.0;
#pragma omp parallel for simd reduction(+ : sq) schedule(static)
  for (int64_t i = 0; i < n; ++i) sq += static_cast<double>(g[i]) * g[i];
  return std::sqrt(sq);
}

double clip_coefficient(double norm, double max_norm) {
  return max_norm > 0 && norm > max_norm ? max_norm / (norm + 1e-6) : 1.0;
}

}  // namespace brisk
