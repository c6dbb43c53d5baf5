// Tensor parallelism through the trainer on every rank of the job: tp ranks (with dp replicas
// over them, plain or under ZeRO 1-3) train as one process with the same global batch, step by
// step and to the final weights, which the run saves as the full model. The embeddings and
// language-model heads split by vocabulary (131 rows: the last rank's padded). GPT-2 (packed Conv1D
// query/key/value), a llama with grouped-query attention and BERT (post-norm), with dropout on
// where there is one replica (the attention's masks are drawn per head as one process draws them).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/json_file.h"
#include "models/sequence_parallel.h"
#include "parallel/tensor_parallel.h"
#include "parallel/test_world.h"
#include "parallel/train_ranks.h"
#include "test_support.h"
#include "train/assembly.h"
#include "train/fit.h"
#include "trainer_support.h"

namespace brisk::testing {
namespace {

TEST(TensorParallel, RanksTrainAsOneProcessWithTheSameGlobalBatch) {
  NEEDS_MPI();
  const int N = world().size();
  const int tp = N == 4 ? 2 : N, dp = N / tp;
  const double dropout = dp == 1 ? 0.1 : 0.0;  // replicas draw their own masks yet
  const std::unique_ptr<Communicator> alone = make_single_process();
  // BERT as a sequence classifier and as a masked LM (its decoder tied to the word embeddings,
  // both split by vocabulary, with the decoder's bias).
  for (const std::string type : {"gpt2", "llama", "bert", "bert_mlm"}) {
    SCOPED_TRACE(type + " on tp " + std::to_string(tp) + " x dp " + std::to_string(dp));
    SharedDir dir("tp_" + type);
    const bool mlm = type == "bert_mlm";
    const std::string model = write_model(dir, mlm ? "bert" : type, dropout);
    UnequalLengths lm_data;  // 18 samples: 3 steps of 3 micro-batches of 2 rows
    const Dataset* data = type == "bert" ? nullptr : &lm_data;
    TrainOptions o = tiny_options(model, dir / "ranks");
    o.mlm = mlm;  // every token a target
    o.per_device_train_batch_size = 2 / dp;
    o.gradient_accumulation_steps = 3;
    o.max_steps = 3;
    o.max_grad_norm = 0.05;  // every step clipped: the norm over the shares must be the whole's
    o.tp_size = tp;
    // Megatron's sequence parallelism pads lengths to a multiple of tp: one process's lengths.
    o.pad_to_max_length = 8 % tp != 0;
    TrainOptions one = o;
    one.output_dir = dir / "one";
    one.per_device_train_batch_size = 2;
    one.tp_size = 1;
    Logged single;
    if (world().rank() == 0) single = run(one, data, alone.get());
    // ZeRO over the data replicas (with one replica, plain data parallelism).
    // The optimizer offloaded (the GPU's path, run on the CPU) under ZeRO 1.
    for (const int64_t zero : {0, 1, 2, 3, -1}) {
      SCOPED_TRACE("zero_stage " + std::to_string(zero));
      o.zero_stage = zero < 0 ? 1 : zero;
      o.offload_optimizer = zero < 0 ? "cpu" : "none";
      o.offload_on_cpu = zero < 0;
      o.output_dir = dir / ("ranks_zero" + std::to_string(zero));
      const Logged ranks = run(o, data, &world());
      if (world().rank() != 0) continue;
      expect_trains_as(ranks, single);
      EXPECT_EQ(total_flos(o.output_dir), total_flos(one.output_dir));  // the whole model's
    }
    SCOPED_TRACE("without Megatron's sequence parallelism (every token on every rank)");
    o.zero_stage = 0;
    o.offload_optimizer = "none";
    o.offload_on_cpu = false;
    o.tp_sequence_parallel = false;
    o.output_dir = dir / "ranks_whole_tokens";
    const Logged whole = run(o, data, &world());
    if (world().rank() == 0) expect_trains_as(whole, single);
  }
}

// Padding-free batches on tensor ranks (with dp replicas over them): each rank's share of the
// heads attends within each sample, Megatron's sequence parallelism slices rows whose length is a
// multiple of the tensor ranks; the run trains as one process on the padded batches.
TEST(TensorParallel, PaddingFreeRanksTrainAsOneProcessPadded) {
  NEEDS_MPI();
  const int N = world().size();
  const int tp = N == 4 ? 2 : N, dp = N / tp;
  const std::unique_ptr<Communicator> alone = make_single_process();
  for (const std::string type : {"gpt2", "llama"}) {
    SCOPED_TRACE(type + " on tp " + std::to_string(tp) + " x dp " + std::to_string(dp));
    SharedDir dir("tp_padding_free_" + type);
    UnequalLengths data;
    TrainOptions o = tiny_options(write_model(dir, type, 0.0), dir / "ranks");
    o.per_device_train_batch_size = 2 / dp;
    o.gradient_accumulation_steps = 3;
    o.max_steps = 3;
    TrainOptions one = o;
    one.output_dir = dir / "one";
    one.per_device_train_batch_size = 2;
    Logged single;
    if (world().rank() == 0) single = run(one, &data, alone.get());
    o.tp_size = tp;
    o.padding_free = true;
    const Logged ranks = run(o, &data, &world());
    if (world().rank() == 0) expect_trains_as(ranks, single);
  }
}

// Megatron's sequence parallelism's exchanges with the world as the tensor group, against what
// each rank computes for the others: every rank's slice of the tokens gathered into every token
// (float32, and 16-bit data moved as its bits; one sequence and several), and each rank's tokens
// of the group's sum of whole tensors.
TEST(TensorParallel, TokenSlicesGatherAndReduceScatter) {
  NEEDS_MPI();
  const int N = world().size(), r = world().rank();
  auto be = make_backend(kHostDevice);
  const std::unique_ptr<TensorGroup> group = make_tensor_group(world());
  auto value = [](int64_t b, int64_t token, int64_t w) {
    return static_cast<float>((b * 100 + token) * 10 + w);
  };
  for (const int64_t B : {1, 3}) {
    SCOPED_TRACE("batch " + std::to_string(B));
    const int64_t t = 2, W = 5, T = t * N;
    const size_t n = static_cast<size_t>(B * T * W);
    std::vector<float> slice(n / N), full(n, -1.f), buffer(n, -1.f);
    std::vector<uint16_t> slice16(n / N), full16(n);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < t; ++i)
        for (int64_t w = 0; w < W; ++w) {
          const auto e = static_cast<size_t>((b * t + i) * W + w);
          slice[e] = value(b, r * t + i, w);
          slice16[e] = static_cast<uint16_t>(slice[e]);  // bits of some fp16 number
        }
    const Tensor buf(buffer.data(), Shape{B * T * W}, DType::f32);
    gather_tokens(*be, *group, Tensor(slice.data(), {B, t, W}, DType::f32),
                  Tensor(full.data(), {B, T, W}, DType::f32), buf);
    gather_tokens(*be, *group, Tensor(slice16.data(), {B, t, W}, DType::f16),
                  Tensor(full16.data(), {B, T, W}, DType::f16), buf);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < T; ++i)
        for (int64_t w = 0; w < W; ++w) {
          const auto e = static_cast<size_t>((b * T + i) * W + w);
          ASSERT_EQ(full[e], value(b, i, w)) << "sequence " << b << " token " << i;
          ASSERT_EQ(full16[e], static_cast<uint16_t>(value(b, i, w))) << "16-bit, token " << i;
        }
    // Rank q's whole tensor is (q + 1) times every value: the sum, N (N + 1) / 2 times.
    for (size_t e = 0; e < n; ++e) full[e] *= static_cast<float>(r + 1);
    std::vector<float> mine(n / N, -1.f);
    scatter_tokens_sum(*be, *group, Tensor(full.data(), {B, T, W}, DType::f32),
                       Tensor(mine.data(), {B, t, W}, DType::f32), buf);
    for (size_t e = 0; e < mine.size(); ++e)
      ASSERT_EQ(mine[e], slice[e] * static_cast<float>(N * (N + 1) / 2)) << "element " << e;
  }
  expect_error(
      [&] {
        std::vector<float> a(6), b(6 * N + 1);
        gather_tokens(*be, *group, Tensor(a.data(), {1, 2, 3}, DType::f32),
                      Tensor(b.data(), {1, 2 * N + 1, 3}, DType::f32), Tensor());
      },
      "is not a slice of");
}

