// Sequence parallelism (DeepSpeed-Ulysses) on every rank of the job: the all-to-all exchanges
// between a rank's tokens of every head and every token of its heads, against what each rank
// computes for the others; then sp ranks (with dp replicas over them, plain, under ZeRO 1 and 3,
// and with the optimizer offloaded) train as one process with the same global batch, step by
// step and to the final weights.
// GPT-2 (learned positions, dropout on with one replica: every mask keyed by its token's place
// in the whole sequence), a llama with grouped-query attention (rotary positions from the rank's
// first token) and BERT's masked LM (post-norm, every token attending every token).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "models/config.h"
#include "models/sequence_parallel.h"
#include "parallel/sequence_parallel.h"
#include "parallel/test_world.h"
#include "parallel/train_ranks.h"
#include "test_support.h"
#include "train/assembly.h"
#include "train/fit.h"
#include "trainer_support.h"

namespace brisk::testing {
namespace {

// The value of sequence b's token `token` (of the whole sequence) in column `column`.
float entry(int64_t b, int64_t token, int64_t column) {
  return static_cast<float>((b * 100 + token) * 100 + column);
}

// The world's ranks as sequence x data ranks: 4 as 2 x 2, fewer as sequence ranks alone.
struct SequenceLayout {
  int sp, dp;
};
SequenceLayout sequence_layout() {
  const int N = world().size();
  const int sp = N == 4 ? 2 : N;
  return {sp, N / sp};
}

// The ranks' options `o` (dp data replicas) as one process's with the same global batches.
TrainOptions as_one_process(TrainOptions o, const std::string& out, int dp) {
  o.output_dir = out;
  o.per_device_train_batch_size *= dp;
  o.per_device_eval_batch_size *= dp;
  o.sp_size = 1;
  return o;
}

TEST(SequenceParallel, ExchangesMoveTokensForHeadsAndBack) {
  NEEDS_MPI();
  const int N = world().size(), r = world().rank();
  auto be = make_backend(kHostDevice);
  CommunicatorSequenceGroup group(world());
  // Query, key and value columns of 2N, N and N: each rank's part 2, 1 and 1 of them.
  const ColumnGroups columns{{2 * N, N, N}, 3};
  const int64_t B = 2, t = 3, W = 4 * N, T = t * N;
  std::vector<float> tokens(static_cast<size_t>(B * t * W)), heads(tokens.size(), -1.f);
  std::vector<float> back(tokens.size(), -1.f), buffer(tokens.size(), -1.f);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < t; ++i)
      for (int64_t c = 0; c < W; ++c) tokens[(b * t + i) * W + c] = entry(b, r * t + i, c);
  auto tensor = [](std::vector<float>& v, Shape s) { return Tensor(v.data(), s, DType::f32); };
  const Tensor mine = tensor(tokens, {B, t, W}), theirs = tensor(heads, {B, T, 4});
  const Tensor buf = tensor(buffer, {B * t * W});
  tokens_to_heads(*be, group, mine, theirs, columns, buf);
  // This rank's columns: 2 of the query group, 1 of the key's, 1 of the value's.
  const int64_t own[4] = {2 * r, 2 * r + 1, 2 * N + r, 3 * N + r};
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < T; ++i)
      for (int64_t k = 0; k < 4; ++k)
        ASSERT_EQ(heads[(b * T + i) * 4 + k], entry(b, i, own[k]))
            << "sequence " << b << " token " << i << " column " << k;
  heads_to_tokens(*be, group, theirs, tensor(back, {B, t, W}), columns, buf);
  EXPECT_EQ(back, tokens);
  EXPECT_EQ(group.bytes(), 2.0 * B * t * W * sizeof(float));
  // A buffer too small, or heads of another shape, are refused by name.
  expect_error([&] { tokens_to_heads(*be, group, mine, theirs, columns, tensor(buffer, {5})); },
               "sequence exchange: a buffer of");
  expect_error(
      [&] {
        tokens_to_heads(*be, group, mine, tensor(heads, {B, t, 4 * N}), columns, buf);
      },
      "sequence exchange");
}

