// AdamW: state, the decay table and the step count; the arithmetic is the backend's
// adamw_update.
#include "optim/adamw.h"

namespace brisk {

void AdamW::plan(MemoryPlan& plan, BufferBinder& binder, const ParameterSet& params) {
  params_ = &params;
  const Shape n{params.total_elements()};
  binder.declare(plan, &m_, "adamw.exp_avg", Category::optimizer_state, DType::f32, n, placement_);
  binder.declare(plan, &v_, "adamw.exp_avg_sq", Category::optimizer_state, DType::f32, n,
                 placement_);
  declare_decay_ranges(plan, binder, params, &decay_ranges_, "adamw.decay_ranges", placement_);
}

void AdamW::reset(Backend& be) {
  be.fill(m_, 0.0f);
  be.fill(v_, 0.0f);
  fill_decay_ranges(be, *params_, decay_ranges_);
  step_ = 0;
}

void AdamW::update(Backend& be, const Tensor& weights, const Tensor& grads, const Tensor& control,
                   float lr) {
  BRISK_CHECK(
      params_ && weights.numel() == params_->total_elements() && grads.numel() == weights.numel(),
      "AdamW: buffers do not match the parameter layout");
  AdamWUpdate u;
  u.weights = weights;
  u.grads = grads;
  u.exp_avg = m_;
  u.exp_avg_sq = v_;
  u.decay_ranges = decay_ranges_;
  u.control = control;
  u.lr = lr;
  u.beta1 = options_.beta1;
  u.beta2 = options_.beta2;
  u.eps = options_.epsilon;
  u.weight_decay = options_.weight_decay;
  u.step = step_;
  be.adamw_update(u);
}

}  // namespace brisk
