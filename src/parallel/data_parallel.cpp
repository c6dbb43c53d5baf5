// Data parallelism as a ParallelPolicy: every rank holds the whole model and trains on its share
// of each global batch. How the gradients are summed is a GradientSync (gradient_sync.h); how the
// update is shared depends on what the ranks partition (ZeRO, Rajbhandari et al. 2020):
//   nothing (one rank, or plain data parallelism): each rank steps the whole parameters alike;
//   stage 1: each rank steps its run of the parameters (its optimizer state, and master copy),
//     then every run is broadcast from its owner;
//   stage 2: the same from its shard of the summed gradients;
//   stage 3: the rank keeps only its run of the weights, gathered when the model needs them;
//     with a frozen base (LoRA) its run of the blocks' frozen weights, the trained parameters
//     as under stage 2.
// With the optimizer offloaded, the step runs on the host's backend from host copies of the
// gradients (this rank's run) and of the step's decision.
#include <algorithm>
#include <chrono>
#include <optional>

#include "backend/backend.h"
#include "core/clock.h"
#include "core/weight_files.h"
#include "optim/optimizer.h"
#include "parallel/communicator.h"
#include "parallel/policy.h"
#include "precision/mixed_precision.h"

namespace brisk {

namespace {

using Clock = std::chrono::steady_clock;

class DataParallel final : public ParallelPolicy {
 public:
  DataParallel(Backend& be, Communicator& comm, Model& model, MixedPrecision& precision,
               Optimizer& optimizer, const ParallelBuffers& buffers, const ParallelOptions& o);

  void begin_step() override { sync_->begin_step(); }
  Model::SegmentDone on_segment(bool last) override { return sync_->on_segment(last); }
  SyncSeconds finish_gradients() override { return sync_->finish(); }

  const Tensor& gradients() const override {
    return b_.grad_shard.empty() ? model_.params().flat_grads() : b_.grad_shard;
  }
  double sum_over_gradients(const Tensor& sums) override;
  double gradient_sum_squares(const Tensor& acc, int skip) override {
    const int64_t base = !b_.grad_shard.empty()
                             ? b_.shards[static_cast<size_t>(comm_.rank())].elements.offset
                             : model_.params().gradient_origin();
    sum_squares_except(be_, model_.params(), gradients(), base, skip, acc);
    return sum_over_gradients(acc);
  }
  double step_weights(float lr, const RngKey& rounding) override;
  double take_weight_wait_seconds() override {
    return weights_ ? weights_->take_wait_seconds() : base_ ? base_->take_wait_seconds() : 0.0;
  }

  void weights_written() override;
  void load_weights(const std::string& file) override;
  const StateShare* state_share() const override { return share_ ? &*share_ : nullptr; }
  std::unique_ptr<GatheredReads> gather_for_save(bool checkpoint) override;

 private:
  bool partitioned() const { return !b_.shards.empty(); }
  // Elements `e` of the parameters in the model's weight buffer, and in its gradient buffer
  // (which, some parameters frozen, holds the trained ones' alone).
  Tensor weights_of(ElementRange e) const {
    const ElementRange at = model_.weight_place(e);
    return element_range(model_.params().flat_weights(), at.offset, at.count);
  }
  Tensor grads_of(ElementRange e) const {
    return element_range(model_.params().flat_grads(), e.offset - model_.params().gradient_origin(),
                         e.count);
  }
  // The optimizer's step on `weights` from `grads`, where its state is.
  void step_optimizer(const Tensor& weights, const Tensor& grads, float lr);
  // ZeRO: each rank's run of the compute weights, from its owner to every rank.
  void share_runs();
  double step_partitioned(float lr, const RngKey& rounding);

