// Data parallelism through the trainer on every rank of the job: N ranks with batch b train as
// one process with batch N x b (the same global batches: the loader shards each as
// DistributedSampler does), step by step and to the final weights, with and without gradient
// accumulation, for BERT and for a causal LM with uneven lengths (the loss normalized by the
// whole global batch's token count). Within 1e-5: the sums are taken in another order.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "dist/test_world.h"
#include "test_support.h"
#include "train/trainer.h"
#include "trainer_support.h"

namespace brisk::testing {
namespace {

namespace fs = std::filesystem;

// A folder every rank sees: rank 0's TempDir (removed with it), named by rank 0's pid.
struct SharedDir {
  std::unique_ptr<TempDir> owned;  // rank 0
  std::string path;
  explicit SharedDir(const std::string& name) {
    double pid = world().rank() == 0 ? static_cast<double>(::getpid()) : 0.0;
    world().broadcast(Tensor(&pid, Shape{1}, DType::f64), 0);
    if (world().rank() == 0) owned = std::make_unique<TempDir>(name);
    path = (fs::temp_directory_path() /
            ("brisk_" + name + "_" + std::to_string(static_cast<long>(pid))))
               .string();
    world().barrier();
  }
  ~SharedDir() { world().barrier(); }  // nobody still reads when rank 0 removes it
  std::string operator/(const std::string& rel) const { return path + "/" + rel; }
};

struct Logged {
  std::vector<double> losses;
  std::string checkpoint;
};

Logged run(const TrainOptions& o, const Dataset* data, Communicator* comm) {
  Logged r;
  const TrainSummary s = train(
      o,
      [&](const nlohmann::json& j) {
        if (j.contains("loss")) r.losses.push_back(j["loss"]);
      },
      data, {}, comm);
  r.checkpoint = s.last_checkpoint;
  return r;
}

TEST(DataParallel, RanksTrainAsOneProcessWithTheirTotalBatch) {
  const int N = world().size();
  const std::unique_ptr<Communicator> alone = make_single_process();
  // Buckets: 25 MiB (one for these models, summed when backward ends) and 0.01 MiB (several,
  // summed while backward computes the earlier layers).
  for (const std::string type : {"bert", "gpt2"})
    for (const auto [accumulation, bucket_mb] :
         {std::pair<int64_t, double>{1, 25.0}, {2, 25.0}, {1, 0.01}, {2, 0.01}}) {
      const std::string tag = type + "_accumulation" + std::to_string(accumulation) +
                              (bucket_mb < 1 ? "_small_buckets" : "");
      SCOPED_TRACE(tag);
      SharedDir dir("ddp_" + tag);
      std::string model = dir / (type + "_model");
      if (world().rank() == 0) model = write_config(*dir.owned, type, 0.0);
      world().barrier();
      UnequalLengths lm_data;  // 18 samples: whole global batches on 2 and 3 ranks
      const Dataset* data = type == "gpt2" ? &lm_data : nullptr;
      TrainOptions o = tiny_options(model, dir / "ranks");
      o.per_device_train_batch_size = 2;
      o.gradient_accumulation_steps = accumulation;
      o.max_steps = 3;
      o.ddp_bucket_cap_mb = bucket_mb;
      const Logged ranks = run(o, data, &world());
      if (world().rank() != 0) {
        EXPECT_TRUE(ranks.losses.empty()) << "only rank 0 logs";
        continue;
      }
      TrainOptions one = o;
      one.output_dir = dir / "one";
      one.per_device_train_batch_size = 2 * N;
      const Logged single = run(one, data, alone.get());
      ASSERT_EQ(ranks.losses.size(), single.losses.size());
      for (size_t i = 0; i < single.losses.size(); ++i)
        EXPECT_NEAR(ranks.losses[i], single.losses[i], 1e-5 * std::abs(single.losses[i]))
            << "step " << i + 1;
      const std::vector<float> a = checkpoint_weights(ranks.checkpoint),
                               b = checkpoint_weights(single.checkpoint);
      ASSERT_EQ(a.size(), b.size());
      EXPECT_LE(rel_error(a.data(), b.data(), static_cast<int64_t>(a.size())), 1e-5);
      // The weights did move.
      TrainOptions none = one;
      none.output_dir = dir / "none";
      none.learning_rate = 0;
      const std::vector<float> still = checkpoint_weights(run(none, data, alone.get()).checkpoint);
      EXPECT_GT(rel_error(b.data(), still.data(), static_cast<int64_t>(b.size())), 1e-3);
    }
}

// What data parallelism does not do yet is refused on every rank alike, before any step.
TEST(DataParallel, UnsupportedRunsAreRefused) {
  SharedDir dir("ddp_refused");
  std::string model = dir / "bert_model";
  if (world().rank() == 0) model = write_config(*dir.owned, "bert", 0.0);
  world().barrier();
  TrainOptions o = tiny_options(model, dir / "gpu", "cuda");
  expect_error([&] { run(o, nullptr, &world()); }, "needs NCCL");
  o = tiny_options(model, dir / "fit");
  o.auto_find_batch_size = true;
  expect_error([&] { run(o, nullptr, &world()); }, "--auto_find_batch_size in a run of");
}

}  // namespace
}  // namespace brisk::testing
