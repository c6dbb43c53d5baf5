// The trainer: an interrupted save leaves the previous checkpoint usable, the plan accounts for
// the process's memory, the tiny models learn with every optimizer, the schedules match
// transformers', bad options and files are refused. The equivalences (accumulation,
// recomputation, resume) run on every device in test_trainer_devices.cpp.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "backend/cpu/cpu_matmul_dnnl.h"
#include "backend/workspace.h"
#include "core/json_file.h"
#include "core/step_control.h"
#include "data/dataset.h"
#include "data/token_file.h"
#include "test_support.h"
#include "train/assembly.h"
#include "train/checkpoint.h"
#include "train/fit.h"
#include "train/schedule.h"
#include "train/trainer.h"
#include "trainer_support.h"

namespace brisk::testing {
namespace {

namespace fs = std::filesystem;

struct Result {
  TrainSummary summary;
  std::vector<double> losses;
};

Result run(const TrainOptions& o, const Dataset* data = nullptr, FaultHooks faults = {}) {
  Result r;
  r.summary = train(
      o,
      [&](const nlohmann::json& j) {
        if (j.contains("loss")) r.losses.push_back(j["loss"]);
      },
      data, faults);
  return r;
}

double rel(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  return rel_error(a.data(), b.data(), static_cast<int64_t>(std::min(a.size(), b.size())));
}

// A mixture of experts' step logs say how many routed pairs each expert took since the last log
// line (every token's top k, in every sparse layer, of every training micro-batch: none from
// evaluation) and the balance, the busiest expert's share over the mean.
TEST(Trainer, MixtureOfExpertsLogsTheTokensEachExpertTook) {
  TempDir dir("moe_log");
  const std::string model = write_tiny_mixtral(dir, R"("output_router_logits": true)");
  TrainOptions o = tiny_options(model, dir / "out");
  o.logging_steps = 2;
  o.gradient_accumulation_steps = 2;
  o.do_eval = true;
  o.eval_strategy = "steps";
  o.eval_steps = 1;
  std::vector<nlohmann::json> logs;
  train(o, [&](const nlohmann::json& j) {
    if (j.contains("expert_tokens")) logs.push_back(j);
  });
  ASSERT_EQ(logs.size(), 2u);  // steps 2 and 4
  for (const nlohmann::json& j : logs) {
    const auto tokens = j["expert_tokens"].get<std::vector<int64_t>>();
    ASSERT_EQ(tokens.size(), 3u);
    int64_t sum = 0, most = 0;
    for (int64_t n : tokens) sum += n, most = std::max(most, n);
    // 2 steps x 2 micro-batches x 4 sequences x 12 tokens x top 2 x 2 layers.
    EXPECT_EQ(sum, 2 * 2 * 4 * 12 * 2 * 2);
    EXPECT_DOUBLE_EQ(j["expert_balance"].get<double>(), most / (sum / 3.0));
  }
}

// Switch's capacity (--moe_capacity_factor): at 0.5, each expert of 3 computes at most 16 of a
// micro-batch's 96 routed pairs per layer, so at least half of them are dropped, and the log
// counts them (at most the pairs routed); the loss moves. At 1.5 (= experts / top k) the capacity
// is every token: nothing is dropped and the losses are the dropless run's, bit for bit.
TEST(Trainer, AnExpertCapacityDropsPairsAndCountsThem) {
  TempDir dir("moe_capacity");
  const std::string model = write_tiny_mixtral(dir);
  auto run = [&](double factor) {
    TrainOptions o = tiny_options(model, dir / "out");
    o.logging_steps = 2;
    o.gradient_accumulation_steps = 2;
    o.moe_capacity_factor = factor;
    std::vector<nlohmann::json> logs;
    train(o, [&](const nlohmann::json& j) {
      if (j.contains("expert_tokens")) logs.push_back(j);
    });
    return logs;
  };
  const auto dropless = run(0), dropping = run(0.5), roomy = run(1.5);
  ASSERT_EQ(dropless.size(), 2u);
  ASSERT_EQ(dropping.size(), 2u);
  ASSERT_EQ(roomy.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_FALSE(dropless[i].contains("expert_dropped"));
    // 2 steps x 2 micro-batches x 2 layers: 96 pairs each, 3 x 16 computed at most.
    const int64_t pairs = 2 * 2 * 2 * 96, dropped = dropping[i]["expert_dropped"].get<int64_t>();
    EXPECT_GE(dropped, pairs - 2 * 2 * 2 * 3 * 16);
    EXPECT_LE(dropped, pairs);
    EXPECT_NE(dropping[i]["loss"], dropless[i]["loss"]);
    EXPECT_EQ(roomy[i]["expert_dropped"].get<int64_t>(), 0);
    EXPECT_EQ(roomy[i]["loss"], dropless[i]["loss"]);
  }
}

// Three training steps of the mixture-of-experts fixtures (scripts/make_moe_fixtures.py: the
// same batch each step, AdamW at a constant 1e-2, gradients clipped to norm 1, the
// load-balancing loss in the loss) give transformers' losses and final weights.
TEST(Trainer, MixtureOfExpertsTrainAsTransformersDoes) {
  for (const char* name : {"mixtral_tiny", "qwen2_moe_tiny"}) {
    SCOPED_TRACE(name);
    TempDir dir("moe_steps");
    const std::string folder = fixture(std::string("moe/") + name);
    FixtureRows rows(folder + "/batch.safetensors");
    TrainOptions o = tiny_options(folder, dir / "out");
    o.seq_len = rows.seq_len();
    o.per_device_train_batch_size = rows.size();
    o.max_steps = 3;
    o.learning_rate = 1e-2;
    o.lr_scheduler_type = "constant";
    o.weight_decay = 0.0;
    o.save_steps = 3;
    const Result r = run(o, &rows);
    SafetensorsFile want(folder + "/train_steps.safetensors");
    const Tensor& losses = want.get("losses");
    ASSERT_EQ(r.losses.size(), 3u);
    for (int s = 0; s < 3; ++s)
      EXPECT_NEAR(r.losses[s], losses.f32()[s], 1e-4 * losses.f32()[s]) << "step " << s + 1;
    SafetensorsFile got(dir / "out/checkpoint-3/model.safetensors");
    const ModelConfig c = resolve_config(folder);
    for (const std::string& n : got.names()) {
      const Tensor& t = got.get(n);
      const std::vector<float> w = moe_fixture_values(want, "final.", n, c);
      ASSERT_EQ(static_cast<size_t>(t.numel()), w.size()) << n;
      EXPECT_LE(rel_error(t.f32(), w.data(), t.numel()), 1e-4) << n;
    }
  }
}

// A kill at every point of the save sequence leaves a complete checkpoint: the previous one
// until the new one is renamed into place, the new one from then on; the next start cleans up,
// and `--resume_from_checkpoint last` continues from it to the uninterrupted run's weights.
TEST(Trainer, AKillAtAnyPointOfASaveLeavesACompleteCheckpointToResume) {
  TempDir dir("killed");
  TrainOptions o = tiny_options(write_config(dir, "bert", 0.0), dir / "straight");
  o.max_steps = 6;
  o.save_steps = 2;
  o.save_total_limit = 1;  // the save at step 4 also rotates checkpoint-2 out
  const std::vector<float> want = checkpoint_weights(run(o).summary.last_checkpoint);
  // The save at step 2 passes 6 points; the one at step 4 has 6 files and 1 rotation rename.
  for (int point = 0; point < 7; ++point) {
    const std::string tag = "kill at point " + std::to_string(point) + " of the second save";
    TrainOptions killed = o;
    killed.output_dir = dir / ("out" + std::to_string(point));
    FaultHooks faults;
    faults.kill_save_at_point = 6 + point;
    EXPECT_THROW(run(killed, nullptr, faults), Error) << tag;
    const bool committed = point >= 6;
    const std::string complete =
        killed.output_dir + (committed ? "/checkpoint-4" : "/checkpoint-2");
    EXPECT_EQ(last_checkpoint(killed.output_dir), complete) << tag;
    TrainOptions resumed = killed;
    resumed.resume_from_checkpoint = "last";
    std::vector<std::string> cleaned;
    int64_t first_step = -1;
    train(resumed, [&](const nlohmann::json& j) {
      if (j.contains("removed_interrupted_save")) cleaned.push_back(j["removed_interrupted_save"]);
      if (j.contains("step") && first_step < 0) first_step = j["step"];
    });
    EXPECT_EQ(cleaned.size(), 1u) << tag;  // the unfinished .tmp- or the half-rotated .del-
    EXPECT_EQ(first_step, committed ? 5 : 3) << tag;
    EXPECT_EQ(checkpoint_weights(killed.output_dir + "/checkpoint-6"), want) << tag;
    for (const auto& e : fs::directory_iterator(killed.output_dir))
      if (e.is_directory())
        EXPECT_EQ(e.path().filename().string().find('.'), std::string::npos) << tag << e.path();
  }
  // Saving a step again (a rerun into the same output_dir): 6 files, the old copy moved aside,
  // the new one renamed into place; a kill at any point leaves one complete checkpoint-2.
  TrainOptions two = o;
  two.max_steps = 2;
  two.save_total_limit = 0;
  two.output_dir = dir / "again";
  run(two);
  for (int point = 0; point < 8; ++point) {
    const std::string tag = "kill at point " + std::to_string(point) + " of a repeated save";
    FaultHooks faults;
    faults.kill_save_at_point = point;
    EXPECT_THROW(run(two, nullptr, faults), Error) << tag;
    TrainOptions resumed = two;
    resumed.max_steps = 3;
    resumed.resume_from_checkpoint = "last";
    const Result r = run(resumed);
    EXPECT_EQ(r.summary.global_step, 3) << tag;
    EXPECT_EQ(r.losses.size(), 1u) << tag;  // continued from step 2
    fs::remove_all(two.output_dir + "/checkpoint-3");
  }
}

// What interrupted saves leave behind is cleaned up at the next start: unfinished temp folders
// are removed, a previous copy moved aside (and not yet replaced) is put back; re-saving a step
// that exists leaves exactly the new copy.
TEST(Trainer, InterruptedSavesAreCleanedUpAtTheNextStart) {
  TempDir dir("leftovers");
  TrainOptions o = tiny_options(write_config(dir, "gpt2", 0.0), dir / "out");
  o.max_steps = 2;
  o.save_steps = 2;
  run(o);
  // A kill between moving checkpoint-2 aside and renaming the new copy into place, and an
  // unfinished temp folder of another step.
  fs::rename(o.output_dir + "/checkpoint-2", o.output_dir + "/checkpoint-2.old-4242");
  fs::create_directories(o.output_dir + "/checkpoint-7.tmp-4243");
  std::ofstream(o.output_dir + "/checkpoint-7.tmp-4243/model.safetensors") << "partial";
  fs::create_directories(o.output_dir + "/checkpoint-1.del-4244/half");  // rotation cut short
  fs::create_directories(o.output_dir + "/checkpoint-9.tmp-x");          // not our naming: kept
  std::vector<std::string> cleaned;
  TrainOptions again = o;
  again.max_steps = 1;
  again.save_steps = 0;
  again.save_strategy = "no";
  train(again, [&](const nlohmann::json& j) {
    if (j.contains("removed_interrupted_save")) cleaned.push_back(j["removed_interrupted_save"]);
  });
  EXPECT_EQ(cleaned.size(), 3u);
  EXPECT_FALSE(fs::exists(o.output_dir + "/checkpoint-1.del-4244"));
  EXPECT_TRUE(fs::exists(o.output_dir + "/checkpoint-2/trainer_state.json"));
  EXPECT_FALSE(fs::exists(o.output_dir + "/checkpoint-2.old-4242"));
  EXPECT_FALSE(fs::exists(o.output_dir + "/checkpoint-7.tmp-4243"));
  EXPECT_TRUE(fs::exists(o.output_dir + "/checkpoint-9.tmp-x"));
  // Saving step 2 again replaces it, with nothing left beside it.
  run(o);
  EXPECT_TRUE(fs::exists(o.output_dir + "/checkpoint-2/model.safetensors"));
  for (const auto& e : fs::directory_iterator(o.output_dir)) {
    const std::string name = e.path().filename().string();
    if (name == "checkpoint-9.tmp-x") continue;
    EXPECT_TRUE(name.find(".old-") == std::string::npos && name.find(".tmp-") == std::string::npos)
        << name;
  }
}

TEST(Trainer, SaveTotalLimitKeepsTheNewest) {
  TempDir dir("limit");
  TrainOptions o = tiny_options(write_config(dir, "gpt2", 0.0), dir / "out");
  o.save_steps = 1;
  o.save_total_limit = 2;
  run(o);
  EXPECT_FALSE(fs::exists(o.output_dir + "/checkpoint-2"));
  EXPECT_TRUE(fs::exists(o.output_dir + "/checkpoint-3"));
  EXPECT_TRUE(fs::exists(o.output_dir + "/checkpoint-4"));
  // transformers can read the names: every parameter of the model is in model.safetensors.
  SafetensorsFile f(o.output_dir + "/checkpoint-4/model.safetensors");
  EXPECT_TRUE(f.has("transformer.h.1.attn.c_attn.weight"));
  EXPECT_TRUE(f.has("transformer.ln_f.bias"));
}

TEST(Trainer, SaveStrategyNoWritesNoCheckpointAndEpochSavesAtEachEpochsEnd) {
  TempDir dir("strategy");
  TrainOptions o = tiny_options(write_config(dir, "gpt2", 0.0), dir / "out");
  o.save_strategy = "no";
  o.save_steps = 1;
  EXPECT_TRUE(run(o).summary.last_checkpoint.empty());
  for (const auto& e : fs::directory_iterator(o.output_dir))
    EXPECT_EQ(e.path().filename().string().find("checkpoint"), std::string::npos) << e.path();
  // 24 samples in batches of 4: 6 steps an epoch; 14 steps end two epochs and a part.
  TrainOptions e = tiny_options(write_config(dir, "gpt2", 0.0), dir / "epochs");
  e.save_strategy = "epoch";
  e.max_steps = 14;
  EXPECT_EQ(run(e).summary.last_checkpoint, e.output_dir + "/checkpoint-14");
  for (int step = 1; step <= 14; ++step)
    EXPECT_EQ(fs::exists(e.output_dir + "/checkpoint-" + std::to_string(step)),
              step == 6 || step == 12 || step == 14)
        << step;
}

// The products' bf16 copy of the weights (Backend::hold_weights, a GPU's way; on the CPU where a
// test asks for it) gives the bits of products that round the weights themselves, so long as it
// is made again after every update and nothing writes the weights while it is held: steps of two
// micro-batches with evaluations between them train to the same losses, evaluation and weights.
TEST(Trainer, AWeightsCopyMadeEachStepTrainsAsTheProductsRounding) {
  TempDir dir("weights_copy");
  TrainOptions o = tiny_options(write_config(dir, "gpt2", 0.0), dir / "rounding");
  o.bf16 = true;
  o.gradient_accumulation_steps = 2;
  o.do_eval = true;
  o.eval_strategy = "steps";
  o.eval_steps = 2;
  const Result rounding = run(o);
  o.output_dir = dir / "copy";
  o.weights_copy_on_cpu = true;
  const auto plan = assemble_run(o, Device::cpu, nullptr);
  EXPECT_EQ(plan->plan.bytes_by_category()[static_cast<int>(Category::weights)],
            static_cast<size_t>(6 * plan->model->params().total_elements()));
  const Result copy = run(o);
  ASSERT_EQ(rounding.losses.size(), 4u);
  EXPECT_EQ(copy.losses, rounding.losses);
  EXPECT_EQ(copy.summary.eval_metrics["eval_loss"], rounding.summary.eval_metrics["eval_loss"]);
  EXPECT_EQ(checkpoint_weights(dir / "copy"), checkpoint_weights(dir / "rounding"));
}

// Where the products read the blocks' 16-bit stored copies as they lie (bf16 on the CPU and on a
// GPU), backward never reads the float32 working set: its gradients of the attention's output,
// qkv and the MLP's activation take that set's ctx, qkv and fc_act instead of buffers of their own
// (TrainerOn.GradientCheckpointingChangesMemoryNotResults trains such a run: a backward that read
// the working set would then differ), an ungated MLP's fc_pre takes fc_act's room (without
// stored copies read as they lie, Models.CheckpointingIsBitIdenticalWith16BitActivations would
// differ) and a pre-norm block's norm outputs take none (without them, Models tests fail). Not in
// float32, nor under gradient checkpointing (no working set).
TEST(Trainer, ABf16BackwardWritesWhereTheForwardWorked) {
  TempDir dir("shared_scratch");
  TrainOptions o = tiny_options(write_config(dir, "gpt2", 0.0), dir / "out", "cuda");
  auto has = [](const RunAssembly& r, const std::string& name) {
    for (const BufferSpec& b : r.plan.buffers())
      if (b.name == name) return true;
    return false;
  };
  for (const Device device : {Device::cuda, Device::cpu})
    for (const bool bf16 : {false, true})
      for (const bool checkpointing : {false, true}) {
        o.bf16 = bf16;
        o.gradient_checkpointing = checkpointing;
        const auto r = assemble_run(o, device, nullptr);
        const bool shared = bf16 && !checkpointing;
        for (const char* name :
             {"block_scratch.d_ctx", "block_scratch.d_qkv", "block_scratch.d_fc"})
          EXPECT_EQ(has(*r, name), !shared)
              << name << (bf16 ? " bf16" : " fp32") << (checkpointing ? " checkpointed" : "");
        EXPECT_EQ(has(*r, "block_work.fc_act"), shared);
        // GPT-2's ungated MLP: the working set's fc_pre lies in fc_act's room; its pre-norm
        // blocks' norms write their outputs straight into the stored copies.
        for (const char* name : {"block_work.fc_pre", "block_work.a_in", "block_work.m_in"})
          EXPECT_FALSE(has(*r, name)) << name;
      }
  // A gated MLP's backward uses both (d_gate_up in fc_pre's room, d_fc in fc_act's).
  o.model_name_or_path = "smollm2-135m";
  o.bf16 = true;
  o.gradient_checkpointing = false;
  EXPECT_TRUE(has(*assemble_run(o, Device::cpu, nullptr), "block_work.fc_pre"));
}

// A GPU run is planned on any machine: the GPU's attention keeps one log-sum-exp per row instead
// of the probabilities, batches get device copies, and the backend plans cuBLASLt's workspace,
// 16-bit operand copies, the ones column, the optimizer scratch and the weights' bf16 copy.
TEST(Trainer, AGpuRunIsPlannedWithoutAGpu) {
  TempDir dir("gpu_plan");
  TrainOptions o = tiny_options(write_config(dir, "gpt2", 0.0), dir / "out", "cuda");
  o.bf16 = true;
  const auto gpu = assemble_run(o, Device::cuda, nullptr);
  o.device = "cpu";
  const auto cpu = assemble_run(o, Device::cpu, nullptr);
  auto find = [](const MemoryPlan& plan, const std::string& name) -> const BufferSpec* {
    for (const BufferSpec& b : plan.buffers())
      if (b.name == name) return &b;
    return nullptr;
  };
  // Both keep one log-sum-exp per query row; the scratch differs (the CPU's: a block of rows per
  // (batch, head) task).
  const int64_t B = 4, H = 2, T = 12, D = 32 / H;
  for (const auto* run : {gpu.get(), cpu.get()}) {
    const BufferSpec* lse = find(run->plan, "block.0.attn_stats");
    ASSERT_TRUE(lse);
    EXPECT_EQ(lse->shape, (Shape{B, H, T}));
  }
  const BufferSpec* gpu_scratch = find(gpu->plan, "block_scratch.attn");
  const BufferSpec* cpu_scratch = find(cpu->plan, "block_scratch.attn");
  ASSERT_TRUE(gpu_scratch && cpu_scratch);
  EXPECT_EQ(gpu_scratch->shape, (Shape{B, H, T}));
  EXPECT_EQ(cpu_scratch->shape, (Shape{B, H, cpu_attention_scratch_floats(T, D)}));
  const BufferSpec* ws = find(gpu->plan, "backend.cublaslt_workspace");
  ASSERT_TRUE(ws);
  EXPECT_EQ(ws->bytes, static_cast<size_t>(kCublasLtWorkspaceBytes));
  EXPECT_EQ(find(cpu->plan, "backend.cublaslt_workspace"), nullptr);
  // A's rows (B x T at most) may be padded to 16 bytes each: 7 more values per row.
  const MatmulOperands ops = gpu->model->matmul_operands();
  EXPECT_EQ(ops.a_rows, B * T);
  const BufferSpec* operand = find(gpu->plan, "backend.operand_a");
  ASSERT_TRUE(operand);
  EXPECT_EQ(operand->dtype, DType::bf16);
  EXPECT_EQ(operand->shape, (Shape{std::max(ops.a + 7 * ops.a_rows, ops.attention)}));
  // A bias gradient sums dy's rows against ones: one a row, not one an element of A.
  const BufferSpec* ones = find(gpu->plan, "backend.ones");
  ASSERT_TRUE(ones);
  EXPECT_EQ(ones->shape, (Shape{B * T}));
  const BufferSpec* ones16 = find(gpu->plan, "backend.ones16");  // those of a bf16 dy
  ASSERT_TRUE(ones16);
  EXPECT_EQ(ones16->shape, (Shape{B * T}));
  EXPECT_EQ(ones16->dtype, DType::bf16);
  // The LM head's weight is the held operand: each device keeps its copy apart from B.
  ASSERT_GT(ops.held, 0);
  const int64_t hidden = gpu->model->config().hidden_size;
  EXPECT_EQ(ops.held_cols, hidden);
  const BufferSpec* gpu_b = find(gpu->plan, "backend.operand_b");
  const BufferSpec* gpu_held = find(gpu->plan, "backend.held_weight");
  const BufferSpec* cpu_held = find(cpu->plan, "backend.bf16_held_weight");
  ASSERT_TRUE(gpu_b && gpu_held && cpu_held);
  EXPECT_EQ(gpu_b->shape, (Shape{std::max(ops.b, ops.attention)}));
  EXPECT_EQ(gpu_held->shape, (Shape{ops.held}));
  EXPECT_EQ(gpu_held->dtype, DType::bf16);
  // On bf16 units one copy per way the products read it, in blocked layouts.
  EXPECT_EQ(cpu_held->shape, cpu_has_bf16_products()
                                 ? (Shape{2, cpu_blocked_elements(ops.held / hidden, hidden)})
                                 : (Shape{ops.held}));
  // The GPU's products read the unbiased head's logits gradient in bf16, as the loss writes it,
  // a chunk at a time (here the one chunk of every row); the CPU's only over more than a chunk.
  const BufferSpec* dlogits = find(gpu->plan, "lm_head.dlogits");
  ASSERT_TRUE(dlogits);
  EXPECT_EQ(dlogits->dtype, DType::bf16);
  EXPECT_EQ(dlogits->shape, (Shape{B * T, gpu->model->logits_width()}));
  EXPECT_EQ(find(cpu->plan, "lm_head.dlogits"), nullptr);
  TrainOptions evaluates = o;  // a run computing no gradients keeps none
  evaluates.device = "cuda";
  evaluates.do_train = false;
  evaluates.do_eval = true;
  evaluates.eval_dataset_size = 8;
  EXPECT_EQ(find(assemble_run(evaluates, Device::cuda, nullptr)->plan, "lm_head.dlogits"), nullptr);
  int device_copies = 0;
  for (const BufferSpec& b : gpu->plan.buffers())
    if (b.category == Category::data && b.placement == Placement::device) ++device_copies;
  EXPECT_GE(device_copies, 3);  // input ids, attention mask and labels at least
  EXPECT_EQ(gpu->product, DType::bf16);
  // Everything the optimizer holds is the same on both devices, and both compute with the float32
  // weights themselves (no master copy); the GPU's products read a bf16 copy of them besides.
  for (Category c : {Category::gradients, Category::optimizer_state, Category::master_weights})
    EXPECT_EQ(gpu->plan.bytes_by_category()[static_cast<int>(c)],
              cpu->plan.bytes_by_category()[static_cast<int>(c)])
        << category_name(c);
  const int weights = static_cast<int>(Category::weights);
  const int64_t n = gpu->model->params().total_elements();
  const BufferSpec* copy = find(gpu->plan, "backend.weights_copy");
  ASSERT_TRUE(copy);
  EXPECT_EQ(copy->dtype, DType::bf16);
  EXPECT_EQ(copy->shape, (Shape{n}));
  EXPECT_EQ(copy->category, Category::weights);
  EXPECT_EQ(gpu->plan.bytes_by_category()[weights],
            cpu->plan.bytes_by_category()[weights] + static_cast<size_t>(2 * n));
  EXPECT_EQ(find(cpu->plan, "backend.weights_copy"), nullptr);
  EXPECT_EQ(cpu->plan.bytes_by_category()[static_cast<int>(Category::master_weights)], 0u);
  EXPECT_TRUE(cpu->precision->float32_weights());
  EXPECT_TRUE(gpu->precision->float32_weights());
}

// The data loader's sample orders grow with the data set, so they are planned: two int64 per
// sample in the data category.
TEST(Trainer, TheLoadersOrdersAreInThePlan) {
  TempDir dir("orders");
  TrainOptions o = tiny_options(write_config(dir, "bert", 0.0), dir / "out");
  auto data_bytes = [&](int64_t samples) {
    TrainOptions t = o;
    t.dataset_size = samples;
    return assemble_run(t, Device::cpu, nullptr)
        ->plan.bytes_by_category()[static_cast<int>(Category::data)];
  };
  const size_t small = data_bytes(1000), large = data_bytes(101000);
  EXPECT_EQ(large - small, size_t{100000} * 2 * sizeof(int64_t));
}

// At real sizes selective recomputation plans activations strictly between none and full: both
// backends' attention keeps one log-sum-exp per query row, and all blocks but one give theirs up.
TEST(Trainer, SelectiveRecomputationPlansBetweenNoneAndFull) {
  for (Device device : {Device::cpu, Device::cuda})
    for (bool bf16 : {false, true}) {
      SCOPED_TRACE(std::string(device == Device::cuda ? "cuda " : "cpu ") +
                   (bf16 ? "bf16" : "fp32"));
      TrainOptions o;
      o.model_name_or_path = "bert-base-uncased";
      o.per_device_train_batch_size = 8;
      o.seq_len = 512;
      o.bf16 = bf16;
      auto activations = [&](int mode) {
        TrainOptions t = o;
        t.selective_recompute = mode == 1;
        t.gradient_checkpointing = mode == 2;
        return assemble_run(t, device, nullptr)
            ->plan.bytes_by_category()[static_cast<int>(Category::activations)];
      };
      const size_t none = activations(0), selective = activations(1), full = activations(2);
      EXPECT_LT(selective, none);
      EXPECT_GT(selective, full);
      EXPECT_EQ(none - selective, size_t{11} * 8 * 12 * 512 * sizeof(float));  // [8, 12, 512]
    }
}

TEST(Trainer, ThePlanAccountsForTheProcessMemory) {
  TempDir dir("memory");
  for (bool bf16 : {false, true}) {
    TrainOptions o = tiny_options("bert-tiny", dir / (bf16 ? "bf16" : "fp32"));
    o.seq_len = 128;
    o.per_device_train_batch_size = 8;
    o.dataset_size = 16;
    o.max_steps = 2;
    o.bf16 = bf16;
    const Result r = run(o);
    const MemoryReport& m = r.summary.memory;
    size_t planned = 0;
    for (size_t b : m.planned) planned += b;
    // One micro-batch a step: the gradients lie over consumed activations,
    // counted once in the arena.
    EXPECT_GT(m.overlaid, 0u);
    planned -= m.overlaid;
    // The arena is the plan plus alignment padding only.
    EXPECT_GE(m.arena_bytes, planned);
    EXPECT_LE(m.arena_bytes - planned, 64 * 1024u);
    // The process grows by the arena and little else: stated margin 24 MiB for thread stacks,
    // OpenBLAS and oneDNN internals and the loader.
    const size_t growth = m.peak_rss - m.rss_before_arena;
    EXPECT_GE(growth, m.arena_bytes * 95 / 100) << "bf16 " << bf16;
    EXPECT_LE(growth, m.arena_bytes + (24u << 20)) << "bf16 " << bf16 << " peak " << m.peak_rss;
  }
}

// Issue 10's bound, saves included: the process peak stays within the plan, the resident memory
// before the arena and max(2%, 32 MiB). The model's 12.9M-value embedding makes AdamW's state
// (103 MB) larger than the margin, so a save that copied the state or the weights whole would
// break the bound.
TEST(Trainer, TheProcessPeakStaysWithinThePlanWhileTrainingAndSaving) {
  TempDir dir("peak");
  const std::string folder = write_model_folder(
      dir, "wide_gpt2",
      R"({"model_type": "gpt2", "vocab_size": 50257, "n_embd": 256, "n_layer": 1, "n_head": 4,
          "n_positions": 64})");
  for (int variant = 0; variant < 3; ++variant) {
    SCOPED_TRACE("variant " + std::to_string(variant));
    TrainOptions o = tiny_options(folder, dir / ("out" + std::to_string(variant)));
    o.seq_len = 16;
    o.per_device_train_batch_size = 2;
    o.dataset_size = 8;
    o.max_steps = 2;
    o.save_steps = 1;
    o.bf16 = variant == 1;
    o.gradient_checkpointing = variant == 2;
    o.gradient_accumulation_steps = variant == 2 ? 2 : 1;
    o.dataloader_num_workers = variant == 2 ? 1 : 0;
    if (variant == 2) o.optim = "adamw_8bit";
    const MemoryReport m = run(o).summary.memory;
    size_t planned = 0;
    for (size_t b : m.planned) planned += b;
    planned -= m.overlaid;
    const size_t bound = planned + m.rss_before_arena + std::max(planned / 50, size_t{32} << 20);
    EXPECT_LE(m.peak_rss, bound) << "peak " << m.peak_rss << ", plan " << planned;
    EXPECT_GT(m.peak_rss_saves, 0u);  // two saves ran
    // The anatomy drawn next to the results: the plan's bars and the measured peaks.
    std::ifstream in(o.output_dir + "/memory.html");
    const std::string page((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_NE(page.find("<svg"), std::string::npos);
    EXPECT_NE(page.find("process peak"), std::string::npos);
    EXPECT_NE(page.find("activations"), std::string::npos);
    EXPECT_LE(m.peak_rss_steps, m.peak_rss);
    EXPECT_GE(m.peak_rss_steps, m.rss_before_arena + planned * 9 / 10);  // the arena is touched
  }
}

// Sizes from input go through checked arithmetic, and a plan beyond the machine's memory is
// refused before anything is allocated.
TEST(Trainer, HugeSizesAreRefusedBeforeAnyAllocation) {
  Shape wide{int64_t{1} << 61, 8};
  EXPECT_THROW(wide.numel(), Error);
  TempDir dir("huge");
  const std::string folder = write_model_folder(
      dir, "huge_gpt2",
      R"({"model_type": "gpt2", "vocab_size": 4611686018427387904, "n_embd": 64, "n_layer": 1,
          "n_head": 2, "n_positions": 64})");
  TrainOptions o = tiny_options(folder, dir / "out");
  expect_error([&] { assemble_run(o, Device::cpu, nullptr); },
               "\"vocab_size\" = 4611686018427387904 is outside [1, 2147483647]");
  // Every size at its bound: planned quickly (4096 layers) in checked arithmetic, and refused
  // before anything is allocated because it does not fit.
  const std::string at_bounds = write_model_folder(
      dir, "at_bounds",
      R"({"model_type": "gpt2", "vocab_size": 2147483647, "n_embd": 131072, "n_layer": 4096,
          "n_head": 4096, "n_inner": 1048576, "n_positions": 4194304})");
  TrainOptions widest = tiny_options(at_bounds, dir / "widest");
  expect_error([&] { train(widest, [](const nlohmann::json&) {}); }, "of host memory but only");
  // A batch whose activations overflow 64 bits is refused by the checked arithmetic.
  widest.per_device_train_batch_size = int64_t{1} << 40;
  widest.dataset_size = int64_t{1} << 40;
  widest.seq_len = int64_t{1} << 22;
  expect_error([&] { assemble_run(widest, Device::cpu, nullptr); }, "is too large");
  // A config nested 100000 deep (as an unknown key) is refused by depth, not by the stack.
  const std::string deep =
      write_model_folder(dir, "deep",
                         R"({"model_type": "gpt2", "x": )" + std::string(100000, '[') +
                             std::string(100000, ']') + "}");
  expect_error([&] { resolve_config(deep); }, "nested deeper than 32 levels");
  TrainOptions big = tiny_options(write_config(dir, "gpt2", 0.0), dir / "big");
  big.dataset_size = int64_t{1} << 40;  // 16 TiB of sample order
  expect_error([&] { train(big, [](const nlohmann::json&) {}); }, "of host memory but only");
}

TEST(Trainer, MemorySizesParseWithTheirUnits) {
  EXPECT_EQ(parse_memory_size("6GB"), 6000000000u);
  EXPECT_EQ(parse_memory_size("6GiB"), size_t{6} << 30);
  EXPECT_EQ(parse_memory_size("6 gib"), size_t{6} << 30);
  EXPECT_EQ(parse_memory_size("512MiB"), size_t{512} << 20);
  EXPECT_EQ(parse_memory_size("1.5G"), size_t{3} << 29);
  EXPECT_EQ(parse_memory_size("300kB"), 300000u);
  EXPECT_EQ(parse_memory_size("4096"), 4096u);
  for (const char* bad : {"", "GB", "6XB", "-1GB", "1.2.3GB", "0", "1e30", "six"})
    EXPECT_THROW(parse_memory_size(bad), Error) << bad;
}

// --auto_find_batch_size shrinks the per-device batch to what the budget holds, keeps the global
// batch through accumulation (so the losses are the unsplit batch's), stays within the budget,
// and refuses a budget too small for batch 1, naming what would fit.
TEST(Trainer, AutoFindBatchSizeFitsTheBudgetAndKeepsTheGlobalBatch) {
  TempDir dir("autofit");
  // Wide enough that a sample's activations (~7 MB) dwarf the process's own drift.
  const std::string folder = write_model_folder(
      dir, "wide_bert",
      R"({"model_type": "bert", "vocab_size": 128, "hidden_size": 256, "num_hidden_layers": 2,
          "num_attention_heads": 4, "intermediate_size": 1024, "max_position_embeddings": 128,
          "hidden_dropout_prob": 0, "attention_probs_dropout_prob": 0})");
  TrainOptions o = tiny_options(folder, dir / "big");
  o.seq_len = 128;
  o.dataset_size = 32;
  o.per_device_train_batch_size = 8;
  o.max_steps = 3;
  auto needed = [&](int64_t batch) {
    TrainOptions t = o;
    t.per_device_train_batch_size = batch;
    t.gradient_accumulation_steps = 8 / batch;
    t.max_memory = "1GB";  // any: only the fixed part (this process's resident memory) matters
    return needed_bytes(assemble_run(t, Device::cpu, nullptr)->plan,
                        memory_budget(t, Device::cpu, nullptr));
  };
  const Result whole = run(o);
  const size_t need8 = needed(8), need4 = needed(4);
  ASSERT_GT(need8 - need4, size_t{16} << 20) << "the test needs a clear gap between the batches";

