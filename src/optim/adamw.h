// AdamW as torch.optim.AdamW computes it, over the flat parameter buffer in one backend pass, with
// weight decay only on the parameters that take it.
#pragma once

#include "backend/backend.h"
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
  // Declares the two moment buffers and the table of weight-decay ranges (optimizer_state).
  void plan(MemoryPlan& plan, BufferBinder& binder, const ParameterSet& params);
  void reset(Backend& be);  // zero moments, step 0, decay table filled
  // Updates `weights` (a flat float32 buffer laid out as the parameters: the model's weights, or
  // the fp32 master copy in mixed precision) from control[kControlMultiplier] * `grads`, unless
  // control[kControlSkip] is set (optim/step_control.h). Counts the step either way; a skipped
  // step is taken back with undo_step once the host knows of it.
  void step(Backend& be, const Tensor& weights, const Tensor& grads, const Tensor& control,
            float lr);
  void undo_step() { --step_; }
  int64_t steps() const { return step_; }
  // State for checkpoints.
  const Tensor& exp_avg() const { return m_; }
  const Tensor& exp_avg_sq() const { return v_; }
  void set_steps(int64_t steps) { step_ = steps; }

 private:
  AdamWOptions options_;
  const ParameterSet* params_ = nullptr;
  Tensor m_, v_, decay_ranges_;
  int64_t step_ = 0;
};

}  // namespace brisk
