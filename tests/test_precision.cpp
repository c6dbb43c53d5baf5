// Mixed precision: casts and rounding against the scalar conversions, the dynamic loss scaler's
// rules, and the trainer in bf16/fp16 (overflow skip, closeness to fp32, memory anatomy).
#include <gtest/gtest.h>
#include <unistd.h>

#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "backend/cpu/cpu_tiles.h"
#include "precision/loss_scaler.h"
#include "test_support.h"
#include "train/trainer.h"

namespace brisk::testing {
namespace {

namespace fs = std::filesystem;

TEST(Precision, CastAndRoundMatchTheScalarConversions) {
  auto be = make_cpu_backend();
  std::mt19937 gen(3);
  std::normal_distribution<float> normal(0.0f, 1000.0f);
  std::vector<float> x(1001);
  for (auto& v : x) v = normal(gen);
  x[0] = 70000.0f;  // beyond fp16
  x[1] = std::nanf("");
  x[2] = -0.0f;
  x[3] = 1e-9f;  // below fp16's subnormals
  for (DType t : {DType::bf16, DType::f16}) {
    std::vector<uint16_t> h(x.size());
    std::vector<float> back(x.size()), rounded = x;
    const Shape s{static_cast<int64_t>(x.size())};
    be->cast(Tensor(x.data(), s, DType::f32), Tensor(h.data(), s, t));
    be->cast(Tensor(h.data(), s, t), Tensor(back.data(), s, DType::f32));
    be->round_to(t, Tensor(rounded.data(), s, DType::f32));
    for (size_t i = 0; i < x.size(); ++i) {
      const uint16_t want = t == DType::bf16 ? float_to_bf16(x[i]) : float_to_fp16(x[i]);
      ASSERT_EQ(h[i], want) << i;
      if (std::isnan(x[i])) {
        EXPECT_TRUE(std::isnan(back[i]) && std::isnan(rounded[i]));
        continue;
      }
      EXPECT_EQ(back[i], rounded[i]) << i;
      const float scalar = t == DType::bf16 ? bf16_to_float(want) : fp16_to_float(want);
      EXPECT_EQ(back[i], scalar) << i;
    }
  }
  std::vector<float> f16_big{70000.0f};
  be->round_to(DType::f16, Tensor(f16_big.data(), Shape{1}, DType::f32));
  EXPECT_TRUE(std::isinf(f16_big[0]));
}

TEST(Precision, LossScalerFollowsGradScalerRules) {
  DynamicLossScaler s;
  EXPECT_EQ(s.scale(), 65536.0);
  s.update(true);
  EXPECT_EQ(s.scale(), 32768.0);
  for (int i = 0; i < 1999; ++i) s.update(false);
  EXPECT_EQ(s.scale(), 32768.0);
  s.update(false);  // the 2000th clean step in a row
  EXPECT_EQ(s.scale(), 65536.0);
  for (int i = 0; i < 1500; ++i) s.update(false);
  s.update(true);  // an overflow resets the count
  EXPECT_EQ(s.scale(), 32768.0);
  for (int i = 0; i < 1999; ++i) s.update(false);
  EXPECT_EQ(s.scale(), 32768.0);
  s.update(false);
  EXPECT_EQ(s.scale(), 65536.0);
}

struct TrainRun {
  std::vector<nlohmann::json> logs;
  TrainSummary summary;
};

class MixedPrecisionTraining : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("brisk_mp_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "model");
    std::ofstream(dir_ / "model" / "config.json")
        << nlohmann::json{{"model_type", "gpt2"}, {"vocab_size", 128}, {"n_embd", 32},
                          {"n_layer", 2},         {"n_head", 2},       {"n_positions", 64}}
               .dump();
  }
  void TearDown() override { fs::remove_all(dir_); }

  TrainRun run(const std::string& name, bool fp16, bool bf16, int64_t steps = 30,
               bool master_weights = true, FaultHooks faults = {}) {
    TrainOptions o;
    o.device = "cpu";  // the plans below are the CPU's (a GPU's: CudaTrainer's tests)
    o.model_name_or_path = (dir_ / "model").string();
    o.output_dir = (dir_ / name).string();
    o.synthetic_task = "learnable";
    o.seq_len = 16;
    o.dataset_size = 128;
    o.per_device_train_batch_size = 8;
    o.max_steps = steps;
    o.learning_rate = 3e-3;
    o.logging_steps = 1;
    o.save_steps = 0;
    o.disable_tqdm = true;
    o.fp16 = fp16;
    o.bf16 = bf16;
    o.bf16_master_weights = master_weights;
    TrainRun r;
    r.summary = train(
        o,
        [&](const nlohmann::json& j) {
          if (j.contains("loss")) r.logs.push_back(j);  // step logs, not the run's notes
        },
        nullptr, faults);
    return r;
  }
  // fp32, bf16 and fp16 runs of the model in dir_: it learned, the 16-bit losses end within 10%
  // of fp32's, fp16 skipped no step, bf16 plans fewer activation bytes. Returns the three runs.
  std::array<TrainRun, 3> expect_16_bit_close_to_fp32() {
    std::array<TrainRun, 3> r{run("fp32", false, false), run("bf16", false, true),
                              run("fp16", true, false)};
    const double a = r[0].logs.back()["loss"];
    EXPECT_LT(a, 0.8 * r[0].logs.front()["loss"].get<double>());  // it learned something
    EXPECT_NEAR(r[1].logs.back()["loss"].get<double>(), a, 0.1 * a);
    EXPECT_NEAR(r[2].logs.back()["loss"].get<double>(), a, 0.1 * a);
    for (const auto& l : r[2].logs) EXPECT_FALSE(l["skipped"].get<bool>());
    const int act = static_cast<int>(Category::activations);
    EXPECT_LT(r[1].summary.memory.planned[act], r[0].summary.memory.planned[act]);
    return r;
  }
  fs::path dir_;
};

TEST_F(MixedPrecisionTraining, Fp16OverflowSkipsExactlyThatStepAndHalvesTheScale) {
  FaultHooks faults;
  faults.overflow_at_step = 3;
  const TrainRun r = run("overflow", true, false, 6, true, faults);
  ASSERT_EQ(r.logs.size(), 6u);
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(r.logs[i]["skipped"].get<bool>(), i == 3) << "step " << i + 1;
    EXPECT_EQ(r.logs[i]["loss_scale"].get<double>(), i <= 3 ? 65536.0 : 32768.0) << i + 1;
  }
  // Five updates were made; the skipped step left the learning-rate schedule where it was.
  SafetensorsFile opt(r.summary.last_checkpoint + "/optimizer.safetensors");
  EXPECT_EQ(opt.get("step").as<int64_t>()[0], 5);
  EXPECT_EQ(r.logs[3]["learning_rate"], r.logs[4]["learning_rate"]);
}