  TrainOptions fitted = o;
  fitted.output_dir = dir / "fitted";
  fitted.auto_find_batch_size = true;
  fitted.max_memory = std::to_string((need4 + need8) / 2);
  fitted.save_steps = 3;
  const Result r = run(fitted);
  EXPECT_NE(
      r.summary.auto_fit.find("per_device_train_batch_size 4 x gradient_accumulation_steps 2"),
      std::string::npos)
      << r.summary.auto_fit;
  ASSERT_EQ(r.losses.size(), whole.losses.size());
  for (size_t i = 0; i < r.losses.size(); ++i)
    EXPECT_NEAR(r.losses[i], whole.losses[i], 1e-5 * std::abs(whole.losses[i])) << i;
  const MemoryReport& m = r.summary.memory;
  EXPECT_LE(m.peak_rss, (need4 + need8) / 2);
  // The checkpoint records the batch actually used.
  std::ifstream args(r.summary.last_checkpoint + "/training_args.json");
  const nlohmann::json j = nlohmann::json::parse(args);
  EXPECT_EQ(j["per_device_train_batch_size"], 4);
  EXPECT_EQ(j["gradient_accumulation_steps"], 2);

  // A larger budget lets the batch grow past the one asked for, with less accumulation.
  TrainOptions grown = fitted;
  grown.output_dir = dir / "grown";
  grown.per_device_train_batch_size = 2;
  grown.gradient_accumulation_steps = 4;
  grown.max_memory = std::to_string(needed(8) + (64 << 20));  // the process as it is now
  EXPECT_NE(run(grown).summary.auto_fit.find("per_device_train_batch_size 8 x"), std::string::npos);