// Gradient checkpointing (each block's forward run again in backward, its sums over the group
// with it), evaluation and prediction: BERT as one process, metrics and predictions alike. Then
// bf16 with selective recomputation, where the partial products are summed in float32 before
// their rounding, to bf16's precision, and fp16 with its loss scaling likewise.
TEST(TensorParallel, RecomputationEvaluationAndBf16RunAsOneProcess) {
  NEEDS_MPI();
  const int N = world().size();
  const int tp = N == 4 ? 2 : N, dp = N / tp;
  const std::unique_ptr<Communicator> alone = make_single_process();
  SharedDir dir("tp_recompute");
  const std::string model = write_model(dir, "bert", dp == 1 ? 0.1 : 0.0);
  TrainOptions o = tiny_options(model, dir / "ranks");
  o.per_device_train_batch_size = 4 / dp;
  o.max_steps = 3;
  o.tp_size = tp;
  o.gradient_checkpointing = true;
  o.do_eval = o.do_predict = true;
  o.eval_dataset_size = 10;
  o.per_device_eval_batch_size = 4 / dp;
  TrainOptions one = o;
  one.output_dir = dir / "one";
  one.per_device_train_batch_size = one.per_device_eval_batch_size = 4;
  one.tp_size = 1;
  const Logged ranks = run(o, nullptr, &world());
  TrainOptions bf16 = o, bf16_one = one;
  bf16.gradient_checkpointing = bf16_one.gradient_checkpointing = false;
  bf16.selective_recompute = bf16_one.selective_recompute = true;
  bf16.bf16 = bf16_one.bf16 = true;
  bf16.do_eval = bf16.do_predict = bf16_one.do_eval = bf16_one.do_predict = false;
  bf16.output_dir = dir / "ranks_bf16";
  bf16_one.output_dir = dir / "one_bf16";
  TrainOptions fp16 = bf16, fp16_one = bf16_one;
  fp16.bf16 = fp16_one.bf16 = false;
  fp16.fp16 = fp16_one.fp16 = true;
  fp16.output_dir = dir / "ranks_fp16";
  fp16_one.output_dir = dir / "one_fp16";
  const Logged ranks_bf16 = run(bf16, nullptr, &world());
  const Logged ranks_fp16 = run(fp16, nullptr, &world());
  if (world().rank() != 0) return;
  expect_trains_as(ranks, run(one, nullptr, alone.get()));
  expect_evaluates_as(dir / "ranks", dir / "one");
  expect_trains_as(ranks_bf16, run(bf16_one, nullptr, alone.get()), 1e-2);
  expect_trains_as(ranks_fp16, run(fp16_one, nullptr, alone.get()), 1e-2);
}

