#include "parallel/pipeline_schedule.h"

#include <algorithm>
#include <cstddef>

#include "core/error.h"

namespace brisk {

std::vector<PipeStep> one_forward_one_backward(int stages, int stage, int micro_batches) {
  BRISK_CHECK(stages >= 1 && stage >= 0 && stage < stages && micro_batches >= 1, "pipeline: stage ",
              stage, " of ", stages, " over ", micro_batches, " micro-batches");
  const int warm_up = std::min(stages - stage - 1, micro_batches);
  std::vector<PipeStep> steps;
  for (int i = 0; i < warm_up; ++i) steps.push_back({PipeOp::forward, i});
  for (int i = 0; i < micro_batches - warm_up; ++i) {
    steps.push_back({PipeOp::forward, warm_up + i});
    steps.push_back({PipeOp::backward, i});
  }
  for (int i = micro_batches - warm_up; i < micro_batches; ++i)
    steps.push_back({PipeOp::backward, i});
  return steps;
}

namespace {

// When each stage's forward and backward of each micro-batch end ([stage][micro-batch]; < 0: not
// yet run).
struct Ends {
  std::vector<std::vector<double>> forward, backward;
  Ends(int stages, int micro_batches)
      : forward(static_cast<size_t>(stages), std::vector<double>(micro_batches, -1.0)),
        backward(forward) {}
};

// The time step `st` of stage s may start, or < 0 while what it waits for has not run.
double ready_at(const Ends& e, int stages, int s, const PipeStep& st) {
  const auto m = static_cast<size_t>(st.micro_batch);
  if (st.op == PipeOp::forward) return s == 0 ? 0.0 : e.forward[static_cast<size_t>(s - 1)][m];
  return s == stages - 1 ? e.forward[static_cast<size_t>(s)][m]
                         : e.backward[static_cast<size_t>(s + 1)][m];
}

}  // namespace

// Each round runs, on every stage, its next step if what it waits for has ended; stages run
// their orders in turn until all are done (1F1B's orders never deadlock).
PipelineTimes simulate_pipeline(int stages, int micro_batches, double forward, double backward) {
  std::vector<std::vector<PipeStep>> order;
  for (int s = 0; s < stages; ++s)
    order.push_back(one_forward_one_backward(stages, s, micro_batches));
  Ends ends(stages, micro_batches);
  std::vector<size_t> next(static_cast<size_t>(stages), 0);
  std::vector<double> free_at(static_cast<size_t>(stages), 0.0);
  PipelineTimes t;
  t.peak_in_flight.assign(static_cast<size_t>(stages), 0);
  std::vector<int> in_flight(static_cast<size_t>(stages), 0);
  for (bool progressed = true; progressed;) {
    progressed = false;
    for (int s = 0; s < stages; ++s) {
      const auto i = static_cast<size_t>(s);
      if (next[i] == order[i].size()) continue;
      const PipeStep& st = order[i][next[i]];
      const double ready = ready_at(ends, stages, s, st);
      if (ready < 0) continue;
      const double end =
          std::max(ready, free_at[i]) + (st.op == PipeOp::forward ? forward : backward);
      auto& slot = (st.op == PipeOp::forward ? ends.forward : ends.backward)[i];
      slot[static_cast<size_t>(st.micro_batch)] = end;
      free_at[i] = end;
      in_flight[i] += st.op == PipeOp::forward ? 1 : -1;
      t.peak_in_flight[i] = std::max(t.peak_in_flight[i], in_flight[i]);
      t.makespan = std::max(t.makespan, end);
      ++next[i];
      progressed = true;
    }
  }
  const double busy = static_cast<double>(stages) * micro_batches * (forward + backward);
  t.bubble_share = t.makespan > 0 ? 1.0 - busy / (stages * t.makespan) : 0.0;
  return t;
}

}  // namespace brisk
