// Data parallelism through the trainer on every rank of the job: N ranks with batch b train as
// one process with batch N x b (the same global batches: the loader shards each as
// DistributedSampler does), step by step and to the final weights, with and without gradient
// accumulation, for BERT and for a causal LM with uneven lengths (the loss normalized by the
// whole global batch's token count). Within 1e-5: the sums are taken in another order.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/json_file.h"
#include "core/safetensors.h"
#include "parallel/test_world.h"
#include "parallel/train_ranks.h"
#include "parallel/zero.h"
#include "test_support.h"
#include "train/assembly.h"
#include "train/trainer.h"
#include "trainer_support.h"

namespace brisk::testing {
namespace {

namespace fs = std::filesystem;

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
      const std::string model = dir.model(type);
      UnequalLengths lm_data(36);  // no rank's share wraps around on 2, 3 or 4 ranks
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
      expect_trains_as(ranks, single);
      const std::vector<float> b = checkpoint_weights(single.checkpoint);
      // The weights did move.
      TrainOptions none = one;
      none.output_dir = dir / "none";
      none.learning_rate = 0;
      const std::vector<float> still = checkpoint_weights(run(none, data, alone.get()).checkpoint);
      EXPECT_GT(rel_error(b.data(), still.data(), static_cast<int64_t>(b.size())), 1e-3);
    }
}

// A causal LM's rows (tests/fixtures/sft's lines, as TRL's SFTTrainer prepares them) padding-free
// and packed, over 2 accumulated micro-batches of a row each, under data parallelism, ZeRO 2 and
// (on an even number of ranks) tensor parallelism of 2: the ranks train as one process with their
// total batch (the loss over the window's label tokens of every rank).
TEST(DataParallel, RowsPaddingFreeAndPackedTrainAsOneProcess) {
  const int N = world().size();
  const std::unique_ptr<Communicator> alone = make_single_process();
  for (const std::string how : {"padding_free", "packing"})
    for (const std::string layout : {"dp", "zero2", "tp2"}) {
      if (layout == "tp2" && N % 2 != 0) continue;
      const std::string tag = how + "_" + layout;
      SCOPED_TRACE(tag);
      SharedDir dir("ddp_rows_" + tag);
      TrainOptions o = tiny_options(fixture("sft/llama"), dir / "ranks");
      o.tokenizer_name = fixture("tokenizer/bpe_llama3");
      o.train_file = fixture("sft/lines.txt");
      o.line_by_line = true;
      o.validation_split_percentage = 0;  // all 8 lines train
      o.block_size = 24;
      o.tokenized_cache_dir = "none";
      o.padding_free = how == "padding_free";
      o.packing = how == "packing";
      o.per_device_train_batch_size = 1;
      // Packed, the 8 lines fill 7 rows: 2 micro-batches on 4 ranks would wrap around.
      o.gradient_accumulation_steps = o.packing && N > 3 ? 1 : 2;
      o.max_steps = 1;
      o.save_steps = 1;
      o.learning_rate = 0.1;
      o.zero_stage = layout == "zero2" ? 2 : 0;
      o.tp_size = layout == "tp2" ? 2 : 1;
      const Logged ranks = run(o, nullptr, &world());
      if (world().rank() != 0) continue;
      TrainOptions one = o;
      one.output_dir = dir / "one";
      one.per_device_train_batch_size = N / o.tp_size;
      one.zero_stage = 0;
      one.tp_size = 1;
      expect_trains_as(ranks, run(one, nullptr, alone.get()));
    }
}

// A mixture of experts (a tiny Mixtral) on N ranks of 2 rows: without the load-balancing loss it
// trains as one process with their 2N rows (the experts' gradients summed over the ranks like any
// other); with it, each rank's loss is its own micro-batch's (as under transformers' DDP, not the
// global batch's: the loss is not linear in the routing counts), and ZeRO stages 2 and 3 (the
// experts' weights gathered with their blocks') train as plain data parallelism. To the sums'
// order (1e-5).
TEST(DataParallel, AMixtureOfExpertsTrainsAsOneProcessAndUnderZero) {
  const int N = world().size();
  const std::unique_ptr<Communicator> alone = make_single_process();
  for (const bool balance : {false, true}) {
    const std::string tag = balance ? "moe_balance" : "moe";
    SCOPED_TRACE(tag);
    SharedDir dir(tag);
    if (world().rank() == 0)
      write_tiny_mixtral(*dir.owned, std::string(R"("router_aux_loss_coef": 0.1, )") +
                                         R"("output_router_logits": )" +
                                         (balance ? "true" : "false"));
    world().barrier();
    TrainOptions o = tiny_options(dir / "mixtral", dir / "ranks");
    o.per_device_train_batch_size = 2;
    o.max_steps = 3;
    const Logged ranks = run(o, nullptr, &world());
    std::vector<Logged> zero;
    for (const int64_t stage : {2, 3}) {
      if (!balance) break;
      TrainOptions z = o;
      z.output_dir = dir / ("zero" + std::to_string(stage));
      z.zero_stage = stage;
      zero.push_back(run(z, nullptr, &world()));
    }
    if (world().rank() != 0) continue;
    if (balance) {
      for (const Logged& z : zero) expect_trains_as(z, ranks);
      continue;
    }
    TrainOptions one = o;
    one.output_dir = dir / "one";
    one.per_device_train_batch_size = 2 * N;
    expect_trains_as(ranks, run(one, nullptr, alone.get()));
  }
}