// Checkpoints hold the full model and optimizer state whatever the layout: the ranks resume one
// process's checkpoint and one process resumes the ranks', each ending as the run that went on.
TEST(TensorParallel, CheckpointsResumeOnAnotherLayout) {
  NEEDS_MPI();
  const int N = world().size();
  const int tp = N == 4 ? 2 : N, dp = N / tp;
  SharedDir dir("tp_resume");
  const std::string model = write_model(dir, "gpt2", dp == 1 ? 0.1 : 0.0);
  UnequalLengths data;
  TrainOptions o = tiny_options(model, dir / "ranks");
  o.per_device_train_batch_size = 2 / dp;
  o.max_steps = 4;
  o.save_steps = 2;
  o.tp_size = tp;
  o.pad_to_max_length = 8 % tp != 0;  // the same lengths as one process
  o.zero_stage = 2;  // the ranks' checkpoint gathered from ZeRO's runs of every share
  TrainOptions one = o;
  one.output_dir = dir / "one";
  one.per_device_train_batch_size = 2;
  one.tp_size = 1;
  one.zero_stage = 0;
  expect_resumes_across_layouts(o, one, &data);
}

// A llama folder (divisible_config's) with `kv_heads` key/value heads and biases on q, k, v and o.
std::string write_kv_model(const SharedDir& dir, const std::string& name, int kv_heads) {
  const std::string folder = dir / name;
  if (world().rank() == 0) {
    nlohmann::json c = divisible_config("llama", 0.0);
    c["num_key_value_heads"] = kv_heads;
    c["attention_bias"] = true;
    std::filesystem::create_directories(folder);
    std::ofstream(folder + "/config.json") << c.dump();
  }
  world().barrier();
  return folder;
}

