// Data parallelism's gradient buckets (the policy of PyTorch's DDP): the flat gradients' segments,
// in the order backward finishes them, grouped into buckets of about `cap` bytes; a bucket's
// all-reduce starts the moment its last segment is final, so the sums of the late layers travel
// while the early layers' backward still computes. Only the last micro-batch of an accumulated
// step reports segments: earlier micro-steps communicate nothing.
#pragma once

#include <vector>

#include "core/tensor.h"

namespace brisk {

class Communicator;

class GradBuckets {
 public:
  // `segments`: ranges of `flat` in the order they become final (Model::grad_segments). A bucket
  // takes consecutive segments that lie end to end until it holds at least cap_bytes.
  GradBuckets(const Tensor& flat, const std::vector<ElementRange>& segments, int64_t cap_bytes);

  // Segment i is final: starts the all-reduce of the bucket it completes.
  void segment_done(Communicator& comm, int segment);
  // Starts the buckets not started yet (all of them when no segment was reported), waits for
  // every one, and makes ready for the next step. Returns the seconds the sums ran.
  double finish(Communicator& comm);

  // The buckets as element ranges of `flat`, in starting order.
  std::vector<ElementRange> ranges() const;

 private:
  struct Bucket {
    ElementRange range;
    int segments = 0;   // how many segments it holds
    int remaining = 0;  // of them, not yet final this step
    bool started = false;
  };
  void start(Communicator& comm, Bucket& b);
  Tensor flat_;
  std::vector<Bucket> buckets_;
  std::vector<int> bucket_of_;  // segment -> bucket
  std::vector<bool> reported_;  // segment -> final this step
};

}  // namespace brisk