  TrainOptions tiny = fitted;
  tiny.output_dir = dir / "tiny";
  tiny.max_memory = "1MB";
  try {
    run(tiny);
    ADD_FAILURE() << "a 1 MB budget was accepted";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("not even per_device_train_batch_size 1 fits"), std::string::npos) << what;
    EXPECT_NE(what.find("with --gradient_checkpointing"), std::string::npos) << what;
    // On the CPU the optimizer state is in host memory already: offload is no way out.
    EXPECT_EQ(what.find("offload_optimizer"), std::string::npos) << what;
  }
  // A GPU run (planned without a GPU) that nothing fits names offload too, with what batch 1
  // needs then: less than without it.
  MemoryBudget gpu{Device::cuda, size_t{1} << 20, 0, "a 1 MiB test budget"};
  const auto mib_before = [](const std::string& what, const std::string& tail) {
    const size_t at = what.find(tail);
    EXPECT_NE(at, std::string::npos) << what;
    const size_t from = what.rfind(", ", at);
    return std::stod(what.substr(from + 2, at - from - 2));
  };
  try {
    fit_batch(tiny, Device::cuda, gpu, nullptr);
    ADD_FAILURE() << "a 1 MiB GPU budget was accepted";
  } catch (const Error& e) {
    const std::string what = e.what();
    const double checkpointed = mib_before(what, " MiB with --gradient_checkpointing,");
    const double offloaded =
        mib_before(what, " MiB with --gradient_checkpointing and --offload_optimizer cpu");
    EXPECT_LT(offloaded, checkpointed) << what;
  }
}