// Key/value heads fewer than the tensor ranks: each rank keeps a copy of the one its query heads
// read (multi-query attention on 2 and 3 ranks; 2 key/value heads on 4 ranks, each copied
// twice), the copies sum their gradients, the norm counts them once and saves hold them once:
// as one process with every step clipped, and resumed across layouts with Adam's state. On 4
// ranks, copies under ZeRO 2 too (tp 2 x dp 2, one key/value head): the copies sum the data
// replicas' partitions of their gradients.
TEST(TensorParallel, KeyValueHeadsFewerThanTheRanksAreCopied) {
  NEEDS_MPI();
  const int N = world().size();
  SharedDir dir("tp_kv_copies");
  UnequalLengths data;
  TrainOptions o = tiny_options(write_kv_model(dir, "kv", N == 4 ? 2 : 1), dir / "ranks");
  o.per_device_train_batch_size = 2;
  o.gradient_accumulation_steps = 2;
  o.max_steps = 4;
  o.save_steps = 2;
  o.max_grad_norm = 0.05;
  o.tp_size = N;
  TrainOptions one = o;
  one.output_dir = dir / "one";
  one.tp_size = 1;
  expect_resumes_across_layouts(o, one, &data);
  if (N != 4) return;
  SCOPED_TRACE("tp 2 x dp 2 under ZeRO 2, one key/value head");
  TrainOptions zero = o;
  zero.model_name_or_path = write_kv_model(dir, "mqa", 1);
  zero.tp_size = 2;
  zero.zero_stage = 2;
  zero.per_device_train_batch_size = 1;
  zero.output_dir = dir / "zero2";
  TrainOptions zero_one = zero;
  zero_one.tp_size = 1;
  zero_one.zero_stage = 0;
  zero_one.per_device_train_batch_size = 2;
  zero_one.output_dir = dir / "zero2_one";
  const Logged ranks = run(zero, &data, &world());
  if (world().rank() != 0) return;
  const std::unique_ptr<Communicator> alone = make_single_process();
  expect_trains_as(ranks, run(zero_one, &data, alone.get()));
}

// An optimizer whose step reads a whole parameter, on tensor ranks: `optim` with `args` at
// learning rate `lr`, under ZeRO stage `zero` where there are replicas (`copied_args`: the
// arguments for the copies' run). Steps match one process's within `tolerance`; where
// `quantized`, the state too as expect_quantized_state_as says.
struct SplitStepCase {
  std::string optim, args, copied_args;
  double lr;
  int64_t zero;
  double tolerance = 1e-5;
  bool quantized = false;
};

