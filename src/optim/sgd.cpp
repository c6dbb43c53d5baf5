// SGD as torch.optim.SGD (--optim sgd; optim_args momentum, dampening, nesterov): the momentum
// buffer (when momentum is set) and the decay table; the arithmetic is the backend's sgd_update.
#include "optim/optimizer.h"

namespace brisk {

namespace {
class Sgd final : public Optimizer {
 public:
  Sgd(float momentum, float dampening, bool nesterov, float weight_decay)
      : momentum_(momentum), dampening_(dampening), nesterov_(nesterov), wd_(weight_decay) {}
  std::string name() const override { return "sgd"; }
  int64_t shard_granule(const ParamInfo&) const override { return 1; }
  void plan(MemoryPlan& plan, BufferBinder& binder, const ParameterSet& params) override {
    params_ = &params;
    if (momentum_ != 0)
      binder.declare(plan, &buf_, "sgd.momentum_buffer", Category::optimizer_state, DType::f32,
                     Shape{params.total_elements()}, placement_);
    declare_decay_ranges(plan, binder, params, &decay_ranges_, "sgd.decay_ranges", placement_);
  }
  void reset(Backend& be) override {
    if (!buf_.empty()) be.fill(buf_, 0.0f);
    fill_decay_ranges(be, *params_, decay_ranges_);
    step_ = 0;
  }
  std::vector<std::pair<std::string, Tensor>> state() const override {
    if (buf_.empty()) return {};
    return {{"momentum_buffer", buf_}};
  }

 protected:
  void update(Backend& be, const Tensor& weights, const Tensor& grads, const Tensor& control,
              float lr) override {
    SgdUpdate u;
    u.weights = weights;
    u.grads = grads;
    u.momentum_buffer = buf_;
    u.decay_ranges = decay_ranges_;
    u.control = control;
    u.lr = lr;
    u.momentum = momentum_;
    u.dampening = dampening_;
    u.nesterov = nesterov_;
    u.weight_decay = wd_;
    u.first_step = step_ == 1;  // the buffer starts as the first applied step's gradient
    be.sgd_update(u);
  }

 private:
  float momentum_, dampening_;
  bool nesterov_;
  float wd_;
  const ParameterSet* params_ = nullptr;
  Tensor buf_, decay_ranges_;
};
}  // namespace

std::unique_ptr<Optimizer> make_sgd(const OptimizerConfig& config, OptimArgs& args) {
  const double momentum = args.number("momentum", 0.0);
  const double dampening = args.number("dampening", 0.0);
  const bool nesterov = args.flag("nesterov", false);
  BRISK_CHECK(momentum >= 0, "optim_args: momentum must not be negative, got ", momentum);
  BRISK_CHECK(dampening >= 0 && dampening <= 1, "optim_args: dampening must lie in [0, 1], got ",
              dampening);
  BRISK_CHECK(!nesterov || (momentum > 0 && dampening == 0),
              "optim_args: nesterov momentum requires a momentum and zero dampening");
  return std::make_unique<Sgd>(static_cast<float>(momentum), static_cast<float>(dampening),
                               nesterov, static_cast<float>(config.weight_decay));
}

}  // namespace brisk