// auto_find_batch_size with pipeline stages fits the largest stage: GPT-2's last stage (the LM
// head's logits) needs more than its first at every batch, and a budget the first stage's larger
// batch fits but the last's does not gives the batch the last stage fits.
TEST(Trainer, AutoFindBatchSizeFitsEveryPipelineStage) {
  TrainOptions o;
  o.model_name_or_path = "gpt2";
  o.seq_len = 128;
  o.per_device_train_batch_size = 8;
  o.gradient_accumulation_steps = 1;
  o.pp_size = 2;
  const MemoryBudget unbounded{kHostDevice, size_t{1} << 40, 0, "a test budget"};
  auto stage_need = [&](int64_t batch, int stage) {
    TrainOptions t = o;
    t.per_device_train_batch_size = batch;
    t.gradient_accumulation_steps = 8 / batch;
    return needed_bytes(assemble_run(t, kHostDevice, nullptr, nullptr, stage)->plan, unbounded);
  };
  ASSERT_GT(stage_need(8, 1), stage_need(8, 0));
  const MemoryBudget budget{kHostDevice, (stage_need(8, 0) + stage_need(8, 1)) / 2, 0,
                            "a test budget"};
  const BatchFit f = fit_batch(o, kHostDevice, budget, nullptr);
  EXPECT_LT(f.batch, 8) << f.reason;
  EXPECT_LE(stage_need(f.batch, 1), budget.budget) << f.reason;
  EXPECT_EQ(f.needed, std::max(stage_need(f.batch, 0), stage_need(f.batch, 1)));
}