// GPT-2 (its packed query/key/value split by columns, the vocabulary by rows with padding) as one
// process, with the optimizer in device memory and offloaded; then the llama of key/value copies
// (on 4 ranks each of its 2 heads held by 2), whose checkpoints (the whole parameters' state from
// tensor rank 0, per-element state by shares) resume across layouts.
void expect_split_steps_as_one_process(const SplitStepCase& c) {
  const int N = world().size();
  const int tp = N == 4 ? 2 : N, dp = N / tp;
  const std::unique_ptr<Communicator> alone = make_single_process();
  SharedDir dir("tp_" + c.optim);
  UnequalLengths data;
  TrainOptions o = tiny_options(write_model(dir, "gpt2", dp == 1 ? 0.1 : 0.0), dir / "ranks");
  o.optim = c.optim;
  o.optim_args = c.args;
  o.learning_rate = c.lr;
  o.per_device_train_batch_size = 2 / dp;
  o.gradient_accumulation_steps = 3;
  o.max_steps = 3;
  o.tp_size = tp;
  o.zero_stage = dp > 1 ? c.zero : 0;
  o.pad_to_max_length = 8 % tp != 0;
  TrainOptions one = o;
  one.output_dir = dir / "one";
  one.per_device_train_batch_size = 2;
  one.tp_size = 1;
  one.zero_stage = 0;
  const Logged ranks = run(o, &data, &world());
  TrainOptions offloaded = o;  // the GPU's path, run on the CPU: the host's backend steps
  offloaded.output_dir = dir / "ranks_offloaded";
  offloaded.offload_optimizer = "cpu";
  offloaded.offload_on_cpu = true;
  const Logged from_host = run(offloaded, &data, &world());
  if (world().rank() == 0) {
    const Logged single = run(one, &data, alone.get());
    for (const Logged* got : {&ranks, &from_host}) {
      SCOPED_TRACE(got->checkpoint);
      expect_trains_as(*got, single, c.tolerance);
      if (c.quantized) expect_quantized_state_as(got->checkpoint, single.checkpoint);
    }
  }
  world().barrier();
  SCOPED_TRACE("key/value heads copied on tp " + std::to_string(N));
  TrainOptions copied = o;
  copied.model_name_or_path = write_kv_model(dir, "kv", N == 4 ? 2 : 1);
  copied.output_dir = dir / "kv_ranks";
  copied.optim_args = c.copied_args;
  copied.per_device_train_batch_size = 2;
  copied.gradient_accumulation_steps = 2;
  copied.max_steps = 4;
  copied.save_steps = 2;
  copied.tp_size = N;
  copied.zero_stage = 0;
  TrainOptions copied_one = copied;
  copied_one.output_dir = dir / "kv_one";
  copied_one.tp_size = 1;
  expect_resumes_across_layouts(copied, copied_one, &data, c.tolerance);
  if (world().rank() != 0 || !c.quantized) return;
  const std::string want = copied_one.output_dir + "/checkpoint-4";
  for (const std::string& got : {copied.output_dir, copied.output_dir + "_from_one",
                                 copied_one.output_dir + "_from_ranks"}) {
    SCOPED_TRACE(got);
    expect_quantized_state_as(got + "/checkpoint-4", want);
  }
}

// Adafactor's statistics span whole parameters: each tensor rank keeps the whole second moment
// of its split parameters (row and column statistics, or a vector's elements) and sums its
// share's partial sums over the group (a copied slice counted once), so the step is one
// process's; with the first moment, scale_parameter and clipping on (unclipped for the copies,
// whose count would otherwise hide behind the clipping). Steps of 5% of each parameter's RMS, so
// that every statistic shows.
TEST(TensorParallel, AdafactorSumsSplitStatisticsAsOneProcess) {
  NEEDS_MPI();
  expect_split_steps_as_one_process({"adafactor",
                                     "beta1=0.9,scale_parameter=true,clip_threshold=0.5",
                                     "scale_parameter=true,clip_threshold=100", 0.05, 3});
}

