// AdamW as torch.optim.AdamW computes it (--optim adamw_torch, the default), over the flat
// parameter buffer in one backend pass, with weight decay only on the parameters that take it.
#pragma once

#include "optim/optimizer.h"

namespace brisk {

struct AdamWOptions {
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float epsilon = 1e-8f;
  float weight_decay = 0.0f;
};

class AdamW final : public Optimizer {
 public:
  explicit AdamW(const AdamWOptions& options) : options_(options) {}
  std::string name() const override { return "adamw_torch"; }
  int64_t shard_granule(const ParamInfo&) const override { return 1; }
  // Two float32 moments per parameter and the table of weight-decay ranges.
  void plan(MemoryPlan& plan, BufferBinder& binder, const ParameterSet& params) override;
  void reset(Backend& be) override;
  std::vector<std::pair<std::string, Tensor>> state() const override {
    return {{"exp_avg", m_}, {"exp_avg_sq", v_}};
  }

 protected:
  void update(Backend& be, const Tensor& weights, const Tensor& grads, const Tensor& control,
              float lr) override;

 private:
  AdamWOptions options_;
  const ParameterSet* params_ = nullptr;
  Tensor m_, v_, decay_ranges_;
};

}  // namespace brisk
