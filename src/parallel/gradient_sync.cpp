#include "parallel/gradient_sync.h"

#include <chrono>

#include "backend/backend.h"
#include "core/clock.h"
#include "parallel/communicator.h"
#include "parallel/grad_buckets.h"
#include "parallel/zero.h"

namespace brisk {

namespace {

using Clock = std::chrono::steady_clock;

// One rank, or nothing to train: its gradients are the batch's.
class OwnGradients final : public GradientSync {
 public:
  Model::SegmentDone on_segment(bool) override { return {}; }
  SyncSeconds finish() override { return {}; }
};

// Several ranks: a policy's own sums, then the step statistics', all of it counted as waited.
class SummedGradients : public GradientSync {
 public:
  SummedGradients(Communicator& comm, Model& model) : comm_(comm), model_(model) {}
  SyncSeconds finish() final {
    const Clock::time_point start = Clock::now();
    SyncSeconds s = finish_sums();
    const Clock::time_point stats = Clock::now();
    comm_.all_reduce_sum(model_.step_stats());
    s.ran += seconds_since(stats);
    s.waited += seconds_since(start);
    return s;
  }

 protected:
  // Waits for the gradients' sums: the seconds they ran, and any waited for during backward.
  virtual SyncSeconds finish_sums() = 0;
  Communicator& comm_;
  Model& model_;
};

// Data parallelism: buckets summed as the last micro-batch's backward finishes them.
class BucketedGradients final : public SummedGradients {
 public:
  BucketedGradients(Communicator& comm, Model& model, double cap_mb)
      : SummedGradients(comm, model),
        buckets_(model.params().flat_grads(), model.grad_segments(),
                 static_cast<int64_t>(cap_mb * 1024 * 1024)) {}
  Model::SegmentDone on_segment(bool last) override {
    if (!last) return {};
    return [this](int i) { buckets_.segment_done(comm_, i); };
  }

 private:
  SyncSeconds finish_sums() override { return {buckets_.finish(comm_), 0.0}; }
  GradBuckets buckets_;
};

// ZeRO stage 2: every micro-batch's segments summed into their owners' shards during backward.
class ShardedSums final : public SummedGradients {
 public:
  ShardedSums(Backend& be, Communicator& comm, Model& model, const GradientSyncSpec& spec)
      : SummedGradients(comm, model),
        be_(be),
        sums_(be, spec.shards, comm.rank(), spec.grad_shard, spec.grad_receive,
              gradient_piece_elements(spec.bucket_cap_mb)) {}
  void begin_step() override { be_.fill(sums_.shard(), 0.0f); }
  Model::SegmentDone on_segment(bool) override {
    return [this](int i) { sums_.segment_done(comm_, model_, i); };
  }

 private:
  SyncSeconds finish_sums() override {
    const auto [ran, waited] = sums_.take_seconds(comm_);
    return {ran, waited};
  }
  Backend& be_;
  ShardedGradients sums_;
};

}  // namespace

std::unique_ptr<GradientSync> make_gradient_sync(Backend& be, Communicator& comm, Model& model,
                                                 const GradientSyncSpec& spec) {
  if (spec.ranks <= 1 || !spec.training) return std::make_unique<OwnGradients>();
  if (!spec.grad_shard.empty()) return std::make_unique<ShardedSums>(be, comm, model, spec);
  return std::make_unique<BucketedGradients>(comm, model, spec.bucket_cap_mb);
}

}  // namespace brisk