TEST_F(MixedPrecisionTraining, Bf16AndFp16StayCloseToFp32AndPlanLessActivationMemory) {
  [[maybe_unused]] const auto [f32, b16, f16] = expect_16_bit_close_to_fp32();
  const int master = static_cast<int>(Category::master_weights);
  const int weights = static_cast<int>(Category::weights);
  // fp16 keeps a float32 master copy beside its compute copy; bf16 on the CPU computes with the
  // float32 weights themselves (its products round their operands): its model states are
  // fp32's, no master copy.
  EXPECT_EQ(f32.summary.memory.planned[master], 0u);
  EXPECT_EQ(f16.summary.memory.planned[master], f32.summary.memory.planned[weights]);
  for (Category c : {Category::weights, Category::master_weights, Category::gradients,
                     Category::optimizer_state})
    EXPECT_EQ(b16.summary.memory.planned[static_cast<int>(c)],
              f32.summary.memory.planned[static_cast<int>(c)])
        << category_name(c);
  // Checkpoints hold float32 weights (fp16: the master copy), not 16-bit values.
  for (const TrainRun* r : {&b16, &f16}) {
    SafetensorsFile w(r->summary.last_checkpoint + "/model.safetensors");
    const Tensor& wte = w.get("transformer.wte.weight");
    int64_t not_bf16 = 0;
    for (int64_t i = 0; i < wte.numel(); ++i)
      not_bf16 += bf16_to_float(float_to_bf16(wte.f32()[i])) != wte.f32()[i];
    EXPECT_GT(not_bf16, wte.numel() / 2);
  }
}

// The llama family's block (RMSNorm, rotary positions, grouped-query attention, SwiGLU) trains
// in bf16 and fp16 close to fp32 as well.
TEST_F(MixedPrecisionTraining, LlamaInBf16AndFp16StaysCloseToFp32) {
  std::ofstream(dir_ / "model" / "config.json") << nlohmann::json{
      {"model_type", "llama"},      {"vocab_size", 128},
      {"hidden_size", 32},          {"num_hidden_layers", 2},
      {"num_attention_heads", 4},   {"num_key_value_heads", 2},
      {"intermediate_size", 48},    {"max_position_embeddings", 64},
      {"tie_word_embeddings", true}}.dump();
  expect_16_bit_close_to_fp32();
}

// bf16 weights updated in place with stochastic rounding: no master copy (on a GPU 4 bytes less
// per parameter; the CPU's bf16 keeps none either, computing with float32 weights), and the loss
// follows the run with float32 weights.
TEST_F(MixedPrecisionTraining, Bf16WithoutMasterWeightsFollowsTheMasterRun) {
  const TrainRun master = run("bf16_master", false, true, 60),
                 direct = run("bf16_direct", false, true, 60, false);
  ASSERT_EQ(master.logs.size(), direct.logs.size());
  const double first = master.logs.front()["loss"], last = master.logs.back()["loss"];
  EXPECT_LT(last, 0.7 * first);  // it learned
  // Every step's loss within 2% of the master run's (measured: at most 0.25%), and the end
  // within 5% of the distance travelled.
  for (size_t i = 0; i < master.logs.size(); ++i) {
    const double a = master.logs[i]["loss"], b = direct.logs[i]["loss"];
    EXPECT_NEAR(b, a, 0.02 * a) << "step " << i + 1;
  }
  EXPECT_NEAR(direct.logs.back()["loss"].get<double>(), last, 0.05 * (first - last));
  const int master_cat = static_cast<int>(Category::master_weights);
  const int weights = static_cast<int>(Category::weights);
  EXPECT_EQ(direct.summary.memory.planned[master_cat], 0u);
  EXPECT_EQ(master.summary.memory.planned[master_cat], 0u);
  EXPECT_EQ(master.summary.memory.planned[weights], direct.summary.memory.planned[weights]);
  // The weights saved are the bf16 weights themselves.
  SafetensorsFile w(direct.summary.last_checkpoint + "/model.safetensors");
  for (const std::string& name : w.names()) {
    const Tensor& t = w.get(name);
    for (int64_t i = 0; i < t.numel(); ++i)
      ASSERT_EQ(bf16_to_float(float_to_bf16(t.f32()[i])), t.f32()[i]) << name << " " << i;
  }
}

}  // namespace
}  // namespace brisk::testing