// Key/value columns fewer than the ranks: each rank receives a copy of the whole key and value
// groups (2 columns each) beside its 2 query columns; back, the ranks' copies are summed (here
// every rank returns what it received, so each key/value column comes back N times its value).
TEST(SequenceParallel, ExchangesCopyKeyValueHeadsFewerThanTheRanksAndSumThemBack) {
  NEEDS_MPI();
  const int N = world().size(), r = world().rank();
  auto be = make_backend(kHostDevice);
  CommunicatorSequenceGroup group(world());
  const ColumnGroups columns{{2 * N, 2, 2}, 3, {1, N, N}};
  const int64_t B = 2, t = 3, W = 2 * N + 4, T = t * N, P = 6;
  ASSERT_EQ(columns.part(N), P);
  std::vector<float> tokens(static_cast<size_t>(B * t * W)), heads(static_cast<size_t>(B * T * P));
  std::vector<float> back(tokens.size(), -1.f), buffer(heads.size(), -1.f);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < t; ++i)
      for (int64_t c = 0; c < W; ++c) tokens[(b * t + i) * W + c] = entry(b, r * t + i, c);
  auto tensor = [](std::vector<float>& v, Shape s) { return Tensor(v.data(), s, DType::f32); };
  const Tensor buf = tensor(buffer, {B * T * P});
  tokens_to_heads(*be, group, tensor(tokens, {B, t, W}), tensor(heads, {B, T, P}), columns, buf);
  const int64_t own[P] = {2 * r, 2 * r + 1, 2 * N, 2 * N + 1, 2 * N + 2, 2 * N + 3};
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < T; ++i)
      for (int64_t k = 0; k < P; ++k)
        ASSERT_EQ(heads[(b * T + i) * P + k], entry(b, i, own[k]))
            << "sequence " << b << " token " << i << " column " << k;
  heads_to_tokens(*be, group, tensor(heads, {B, T, P}), tensor(back, {B, t, W}), columns, buf);
  for (size_t e = 0; e < tokens.size(); ++e)
    ASSERT_EQ(back[e], static_cast<int64_t>(e) % W < 2 * N ? tokens[e] : N * tokens[e])
        << "element " << e;
}

TEST(SequenceParallel, RanksTrainAsOneProcessWithTheSameGlobalBatch) {
  NEEDS_MPI();
  const auto [sp, dp] = sequence_layout();
  const double dropout = dp == 1 ? 0.1 : 0.0;  // data replicas draw their own masks yet
  const std::unique_ptr<Communicator> alone = make_single_process();
  for (const std::string type : {"gpt2", "llama", "bert"}) {
    SCOPED_TRACE(type + " on sp " + std::to_string(sp) + " x dp " + std::to_string(dp));
    SharedDir dir("sp_" + type);
    const std::string model = write_model(dir, type, dropout);
    UnequalLengths data;  // 18 samples of 4 to 12 tokens: 3 steps of 3 micro-batches of 2 rows
    TrainOptions o = tiny_options(model, dir / "ranks");
    o.mlm = type == "bert";  // every token a target (BertForMaskedLM)
    o.per_device_train_batch_size = 2 / dp;
    o.gradient_accumulation_steps = 3;
    o.max_steps = 3;
    o.max_grad_norm = 0.05;  // every step clipped: the norm is the whole gradients'
    o.sp_size = sp;
    // Dynamic padding rounds lengths to multiples of 8 and of sp: 3 ranks pad to 12 where one
    // process pads to 8, and the masks, keyed by place in the padded batch, would differ.
    o.pad_to_max_length = 8 % sp != 0;
    const TrainOptions one = as_one_process(o, dir / "one", dp);
    Logged single;
    if (world().rank() == 0) single = run(one, &data, alone.get());
    // ZeRO over the data and sequence ranks together; the optimizer offloaded (the GPU's path,
    // run on the CPU) under ZeRO 1.
    for (const int64_t zero : {0, 1, 3, -1}) {
      SCOPED_TRACE("zero_stage " + std::to_string(zero));
      o.zero_stage = zero < 0 ? 1 : zero;
      o.offload_optimizer = zero < 0 ? "cpu" : "none";
      o.offload_on_cpu = zero < 0;
      o.output_dir = dir / ("ranks_zero" + std::to_string(zero));
      const Logged ranks = run(o, &data, &world());
      if (world().rank() != 0) continue;
      expect_trains_as(ranks, single);
    }
  }
}

