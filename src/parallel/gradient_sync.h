// The data-parallel policy of a run: how the gradients each rank computes become the global
// batch's. One rank keeps its own; data parallelism sums them bucket by bucket as backward
// finishes them (GradBuckets); ZeRO stage 2 sums each segment into its owner's shard
// (ShardedGradients). make_gradient_sync picks one per run, and the training loop calls it the
// same way whatever it picked.
#pragma once

#include <memory>
#include <vector>

#include "core/tensor.h"
#include "models/model.h"
#include "parallel/zero.h"

namespace brisk {

class Backend;
class Communicator;

// Seconds of communication a step spent: while the sums ran, and while training waited for them.
struct SyncSeconds {
  double ran = 0, waited = 0;
};

class GradientSync {
 public:
  virtual ~GradientSync() = default;
  // Before an optimizer step's first micro-batch.
  virtual void begin_step() {}
  // What backward calls as it finishes a gradient segment of a micro-batch (`last`: the step's
  // last one); empty where that micro-batch communicates nothing.
  virtual Model::SegmentDone on_segment(bool last) = 0;
  // After the step's last backward: the global batch's gradients and the model's step statistics
  // (summed loss, counts) on every rank.
  virtual SyncSeconds finish() = 0;
};

// What a run's policy is made from. `grad_shard` non-empty: ZeRO stage 2, this rank's float32
// shard of the gradients (shards[rank]), the sums arriving in `grad_receive`.
struct GradientSyncSpec {
  int ranks = 1;
  bool training = true;
  std::vector<ParamShard> shards;
  Tensor grad_shard, grad_receive;
  double bucket_cap_mb = 25;
};

std::unique_ptr<GradientSync> make_gradient_sync(Backend& be, Communicator& comm, Model& model,
                                                 const GradientSyncSpec& spec);

}  // namespace brisk