std::vector<nlohmann::json> records_of(const TrainOptions& o, Communicator* comm) {
  std::vector<nlohmann::json> records;
  train(
      o, [&](const nlohmann::json& j) { records.push_back(j); }, nullptr, {}, comm);
  return records;
}

// The eval_loss of every evaluation record, in order.
std::vector<double> eval_losses(const std::vector<nlohmann::json>& records) {
  std::vector<double> e;
  for (const nlohmann::json& r : records)
    if (r.contains("eval_loss")) e.push_back(r["eval_loss"].get<double>());
  return e;
}

// Evaluation is sharded (rank r takes every N-th batch) and its metrics made from every rank's
// counts: as one process's, to the order of the loss sums, for classification (accuracy, macro
// F1 of three labels), regression (MSE, Pearson, Spearman from every rank's pairs) and a causal
// LM (perplexity); predict_results.txt is the same file. Evaluation during training runs on every
// rank too, and load_best_model_at_end gives every rank the best weights.
TEST(DataParallel, EvaluationIsShardedAndReducedAsOneProcess) {
  const int N = world().size();
  const std::unique_ptr<Communicator> alone = make_single_process();
  for (const std::string task : {"classification", "regression", "causal_lm"}) {
    SCOPED_TRACE(task);
    SharedDir dir("ddp_eval_" + task);
    // The folder the writers below name.
    std::string model = dir / (task == "causal_lm" ? "gpt2_model" : "bert");
    if (world().rank() == 0) {
      if (task == "causal_lm") {
        model = write_config(*dir.owned, "gpt2", 0.0);
      } else {
        const char* labels[] = {"pos", "neg", "meh"};
        const char* words[] = {"good", "bad", "fine", "awful"};
        auto csv = [&](const std::string& name, int rows, int seed, bool labelled) {
          std::ofstream f(dir / name);
          f << (labelled ? "sentence,label\n" : "sentence\n");
          for (int i = 0; i < rows; ++i) {
            const int w = (i * 5 + seed) % 4;
            f << words[w] << " film " << (i % 3);
            if (labelled && task == "classification") f << "," << labels[(w + i / 4) % 3];
            if (labelled && task == "regression") f << "," << (w - 1.5f + 0.125f * (i % 5));
            f << "\n";
          }
        };
        csv("train.csv", 48, 1, true);
        csv("dev.csv", 26, 2, true);  // 7 batches of 4, the last partial: uneven shares
        csv("test.csv", 11, 3, false);
        model = write_wordpiece_bert(*dir.owned);
      }
    }
    world().barrier();
    TrainOptions o = tiny_options(model, dir / "ranks");
    if (task != "causal_lm") {
      o.tokenizer_name = fixture("tokenizer/wordpiece");
      o.train_file = dir / "train.csv";
      o.validation_file = dir / "dev.csv";
      o.test_file = dir / "test.csv";
      o.max_seq_length = 8;
      o.do_predict = true;
    } else {
      o.synthetic_task = "learnable";
      o.eval_dataset_size = 26;
    }
    o.per_device_train_batch_size = 2;
    o.max_steps = 6;
    o.do_eval = true;
    o.eval_strategy = "steps";
    o.eval_steps = 2;
    o.save_steps = 2;
    o.load_best_model_at_end = true;
    TrainOptions one = o;
    one.output_dir = dir / "one";
    one.per_device_train_batch_size = 2 * N;
    const std::vector<nlohmann::json> ranks = records_of(o, &world());
    std::vector<nlohmann::json> single;
    if (world().rank() == 0) single = records_of(one, alone.get());
    world().barrier();
    if (world().rank() != 0) {
      EXPECT_TRUE(ranks.empty()) << "only rank 0 logs";
    } else {
      // Training differs by its sums' order (1e-5): the evaluations as closely.
      const std::vector<double> a = eval_losses(ranks), b = eval_losses(single);
      ASSERT_EQ(a.size(), 4u);  // steps 2, 4, 6 and the final evaluation
      ASSERT_EQ(a.size(), b.size());
      for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-4 * b[i]) << i;
    }
    // Evaluating and predicting alone (the trained folder, no training): the same weights on
    // every rank, so the metrics equal one process's to the sums' order and the predictions
    // are the same file.
    TrainOptions eval_only = o;
    eval_only.model_name_or_path = dir / "one";
    eval_only.do_train = false;
    eval_only.per_device_eval_batch_size = 4;
    eval_only.output_dir = dir / "eval_ranks";
    TrainOptions eval_one = eval_only;
    eval_one.output_dir = dir / "eval_one";
    std::vector<nlohmann::json> eval_ranks;
    if (world().rank() == 0) records_of(eval_one, alone.get());
    world().barrier();
    eval_ranks = records_of(eval_only, &world());
    if (world().rank() != 0) continue;
    const nlohmann::json want = read_json_file(dir / "eval_one/eval_results.json", "eval results");
    const nlohmann::json got = read_json_file(dir / "eval_ranks/eval_results.json", "eval results");
    std::vector<std::string> metrics{"eval_loss"};
    if (task == "classification") metrics.insert(metrics.end(), {"eval_accuracy", "eval_f1"});
    if (task == "regression")
      metrics.insert(metrics.end(), {"eval_mse", "eval_pearson", "eval_spearmanr"});
    if (task == "causal_lm") metrics.push_back("perplexity");
    for (const std::string& m : metrics) {
      ASSERT_TRUE(got.contains(m)) << m << " in " << got.dump();
      EXPECT_NEAR(got[m].get<double>(), want[m].get<double>(),
                  1e-9 * std::abs(want[m].get<double>()))
          << m;
    }
    EXPECT_EQ(got["eval_samples"], 26);
    if (task == "classification") EXPECT_GT(want["eval_accuracy"].get<double>(), 0.0);
    if (task != "causal_lm") {
      const std::string predicted = read_text(dir / "eval_ranks/predict_results.txt");
      EXPECT_EQ(predicted, read_text(dir / "eval_one/predict_results.txt"));
      EXPECT_EQ(std::count(predicted.begin(), predicted.end(), '\n'), 12) << predicted;
    }
  }
}

