// Pipeline parallelism through the trainer on every rank of the job: stages (with dp replicas
// over them, or tensor ranks inside them) train as one process with the same global batch, step by
// step and to the final weights, which the run saves as the whole model. GPT-2 (tied embeddings on
// the first and last stages), a llama with grouped-query attention and untied head, and BERT
// (post-norm), with dropout on where there is one replica: the stages draw one process's masks,
// their forward run again before backward included.
#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/json_file.h"
#include "parallel/test_world.h"
#include "parallel/train_ranks.h"
#include "test_support.h"
#include "trainer_support.h"

namespace brisk::testing {
namespace {

constexpr int kLayers = 6;  // 2 and 3 stages divide them

// The layout of the world's ranks: pp 2 x dp 2 on 4 ranks, else as many stages as ranks.
struct Layout {
  int pp, dp;
  Layout() : pp(world().size() == 4 ? 2 : world().size()), dp(world().size() / pp) {}
  std::string str() const { return "pp " + std::to_string(pp) + " x dp " + std::to_string(dp); }
};

TEST(PipelineParallel, StagesTrainAsOneProcessWithTheSameGlobalBatch) {
  NEEDS_MPI();
  const Layout l;
  const double dropout = l.dp == 1 ? 0.1 : 0.0;  // replicas draw their own masks yet
  const std::unique_ptr<Communicator> alone = make_single_process();
  for (const std::string type : {"gpt2", "llama", "bert"}) {
    SCOPED_TRACE(type + " on " + l.str());
    SharedDir dir("pp_" + type);
    const std::string model = write_model(dir, type, dropout, kLayers);
    UnequalLengths lm_data;  // 18 samples
    const Dataset* data = type == "bert" ? nullptr : &lm_data;
    TrainOptions o = tiny_options(model, dir / "ranks");
    o.per_device_train_batch_size = 2 / l.dp;
    o.gradient_accumulation_steps = 4;  // more micro-batches than stages: the steady 1F1B
    o.max_steps = 3;
    o.max_grad_norm = 0.05;  // every step clipped: the norm over the stages must be the whole's
    o.pp_size = l.pp;
    TrainOptions one = o;
    one.output_dir = dir / "one";
    one.per_device_train_batch_size = 2;
    one.pp_size = 1;
    Logged single;
    if (world().rank() == 0) single = run(one, data, alone.get());
    // ZeRO stage 1 over the data replicas (with one replica, none); the optimizer offloaded
    // (the GPU's path, run on the CPU), under ZeRO 1 where there are replicas.
    for (const int64_t zero : {0, 1, 2, 3, -1}) {
      if (zero > 0 && l.dp == 1) continue;
      SCOPED_TRACE("zero_stage " + std::to_string(zero));
      o.zero_stage = zero < 0 ? (l.dp > 1 ? 1 : 0) : zero;
      o.offload_optimizer = zero < 0 ? "cpu" : "none";
      o.offload_on_cpu = zero < 0;
      // Stage 2's sums in pieces of 512 elements: the tied embeddings' sums in many chunks.
      o.ddp_bucket_cap_mb = zero == 2 ? 512.0 * 4 / (1 << 20) : 25;
      o.output_dir = dir / ("ranks_zero" + std::to_string(zero));
      const Logged ranks = run(o, data, &world());
      if (world().rank() != 0) continue;
      expect_trains_as(ranks, single);
      EXPECT_EQ(total_flos(o.output_dir), total_flos(one.output_dir));  // the whole model's
    }
  }
}

// Fewer micro-batches than stages (no steady phase), gradient checkpointing inside the stages,
// and bf16 and fp16 (its loss scaled on the last stage, its gradients unscaled on every one) with
// selective recomputation to their precision.
TEST(PipelineParallel, FewMicroBatchesRecomputationAndBf16RunAsOneProcess) {
  NEEDS_MPI();
  const Layout l;
  const std::unique_ptr<Communicator> alone = make_single_process();
  SharedDir dir("pp_variants");
  const std::string model = write_model(dir, "gpt2", l.dp == 1 ? 0.1 : 0.0, kLayers);
  UnequalLengths data;
  struct Variant {
    const char* name;
    int accumulation;
    bool checkpointing, bf16, fp16;
    double tolerance;
  };
  for (const Variant v : {Variant{"one micro-batch", 1, false, false, false, 1e-5},
                          Variant{"checkpointing", 3, true, false, false, 1e-5},
                          Variant{"bf16", 3, false, true, false, 1e-2},
                          Variant{"fp16", 3, false, false, true, 1e-2}}) {
    SCOPED_TRACE(std::string(v.name) + " on " + l.str());
    TrainOptions o = tiny_options(model, dir / (std::string("ranks_") + v.name));
    o.per_device_train_batch_size = 2 / l.dp;
    o.gradient_accumulation_steps = v.accumulation;
    o.max_steps = 3;
    o.gradient_checkpointing = v.checkpointing;
    o.bf16 = v.bf16;
    o.fp16 = v.fp16;
    o.selective_recompute = v.bf16 || v.fp16;
    o.pp_size = l.pp;
    TrainOptions one = o;
    one.output_dir = dir / (std::string("one_") + v.name);
    one.per_device_train_batch_size = 2;
    one.pp_size = 1;
    const Logged ranks = run(o, &data, &world());
    if (world().rank() == 0) expect_trains_as(ranks, run(one, &data, alone.get()), v.tolerance);
    world().barrier();
  }
}

// Evaluation and prediction through the stages (BERT, a classifier: the last stage's logits),
// during training (eval_steps) and after it, with the best model loaded at the end: metrics and
// predictions as one process's.
TEST(PipelineParallel, EvaluationAndPredictionRunThroughTheStages) {
  NEEDS_MPI();
  const Layout l;
  const std::unique_ptr<Communicator> alone = make_single_process();
  SharedDir dir("pp_eval");
  const std::string model = write_model(dir, "bert", l.dp == 1 ? 0.1 : 0.0, kLayers);
  TrainOptions o = tiny_options(model, dir / "ranks");
  o.per_device_train_batch_size = 4 / l.dp;
  o.max_steps = 4;
  o.pp_size = l.pp;
  o.do_eval = o.do_predict = true;
  o.eval_strategy = "steps";
  o.eval_steps = o.save_steps = 2;
  o.load_best_model_at_end = true;
  o.eval_dataset_size = 10;
  o.per_device_eval_batch_size = 4 / l.dp;
  TrainOptions one = o;
  one.output_dir = dir / "one";
  one.per_device_train_batch_size = one.per_device_eval_batch_size = 4;
  one.pp_size = 1;
  const Logged ranks = run(o, nullptr, &world());
  if (world().rank() != 0) return;
  expect_trains_as(ranks, run(one, nullptr, alone.get()));
  expect_evaluates_as(dir / "ranks", dir / "one");
  auto best = [&](const std::string& out) {  // the best checkpoint's folder name
    const nlohmann::json state = read_json_file(dir / (out + "/trainer_state.json"), "state");
    return std::filesystem::path(state["best_model_checkpoint"].get<std::string>()).filename();
  };
  EXPECT_EQ(best("ranks"), best("one"));
}

// The stages (o on layout l, 4 steps of 2 micro-batches, ZeRO stage `zero` over a stage's
// replicas) and one process with the same global batch, each resuming the other's checkpoint at
// step 2.
void expect_stages_resume_across_layouts(TrainOptions o, const Layout& l, const Dataset* data,
                                         int64_t zero = 1) {
  o.per_device_train_batch_size = 2 / l.dp;
  o.gradient_accumulation_steps = 2;
  o.max_steps = 4;
  o.save_steps = 2;
  o.pp_size = l.pp;
  o.zero_stage = l.dp > 1 ? zero : 0;  // the checkpoint gathered from ZeRO's runs of each stage
  TrainOptions one = o;
  one.output_dir = o.output_dir + "_one";
  one.per_device_train_batch_size = 2;
  one.pp_size = 1;
  one.zero_stage = 0;
  expect_resumes_across_layouts(o, one, data);
}

// Checkpoints hold the whole model and optimizer state: the stages resume one process's
// checkpoint and one process resumes the stages', each ending as the run that went on. The
// llama under ZeRO 1, GPT-2 (tied) under ZeRO 3 (the weights too gathered from the replicas'
// runs), where a stage has replicas.
TEST(PipelineParallel, CheckpointsResumeOnAnotherLayout) {
  NEEDS_MPI();
  for (const auto& [type, zero] : {std::pair{"llama", 1}, std::pair{"gpt2", 3}}) {
    SCOPED_TRACE(std::string(type) + " under zero_stage " + std::to_string(zero));
    SharedDir dir(std::string("pp_resume_") + type);
    UnequalLengths data;
    expect_stages_resume_across_layouts(
        tiny_options(write_model(dir, type, 0.0, kLayers), dir / "ranks"), Layout(), &data, zero);
  }
}

// Optimizers whose state is not laid out as the parameters: Adafactor (a matrix's row and column
// statistics, with the first moment on) and 8-bit AdamW (block-wise codes for the larger
// matrices, float32 moments for the rest, min_8bit_size low enough for the tiny model's blocks)
// step each stage's whole parameters as one process does, and their checkpoints, placed parameter
// by parameter, resume across layouts; on 4 ranks under ZeRO over each stage's 2 replicas (a
// partition between whole matrices for Adafactor, under stage 3; whole 256-value blocks for
// 8-bit AdamW, under stage 2).
TEST(PipelineParallel, PerTensorOptimizersTrainAndResumeAsOneProcess) {
  NEEDS_MPI();
  const Layout l;
  for (const std::string optim : {"adafactor", "adamw_8bit"}) {
    SCOPED_TRACE(optim + " on " + l.str());
    SharedDir dir("pp_" + optim);
    const std::string model = write_model(dir, "gpt2", 0.0, kLayers);  // a tied head
    UnequalLengths data;
    TrainOptions o = tiny_options(model, dir / "ranks");
    o.optim = optim;
    o.optim_args = optim == "adafactor" ? "beta1=0.9,scale_parameter=true" : "min_8bit_size=256";
    o.max_grad_norm = 0.05;
    expect_stages_resume_across_layouts(o, l, &data, optim == "adafactor" ? 3 : 2);
  }
}

// Tensor parallelism inside the stages, tp 2 x pp 2 on 4 ranks: each stage's blocks split over
// its tensor ranks, each tensor rank exchanging activations with its counterpart in the next
// stage. GPT-2, the grouped-query llama and BERT as one process, with dropout; then one process
// resumes the 4 ranks' checkpoint (assembled from every stage's tensor shares).
TEST(PipelineParallel, TensorParallelStagesTrainAsOneProcess) {
  NEEDS_MPI();
  if (world().size() != 4) GTEST_SKIP() << "tp 2 x pp 2 needs 4 ranks, not " << world().size();
  const std::unique_ptr<Communicator> alone = make_single_process();
  for (const std::string type : {"gpt2", "llama", "bert"}) {
    SCOPED_TRACE(type + " on tp 2 x pp 2");
    SharedDir dir("tp_pp_" + type);
    const std::string model = write_model(dir, type, 0.1, kLayers);
    UnequalLengths lm_data;
    const Dataset* data = type == "bert" ? nullptr : &lm_data;
    TrainOptions o = tiny_options(model, dir / "ranks");
    o.per_device_train_batch_size = 2;
    o.gradient_accumulation_steps = 3;
    o.max_steps = 4;
    o.save_steps = 2;
    o.max_grad_norm = 0.05;
    o.pp_size = 2;
    o.tp_size = 2;
    TrainOptions one = o;
    one.output_dir = dir / "one";
    one.pp_size = one.tp_size = 1;
    const Logged ranks = run(o, data, &world());
    if (world().rank() != 0) continue;
    const Logged single = run(one, data, alone.get());
    expect_trains_as(ranks, single);
    TrainOptions from_ranks = one;
    from_ranks.output_dir = dir / "one_from_ranks";
    from_ranks.resume_from_checkpoint = dir / "ranks/checkpoint-2";
    expect_resumes_as(run(from_ranks, data, alone.get()), single);
  }
  // Adafactor (with its first moment), each stage's split statistics summed over its tensor
  // ranks, and 8-bit AdamW, its blocks' maxima taken over them; their checkpoints (whole-parameter
  // state from tensor rank 0, per-element state by shares) resume across layouts. 8-bit codes
  // as TensorParallel.EightBitAdamWTakesBlockMaximaOverTheGroupAsOneProcess compares them.
  for (const std::string optim : {"adafactor", "adamw_8bit"}) {
    SCOPED_TRACE(optim + " on tp 2 x pp 2");
    const bool quantized = optim == "adamw_8bit";
    SharedDir dir("tp_pp_" + optim);
    UnequalLengths data;
    TrainOptions o = tiny_options(write_model(dir, "gpt2", 0.0, kLayers), dir / "ranks");
    o.optim = optim;
    o.optim_args = quantized ? "min_8bit_size=256" : "beta1=0.9,scale_parameter=true";
    o.learning_rate = 0.01;
    o.per_device_train_batch_size = 2;
    o.gradient_accumulation_steps = 2;
    o.max_steps = 4;
    o.save_steps = 2;
    o.pp_size = o.tp_size = 2;
    TrainOptions one = o;
    one.output_dir = dir / "one";
    one.pp_size = one.tp_size = 1;
    expect_resumes_across_layouts(o, one, &data, quantized ? 1e-3 : 1e-5);
    if (world().rank() == 0 && quantized)
      for (const std::string& got :
           {o.output_dir, o.output_dir + "_from_one", one.output_dir + "_from_ranks"})
        expect_quantized_state_as(got + "/checkpoint-4", one.output_dir + "/checkpoint-4");
    world().barrier();
  }
}

// A pipeline around tensor parallelism reports both layers' measures: the stages' bubble and the
// tensor group's sums (each layer adds its statistics to those of the policy within).
TEST(PipelineParallel, TensorParallelStagesReportBothLayersStatistics) {
  NEEDS_MPI();
  if (world().size() != 4) GTEST_SKIP() << "tp 2 x pp 2 needs 4 ranks, not " << world().size();
  SharedDir dir("tp_pp_statistics");
  const std::string model = write_model(dir, "gpt2", 0.0, kLayers);
  UnequalLengths data;
  TrainOptions o = tiny_options(model, dir / "ranks");
  o.pp_size = o.tp_size = 2;
  const std::vector<double> got =
      statistics_of_two_steps(o, &data, {"pipeline_bubble_share", "tensor_parallel_sum_bytes"});
  EXPECT_GE(got[0], 0.0);
  EXPECT_GT(got[1], 0.0);
  world().barrier();
}

// On GPUs through NCCL (the stages' activations sent with ncclSend/ncclRecv): a llama on the
// ranks' stages trains as one GPU process. Skipped without a GPU per rank.
TEST(PipelineParallel, GpuStagesTrainThroughNcclAsOneProcess) {
  std::string why;
  const std::unique_ptr<Communicator> nccl = nccl_world(&why);
  if (!nccl) GTEST_SKIP() << why;
  const Layout l;
  const std::unique_ptr<Communicator> alone = make_single_process();
  SharedDir dir("pp_nccl");
  const std::string model = write_model(dir, "llama", 0.0, kLayers);
  UnequalLengths data;
  TrainOptions o = tiny_options(model, dir / "ranks", "cuda");
  o.per_device_train_batch_size = 2 / l.dp;
  o.gradient_accumulation_steps = 4;
  o.max_steps = 3;
  o.pp_size = l.pp;
  const Logged ranks = run(o, &data, nccl.get());
  world().barrier();
  if (world().rank() != 0) return;
  TrainOptions one = o;
  one.output_dir = dir / "one";
  one.per_device_train_batch_size = 2;
  one.pp_size = 1;
  expect_trains_as(ranks, run(one, &data, alone.get()));
}

TEST(PipelineParallel, UnsupportedLayoutsAreRefused) {
  NEEDS_MPI();
  const Layout l;
  SharedDir dir("pp_refused");
  // Block counts that do not divide: models/config's pipeline_share (test_tensor_split.cpp).
  const std::string model = write_model(dir, "gpt2", 0.0, kLayers);
  TrainOptions o = tiny_options(model, dir / "out");
  o.pp_size = world().size() + 1;
  expect_error([&] { run(o, nullptr, &world()); }, "does not divide");
}

}  // namespace
}  // namespace brisk::testing
