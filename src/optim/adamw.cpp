// AdamW step on the CPU.
#include "optim/adamw.h"

#include <cmath>

namespace brisk {

void AdamW::plan(MemoryPlan& plan, BufferBinder& binder, int64_t num_params) {
  binder.declare(plan, &m_, "adamw.exp_avg", Category::optimizer_state, DType::f32,
                 Shape{num_params});
  binder.declare(plan, &v_, "adamw.exp_avg_sq", Category::optimizer_state, DType::f32,
                 Shape{num_params});
}

void AdamW::reset() {
  std::fill(m_.f32(), m_.f32() + m_.numel(), 0.0f);
  std::fill(v_.f32(), v_.f32() + v_.numel(), 0.0f);
  step_ = 0;
}

void AdamW::step(const ParameterSet& params, const Tensor& weights, const Tensor& grads, float lr,
                 float grad_multiplier) {
  BRISK_CHECK(weights.numel() == params.total_elements() && grads.numel() == weights.numel(),
              "AdamW: buffers do not match the parameter layout");
  ++step_;
  const float b1 = options_.beta1, b2 = options_.beta2;
  const double bc1 = 1.0 - std::pow(static_cast<double>(b1), static_cast<double>(step_));
  const double bc2 = 1.0 - std::pow(static_cast<double>(b2), static_cast<double>(step_));
  const float step_size = static_cast<float>(lr / bc1);
  const float bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  float* __restrict w = weights.f32();
  const float* __restrict g = grads.f32();
  float* __restrict m = m_.f32();
  float* __restrict v = v_.f32();
  const float eps = options_.epsilon;
  for (const ParamInfo& p : params.list()) {
    const float decay = p.decay ? 1.0f - lr * options_.weight_decay : 1.0f;
    const int64_t begin = p.offset, end = p.offset + p.shape.numel();
#pragma omp parallel for simd schedule(static) if (end - begin > 32768)
    for (int64_t i = begin; i < end; ++i) {
      const float gi = g[i] * grad_multiplier;
      const float mi = b1 * m[i] + (1.0f - b1) * gi;
      const float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
      m[i] = mi;
      v[i] = vi;
      w[i] = w[i] * decay - step_size * mi / (std::sqrt(vi) / bc2_sqrt + eps);
    }
  }
}

}  // namespace brisk