// What a ZeRO save writes, read by rank 0 piece by piece from the ranks holding it: any range of
// any whole (parts of unequal length, one rank's empty, a whole only rank 0 holds) equals the
// ranks' parts laid end to end; the others serve until rank 0 is done, or until it goes
// without saying so (a failed write).
TEST(ZeroSaves, RankZeroReadsPiecesOfEveryRanksPartsWhileTheOthersServe) {
  const int N = world().size(), r = world().rank();
  auto length = [](size_t i, int q) -> int64_t {
    if (i == 0) return q == 1 ? 0 : 1000 + 37 * q;
    if (i == 1) return q == 0 ? 500 : 0;
    return 3;
  };
  auto byte = [](size_t i, int q, int64_t k) {
    return static_cast<uint8_t>((i * 31 + static_cast<size_t>(q) * 7 + static_cast<size_t>(k)) &
                                0xff);
  };
  std::vector<std::vector<uint8_t>> mine(3), whole(3);
  for (size_t i = 0; i < 3; ++i)
    for (int q = 0; q < N; ++q)
      for (int64_t k = 0; k < length(i, q); ++k) {
        whole[i].push_back(byte(i, q, k));
        if (q == r) mine[i].push_back(byte(i, q, k));
      }
  std::vector<Tensor> parts;
  for (auto& m : mine)
    parts.push_back(m.empty() ? Tensor()
                              : Tensor(m.data(), Shape{static_cast<int64_t>(m.size())}, DType::u8));
  {
    GatheredReads reads(world(), parts);
    for (size_t i = 0; i < 3; ++i)
      EXPECT_EQ(reads.whole_bytes(i), static_cast<int64_t>(whole[i].size())) << i;
    if (r == 0) {
      struct Range {
        size_t i, offset, bytes;
      };
      const size_t w0 = whole[0].size();
      for (const Range& g : {Range{0, 0, w0}, Range{0, 980, w0 - 990}, Range{0, w0 - 1, 1},
                             Range{0, 5, 0}, Range{1, 0, 500}, Range{1, 123, 7},
                             Range{2, 0, whole[2].size()}, Range{2, 2, whole[2].size() - 3}}) {
        std::vector<uint8_t> got(g.bytes + 1, 0xee);
        reads.read(g.i, g.offset, g.bytes, got.data());
        EXPECT_TRUE(std::equal(got.begin(), got.begin() + static_cast<std::ptrdiff_t>(g.bytes),
                               whole[g.i].begin() + static_cast<std::ptrdiff_t>(g.offset)))
            << "whole " << g.i << " from " << g.offset << ", " << g.bytes << " bytes";
        EXPECT_EQ(got.back(), 0xee) << "written past the piece";
      }
      reads.done();
    } else {
      reads.serve();
    }
  }
  {
    GatheredReads reads(world(), parts);
    if (r == 0) {
      std::vector<uint8_t> got(10);
      reads.read(0, 0, 10, got.data());
    } else {
      reads.serve();
    }
  }  // rank 0 goes without done(): the others' serve returns
  world().barrier();
}

