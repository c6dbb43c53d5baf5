// AdamW: state, the decay table and the step count; the arithmetic is the backend's
// adamw_update.
#include "optim/adamw.h"

#include <vector>

namespace brisk {

namespace {
// Maximal runs of consecutive parameters that take weight decay, as [begin, end) elements.
std::vector<int64_t> decay_ranges(const ParameterSet& params) {
  std::vector<int64_t> r;
  for (const ParamInfo& p : params.list()) {
    if (!p.decay) continue;
    const int64_t begin = p.offset, end = p.offset + p.shape.numel();
    if (!r.empty() && r.back() == begin)
      r.back() = end;
    else
      r.insert(r.end(), {begin, end});
  }
  return r;
}
}  // namespace

void AdamW::plan(MemoryPlan& plan, BufferBinder& binder, const ParameterSet& params) {
  params_ = &params;
  const Shape n{params.total_elements()};
  binder.declare(plan, &m_, "adamw.exp_avg", Category::optimizer_state, DType::f32, n);
  binder.declare(plan, &v_, "adamw.exp_avg_sq", Category::optimizer_state, DType::f32, n);
  const int64_t ranges = static_cast<int64_t>(decay_ranges(params).size() / 2);
  binder.declare(plan, &decay_ranges_, "adamw.decay_ranges", Category::optimizer_state, DType::i64,
                 Shape{ranges, 2});
}

void AdamW::reset(Backend& be) {
  be.fill(m_, 0.0f);
  be.fill(v_, 0.0f);
  const std::vector<int64_t> r = decay_ranges(*params_);
  with_host_view(be, decay_ranges_, false, true,
                 [&](const Tensor& t) { std::copy(r.begin(), r.end(), t.as<int64_t>()); });
  step_ = 0;
}

void AdamW::step(Backend& be, const Tensor& weights, const Tensor& grads, const Tensor& control,
                 float lr) {
  BRISK_CHECK(
      params_ && weights.numel() == params_->total_elements() && grads.numel() == weights.numel(),
      "AdamW: buffers do not match the parameter layout");
  ++step_;
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
