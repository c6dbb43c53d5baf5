// AdamW as torch.optim.AdamW computes it, over the flat parameter buffer in one pass, with weight
// decay only on the parameters that take it.
#pragma once

#include "core/memory_plan.h"
#include "models/parameters.h"

namespace brisk {

struct AdamWOptions {
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float epsilon = 1e-8f;
  float weight_decay = 0.0f;
};

class AdamW {
 public:
  explicit AdamW(const AdamWOptions& options) : options_(options) {}
  // Declares the two moment buffers (optimizer_state).
  void plan(MemoryPlan& plan, BufferBinder& binder, int64_t num_params);
  void reset();  // zero moments, step 0
  // Updates `weights` (a flat float32 buffer laid out as `params`: the model's weights, or the
  // fp32 master copy in mixed precision) from grad_multiplier * `grads` (clipping and loss
  // unscaling folded in).
  void step(const ParameterSet& params, const Tensor& weights, const Tensor& grads, float lr,
            float grad_multiplier = 1.0f);
  void step(const ParameterSet& params, float lr) {
    step(params, params.flat_weights(), params.flat_grads(), lr);
  }
  int64_t steps() const { return step_; }
  // State for checkpoints.
  const Tensor& exp_avg() const { return m_; }
  const Tensor& exp_avg_sq() const { return v_; }
  void set_steps(int64_t steps) { step_ = steps; }

 private:
  AdamWOptions options_;
  Tensor m_, v_;
  int64_t step_ = 0;
};

}  // namespace brisk