// Grouped-query attention with fewer key/value heads than sequence ranks (one on 2 and 3 ranks,
// two on 4): each rank attends with a copy of the key/value head its query heads read, the
// copies' gradients summed on the way back; as one process with attention dropout, plain and
// recomputing.
TEST(SequenceParallel, KeyValueHeadsFewerThanTheRanksAreCopied) {
  NEEDS_MPI();
  const int sp = world().size();
  const std::unique_ptr<Communicator> alone = make_single_process();
  SharedDir dir("sp_kv_copies");
  const std::string model = dir / "llama_model";
  if (world().rank() == 0) {
    nlohmann::json c = divisible_config("llama", 0.0);
    c["num_key_value_heads"] = sp == 4 ? 2 : 1;
    c["attention_dropout"] = 0.1;
    std::filesystem::create_directories(model);
    std::ofstream(model + "/config.json") << c.dump();
  }
  world().barrier();
  UnequalLengths data;
  for (const bool checkpointing : {false, true}) {
    SCOPED_TRACE(checkpointing ? "gradient checkpointing" : "plain");
    TrainOptions o = tiny_options(model, dir / (checkpointing ? "ranks_recompute" : "ranks"));
    o.per_device_train_batch_size = 2;
    o.gradient_accumulation_steps = 3;
    o.max_steps = 3;
    o.max_grad_norm = 0.05;
    o.sp_size = sp;
    o.pad_to_max_length = true;  // 12 tokens: every degree splits them
    o.gradient_checkpointing = checkpointing;
    const TrainOptions one = as_one_process(o, dir / (checkpointing ? "one_recompute" : "one"), 1);
    const Logged ranks = run(o, &data, &world());
    if (world().rank() == 0) expect_trains_as(ranks, run(one, &data, alone.get()));
  }
}

// Gradient checkpointing (each block's forward with its exchanges run again in backward) and
// evaluation (each rank's tokens' losses summed), then bf16 with selective recomputation (the
// attention statistics rebuilt from the exchanged qkv), and fp16 with its loss scaling: GPT-2 as
// one process, the 16-bit runs to their precision.
TEST(SequenceParallel, RecomputationAndBf16RunAsOneProcess) {
  NEEDS_MPI();
  const auto [sp, dp] = sequence_layout();
  const std::unique_ptr<Communicator> alone = make_single_process();
  SharedDir dir("sp_recompute");
  const std::string model = write_model(dir, "gpt2", dp == 1 ? 0.1 : 0.0);
  UnequalLengths data;
  TrainOptions o = tiny_options(model, dir / "ranks");
  o.per_device_train_batch_size = 2 / dp;
  o.max_steps = 3;
  o.sp_size = sp;
  o.pad_to_max_length = 8 % sp != 0;  // the same lengths as one process (above)
  o.gradient_checkpointing = true;
  o.do_eval = true;
  o.eval_strategy = "steps";
  o.eval_steps = 2;
  o.eval_dataset_size = 10;
  o.per_device_eval_batch_size = 4 / dp;
  const TrainOptions one = as_one_process(o, dir / "one", dp);
  const Logged ranks = run(o, &data, &world());
  TrainOptions bf16 = o, bf16_one = one;
  bf16.do_eval = bf16_one.do_eval = false;
  bf16.eval_strategy = bf16_one.eval_strategy = "no";
  bf16.gradient_checkpointing = bf16_one.gradient_checkpointing = false;
  bf16.selective_recompute = bf16_one.selective_recompute = true;
  bf16.bf16 = bf16_one.bf16 = true;
  bf16.output_dir = dir / "ranks_bf16";
  bf16_one.output_dir = dir / "one_bf16";
  TrainOptions fp16 = bf16, fp16_one = bf16_one;
  fp16.bf16 = fp16_one.bf16 = false;
  fp16.fp16 = fp16_one.fp16 = true;
  fp16.output_dir = dir / "ranks_fp16";
  fp16_one.output_dir = dir / "one_fp16";
  const Logged ranks_bf16 = run(bf16, &data, &world());
  const Logged ranks_fp16 = run(fp16, &data, &world());
  if (world().rank() != 0) return;
  expect_trains_as(ranks, run(one, &data, alone.get()));
  const auto eval_loss = [](const std::string& out) {
    return read_json_file(out + "/eval_results.json", "eval results")["eval_loss"].get<double>();
  };
  EXPECT_NEAR(eval_loss(o.output_dir), eval_loss(one.output_dir), 1e-5 * eval_loss(one.output_dir));
  expect_trains_as(ranks_bf16, run(bf16_one, &data, alone.get()), 1e-2);
  expect_trains_as(ranks_fp16, run(fp16_one, &data, alone.get()), 1e-2);
}