// ZeRO stage 1 (each rank holds and updates the optimizer state of its share of the parameters,
// then the updated weights are broadcast from their owners) trains as plain data parallelism
// with every optimizer, bit for bit: the same gradient sums, the same per-element arithmetic.
// Stage 2 (each rank also keeps only its share of the summed gradients, summed segment by segment
// on every micro-batch while backward runs) to the sums' order (1e-5; Adafactor 5e-3, see below),
// with and without gradient accumulation, in whole segments and in small pieces. Checkpoints
// gather the state to rank 0 alone. The checkpoint's optimizer state (every rank's laid end
// to end) is the whole state, and a run resumes from it on another number of ranks, with or
// without ZeRO.
TEST(DataParallel, ZeroTrainsAsPlainDataParallelism) {
  const int N = world().size();
  const std::unique_ptr<Communicator> alone = make_single_process();
  struct Optim {
    std::string optim, args;
    double lr;
    bool bf16 = false;  // bf16 training: the float32 master copy is partitioned too
  };
  for (const int stage : {1, 2, 3})
    for (const int64_t accumulation : {int64_t{1}, int64_t{2}})
      for (const Optim& c : {Optim{"adamw_torch", "", 3e-3}, Optim{"adafactor", "beta1=0.9", 1e-2},
                             Optim{"adamw_8bit", "min_8bit_size=256", 3e-3},
                             Optim{"sgd", "momentum=0.9,nesterov=true", 0.1},
                             Optim{"adamw_torch", "", 3e-3, true}}) {
        if (stage == 1 && accumulation == 2) continue;  // stage 1 communicates as plain DDP
        // Stage 3 with accumulation (the blocks' weights gathered again for every micro-batch's
        // passes) for every optimizer, without it for AdamW alone.
        if (stage == 3 && accumulation == 1 && (c.optim != "adamw_torch" || c.bf16)) continue;
        const std::string tag = "zero" + std::to_string(stage) + "_" + c.optim +
                                (c.bf16 ? "_bf16" : "") + "_accumulation" +
                                std::to_string(accumulation);
        SCOPED_TRACE(tag);
        SharedDir dir(tag);
        // Five blocks: stage 2 stages them in two slots (two slots and the shard hold less
        // than whole gradients), summing one block's gradients while the next block's
        // backward computes; stage 3 gathers their weights into two slots likewise.
        const std::string model = dir.model("gpt2", 5);
        TrainOptions ddp = tiny_options(model, dir / "ddp");
        ddp.per_device_train_batch_size = 2;
        ddp.gradient_accumulation_steps = accumulation;
        ddp.max_steps = 4;
        ddp.save_steps = 2;
        use_optimizer(ddp, c.optim, c.args, c.lr);
        ddp.bf16 = c.bf16;
        // With accumulation, stage 2 sums in pieces of 262 elements (every segment cut into
        // several, cut again by the shards).
        if (accumulation == 2) ddp.ddp_bucket_cap_mb = 0.001;
        TrainOptions zero = ddp;
        zero.output_dir = dir / "zero";
        zero.zero_stage = stage;
        const Logged plain = run(ddp, nullptr, &world());
        const Logged sharded = run(zero, nullptr, &world());
        // Resumed from the sharded run's step-2 checkpoint: on one process, and on N ranks
        // without ZeRO; and the plain run's checkpoint on N ranks with ZeRO.
        TrainOptions resume_zero = zero;
        resume_zero.output_dir = dir / "resume_zero";
        resume_zero.resume_from_checkpoint = dir / "ddp/checkpoint-2";
        const Logged from_plain = run(resume_zero, nullptr, &world());
        TrainOptions resume_ddp = ddp;
        resume_ddp.output_dir = dir / "resume_ddp";
        resume_ddp.resume_from_checkpoint = dir / "zero/checkpoint-2";
        const Logged from_sharded = run(resume_ddp, nullptr, &world());
        Logged alone_resumed;
        if (world().rank() == 0) {
          TrainOptions one = ddp;
          one.output_dir = dir / "resume_one";
          one.per_device_train_batch_size = 2 * N;
          one.resume_from_checkpoint = dir / "zero/checkpoint-2";
          alone_resumed = run(one, nullptr, alone.get());
        }
        world().barrier();
        if (world().rank() != 0) continue;
        // Adafactor divides by the gradients' running RMS, so elements whose gradient is near
        // zero move by amounts the rounding sets: 5e-3 there (measured up to 3e-4 in stage 1 and
        // 2.0e-3 in stage 2 on 3 ranks). 8-bit moments and bf16 weights round to coarse steps
        // (bf16's is 2^-8) a last-bit difference can cross: 1e-4 for 8-bit (measured 1.4e-5),
        // 1e-3 for bf16 (measured 1.5e-5, and 1.5e-4 in the sanitizer build, whose bf16 products
        // take another path); the others 1e-5. A wait dropped for a slot fails by far more.
        const double order = c.optim == "adafactor"    ? 5e-3
                             : c.bf16                  ? 1e-3
                             : c.optim == "adamw_8bit" ? 1e-4
                                                       : 1e-5;
        const std::vector<float> want = checkpoint_weights(plain.checkpoint);
        auto expect_weights = [&](const Logged& got, double tolerance, const char* what) {
          const std::vector<float> w = checkpoint_weights(got.checkpoint);
          ASSERT_EQ(w.size(), want.size()) << what;
          if (tolerance == 0)
            EXPECT_EQ(w, want) << what;
          else
            EXPECT_LE(rel_error(w.data(), want.data(), static_cast<int64_t>(want.size())),
                      tolerance)
                << what;
        };
        // Stage 1 sums exactly as DDP; stages 2 and 3 sum each micro-batch's gradients across
        // the ranks before adding the micro-batches, and their reduce-scatter may add ranks in
        // another order than the all-reduce.
        const double exact = stage == 1 ? 0.0 : order;
        ASSERT_EQ(sharded.losses.size(), plain.losses.size());
        for (size_t i = 0; i < plain.losses.size(); ++i)
          EXPECT_NEAR(sharded.losses[i], plain.losses[i], exact * std::abs(plain.losses[i]))
              << "step " << i + 1;
        expect_weights(sharded, exact, "ZeRO");
        if (stage == 1) {
          EXPECT_EQ(optimizer_state(dir / "zero/checkpoint-2"),
                    optimizer_state(dir / "ddp/checkpoint-2"));
          EXPECT_EQ(optimizer_state(sharded.checkpoint), optimizer_state(plain.checkpoint));
        } else {
          const auto a = optimizer_state(sharded.checkpoint), b = optimizer_state(plain.checkpoint);
          ASSERT_EQ(a.size(), b.size());
          for (const auto& [name, v] : b) {
            ASSERT_TRUE(a.count(name)) << name;
            ASSERT_EQ(a.at(name).size(), v.size()) << name;
          }
        }
        expect_weights(from_plain, exact, "resumed with ZeRO from DDP's checkpoint");
        expect_weights(from_sharded, exact, "resumed without ZeRO from ZeRO's checkpoint");
        expect_weights(alone_resumed, order, "resumed on one process from ZeRO's checkpoint");
      }
}

