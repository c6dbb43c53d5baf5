// The trainer's equivalences on every device (TrainerOn/<device>): gradient accumulation equals
// the large batch, gradient checkpointing and selective recomputation change memory and not
// results, and a resumed run equals the uninterrupted one, with every optimizer. On the CPU
// these hold bit for bit (the same float32 operations in the same order); on a GPU to rounding,
// its embedding gradients, loss sum and gradient norm being summed with atomics in an order
// that changes from run to run (a device this machine cannot run skips, saying why).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "backend_support.h"
#include "test_support.h"
#include "train/trainer.h"
#include "trainer_support.h"

namespace brisk::testing {
namespace {

struct DeviceUnderTest {
  Device device;
  const char* option;  // TrainOptions::device
  // Relative agreement of two runs that should be equal: 0 (bit for bit), or the rounding of the
  // device's unordered sums; in fp16/bf16 a compute weight at a rounding midpoint may round the
  // other way, moving by one 16-bit step, hence the second, looser bound.
  double rounding, rounding_16bit;
};

const DeviceUnderTest kDevices[] = {{Device::cpu, "cpu", 0.0, 0.0},
                                    {Device::cuda, "cuda", 1e-5, 1e-4}};

void PrintTo(const DeviceUnderTest& d, std::ostream* os) {
  *os << d.option;
}

struct Result {
  TrainSummary summary;
  std::vector<double> losses;
};

class TrainerOn : public ::testing::TestWithParam<DeviceUnderTest> {
 protected:
  void SetUp() override {
    if (GetParam().device == Device::cuda) REQUIRE_GPU();
  }
  TrainOptions options(const std::string& model, const std::string& out) const {
    return tiny_options(model, out, GetParam().option);
  }
  double tolerance(const TrainOptions& o) const {
    return o.fp16 || o.bf16 ? GetParam().rounding_16bit : GetParam().rounding;
  }
  Result run(const TrainOptions& o, const Dataset* data = nullptr) const {
    Result r;
    r.summary = train(
        o,
        [&](const nlohmann::json& j) {
          if (j.contains("loss")) r.losses.push_back(j["loss"]);
        },
        data);
    EXPECT_EQ(r.summary.device.rfind(o.device, 0), 0u) << "the run was on " << r.summary.device;
    return r;
  }
  // Every weight of a checkpoint; where sums are not bit-reproducible, not the key biases
  // (checkpoint_weights says why).
  FVec weights_of(const std::string& checkpoint) const {
    return checkpoint_weights(checkpoint, GetParam().rounding != 0);
  }
  // Losses step by step and the final weights within `tol` (0: bit for bit).
  void expect_same_run(const Result& got, const Result& want, double tol, const std::string& what,
                       size_t from_step = 0) const {
    const std::vector<double> w(want.losses.begin() + static_cast<std::ptrdiff_t>(from_step),
                                want.losses.end());
    ASSERT_EQ(got.losses.size(), w.size()) << what;
    for (size_t i = 0; i < w.size(); ++i)
      if (tol == 0)
        EXPECT_EQ(got.losses[i], w[i]) << what << ", step " << from_step + i + 1;
      else
        EXPECT_NEAR(got.losses[i], w[i], tol * std::abs(w[i]))
            << what << ", step " << from_step + i + 1;
    const FVec a = weights_of(got.summary.last_checkpoint);
    const FVec b = weights_of(want.summary.last_checkpoint);
    if (tol == 0)
      EXPECT_EQ(a, b) << what << ": final weights";
    else
      EXPECT_LE(rel_error(a.data(), b.data(), static_cast<int64_t>(std::min(a.size(), b.size()))),
                tol)
          << what << ": final weights";
  }
};

// Summation order differs (other product shapes) on every device: within rounding, 1e-5.
TEST_P(TrainerOn, AccumulationEqualsTheLargeBatch) {
  TempDir dir("accum");
  for (const std::string type : {"bert", "gpt2"}) {
    const std::string model = write_config(dir, type, 0.0);
    UnequalLengths lm_data;
    const Dataset* data = type == "gpt2" ? &lm_data : nullptr;
    TrainOptions big = options(model, dir / (type + "_big"));
    big.per_device_train_batch_size = 3;
    TrainOptions small = big;
    small.output_dir = dir / (type + "_small");
    small.per_device_train_batch_size = 1;
    small.gradient_accumulation_steps = 3;
    const Result a = run(big, data), b = run(small, data);
    expect_same_run(b, a, 1e-5, type);
    // The weights did move: the comparison is not between two untouched initializations.
    TrainOptions none = big;
    none.max_steps = 1;
    none.learning_rate = 0;
    none.output_dir = dir / (type + "_none");
    const FVec moved = weights_of(a.summary.last_checkpoint);
    const FVec still = weights_of(run(none, data).summary.last_checkpoint);
    EXPECT_GT(rel_error(moved.data(), still.data(), static_cast<int64_t>(moved.size())), 1e-3)
        << type;
  }
}

// With dropout, in fp32 and bf16: the recomputation is exact. Four blocks: checkpointing keeps
// one block's internals in float32, which can outweigh what two tiny blocks keep in bf16 on the
// CPU (whose plain runs keep no pre-norm block's norm outputs: PlanOptions::recompute_norms).
TEST_P(TrainerOn, GradientCheckpointingChangesMemoryNotResults) {
  TempDir dir("ckpt");
  for (const std::string type : {"bert", "gpt2"})
    for (bool bf16 : {false, true}) {
      const std::string tag = type + (bf16 ? "_bf16" : "_fp32");
      TrainOptions plain =
          options(write_config(dir, type, 0.1, /*layers=*/4), dir / (tag + "_plain"));
      plain.bf16 = bf16;
      TrainOptions ckpt = plain;
      ckpt.output_dir = dir / (tag + "_ckpt");
      ckpt.gradient_checkpointing = true;
      const Result a = run(plain), b = run(ckpt);
      expect_same_run(b, a, tolerance(plain), tag);
      const int act = static_cast<int>(Category::activations);
      EXPECT_LT(b.summary.memory.planned[act], a.summary.memory.planned[act]) << tag;
    }
}

// Selective recomputation (the attention statistics rebuilt per block), with dropout.
TEST_P(TrainerOn, SelectiveRecomputationChangesMemoryNotResults) {
  TempDir dir("selective");
  for (const std::string type : {"bert", "gpt2"})
    for (bool bf16 : {false, true}) {
      const std::string tag = type + (bf16 ? "_bf16" : "_fp32");
      TrainOptions o = options(write_config(dir, type, 0.1), dir / (tag + "_plain"));
      o.bf16 = bf16;
      const Result plain = run(o);
      o.output_dir = dir / (tag + "_selective");
      o.selective_recompute = true;
      const Result selective = run(o);
      expect_same_run(selective, plain, tolerance(o), tag);
      const int act = static_cast<int>(Category::activations);
      EXPECT_LT(selective.summary.memory.planned[act], plain.summary.memory.planned[act]) << tag;
    }
}

// With dropout, accumulation, a loader worker and fp16's loss scale: the checkpoint's RNG,
// loader position, scaler and moments restore the run (its seed wins over a new one, as
// transformers restores its RNG states).
TEST_P(TrainerOn, ResumeEqualsTheUninterruptedRun) {
  TempDir dir("resume");
  for (const std::string type : {"bert", "gpt2", "gpt2_fp16"}) {
    TrainOptions straight =
        options(write_config(dir, type.substr(0, 4), 0.1), dir / (type + "_straight"));
    straight.fp16 = type == "gpt2_fp16";
    straight.max_steps = 6;
    straight.save_steps = 3;
    straight.gradient_accumulation_steps = 2;
    straight.dataloader_num_workers = 1;
    const Result a = run(straight);
    ASSERT_EQ(a.losses.size(), 6u);
    TrainOptions resumed = straight;
    resumed.output_dir = dir / (type + "_resumed");
    resumed.resume_from_checkpoint = straight.output_dir + "/checkpoint-3";
    resumed.seed = 1234;
    expect_same_run(run(resumed), a, tolerance(straight), type, 3);
  }
}

// Each optimizer's state is saved and restored: resuming equals the uninterrupted run (8-bit
// AdamW with min_8bit_size 256 so that the tiny model's matrices get 8-bit state). A GPU's
// Adafactor sums with double atomics, not bit-reproducible: 1e-4 there. Resuming with another
// optimizer is refused, naming both.
TEST_P(TrainerOn, ResumeEqualsTheUninterruptedRunWithEveryOptimizer) {
  TempDir dir("resume_optim");
  const std::string model = write_config(dir, "gpt2", 0.1);
  struct Optim {
    std::string optim, args;
    double lr;
  };
  for (const Optim& c :
       {Optim{"adafactor", "", 1e-2}, Optim{"adafactor", "beta1=0.9,scale_parameter=true", 0.5},
        Optim{"adamw_8bit", "min_8bit_size=256", 3e-3},
        Optim{"sgd", "momentum=0.9,nesterov=true", 0.1}}) {
    const std::string tag = c.optim + "_" + c.args;
    TrainOptions straight = options(model, dir / (tag + "_straight"));
    straight.max_steps = 6;
    straight.save_steps = 3;
    use_optimizer(straight, c.optim, c.args, c.lr);
    const Result a = run(straight);
    TrainOptions resumed = straight;
    resumed.output_dir = dir / (tag + "_resumed");
    resumed.resume_from_checkpoint = straight.output_dir + "/checkpoint-3";
    expect_same_run(run(resumed), a, GetParam().rounding_16bit, tag, 3);
    TrainOptions other = resumed;
    other.output_dir = dir / (tag + "_other");
    other.optim = c.optim == "sgd" ? "adamw_torch" : "sgd";
    other.optim_args = "";
    expect_error([&] { run(other); }, "holds the state of optimizer " + c.optim);
  }
}

// offload_optimizer cpu: the optimizer's state and the float32 master copy in host memory,
// stepped by the CPU from downloaded gradients, the master uploaded after each step. On a GPU the
// run equals the one stepped on the GPU to the two optimizers' rounding; on the CPU (where the
// option otherwise changes nothing, offload_on_cpu takes the GPU's path: the plan's host block,
// a backend of its own, the copies) bit for bit, with every optimizer, in fp32, bf16 and fp16
// (an overflowing step skipped), and resumed from an offloaded checkpoint as uninterrupted.
TEST_P(TrainerOn, AnOffloadedOptimizerTrainsAsOneOnTheDevice) {
  TempDir dir("offload");
  const std::string model = write_config(dir, "gpt2", 0.0);
  struct Case {
    std::string optim, args, precision;
    double lr;
  };
  for (const Case& c :
       {Case{"adamw_torch", "", "fp32", 3e-3}, Case{"adamw_torch", "", "bf16", 3e-3},
        Case{"adamw_torch", "", "fp16", 3e-3}, Case{"adafactor", "", "fp32", 1e-2},
        Case{"adamw_8bit", "min_8bit_size=256", "bf16", 3e-3},
        Case{"sgd", "momentum=0.9", "fp32", 0.1}}) {
    const std::string tag = c.optim + "_" + c.precision;
    SCOPED_TRACE(tag);
    TrainOptions on_device = options(model, dir / (tag + "_device"));
    on_device.max_steps = 4;
    on_device.save_steps = 2;
    use_optimizer(on_device, c.optim, c.args, c.lr);
    on_device.bf16 = c.precision == "bf16";
    on_device.fp16 = c.precision == "fp16";
    TrainOptions offloaded = on_device;
    offloaded.output_dir = dir / (tag + "_offloaded");
    offloaded.offload_optimizer = "cpu";
    offloaded.offload_on_cpu = true;
    // fp16: the second step overflows and is skipped, its loss scale halved.
    const FaultHooks faults{on_device.fp16 ? 1 : -1};
    int skipped = 0;
    auto train_logged = [&](const TrainOptions& o) {
      Result r;
      r.summary = train(
          o,
          [&](const nlohmann::json& j) {
            if (j.contains("loss")) r.losses.push_back(j["loss"]);
            if (j.value("skipped", false)) ++skipped;
          },
          nullptr, faults);
      return r;
    };
    const Result want = train_logged(on_device);
    skipped = 0;
    const Result got = train_logged(offloaded);
    EXPECT_EQ(skipped, on_device.fp16 ? 1 : 0);
    // Adafactor's GPU row and column sums use double atomics: its steps differ from run to run,
    // and four steps on an H100 ended 1.1e-4 to 1.6e-4 from the CPU-stepped run (4 repeats).
    const double tol = GetParam().rounding == 0 ? 0.0 : c.optim == "adafactor" ? 1e-3 : 1e-4;
    expect_same_run(got, want, tol, "offloaded");
    const auto a = optimizer_state(got.summary.last_checkpoint),
               b = optimizer_state(want.summary.last_checkpoint);
    ASSERT_EQ(a.size(), b.size());
    for (const auto& [name, v] : b) {
      ASSERT_TRUE(a.count(name)) << name;
      if (tol == 0)
        EXPECT_EQ(a.at(name), v) << name;
      else
        ASSERT_EQ(a.at(name).size(), v.size()) << name;
    }
    TrainOptions resumed = offloaded;
    resumed.output_dir = dir / (tag + "_resumed");
    resumed.resume_from_checkpoint = offloaded.output_dir + "/checkpoint-2";
    const Result continued = train_logged(resumed);
    expect_same_run(continued, got, GetParam().rounding_16bit, "resumed offloaded", 2);
  }
}

INSTANTIATE_TEST_SUITE_P(Every, TrainerOn, ::testing::ValuesIn(kDevices),
                         [](const ::testing::TestParamInfo<DeviceUnderTest>& p) {
                           return std::string(p.param.option);
                         });

}  // namespace
}  // namespace brisk::testing