// A sequence classifier (BERT on synthetic labels, dropout on with one replica): the rank holding
// the first tokens computes the head and the loss, the others' labels are none; training,
// evaluation's metrics and the predictions are one process's.
TEST(SequenceParallel, ClassifiersTrainEvaluateAndPredictAsOneProcess) {
  NEEDS_MPI();
  const auto [sp, dp] = sequence_layout();
  const std::unique_ptr<Communicator> alone = make_single_process();
  SharedDir dir("sp_classifier");
  const std::string model = write_model(dir, "bert", dp == 1 ? 0.1 : 0.0);
  TrainOptions o = tiny_options(model, dir / "ranks");
  o.per_device_train_batch_size = 4 / dp;
  o.max_steps = 3;
  o.max_grad_norm = 0.05;
  o.sp_size = sp;
  o.do_eval = o.do_predict = true;
  o.eval_dataset_size = 10;
  o.per_device_eval_batch_size = 4 / dp;
  const TrainOptions one = as_one_process(o, dir / "one", dp);
  const Logged ranks = run(o, nullptr, &world());
  if (world().rank() != 0) return;
  expect_trains_as(ranks, run(one, nullptr, alone.get()));
  expect_evaluates_as(dir / "ranks", dir / "one");
}

// Checkpoints hold the whole model and optimizer state: the sequence ranks (under ZeRO 2, its
// runs over them) resume one process's checkpoint and one process resumes theirs, each ending as
// the run that went on.
TEST(SequenceParallel, CheckpointsResumeOnAnotherLayout) {
  NEEDS_MPI();
  const auto [sp, dp] = sequence_layout();
  SharedDir dir("sp_resume");
  const std::string model = write_model(dir, "gpt2", dp == 1 ? 0.1 : 0.0);
  UnequalLengths data;
  TrainOptions o = tiny_options(model, dir / "ranks");
  o.per_device_train_batch_size = 2 / dp;
  o.max_steps = 4;
  o.save_steps = 2;
  o.sp_size = sp;
  o.pad_to_max_length = 8 % sp != 0;  // the same lengths as one process
  o.zero_stage = 2;
  TrainOptions one = as_one_process(o, dir / "one", dp);
  one.zero_stage = 0;
  expect_resumes_across_layouts(o, one, &data);
}

// On 4 ranks, sequence parallelism composed: tp 2 x sp 2 (each tensor rank's heads split again
// among its sequence ranks; ZeRO over the sequence ranks) and pp 2 x sp 2 (the stages pass their
// tokens' activations), each as one process with dropout on.
TEST(SequenceParallel, WithTensorOrPipelineRanksTrainsAsOneProcess) {
  NEEDS_MPI();
  if (world().size() != 4) GTEST_SKIP() << "needs 4 ranks (Dist.SequenceParallelOn4Ranks)";
  const std::unique_ptr<Communicator> alone = make_single_process();
  for (const std::string type : {"gpt2", "llama"}) {
    SharedDir dir("sp_composed_" + type);
    // Head counts tp x sp divides: GPT-2 4 heads, the llama 12 over 4 key/value heads.
    const std::string model = dir / "model";
    if (world().rank() == 0) {
      nlohmann::json c = divisible_config(type, 0.1);
      c[type == "gpt2" ? "n_head" : "num_key_value_heads"] = 4;
      std::filesystem::create_directories(model);
      std::ofstream(model + "/config.json") << c.dump();
    }
    world().barrier();
    UnequalLengths data;
    TrainOptions o = tiny_options(model, dir / "ranks");
    o.per_device_train_batch_size = 2;
    o.gradient_accumulation_steps = 3;
    o.max_steps = 3;
    o.max_grad_norm = 0.05;
    o.sp_size = 2;
    const TrainOptions one = as_one_process(o, dir / "one", 1);
    Logged single;
    if (world().rank() == 0) single = run(one, &data, alone.get());
    for (const char* layout : {"tp", "tp_zero1", "pp"}) {
      SCOPED_TRACE(type + " on " + layout + " 2 x sp 2");
      TrainOptions l = o;
      l.output_dir = dir / layout;
      (layout[0] == 't' ? l.tp_size : l.pp_size) = 2;
      l.zero_stage = std::string(layout) == "tp_zero1" ? 1 : 0;
      const Logged ranks = run(l, &data, &world());
      if (world().rank() == 0) expect_trains_as(ranks, single);
    }
  }
}