// A checkpoint of one process with batch 4N resumes on N ranks of batch 4 on the samples the
// uninterrupted run takes (the data position is kept in samples of the global order), with file
// data, dynamic padding and group_by_length (mega-batches counted in the global batch).
TEST(DataParallel, OneProcesssCheckpointResumesOnTheRanksOnTheSameSamples) {
  const int N = world().size();
  const std::unique_ptr<Communicator> alone = make_single_process();
  SharedDir dir("resume_ranks");
  if (world().rank() == 0) {
    write_wordpiece_bert(*dir.owned);
    write_varied_csv(*dir.owned, "train.csv", 36);
  }
  world().barrier();
  TrainOptions o = tiny_options(dir / "bert", dir / "one");
  o.tokenizer_name = fixture("tokenizer/wordpiece");
  o.train_file = dir / "train.csv";
  o.max_seq_length = 16;
  o.group_by_length = true;
  o.per_device_train_batch_size = 4 * N;
  o.max_steps = 6;
  o.save_steps = 2;
  std::vector<nlohmann::json> straight;
  if (world().rank() == 0) straight = records_of(o, alone.get());
  world().barrier();
  TrainOptions ranks = o;
  ranks.output_dir = dir / "ranks";
  ranks.per_device_train_batch_size = 4;
  ranks.resume_from_checkpoint = dir / "one/checkpoint-2";
  const std::vector<nlohmann::json> resumed = records_of(ranks, &world());
  if (world().rank() != 0) return;
  auto steps = [](const std::vector<nlohmann::json>& records) {
    std::vector<nlohmann::json> s;
    for (const nlohmann::json& r : records)
      if (r.contains("loss")) s.push_back(r);
    return s;
  };
  const std::vector<nlohmann::json> want = steps(straight), got = steps(resumed);
  ASSERT_EQ(want.size(), 6u);
  ASSERT_EQ(got.size(), 4u);
  for (size_t i = 0; i < got.size(); ++i) {
    const nlohmann::json& w = want[i + 2];
    EXPECT_EQ(got[i]["epoch"].get<double>(), w["epoch"].get<double>()) << "step " << i + 3;
    EXPECT_NEAR(got[i]["loss"].get<double>(), w["loss"].get<double>(),
                1e-5 * std::abs(w["loss"].get<double>()))
        << "step " << i + 3;
  }
}

