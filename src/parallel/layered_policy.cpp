#include "parallel/layered_policy.h"

#include "core/clock.h"
#include "parallel/zero.h"
#include "precision/mixed_precision.h"

namespace brisk {

ElementRange stepped_run(const ParallelContext& c) {
  if (c.buffers.shards.empty()) return c.model.params().trained_run().elements;
  return c.buffers.shards[static_cast<size_t>(c.mesh.expert_replicas().rank())].elements;
}

LayeredPolicy::LayeredPolicy(const ParallelContext& c, std::unique_ptr<ParallelPolicy> inner)
    : be_(c.be),
      world_(c.world),
      mesh_(c.mesh),
      model_(c.model),
      precision_(c.precision),
      optimizer_(c.optimizer),
      replica_(c.mesh.expert_replicas().rank()),
      run_(stepped_run(c)),
      zero_(run_.count < c.model.params().trainable_elements()),
      inner_(std::move(inner)) {}

SyncSeconds LayeredPolicy::finish_then(const std::function<void()>& sum) {
  SyncSeconds s = inner_->finish_gradients();
  const auto start = std::chrono::steady_clock::now();
  sum();
  const double seconds = seconds_since(start);
  s.ran += seconds;
  s.waited += seconds;
  return s;
}

double LayeredPolicy::sum_over_gradients_then(const Tensor& sums, Communicator& group) {
  const double seconds = inner_->sum_over_gradients(sums);
  const auto start = std::chrono::steady_clock::now();
  group.all_reduce_sum(sums);
  return seconds + seconds_since(start);
}

int64_t LayeredPolicy::held_base() const {
  const ParameterSet& params = model_.params();
  return inner_->gradients().numel() == params.trainable_elements() ? params.gradient_origin()
                                                                    : run_.offset;
}

std::vector<Tensor> LayeredPolicy::saved_parts(bool checkpoint) const {
  const Optimizer* state = checkpoint ? &optimizer_ : nullptr;
  std::vector<Tensor> parts =
      checkpoint_parts(precision_.master(model_.params()), precision_.sharded(), replica_, state);
  if (!zero_ && replica_ != 0) parts.assign(parts.size(), Tensor());
  return parts;
}

}  // namespace brisk