// On GPUs through NCCL (the sequence group split from the run's NCCL communicator, the exchanges'
// packing by cudaMemcpy2DAsync): sp over the ranks, plain and under ZeRO 2, trains as one GPU
// process. Skipped without a GPU per rank (one GPU: NCCL takes one rank per device).
TEST(SequenceParallel, GpuRanksTrainThroughNcclAsOneProcess) {
  std::string why;
  const std::unique_ptr<Communicator> nccl = nccl_world(&why);
  if (!nccl) GTEST_SKIP() << why;
  if (world().size() < 2) GTEST_SKIP() << "sequence parallelism needs 2 ranks, one GPU each";
  const auto [sp, dp] = sequence_layout();
  expect_nccl_ranks_train_as_one_process(*nccl, "sp_nccl", dp,
                                         [sp](TrainOptions& o) { o.sp_size = sp; });
}

// The bytes a rank passes to its all-to-alls in a run are what `brisk estimate` prints
// (sequence_step_bytes of the run's plan, per step): with and without gradient checkpointing,
// float32 and bf16 (where the products read bf16, the attention output is exchanged back as its
// bf16 copy), at the planned length. A llama (grouped-query qkv); then one with a single
// key/value head, which every rank receives a copy of.
TEST(SequenceParallel, ExchangedBytesAreTheEstimates) {
  NEEDS_MPI();
  const int sp = sequence_layout().sp;
  SharedDir dir("sp_bytes");
  const std::string llama = write_model(dir, "llama", 0.0);
  const std::string mqa = dir / "mqa";
  if (world().rank() == 0) {
    nlohmann::json c = divisible_config("llama", 0.0);
    c["num_key_value_heads"] = 1;
    std::filesystem::create_directories(mqa);
    std::ofstream(mqa + "/config.json") << c.dump();
  }
  world().barrier();
  UnequalLengths data;
  for (const int variant : {0, 1, 2, 3}) {
    const bool checkpointing = variant == 1, bf16 = variant == 2;
    const std::string model = variant == 3 ? mqa : llama;
    TrainOptions o = tiny_options(model, dir / ("variant" + std::to_string(variant)));
    o.bf16 = bf16;
    o.sp_size = sp;
    o.gradient_checkpointing = checkpointing;
    const double measured = statistic_of_two_steps(o, &data, "sequence_all_to_all_bytes");
    const double estimated = sequence_step_bytes(*assemble_run(o, kHostDevice, nullptr, &data));
    EXPECT_EQ(measured, 2 * estimated)  // two steps
        << "gradient_checkpointing " << checkpointing << ", bf16 " << bf16;
    // Float32 activations are exchanged as float32 throughout: 4 bytes a value.
    if (!bf16)
      EXPECT_EQ(estimated,
                sequence_exchange_bytes(resolve_config(model), 2, 12, sp, 2, checkpointing, 4));
    if (variant != 3) continue;
    // By hand: a rank's 2 x 12 / sp tokens of qkv (12 query heads and sp copies of the key and
    // value heads, 4 columns each) and of the 48-wide output forward; backward the output's
    // gradient, the output and the qkv gradient: 2 blocks, 2 micro-batches.
    const double tokens = 2.0 * 12 / sp, qkv = (12.0 + 2 * sp) * 4;
    const double forward = tokens * (qkv + 48) * 4, backward = tokens * (qkv + 48 + 48) * 4;
    EXPECT_EQ(estimated, 2 * 2 * (forward + backward));
  }
}

// What every rank refuses before the run starts (the head counts and lengths a share refuses:
// TensorSplit.SequenceShares...).
TEST(SequenceParallel, UnsupportedLayoutsAreRefused) {
  NEEDS_MPI();
  const int N = world().size();
  SharedDir dir("sp_refused");
  const std::string gpt2 = write_model(dir, "gpt2", 0.0);
  TrainOptions o = tiny_options(gpt2, dir / "out");
  o.sp_size = N + 1;
  expect_error([&] { run(o, nullptr, &world()); }, "does not divide");
  o.sp_size = 5000;
  expect_error([&] { run(o, nullptr, &world()); }, "sp_size must lie in [0, 4096], got 5000");
}

}  // namespace
}  // namespace brisk::testing