// offload_optimizer cpu with data parallelism and ZeRO (on the CPU ranks through the GPU's path,
// offload_on_cpu): each rank steps its run of the master copy and optimizer state in host memory
// from its downloaded run of the gradients; the runs equal those stepped in place bit for bit
// (the same operations on the same values), checkpoints included, and an offloaded ZeRO
// checkpoint resumes without offload as the uninterrupted run.
TEST(DataParallel, AnOffloadedOptimizerTrainsAsOneSteppedInPlace) {
  for (const int stage : {0, 1, 2, 3})
    for (const std::string optim : {"adamw_torch", "adamw_8bit"})
      for (const bool bf16 : {false, true}) {
        if (optim == "adamw_8bit" && (bf16 || stage == 1 || stage == 3)) continue;
        const std::string tag =
            "offload_zero" + std::to_string(stage) + "_" + optim + (bf16 ? "_bf16" : "");
        SCOPED_TRACE(tag);
        SharedDir dir(tag);
        const std::string model = dir.model("gpt2", 5);
        TrainOptions o = tiny_options(model, dir / "in_place");
        o.per_device_train_batch_size = 2;
        o.gradient_accumulation_steps = 2;
        o.max_steps = 4;
        o.save_steps = 2;
        use_optimizer(o, optim, optim == "adamw_8bit" ? "min_8bit_size=256" : "", 3e-3);
        o.bf16 = bf16;
        o.zero_stage = stage;
        TrainOptions off = o;
        off.output_dir = dir / "offloaded";
        off.offload_optimizer = "cpu";
        off.offload_on_cpu = true;
        const Logged in_place = run(o, nullptr, &world());
        const Logged offloaded = run(off, nullptr, &world());
        TrainOptions resumed = o;
        resumed.output_dir = dir / "resumed";
        resumed.resume_from_checkpoint = dir / "offloaded/checkpoint-2";
        const Logged continued = run(resumed, nullptr, &world());
        world().barrier();
        if (world().rank() != 0) continue;
        EXPECT_EQ(offloaded.losses, in_place.losses);
        EXPECT_EQ(checkpoint_weights(offloaded.checkpoint),
                  checkpoint_weights(in_place.checkpoint));
        EXPECT_EQ(optimizer_state(offloaded.checkpoint), optimizer_state(in_place.checkpoint));
        EXPECT_EQ(checkpoint_weights(continued.checkpoint),
                  checkpoint_weights(in_place.checkpoint));
      }
}

// ZeRO stage 3 keeps each rank's forward passes in step (every block's weights are gathered from
// every rank), in training and in evaluation, where ranks with no batch left run one without
// keeping it: a GPT-2 of five blocks (two weight slots) trains, evaluates every two steps and
// loads its best checkpoint as plain data parallelism does (to the sums' order), and a BERT's
// evaluation and predictions alone equal one process's (the same weights).
TEST(DataParallel, ZeroStage3KeepsTheRanksInStep) {
  const std::unique_ptr<Communicator> alone = make_single_process();
  SharedDir dir("zero3_eval");
  std::string gpt2 = dir / "gpt2_model", bert = dir / "bert_model";
  if (world().rank() == 0) {
    for (const std::string type : {"gpt2", "bert"}) write_config(*dir.owned, type, 0.0, 5);
  }
  world().barrier();
  TrainOptions o = tiny_options(gpt2, dir / "ddp");
  o.per_device_train_batch_size = 2;
  o.max_steps = 6;
  o.synthetic_task = "learnable";
  o.eval_dataset_size = 26;  // 7 batches of 4, the last partial: uneven shares
  o.per_device_eval_batch_size = 4;
  o.do_eval = true;
  o.eval_strategy = "steps";
  o.eval_steps = 2;
  o.save_steps = 2;
  o.load_best_model_at_end = true;
  TrainOptions zero = o;
  zero.output_dir = dir / "zero3";
  zero.zero_stage = 3;
  const std::vector<nlohmann::json> plain = records_of(o, &world());
  const std::vector<nlohmann::json> sharded = records_of(zero, &world());
  // No block gathered ahead (one slot): the same gathers, later, bit for bit.
  TrainOptions one_slot = zero;
  one_slot.output_dir = dir / "zero3_one_slot";
  one_slot.stage3_prefetch_bucket_size = 0;
  const std::vector<nlohmann::json> unfetched = records_of(one_slot, &world());
  // A run that does not train reads trained weights: a BERT's after one step, on rank 0 alone.
  if (world().rank() == 0) records_of(tiny_options(bert, dir / "bert_trained"), alone.get());
  world().barrier();
  TrainOptions predict = tiny_options(dir / "bert_trained", dir / "predict_ranks");
  predict.do_train = false;
  predict.do_eval = true;
  predict.do_predict = true;
  predict.eval_dataset_size = 26;
  predict.per_device_eval_batch_size = 4;
  predict.zero_stage = 3;
  TrainOptions predict_one = predict;
  predict_one.output_dir = dir / "predict_one";
  records_of(predict, &world());
  if (world().rank() == 0) records_of(predict_one, alone.get());
  world().barrier();
  if (world().rank() != 0) return;
  const std::vector<double> a = eval_losses(sharded), b = eval_losses(plain);
  ASSERT_EQ(a.size(), 4u);  // steps 2, 4, 6 and the final evaluation
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-5 * b[i]) << i;
  auto loaded = [](const std::vector<nlohmann::json>& recs) {
    for (const nlohmann::json& r : recs)
      if (r.contains("loaded_best_model"))
        return fs::path(r["loaded_best_model"].get<std::string>()).filename().string();
    return std::string();
  };
  EXPECT_FALSE(loaded(plain).empty());
  EXPECT_EQ(loaded(sharded), loaded(plain));
  const std::vector<float> w = checkpoint_weights(dir / "zero3"),
                           want = checkpoint_weights(dir / "ddp");
  ASSERT_EQ(w.size(), want.size());
  EXPECT_LE(rel_error(w.data(), want.data(), static_cast<int64_t>(want.size())), 1e-5);
  EXPECT_EQ(checkpoint_weights(dir / "zero3_one_slot"), w);
  EXPECT_EQ(eval_losses(unfetched), a);
  const nlohmann::json got = read_json_file(dir / "predict_ranks/eval_results.json", "eval"),
                       one = read_json_file(dir / "predict_one/eval_results.json", "eval");
  for (const char* m : {"eval_loss", "eval_accuracy"})
    EXPECT_NEAR(got[m].get<double>(), one[m].get<double>(), 1e-9 * std::abs(one[m].get<double>()))
        << m;
  const std::string predicted = read_text(dir / "predict_ranks/predict_results.txt");
  EXPECT_EQ(predicted, read_text(dir / "predict_one/predict_results.txt"));
  EXPECT_EQ(std::count(predicted.begin(), predicted.end(), '\n'), 27) << predicted;
}

