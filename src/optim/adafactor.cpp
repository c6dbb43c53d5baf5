// Adafactor as transformers' Adafactor, configured as Trainer does for --optim adafactor
// (lr = learning_rate, scale_parameter and relative_step off, no first moment); optim_args may
// turn on scale_parameter, relative_step (with warmup_init) and beta1, and set clip_threshold and
// decay_rate. State: a row and a column statistic per matrix, a full second moment per vector,
// and with beta1 a first moment per parameter. The arithmetic is the backend's adafactor_update.
#include <algorithm>
#include <cmath>
#include <functional>

#include "optim/optimizer.h"

namespace brisk {

namespace {
struct AdafactorOptions {
  bool scale_parameter = false, relative_step = false, warmup_init = false;
  double beta1 = -1;  // < 0: no first moment
  double clip_threshold = 1.0, decay_rate = -0.8, eps1 = 1e-30, eps2 = 1e-3;
  double weight_decay = 0;
};

class Adafactor final : public Optimizer {
 public:
  explicit Adafactor(const AdafactorOptions& o) : o_(o) {}
  std::string name() const override { return "adafactor"; }
  void plan(MemoryPlan& plan, BufferBinder& binder, const ParameterSet& params) override {
    slots_ = param_slots(params);
    split_ = split_slots(params);
    int64_t state = 0, sums = 0;
    for (size_t i = 0; i < slots_.size(); ++i) {
      slots_[i].state = state;
      state += state_elements(0, params.list()[i]);
    }
    for (SplitSlot& x : split_) {  // the moment's sums and the weights' squares
      x.sums_at = sums;
      sums += state_elements(0, params.list()[x.slot]) + 1;
    }
    sums += static_cast<int64_t>(split_.size());  // the updates' squares
    binder.declare(plan, &v_, "adafactor.exp_avg_sq", Category::optimizer_state, DType::f32,
                   Shape{state}, placement_);
    if (o_.beta1 >= 0)
      binder.declare(plan, &m_, "adafactor.exp_avg", Category::optimizer_state, DType::f32,
                     Shape{params.total_elements()}, placement_);
    if (!split_.empty())
      binder.declare(plan, &sums_, "adafactor.split_sums", Category::temporaries, DType::f64,
                     Shape{sums}, placement_);
  }
  // A split parameter's statistics are the whole one's: summed over the group.
  bool steps_split_parameters(const Backend& be) const override {
    return be.sums_split_statistics();
  }
  void join_split_group(const SplitGroup& group) override {
    group_ = group.sum;
    for (size_t k = 0; k < split_.size(); ++k) split_[k].counted = group.rank % copies_[k] == 0;
  }
  void reset(Backend& be) override {
    be.fill(v_, 0.0f);
    if (!m_.empty()) be.fill(m_, 0.0f);
    step_ = 0;
  }
  std::vector<std::pair<std::string, Tensor>> state() const override {
    std::vector<std::pair<std::string, Tensor>> s{{"exp_avg_sq", v_}};
    if (!m_.empty()) s.emplace_back("exp_avg", m_);
    return s;
  }
  // The second moment: a matrix's row and column statistics, a vector's every element, of the
  // whole parameter where p is a tensor rank's share (alike on every rank); the first moment
  // one value per element of p.
  int64_t state_elements(size_t i, const ParamInfo& p) const override {
    if (i > 0) return p.shape.numel();
    const Shape whole = p.full_shape();
    const int64_t n = whole.numel();
    if (whole.rank() < 2) return n;
    const int64_t cols = whole[whole.rank() - 1];
    return n / cols + cols;
  }
  bool state_per_element(size_t i, const ParamInfo&) const override { return i > 0; }
  // Partitions keep matrices whole (shard_granule); the first moment is one value per element.
  int64_t state_offset(size_t i, const ParamInfo& p, int64_t element) const override {
    BRISK_CHECK(i > 0 || element == 0 || p.shape.rank() < 2, "internal error: adafactor's ", p.name,
                " cut at element ", element);
    return element;
  }

 protected:
  void update(Backend& be, const Tensor& weights, const Tensor& grads, const Tensor& control,
              float lr) override {
    const double t = static_cast<double>(step_);
    AdafactorUpdate u;
    u.weights = weights;
    u.grads = grads;
    u.second_moment = v_;
    u.exp_avg = m_;
    u.control = control;
    u.slots = &slots_;
    // With relative_step, Adafactor's own step size replaces the learning rate and schedule.
    u.step_size =
        o_.relative_step
            ? static_cast<float>(std::min(o_.warmup_init ? 1e-6 * t : 1e-2, 1.0 / std::sqrt(t)))
            : lr;
    u.beta2t = static_cast<float>(1.0 - std::pow(t, o_.decay_rate));
    u.eps1 = static_cast<float>(o_.eps1);
    u.eps2 = static_cast<float>(o_.eps2);
    u.clip_threshold = static_cast<float>(o_.clip_threshold);
    u.beta1 = static_cast<float>(std::max(o_.beta1, 0.0));
    u.weight_decay = static_cast<float>(o_.weight_decay);
    u.scale_parameter = o_.scale_parameter;
    BRISK_CHECK(split_.empty() || group_,
                "internal error: adafactor steps split parameters without their group");
    u.split = &split_;
    u.sums = sums_;
    u.group_sum = group_;
    be.adafactor_update(u);
  }

 private:
  // Tensor parallelism's shares among params.
  std::vector<SplitSlot> split_slots(const ParameterSet& params) {
    std::vector<SplitSlot> out;
    copies_.clear();
    for (size_t i = 0; i < params.list().size(); ++i) {
      const ParamInfo& p = params.list()[i];
      if (!p.split.split()) continue;
      out.push_back(split_slot(p, slots_[i], i));
      copies_.push_back(p.split.copies);
    }
    return out;
  }

  AdafactorOptions o_;
  std::vector<ParamSlot> slots_;
  std::vector<SplitSlot> split_;
  std::vector<int> copies_;  // per split slot: the ranks holding its slice
  std::function<void(const Tensor&)> group_;
  Tensor v_, m_, sums_;
};
}  // namespace

std::unique_ptr<Optimizer> make_adafactor(const OptimizerConfig& config, OptimArgs& args) {
  AdafactorOptions o;
  o.scale_parameter = args.flag("scale_parameter", false);
  o.relative_step = args.flag("relative_step", false);
  o.warmup_init = args.flag("warmup_init", false);
  o.beta1 = args.number("beta1", -1);
  o.clip_threshold = args.number("clip_threshold", 1.0);
  o.decay_rate = args.number("decay_rate", -0.8);
  o.weight_decay = config.weight_decay;
  BRISK_CHECK(!o.warmup_init || o.relative_step,
              "optim_args: adafactor's warmup_init requires relative_step=true");
  BRISK_CHECK(o.beta1 == -1 || (o.beta1 >= 0 && o.beta1 < 1),
              "optim_args: adafactor's beta1 must lie in [0, 1), got ", o.beta1);
  BRISK_CHECK(o.clip_threshold > 0, "optim_args: clip_threshold must be positive, got ",
              o.clip_threshold);
  BRISK_CHECK(o.decay_rate < 0, "optim_args: decay_rate must be negative, got ", o.decay_rate);
  return std::make_unique<Adafactor>(o);
}

}  // namespace brisk