TEST(Trainer, TinyModelsLearnTheLearnableTask) {
  TempDir dir("learn");
  for (const std::string type : {"bert", "gpt2"}) {
    TrainOptions o = tiny_options(write_config(dir, type, 0.0), dir / (type + "_out"));
    o.synthetic_task = "learnable";
    o.seq_len = 16;
    o.dataset_size = 256;
    o.max_steps = 150;
    o.logging_steps = 50;
    o.per_device_train_batch_size = 8;
    const Result r = run(o);
    // Chance: ln 2 for the labels, ln 28 for the 28 ids the sequences use.
    const double chance = type == "bert" ? std::log(2.0) : std::log(28.0);
    EXPECT_LT(r.losses.back(), 0.5 * chance) << type;
  }
}

// Each optimizer of --optim trains both tiny models on the learnable task, and resuming from
// a checkpoint (its state saved and restored) equals the uninterrupted run. 8-bit AdamW is run
// with min_8bit_size 256 so that the tiny models' matrices get 8-bit state.
struct OptimCase {
  std::string optim, args;
  double lr;
};
const OptimCase kOptimCases[] = {{"adafactor", "", 1e-2},
                                 // scale_parameter: steps relative to the weights RMS (~0.02)
                                 {"adafactor", "beta1=0.9,scale_parameter=true", 0.5},
                                 {"adamw_8bit", "min_8bit_size=256", 3e-3},
                                 {"sgd", "momentum=0.9,nesterov=true", 0.1}};