// ZeRO stages 2 and 3 stage the embeddings' and the head's gradients over the blocks' slots (a
// tied head's embeddings' gradients apart), and stage 3 gathers their weights into the slots'
// space too, when a pass reaches them: every architecture trains as plain data parallelism does
// (to the sums' order), whichever weights its passes read and gradients they write — a BERT whose
// embedding LayerNorm its backward reads, fine-tuned from a base model's file that lacks the
// classifier (the head's place first gathered with its fresh classifier, then the pooler loaded
// over it), a masked LM whose decoder is the word embeddings, a Llama with its own head, a
// DistilBERT with sinusoidal positions written while the weights are initialized.
TEST(DataParallel, ZeroStagesStageTheEmbeddingsAndHeadOverTheSlots) {
  const int N = world().size();
  const std::unique_ptr<Communicator> alone = make_single_process();
  SharedDir dir("zero3_edges");
  const std::string base = dir / "base";
  const std::vector<std::pair<std::string, std::string>> models = {
      {"bert_finetuned", base},
      {"bert_mlm",
       R"({"model_type": "bert", "architectures": ["BertForMaskedLM"], "vocab_size": 128,
           "hidden_size": 32, "num_hidden_layers": 5, "num_attention_heads": 2,
           "intermediate_size": 48, "max_position_embeddings": 64, "hidden_dropout_prob": 0.0,
           "attention_probs_dropout_prob": 0.0})"},
      {"llama_untied",
       R"({"model_type": "llama", "vocab_size": 128, "hidden_size": 32, "num_hidden_layers": 5,
           "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 48,
           "max_position_embeddings": 64, "tie_word_embeddings": false})"},
      {"distilbert_sinusoidal",
       R"({"model_type": "distilbert", "vocab_size": 128, "dim": 32, "n_layers": 5, "n_heads": 2,
           "hidden_dim": 48, "max_position_embeddings": 64, "sinusoidal_pos_embds": true,
           "dropout": 0.0, "attention_dropout": 0.0})"}};
  if (world().rank() == 0) {
    // The base model: a trained BERT classifier's weights without the classifier's.
    TrainOptions o = tiny_options(write_config(*dir.owned, "bert", 0.0, 5), dir / "trained");
    o.max_steps = 1;
    run(o, nullptr, alone.get());
    SafetensorsFile trained(o.output_dir + "/model.safetensors");
    std::vector<std::pair<std::string, Tensor>> kept;
    // The embedding LayerNorm's scale far from the blocks' LayerNorms' (a backward that read
    // theirs in its place would move the weights in other directions).
    std::vector<float> scale(32);
    for (size_t j = 0; j < scale.size(); ++j) scale[j] = 0.5f + 0.25f * static_cast<float>(j % 7);
    for (const std::string& name : trained.names())
      if (name == "bert.embeddings.LayerNorm.weight")
        kept.emplace_back(name, Tensor(scale.data(), Shape{32}, DType::f32));
      else if (!name.starts_with("classifier."))
        kept.emplace_back(name, trained.get(name));
    fs::create_directories(base);
    fs::copy_file(dir / "bert_model/config.json", base + "/config.json");
    write_safetensors(base + "/model.safetensors", kept);
    for (const auto& [name, config] : models)
      if (name != "bert_finetuned") write_model_folder(*dir.owned, name, config);
  }
  world().barrier();
  for (const auto& [name, config] : models) {
    SCOPED_TRACE(name);
    TrainOptions ddp =
        tiny_options(name == "bert_finetuned" ? base : dir / name, dir / name + "_ddp");
    ddp.per_device_train_batch_size = 2;
    ddp.gradient_accumulation_steps = 2;
    ddp.max_steps = 3;
    const Logged plain = run(ddp, nullptr, &world());
    for (const int stage : {2, 3}) {
      SCOPED_TRACE("stage " + std::to_string(stage));
      TrainOptions zero = ddp;
      zero.output_dir = dir / name + "_zero" + std::to_string(stage);
      zero.zero_stage = stage;
      const auto planned = assemble_run(zero, Device::cpu, nullptr, nullptr, world().rank(), N);
      EXPECT_TRUE(planned->model->staged_gradients()) << "the gradients are not staged";
      EXPECT_EQ(planned->model->staged_weights(), stage == 3);
      const Logged sharded = run(zero, nullptr, &world());
      if (world().rank() == 0) expect_trains_as(sharded, plain);
    }
  }
}