// 8-bit AdamW's blocks of 256 values are the full parameter's: each tensor rank keeps every
// block's maxima of its split parameters, takes the group's largest of each, and quantizes its
// share's moments under them (min_8bit_size low enough for the tiny models' matrices); under
// ZeRO 2 with replicas, which cuts the float32 moments anywhere and keeps the 8-bit shares whole.
// The state is one process's, but for the codes another summation order moves onto a neighbour
// (expect_quantized_state_as), each such code moving its weight by up to the learning rate per
// step: weights and losses within 1e-3 (measured up to 1.4e-4 on 4 ranks, from 2 to 6 of 55,296
// codes a step apart after 3 steps).
TEST(TensorParallel, EightBitAdamWTakesBlockMaximaOverTheGroupAsOneProcess) {
  NEEDS_MPI();
  expect_split_steps_as_one_process(
      {"adamw_8bit", "min_8bit_size=256", "min_8bit_size=256", 0.01, 2, 1e-3, true});
}

// The bytes a rank sums over the tensor group in a run, and those it gathers and
// reduce-scatters under Megatron's sequence parallelism, are what `brisk estimate` prints
// (tensor_step_bytes and tensor_token_bytes, per step), with and without gradient checkpointing.
TEST(TensorParallel, SummedBytesAreTheEstimates) {
  NEEDS_MPI();
  const int N = world().size();
  const int tp = N == 4 ? 2 : N;
  SharedDir dir("tp_bytes");
  const std::string model = write_model(dir, "gpt2", 0.0);
  UnequalLengths data;
  const double A = 2 * 12 * 48 * 4;  // a float32 [2, 12, 48] tensor, per micro-batch
  const double stats = 24 * 3 * 4 * tp;
  for (const bool sequence : {false, true}) {
    for (const bool checkpointing : {false, true}) {
      SCOPED_TRACE(std::string("sequence parallel ") + (sequence ? "on" : "off") +
                   ", gradient_checkpointing " + (checkpointing ? "on" : "off"));
      TrainOptions o = tiny_options(
          model, dir / (std::to_string(sequence) + "_" + std::to_string(checkpointing)));
      o.tp_size = tp;
      o.tp_sequence_parallel = sequence;
      o.gradient_checkpointing = checkpointing;
      const std::vector<double> measured = statistics_of_two_steps(
          o, &data, {"tensor_parallel_sum_bytes", "tensor_parallel_token_bytes"});
      const auto run = assemble_run(o, kHostDevice, nullptr, &data, 0, N);
      EXPECT_EQ(measured[0], 2 * tensor_step_bytes(*run));
      EXPECT_EQ(measured[1], 2 * tensor_token_bytes(*run));
      if (!sequence) {
        // By hand: 2 blocks' 4 sums (and the first's attention output again, recomputing) and
        // 2 more, and 2 x 12 rows' 3 statistics from each rank, per micro-batch.
        const double sums = (checkpointing ? 9 : 8) + 2;
        EXPECT_EQ(tensor_step_bytes(*run), 2 * (sums * A + stats));
        EXPECT_EQ(tensor_token_bytes(*run), 0);
        continue;
      }
      // The embeddings' output and the head's input gradient summed, and the 2 blocks' 4 norm
      // parameters of 48 once a step; per block 10 tensors gathered or reduce-scattered (and 3
      // recomputing the first), and the ends' 2.
      EXPECT_EQ(tensor_step_bytes(*run), 2 * (2 * A + stats) + 2 * 4 * 48 * 4);
      EXPECT_EQ(tensor_token_bytes(*run), 2 * ((checkpointing ? 23 : 20) + 2) * A);
    }
  }
}

