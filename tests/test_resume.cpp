// Resuming with another split of the global batch: the data position is kept in samples of the
// global order, so a run saved at one per-device batch and accumulation continues at another on
// the very samples the uninterrupted run takes (the losses to the order of their sums, the epochs
// exactly), with file data, dynamic padding and group_by_length; a position no micro-batch of
// the new split starts at is refused by name. (Across ranks: tests/parallel/test_ddp.cpp.)
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "test_support.h"
#include "train/trainer.h"
#include "trainer_support.h"

namespace brisk::testing {
namespace {

struct Step {
  double loss, epoch;
};

// The run's per-step records (logging_steps 1), by step.
std::vector<Step> steps_of(const TrainOptions& o) {
  std::vector<Step> steps;
  train(o, [&](const nlohmann::json& j) {
    if (j.contains("loss")) steps.push_back({j["loss"].get<double>(), j["epoch"].get<double>()});
  });
  return steps;
}

// 36 labelled rows: an epoch of four global batches of 8 and a short fifth of 4.
TrainOptions varied_run(const TempDir& dir, const std::string& out) {
  TrainOptions o = tiny_options(write_wordpiece_bert(dir), dir / out);
  o.tokenizer_name = fixture("tokenizer/wordpiece");
  o.train_file = write_varied_csv(dir, "train.csv", 36);
  o.max_seq_length = 16;
  o.group_by_length = true;
  o.per_device_train_batch_size = 8;
  o.max_steps = 8;  // into the second epoch
  o.save_steps = 3;
  return o;
}

TEST(Resume, AnotherBatchSplitContinuesOnTheSameSamples) {
  TempDir dir("resume_split");
  const TrainOptions straight = varied_run(dir, "straight");
  const std::vector<Step> want = steps_of(straight);
  ASSERT_EQ(want.size(), 8u);
  // Steps 1-5 are epoch 1 (the fifth takes the last 4 samples), 6-8 the second.
  EXPECT_DOUBLE_EQ(want[3].epoch, 32.0 / 36.0);
  EXPECT_DOUBLE_EQ(want[4].epoch, 1.0);
  EXPECT_DOUBLE_EQ(want[7].epoch, 1.0 + 24.0 / 36.0);
  for (const auto [batch, accumulation] : {std::pair<int64_t, int64_t>{2, 4}, {4, 2}, {1, 8}}) {
    const std::string tag = std::to_string(batch) + " x " + std::to_string(accumulation);
    SCOPED_TRACE(tag);
    TrainOptions resumed = straight;
    resumed.output_dir = dir / ("resumed_" + std::to_string(batch));
    resumed.per_device_train_batch_size = batch;
    resumed.gradient_accumulation_steps = accumulation;
    resumed.resume_from_checkpoint = dir / "straight/checkpoint-3";
    const std::vector<Step> got = steps_of(resumed);
    ASSERT_EQ(got.size(), 5u);
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i].epoch, want[i + 3].epoch) << "step " << i + 4;
      EXPECT_NEAR(got[i].loss, want[i + 3].loss, 1e-5 * std::abs(want[i + 3].loss))
          << "step " << i + 4;
    }
  }
  // A micro-batch of 16 cannot start at sample 24.
  TrainOptions wide = straight;
  wide.output_dir = dir / "wide";
  wide.per_device_train_batch_size = 16;
  wide.resume_from_checkpoint = dir / "straight/checkpoint-3";
  expect_error([&] { train(wide, [](const nlohmann::json&) {}); },
               "--resume_from_checkpoint: the data position, sample 24 of epoch 0's 36, is not "
               "where a micro-batch of 16 samples (1 process x 16) starts");
}

// The epoch's last optimizer step takes the micro-batches left in it, as Trainer's does: with
// 36 samples in micro-batches of 8 and 2 accumulation steps, an epoch is 3 steps (16, 16, 4
// samples), and save_strategy / eval_strategy "epoch" act after the third.
TEST(Resume, AnEpochsLastStepTakesTheMicroBatchesLeft) {
  TempDir dir("epoch_steps");
  TrainOptions o = varied_run(dir, "out");
  o.gradient_accumulation_steps = 2;
  o.max_steps = -1;
  o.num_train_epochs = 2;
  o.save_steps = 0;
  o.save_strategy = "epoch";
  const std::vector<Step> steps = steps_of(o);
  ASSERT_EQ(steps.size(), 6u);
  const double epochs[] = {16.0 / 36, 32.0 / 36, 1.0, 1 + 16.0 / 36, 1 + 32.0 / 36, 2.0};
  for (size_t i = 0; i < steps.size(); ++i) EXPECT_DOUBLE_EQ(steps[i].epoch, epochs[i]);
  EXPECT_TRUE(std::filesystem::exists(dir / "out/checkpoint-3"));
  EXPECT_TRUE(std::filesystem::exists(dir / "out/checkpoint-6"));
  EXPECT_FALSE(std::filesystem::exists(dir / "out/checkpoint-2"));
}

}  // namespace
}  // namespace brisk::testing