// On GPUs, through NCCL (one GPU per rank; host buffers such as metrics go through it too): N
// ranks with batch 2 train as one GPU process with batch 2N, with gradient accumulation and
// buckets summed while backward runs, to the sums' order; ZeRO stages 1, 2 and 3 (five blocks:
// two slots) train as that, and their checkpoints, streamed to rank 0 from the GPUs, hold the
// same weights; stage 2 with the optimizer offloaded to the CPU trains as stage 2. Skips, saying
// why, without NCCL or without a GPU for every rank (NCCL refuses two ranks on one GPU).
TEST(DataParallel, GpuRanksTrainThroughNcclAsOneProcess) {
  std::string why;
  const std::unique_ptr<Communicator> nccl = nccl_world(&why);
  if (!nccl) GTEST_SKIP() << why;
  const int N = world().size(), r = world().rank();
  const std::unique_ptr<Communicator> alone = make_single_process();
  SharedDir dir("ddp_nccl");
  const std::string model = dir.model("gpt2", 5);
  UnequalLengths data;
  TrainOptions o = tiny_options(model, dir / "ranks", "cuda");
  o.per_device_train_batch_size = 2;
  o.gradient_accumulation_steps = 2;
  o.max_steps = 3;
  o.ddp_bucket_cap_mb = 0.01;
  const Logged ranks = run(o, &data, nccl.get());
  std::vector<Logged> zero;
  for (const int stage : {1, 2, 3}) {
    TrainOptions z = o;
    z.output_dir = dir / ("zero" + std::to_string(stage));
    z.zero_stage = stage;
    zero.push_back(run(z, &data, nccl.get()));
  }
  // Stage 2 with the optimizer offloaded: each rank's run stepped by its CPU.
  TrainOptions off = o;
  off.output_dir = dir / "zero2_offloaded";
  off.zero_stage = 2;
  off.offload_optimizer = "cpu";
  const Logged offloaded = run(off, &data, nccl.get());
  world().barrier();
  if (r != 0) return;
  for (size_t s = 0; s < zero.size(); ++s) {
    SCOPED_TRACE("ZeRO stage " + std::to_string(s + 1));
    expect_trains_as(zero[s], ranks);
  }
  // The CPU's AdamW and the GPU's round differently in the last bits.
  expect_trains_as(offloaded, zero[1], 1e-4);
  TrainOptions one = o;
  one.output_dir = dir / "one";
  one.per_device_train_batch_size = 2 * N;
  expect_trains_as(ranks, run(one, &data, alone.get()));
}

// What data parallelism does not do yet is refused on every rank alike, before any step.
TEST(DataParallel, UnsupportedRunsAreRefused) {
  SharedDir dir("ddp_refused");
  const std::string model = dir.model("bert");
  TrainOptions o = tiny_options(model, dir / "fit");
  o.auto_find_batch_size = true;
  expect_error([&] { run(o, nullptr, &world()); }, "--auto_find_batch_size in a run of");
}

}  // namespace
}  // namespace brisk::testing
