// The order in which a pipeline stage runs its micro-batches: one forward, one backward (1F1B,
// the schedule of PipeDream-Flush that Megatron-LM runs). Stage s of p first runs p - s - 1
// forwards (warm-up), then alternates one forward and one backward, then runs the backwards left
// (cool-down): a stage never holds the activations of more than p - s micro-batches, and the
// step ends with every stage's gradients whole (a flush). simulate_pipeline times a schedule
// from the stages' dependencies: its bubble, the share of the stages' time spent waiting, is
// (p - 1) / (m + p - 1) for m micro-batches when every stage takes as long.
#pragma once

#include <vector>

namespace brisk {

enum class PipeOp { forward, backward };

struct PipeStep {
  PipeOp op;
  int micro_batch;
  bool operator==(const PipeStep&) const = default;
};

// Stage `stage` (0: the embeddings' end) of `stages`, over `micro_batches` micro-batches.
std::vector<PipeStep> one_forward_one_backward(int stages, int stage, int micro_batches);

struct PipelineTimes {
  double makespan = 0;              // from the first forward's start to the last backward's end
  double bubble_share = 0;          // 1 - (busy time over every stage) / (stages x makespan)
  std::vector<int> peak_in_flight;  // per stage: most micro-batches forward but not backward
};

// Runs every stage's 1F1B order where a forward waits for the stage before's forward of its
// micro-batch, and a backward for the stage after's backward (the last stage's for its own
// forward); a forward takes `forward` and a backward `backward` time, transfers none.
PipelineTimes simulate_pipeline(int stages, int micro_batches, double forward, double backward);

}  // namespace brisk