  Backend& be_;
  Communicator& comm_;
  Model& model_;
  MixedPrecision& precision_;
  Optimizer& optimizer_;
  ParallelBuffers b_;
  std::unique_ptr<Backend> host_;  // offloaded: the backend the optimizer steps on
  std::unique_ptr<GradientSync> sync_;
  std::optional<ShardedWeights> weights_;  // stage 3
  std::optional<ShardedWeights> base_;     // stage 3's frozen base (LoRA)
  std::optional<StateShare> share_;        // ZeRO
};

DataParallel::DataParallel(Backend& be, Communicator& comm, Model& model, MixedPrecision& precision,
                           Optimizer& optimizer, const ParallelBuffers& buffers,
                           const ParallelOptions& o)
    : be_(be),
      comm_(comm),
      model_(model),
      precision_(precision),
      optimizer_(optimizer),
      b_(buffers),
      host_(buffers.offload ? make_backend(kHostDevice) : nullptr) {
  if (o.training) optimizer_.reset(host_ ? *host_ : be_);  // else it never steps
  if (!b_.weight_shard.empty()) {
    weights_.emplace(be_, comm_, model_, b_.shards, comm_.rank(), b_.weight_shard);
    model_.set_weight_slots(&*weights_);
    precision_.use_weight_shard(b_.weight_shard);
  }
  if (!b_.base_shards.empty()) {
    const int64_t mine = b_.base_shards[static_cast<size_t>(comm_.rank())].elements.count;
    base_.emplace(be_, comm_, model_, b_.base_shards, comm_.rank(),
                  element_range(b_.base_shard, 0, mine));
    model_.set_weight_slots(&*base_);
  }
  if (partitioned()) share_ = brisk::state_share(comm_, optimizer_);
  sync_ = make_gradient_sync(
      be_, comm_, model_,
      {comm_.size(), o.training, b_.shards, b_.grad_shard, b_.grad_receive, o.bucket_cap_mb});
}

// Stage 2: every rank added 0 before, so the sum over the ranks is the whole gradients'.
double DataParallel::sum_over_gradients(const Tensor& sums) {
  if (b_.grad_shard.empty()) return 0.0;
  const Clock::time_point start = Clock::now();
  comm_.all_reduce_sum(sums);
  return seconds_since(start);
}

void DataParallel::step_optimizer(const Tensor& weights, const Tensor& grads, float lr) {
  const Tensor& control = model_.step_control();
  if (!host_) {
    optimizer_.step(be_, weights, grads, control, lr);
    return;
  }
  be_.download(grads, b_.offload_grads);
  be_.download(control, b_.offload_control);
  optimizer_.step(*host_, weights, b_.offload_grads, b_.offload_control, lr);
}

double DataParallel::step_weights(float lr, const RngKey& rounding) {
  if (partitioned()) return step_partitioned(lr, rounding);
  step_optimizer(precision_.stepped(model_.params()), gradients(), lr);
  // On a skip the weights are unchanged, and rounding them again changes nothing.
  precision_.refresh_weights(be_, model_.params(), rounding);
  return 0.0;
}

void DataParallel::share_runs() {
  if (weights_) {
    weights_->publish();
    return;
  }
  for (int r = 0; r < comm_.size(); ++r) {
    const ElementRange e = b_.shards[static_cast<size_t>(r)].elements;
    if (e.count > 0) comm_.broadcast(weights_of(e), r);
  }
}

// With a master copy, the rank holds the master of its run only: it rounds its run of the
// compute weights, which every rank then gathers. Otherwise the weights are what the optimizer
// updates: gathered, then (bf16 without a master) rounded alike on every rank.
double DataParallel::step_partitioned(float lr, const RngKey& rounding) {
  const ElementRange mine = b_.shards[static_cast<size_t>(comm_.rank())].elements;
  const Tensor my_grads = b_.grad_shard.empty() ? grads_of(mine) : b_.grad_shard;
  const bool sharded_master = precision_.sharded_master();
  step_optimizer(precision_.sharded() ? precision_.master(model_.params()) : weights_of(mine),
                 my_grads, lr);
  if (sharded_master) precision_.refresh_weights(be_, model_.params(), rounding);
  const Clock::time_point start = Clock::now();
  share_runs();
  const double seconds = seconds_since(start);
  if (!sharded_master) precision_.refresh_weights(be_, model_.params(), rounding);
  return seconds;
}

void DataParallel::weights_written() {
  precision_.adopt_model_weights(be_, model_.params());
  if (weights_) weights_->publish();
  if (base_) base_->publish();
}

// Rank 0 reads the file and broadcasts the weights; stage 3's ranks each read theirs.
void DataParallel::load_weights(const std::string& file) {
  const bool sharded = weights_ || base_;
  if (comm_.rank() == 0 || sharded) model_.load_weights(be_, WeightFiles(file));
  if (comm_.size() > 1 && !sharded) comm_.broadcast(model_.params().flat_weights(), 0);
  weights_written();
}

// The weights a save writes are the trained ones (all, but a LoRA's frozen base): the ranks'
// runs of the master copy or weight shard, else rank 0's.
std::unique_ptr<GatheredReads> DataParallel::gather_for_save(bool checkpoint) {
  if (!partitioned()) return nullptr;
  const ParameterSet& params = model_.params();
  const Tensor weights =
      precision_.sharded() ? precision_.master(params) : weights_of(params.trained_run().elements);
  auto reads = std::make_unique<GatheredReads>(
      comm_, checkpoint_parts(weights, precision_.sharded(), comm_.rank(),
                              checkpoint ? &optimizer_ : nullptr));
  reads->set_weights_origin(params.trained_run().elements.offset);
  return reads;
}

}  // namespace

void sum_squares_except(Backend& be, const ParameterSet& params, const Tensor& grads, int64_t base,
                        int skip, const Tensor& acc) {
  if (skip < 0) {
    be.sum_squares(grads, acc);
    return;
  }
  const ParamInfo& p = params.list().at(static_cast<size_t>(skip));
  const int64_t end = base + grads.numel();
  const int64_t lo = std::clamp(p.offset, base, end);
  const int64_t hi = std::clamp(p.offset + p.shape.numel(), base, end);
  if (lo > base) be.sum_squares(element_range(grads, 0, lo - base), acc);
  if (hi < end) be.sum_squares(element_range(grads, hi - base, end - hi), acc);
}

void ParallelPolicy::run_micro_batches(Backend& be, Model& model, int count,
                                       MicroBatches& batches) {
  for (int i = 0; i < count; ++i) {
    batches.load(i);
    const StepOptions o = batches.options(i);
    const Model::SegmentDone done = on_segment(i == count - 1);
    if (recorder_ && !done) {
      recorder_->run(o);
      continue;
    }
    model.forward_step(be, o);
    model.backward(be, o, done);
  }
}

std::unique_ptr<ParallelPolicy> make_data_parallel(const ParallelContext& c,
                                                   Communicator& replicas) {
  return std::make_unique<DataParallel>(c.be, replicas, c.model, c.precision, c.optimizer,
                                        c.buffers, c.options);
}

}  // namespace brisk
