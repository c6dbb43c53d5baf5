// 1F1B: every stage runs each micro-batch's forward once and then its backward once, holds at
// most p - s micro-batches, and the simulated step's bubble is (p - 1) / (m + p - 1).
#include <gtest/gtest.h>

#include <vector>

#include "parallel/pipeline_schedule.h"
#include "test_support.h"

namespace brisk::testing {
namespace {

TEST(PipelineSchedule, TwoStagesOfFourMicroBatchesRunInMegatronsOrder) {
  using P = PipeStep;
  const auto F = PipeOp::forward, B = PipeOp::backward;
  EXPECT_EQ(one_forward_one_backward(2, 0, 4),
            (std::vector<P>{{F, 0}, {F, 1}, {B, 0}, {F, 2}, {B, 1}, {F, 3}, {B, 2}, {B, 3}}));
  EXPECT_EQ(one_forward_one_backward(2, 1, 4),
            (std::vector<P>{{F, 0}, {B, 0}, {F, 1}, {B, 1}, {F, 2}, {B, 2}, {F, 3}, {B, 3}}));
  // Fewer micro-batches than the warm-up wants: all forwards, then all backwards.
  EXPECT_EQ(one_forward_one_backward(4, 0, 2), (std::vector<P>{{F, 0}, {F, 1}, {B, 0}, {B, 1}}));
}

TEST(PipelineSchedule, EveryStageRunsEachMicroBatchOnceForwardThenBackward) {
  for (int p = 1; p <= 5; ++p)
    for (int m = 1; m <= 9; ++m)
      for (int s = 0; s < p; ++s) {
        std::vector<int> forwards(static_cast<size_t>(m), 0), backwards(forwards);
        for (const PipeStep& st : one_forward_one_backward(p, s, m)) {
          const auto i = static_cast<size_t>(st.micro_batch);
          if (st.op == PipeOp::forward) {
            ++forwards[i];
          } else {
            EXPECT_EQ(forwards[i], 1) << "backward before forward, p " << p << " m " << m;
            ++backwards[i];
          }
        }
        EXPECT_EQ(forwards, std::vector<int>(static_cast<size_t>(m), 1));
        EXPECT_EQ(backwards, std::vector<int>(static_cast<size_t>(m), 1));
      }
}

TEST(PipelineSchedule, TheBubbleIsTheTextbooksAndStagesHoldAtMostTheirShare) {
  for (int p = 1; p <= 5; ++p)
    for (int m = 1; m <= 12; ++m) {
      const PipelineTimes t = simulate_pipeline(p, m, 1.0, 2.0);
      EXPECT_DOUBLE_EQ(t.makespan, (m + p - 1) * 3.0) << "p " << p << " m " << m;
      EXPECT_NEAR(t.bubble_share, static_cast<double>(p - 1) / (m + p - 1), 1e-12)
          << "p " << p << " m " << m;
      for (int s = 0; s < p; ++s)
        EXPECT_EQ(t.peak_in_flight[static_cast<size_t>(s)], std::min(p - s, m))
            << "p " << p << " m " << m << " stage " << s;
    }
}

TEST(PipelineSchedule, ImpossibleStagesAreRefused) {
  expect_error([] { one_forward_one_backward(2, 2, 4); }, "pipeline: stage 2 of 2 over 4");
  expect_error([] { one_forward_one_backward(2, 0, 0); }, "over 0 micro-batches");
}

}  // namespace
}  // namespace brisk::testing