void use_optimizer(TrainOptions& o, const OptimCase& c) {
  o.optim = c.optim;
  o.optim_args = c.args;
  o.learning_rate = c.lr;
  o.weight_decay = 0.01;
}

TEST(Trainer, EveryOptimizerLearnsTheLearnableTask) {
  TempDir dir("learn_optim");
  for (const OptimCase& c : kOptimCases)
    for (const std::string type : {"bert", "gpt2"}) {
      const std::string tag = type + "_" + c.optim + "_" + c.args;
      TrainOptions o = tiny_options(write_config(dir, type, 0.0), dir / tag);
      o.synthetic_task = "learnable";
      o.seq_len = 16;
      o.dataset_size = 256;
      o.max_steps = 150;
      o.logging_steps = 50;
      o.per_device_train_batch_size = 8;
      use_optimizer(o, c);
      const Result r = run(o);
      const double chance = type == "bert" ? std::log(2.0) : std::log(28.0);
      EXPECT_LT(r.losses.back(), 0.5 * chance) << tag;
    }
}

TEST(Trainer, SchedulesFollowTransformers) {
  const Schedule linear{"linear", 2, 10}, cosine{"cosine", 2, 10}, constant{"constant", 2, 10},
      warm{"constant_with_warmup", 2, 10};
  EXPECT_DOUBLE_EQ(linear.factor(0), 0.0);
  EXPECT_DOUBLE_EQ(linear.factor(1), 0.5);
  EXPECT_DOUBLE_EQ(linear.factor(2), 1.0);
  EXPECT_DOUBLE_EQ(linear.factor(6), 0.5);
  EXPECT_DOUBLE_EQ(cosine.factor(6), 0.5);
  EXPECT_NEAR(cosine.factor(4), 0.5 * (1 + std::cos(M_PI * 0.25)), 1e-12);
  EXPECT_DOUBLE_EQ(constant.factor(0), 1.0);
  EXPECT_DOUBLE_EQ(warm.factor(1), 0.5);
  EXPECT_DOUBLE_EQ(warm.factor(9), 1.0);
  EXPECT_EQ(resolve_warmup_steps(0.1, 0, 95), 10);  // a fraction rounds up
  EXPECT_EQ(resolve_warmup_steps(7, 0, 95), 7);
  EXPECT_EQ(resolve_warmup_steps(0, 0.5, 9), 5);
}

}  // namespace
}  // namespace brisk::testing

