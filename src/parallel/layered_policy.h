// The base of the policies that wrap another (tensor, expert and pipeline parallelism around data
// parallelism, parallel/layout.h's stack): every method forwards to the policy within by
// default, so that a layer names only what it adds, its own reductions and its saves.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "parallel/layout.h"
#include "parallel/policy.h"

namespace brisk {

// The parameters this rank steps: its replica's ZeRO run, or the trained ones (all, but a LoRA's
// base).
ElementRange stepped_run(const ParallelContext& c);

class LayeredPolicy : public ParallelPolicy {
 public:
  LayeredPolicy(const ParallelContext& c, std::unique_ptr<ParallelPolicy> inner);

  void begin_step() override { inner_->begin_step(); }
  Model::SegmentDone on_segment(bool last) override { return inner_->on_segment(last); }
  SyncSeconds finish_gradients() override { return inner_->finish_gradients(); }
  const Tensor& gradients() const override { return inner_->gradients(); }
  double sum_over_gradients(const Tensor& sums) override {
    return inner_->sum_over_gradients(sums);
  }
  double gradient_sum_squares(const Tensor& acc, int skip) override {
    return inner_->gradient_sum_squares(acc, skip);
  }
  double step_weights(float lr, const RngKey& rounding) override {
    return inner_->step_weights(lr, rounding);
  }
  double take_weight_wait_seconds() override { return inner_->take_weight_wait_seconds(); }
  void weights_written() override { inner_->weights_written(); }
  void load_weights(const std::string& file) override { inner_->load_weights(file); }
  std::vector<std::pair<std::string, double>> statistics() const override {
    return inner_->statistics();
  }
  std::vector<std::pair<std::string, double>> step_statistics() const override {
    return inner_->step_statistics();
  }
  const StateShare* state_share() const override { return inner_->state_share(); }
  std::unique_ptr<GatheredReads> gather_for_save(bool checkpoint) override {
    return inner_->gather_for_save(checkpoint);
  }
  const Model* saved_model() const override { return inner_->saved_model(); }
  StagedForward* staged_forward() override { return inner_->staged_forward(); }

 protected:
  ParallelPolicy& inner() const { return *inner_; }
  // The inner policy's gradients, then this layer's sums (`sum`, blocking: its seconds all
  // waited for).
  SyncSeconds finish_then(const std::function<void()>& sum);
  // The inner policy's sums over the gradients, then the sum over `group`; the seconds of both.
  double sum_over_gradients_then(const Tensor& sums, Communicator& group);
  // Where the inner policy's gradients start among the model's parameters: ZeRO's run, or the
  // gradient buffer's (0, or a LoRA's trained run).
  int64_t held_base() const;
  // This rank's parts of the weights (and with `checkpoint` of the optimizer's state) for a
  // save: under ZeRO its replica's run, else the whole on the first replica and none on others.
  std::vector<Tensor> saved_parts(bool checkpoint) const;

  Backend& be_;
  Communicator& world_;
  DeviceMesh& mesh_;
  Model& model_;
  MixedPrecision& precision_;
  Optimizer& optimizer_;
  int replica_;       // this rank's place among the replicas that hold its parameters
  ElementRange run_;  // the parameters this rank steps (ZeRO's run, or the trained ones)
  bool zero_;         // the run is a part: ZeRO partitions the state

 private:
  std::unique_ptr<ParallelPolicy> inner_;
};

}  // namespace brisk