// On GPUs through NCCL (the tensor group split from the run's NCCL communicator): tp over the
// ranks, plain and under ZeRO 2, trains as one GPU process. Skipped without a GPU per rank.
TEST(TensorParallel, GpuRanksTrainThroughNcclAsOneProcess) {
  std::string why;
  const std::unique_ptr<Communicator> nccl = nccl_world(&why);
  if (!nccl) GTEST_SKIP() << why;
  const int N = world().size();
  const int tp = N == 4 ? 2 : N;
  expect_nccl_ranks_train_as_one_process(*nccl, "tp_nccl", N / tp,
                                         [&](TrainOptions& o) { o.tp_size = tp; });
}

// LoRA adapters on every block linear under tensor parallelism on GPUs (the adapters' CUDA
// products on each rank's shares, the group's sums through NCCL), plain and under ZeRO 2, train
// as one GPU process. Skipped without a GPU per rank.
TEST(TensorParallel, GpuLoraRanksTrainThroughNcclAsOneProcess) {
  std::string why;
  const std::unique_ptr<Communicator> nccl = nccl_world(&why);
  if (!nccl) GTEST_SKIP() << why;
  const int N = world().size();
  const int tp = N == 4 ? 2 : N;
  expect_nccl_ranks_train_as_one_process(
      *nccl, "tp_lora_nccl", N / tp, [&](TrainOptions& o) { o.tp_size = tp; },
      [](TrainOptions& o) {
        o.use_peft = true;
        o.lora_r = 4;
        o.lora_dropout = 0;
        o.lora_target_modules = "all-linear";
        o.learning_rate = 1e-2;
      });
}

// On GPUs the CUDA backend does not step tensor ranks' shares of whole-parameter state: adafactor
// and adamw_8bit under --tp_size are refused by name, and train as one process with the
// optimizer offloaded (the host's backend steps, the group's sums and maxima through the GPUs),
// one process's offloaded too. Skipped without a GPU per rank, and on one rank (no tensor group).
TEST(TensorParallel, GpuRanksStepWholeParameterOptimizersOffloaded) {
  std::string why;
  const std::unique_ptr<Communicator> nccl = nccl_world(&why);
  if (!nccl) GTEST_SKIP() << why;
  const int N = world().size();
  if (N < 2) GTEST_SKIP() << "tensor parallelism needs 2 ranks, one GPU each";
  const int tp = N == 4 ? 2 : N;
  const std::unique_ptr<Communicator> alone = make_single_process();
  for (const std::string optim : {"adafactor", "adamw_8bit"}) {
    SCOPED_TRACE(optim);
    const bool quantized = optim == "adamw_8bit";
    SharedDir dir("tp_nccl_" + optim);
    UnequalLengths data;
    TrainOptions one = tiny_options(write_model(dir, "llama", 0.0), dir / "one", "cuda");
    one.optim = optim;
    one.optim_args = quantized ? "min_8bit_size=256" : "beta1=0.9,scale_parameter=true";
    one.per_device_train_batch_size = 2;
    one.gradient_accumulation_steps = 3;
    one.max_steps = 3;
    TrainOptions o = one;
    o.output_dir = dir / "ranks";
    o.per_device_train_batch_size = 2 / (N / tp);
    o.tp_size = tp;
    expect_error([&] { run(o, &data, nccl.get()); }, "--offload_optimizer cpu");
    o.offload_optimizer = one.offload_optimizer = "cpu";
    const Logged ranks = run(o, &data, nccl.get());
    world().barrier();
    if (world().rank() == 0)
      expect_trains_as(ranks, run(one, &data, alone.get()), quantized ? 1e-3 : 1e-5);
    world().barrier();
  }
}

TEST(TensorParallel, UnsupportedLayoutsAreRefused) {
  NEEDS_MPI();
  const int N = world().size();
  SharedDir dir("tp_refused");
  const std::string model = write_model(dir, "gpt2", 0.0);
  TrainOptions o = tiny_options(model, dir / "out");
  o.tp_size = N + 1;
  expect_error([&] { run(o, nullptr, &world()); }, "does not divide");
}

}  // namespace
}  // namespace brisk::testing