namespace brisk::testing {
namespace {

TEST(Trainer, RefusesBadOptions) {
  TempDir dir("badopts");
  const TrainOptions base = tiny_options(write_config(dir, "gpt2", 0.0), dir / "out");
  auto refused = [&](auto change, const std::string& needle) {
    TrainOptions o = base;
    change(o);
    expect_error([&] { run(o); }, needle);
  };
  refused([](TrainOptions& o) { o.per_device_train_batch_size = 0; },
          "per_device_train_batch_size must be positive");
  refused([](TrainOptions& o) { o.gradient_accumulation_steps = 0; },
          "gradient_accumulation_steps must be positive");
  refused([](TrainOptions& o) { o.fp16 = o.bf16 = true; }, "contradict each other");
  refused([](TrainOptions& o) { o.lr_scheduler_type = "exotic"; }, "unknown lr_scheduler_type");
  refused([](TrainOptions& o) { o.save_strategy = "best"; }, "unknown save_strategy");
  refused([](TrainOptions& o) { o.selective_recompute = o.gradient_checkpointing = true; },
          "--selective_recompute and --gradient_checkpointing contradict");
  refused([](TrainOptions& o) { o.warmup_steps = 2.5; }, "whole number of steps");
  refused([](TrainOptions& o) { o.warmup_steps = 2, o.warmup_ratio = 0.1; },
          "warmup_steps and warmup_ratio contradict");
  refused([](TrainOptions& o) { o.optim = "adam_sgd"; }, "unknown optim \"adam_sgd\"");
  refused([](TrainOptions& o) { o.optim = "sgd", o.optim_args = "momentum=0.9,nesterov=perhaps"; },
          "nesterov must be true or false");
  refused([](TrainOptions& o) { o.bf16_master_weights = false; },
          "--bf16_master_weights false applies to --bf16 training only");
  refused([](TrainOptions& o) { o.device = "tpu"; }, "unknown device");
  refused([](TrainOptions& o) { o.offload_optimizer = "nvme"; },
          "unknown offload_optimizer \"nvme\" (valid: none, cpu)");
  refused(
      [](TrainOptions& o) {
        o.offload_optimizer = "cpu", o.bf16 = true, o.bf16_master_weights = false;
      },
      "offload_optimizer cpu with --bf16 needs the float32 master copy");
  refused([](TrainOptions& o) { o.weight_decay = -1; }, "weight_decay must not be negative");
  refused([](TrainOptions& o) { o.adam_beta1 = 1.0; }, "adam_beta1 must lie in [0, 1)");
  refused([](TrainOptions& o) { o.num_train_epochs = 0, o.max_steps = -1; },
          "num_train_epochs must be positive");
  refused([](TrainOptions& o) { o.synthetic_task = "chess"; }, "unknown synthetic_task");
  refused([](TrainOptions& o) { o.dataset_size = 3; }, "smaller than one batch");
  refused([](TrainOptions& o) { o.seq_len = 65; }, "exceeds max_position_embeddings");
  std::ofstream(dir / "a_file") << "not a folder";  // a folder cannot be made under a file
  refused([&](TrainOptions& o) { o.output_dir = dir / "a_file/sub"; }, "cannot create output_dir");
  refused([&](TrainOptions& o) { o.resume_from_checkpoint = dir / "nowhere"; }, "does not exist");

  TrainOptions o;
  expect_error(
      [&] {
        apply_options_json(o, {{"learning_rat", 1e-3}}, "x");
      },
      "unknown option \"learning_rat\"");
  expect_error(
      [&] {
        apply_options_json(o, {{"max_steps", "ten"}}, "x");
      },
      "option \"max_steps\" must be a whole number, got \"ten\"");
  expect_error([&] { load_options_file(o, fixture("bad/not_json.json")); }, "not valid JSON");
  apply_options_json(o, {{"max_steps", 7}, {"bf16", false}, {"lr_scheduler_type", "cosine"}}, "x");
  EXPECT_EQ(o.max_steps, 7);
  EXPECT_EQ(o.lr_scheduler_type, "cosine");
}

TEST(Trainer, RefusesBadTokenFilesAndCheckpoints) {
  TempDir dir("baddata");
  TrainOptions o = tiny_options(write_config(dir, "gpt2", 0.0), dir / "out");
  o.dataset = dir / "missing.bin";
  expect_error([&] { run(o); }, "cannot open token file");

  std::vector<uint32_t> tokens(100);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = 100 + i % 28;
  write_token_file(dir / "good.bin", tokens, 2);
  {  // cut the file short of what its header promises
    const auto size = fs::file_size(dir / "good.bin");
    fs::copy_file(dir / "good.bin", dir / "truncated.bin");
    fs::resize_file(dir / "truncated.bin", size - 10);
  }
  o.dataset = dir / "truncated.bin";
  expect_error([&] { run(o); }, "is truncated");
  tokens[37] = 500;
  write_token_file(dir / "oov.bin", tokens, 4);
  o.dataset = dir / "oov.bin";
  expect_error([&] { run(o); }, "token 500 at position 37 is outside the vocabulary");
  std::ofstream(dir / "junk.bin") << "definitely not tokens, but long enough for a header";
  o.dataset = dir / "junk.bin";
  expect_error([&] { run(o); }, "not a brisk token file");
  o.dataset = dir / "good.bin";
  o.seq_len = 40;  // 100 tokens make 2 sequences: fewer than one batch of 4
  expect_error([&] { run(o); }, "smaller than one batch");

  // A good token file trains, and its checkpoint resumes; one with a file removed is refused.
  o.seq_len = 12;
  o.per_device_train_batch_size = 2;
  const Result r = run(o);
  EXPECT_EQ(r.summary.global_step, 4);
  fs::remove(r.summary.last_checkpoint + "/optimizer.safetensors");
  o.resume_from_checkpoint = r.summary.last_checkpoint;
  o.output_dir = dir / "out2";
  expect_error([&] { run(o); }, "optimizer.safetensors is missing");
}

// A resumed run checks every value of trainer_state.json before using it.
TEST(Trainer, ResumeRefusesATamperedTrainerState) {
  TempDir dir("tampered");
  TrainOptions o = tiny_options(write_config(dir, "gpt2", 0.0), dir / "out");
  o.save_steps = 2;
  const Result r = run(o);
  const std::string state_file = dir / "out/checkpoint-2/trainer_state.json";
  std::ifstream in(state_file);
  const nlohmann::json good = nlohmann::json::parse(in);
  in.close();
  const std::vector<std::pair<nlohmann::json, std::string>> cases = {
      {{{"sample_position", -3}}, "\"sample_position\" must be a whole number"},
      {{{"global_step", 1e300}}, "\"global_step\" must be a whole number"},
      {{{"global_step", "2"}}, "\"global_step\" must be a whole number"},
      {{{"loss_scale", -1.0}}, "\"loss_scale\" must be a number from 1e-30 to 1.84467e+19"},
      {{{"loss_scale", 1e300}}, "\"loss_scale\" must be a number from 1e-30 to 1.84467e+19"},
      {{{"epoch", 1e300}}, "\"epoch\" must be a number from 0 to 1e+12"},
      {{{"growth_tracker", -1}}, "\"growth_tracker\" must be a whole number"},
      {{{"log_history", {1, 2}}}, "\"log_history\" must be a list of records"},
      {"[]", "trainer_state.json is not a JSON object"},
      {{{"log_history", "none"}}, "\"log_history\" must be a list of records"},
      {{{"sample_position", 1}}, "sample_position 1 is fewer than global_step 2"}};
  for (const auto& [patch, needle] : cases) {
    nlohmann::json bad = good;
    if (patch.is_string())
      bad = nlohmann::json::parse(patch.get<std::string>());
    else
      bad.merge_patch(patch);
    std::ofstream(state_file) << bad.dump();
    TrainOptions resumed = o;
    resumed.resume_from_checkpoint = dir / "out/checkpoint-2";
    resumed.output_dir = dir / "resumed";
    expect_error([&] { run(resumed); }, needle);
  }
  EXPECT_EQ(r.summary.global_step, 4);
}

TEST(Trainer, StartsFromAModelFolder) {
  TempDir dir("from_folder");
  TrainOptions o = tiny_options(write_config(dir, "bert", 0.0), dir / "first");
  const Result first = run(o);
  // The checkpoint folder is a model folder (config.json + model.safetensors): training from
  // it with learning rate 0 keeps its weights.
  TrainOptions again = o;
  again.model_name_or_path = first.summary.last_checkpoint;
  again.output_dir = dir / "second";
  again.learning_rate = 0;
  again.max_steps = 1;
  const Result second = run(again);
  EXPECT_EQ(checkpoint_weights(first.summary.last_checkpoint),
            checkpoint_weights(second.summary.last_checkpoint));
}

// A bf16 folder's config names bfloat16; the float32 weights a bf16 run saves are named float32
// (torch_dtype and dtype), in checkpoints and in output_dir, so transformers loads them as saved.
TEST(Trainer, ASavedConfigNamesTheDtypeOfTheSavedWeights) {
  TempDir dir("saved_dtype");
  const std::string folder = write_config(dir, "bert", 0.0);
  nlohmann::json config = read_json_file(folder + "/config.json", "config");
  config["torch_dtype"] = "bfloat16";
  config["dtype"] = "bfloat16";
  std::ofstream(folder + "/config.json") << config.dump();
  TrainOptions o = tiny_options(folder, dir / "out");
  o.bf16 = true;
  const Result r = run(o);
  for (const std::string& saved : {r.summary.last_checkpoint, o.output_dir}) {
    SCOPED_TRACE(saved);
    const nlohmann::json c = read_json_file(saved + "/config.json", "config");
    SafetensorsFile weights(saved + "/model.safetensors");
    ASSERT_FALSE(weights.names().empty());
    for (const auto& name : weights.names()) {
      EXPECT_EQ(c["torch_dtype"], dtype_name(weights.get(name).dtype())) << name;
      EXPECT_EQ(c["dtype"], dtype_name(weights.get(name).dtype())) << name;
    }
  }
}

}  // namespace
}  // namespace brisk::testing

namespace brisk::testing {
namespace {

TEST(Trainer, ANonFiniteLossStopsTheRunNamingTheStep) {
  TempDir dir("nan");
  TrainOptions o = tiny_options(write_config(dir, "gpt2", 0.0), dir / "out");
  o.learning_rate = 1e30;  // the first update destroys the weights
  o.max_grad_norm = 0;
  o.max_steps = 5;
  try {
    run(o);
    ADD_FAILURE() << "the run did not stop";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the loss became"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("at step 2"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(o.output_dir + "/checkpoint-2"));
}

// Without loss scaling an inf gradient is no overflow to skip but a run to stop; the step's
// update must not have been applied (the save at step 2 would hold it), so no checkpoint exists.
TEST(Trainer, ANonFiniteGradientStopsAnFp32RunNamingTheStep) {
  TempDir dir("inf_grad");
  TrainOptions o = tiny_options(write_config(dir, "bert", 0.0), dir / "out");
  o.save_steps = 1;
  FaultHooks faults;
  faults.overflow_at_step = 1;  // 0-based: the second step
  try {
    run(o, nullptr, faults);
    ADD_FAILURE() << "the run did not stop";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the gradient norm became inf at step 2"),
              std::string::npos)
        << e.what();
  }
  EXPECT_TRUE(fs::exists(o.output_dir + "/checkpoint-1"));
  EXPECT_FALSE(fs::exists(o.output_dir + "/checkpoint-2"));
}

TEST(Trainer, StartsFromATransformersModelFolder) {
  // tests/fixtures/gpt2_tiny was written by transformers' save_pretrained.
  TempDir dir("hf_folder");
  TrainOptions o = tiny_options(fixture("gpt2_tiny"), dir / "out");
  std::vector<uint32_t> tokens(60);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint32_t>(i * 7 % 89);
  write_token_file(dir / "tokens.bin", tokens, 2);
  o.dataset = dir / "tokens.bin";
  o.learning_rate = 0;
  o.max_steps = 1;
  const Result r = run(o);
  SafetensorsFile hf(fixture("gpt2_tiny/model.safetensors"));
  SafetensorsFile ours(r.summary.last_checkpoint + "/model.safetensors");
  for (const auto& name : ours.names()) {
    ASSERT_TRUE(hf.has(name)) << name;
    const Tensor &a = ours.get(name), &b = hf.get(name);
    ASSERT_EQ(a.shape(), b.shape()) << name;
    EXPECT_TRUE(std::equal(a.f32(), a.f32() + a.numel(), b.f32())) << name;
  }
}

// A base-model folder (BertModel, as sentence-transformers ships all-MiniLM-L6-v2: names without
// "bert.", no classifier, an extra position_ids buffer) loads as from_pretrained loads it: every
// base weight by its short name, the classifier newly initialized and reported.
TEST(Trainer, StartsFromABaseModelFolderAsFromPretrained) {
  TempDir dir("base_folder");
  // A full model's weights (one step at learning rate 0 saves the initialized model).
  TrainOptions o = tiny_options(write_config(dir, "bert", 0.0), dir / "full");
  o.learning_rate = 0;
  o.max_steps = 1;
  o.save_strategy = "no";
  run(o);
  const std::string folder = dir / "base";
  fs::create_directories(folder);
  fs::copy_file(o.output_dir + "/config.json", folder + "/config.json");
  SafetensorsFile full(o.output_dir + "/model.safetensors");
  std::vector<std::pair<std::string, Tensor>> base;
  for (const auto& name : full.names())
    if (name.rfind("bert.", 0) == 0) base.emplace_back(name.substr(5), full.get(name));
  std::vector<int64_t> position_ids(64);
  base.emplace_back("embeddings.position_ids",
                    Tensor(position_ids.data(), Shape{1, 64}, DType::i64));
  write_safetensors(folder + "/model.safetensors", base);
  o.model_name_or_path = folder;
  o.output_dir = dir / "out";
  o.seed = 7;  // another seed: the classifier is drawn anew
  std::vector<std::string> fresh;
  std::string warning;
  train(o, [&](const nlohmann::json& j) {
    if (j.contains("newly_initialized")) {
      fresh = j["newly_initialized"].get<std::vector<std::string>>();
      warning = j["warning"];
    }
  });
  EXPECT_EQ(fresh, (std::vector<std::string>{"classifier.bias", "classifier.weight"}));
  EXPECT_NE(
      warning.find("Some weights of BertForSequenceClassification were not initialized from "
                   "the model checkpoint at " +
                   folder + " and are newly initialized: ['classifier.bias', 'classifier.weight']"),
      std::string::npos)
      << warning;
  SafetensorsFile saved(o.output_dir + "/model.safetensors");  // learning rate 0: unchanged
  for (const auto& [name, t] : base) {
    if (name == "embeddings.position_ids") continue;
    const Tensor& a = saved.get("bert." + name);
    EXPECT_TRUE(std::equal(a.f32(), a.f32() + a.numel(), t.f32())) << name;
  }
  const Tensor& bias = saved.get("classifier.bias");
  EXPECT_TRUE(std::all_of(bias.f32(), bias.f32() + bias.numel(), [](float v) { return v == 0; }));
  // A base-model file missing a base weight is still refused by name.
  base.erase(base.begin());
  write_safetensors(folder + "/model.safetensors", base);
  expect_error([&] { train(o, [](const nlohmann::json&) {}); }, "lacks parameter 'bert.");
}
}  // namespace
}  // namespace brisk::testing
