// What the tests of training on every rank of the job share: a folder every rank sees, a run's
// logged losses and last checkpoint, and the comparison of two runs.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <array>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "core/json_file.h"
#include "core/quantization.h"
#include "parallel/test_world.h"
#include "test_support.h"
#include "train/trainer.h"
#include "trainer_support.h"

namespace brisk::testing {

// A folder every rank sees: rank 0's TempDir (removed with it), named by rank 0's pid.
struct SharedDir {
  std::unique_ptr<TempDir> owned;  // rank 0
  std::string path;
  explicit SharedDir(const std::string& name) {
    double pid = world().rank() == 0 ? static_cast<double>(::getpid()) : 0.0;
    world().broadcast(Tensor(&pid, Shape{1}, DType::f64), 0);
    if (world().rank() == 0) owned = std::make_unique<TempDir>(name);
    path = (std::filesystem::temp_directory_path() /
            ("brisk_" + name + "_" + std::to_string(static_cast<long>(pid))))
               .string();
    world().barrier();
  }
  ~SharedDir() { world().barrier(); }  // nobody still reads when rank 0 removes it
  std::string operator/(const std::string& rel) const { return path + "/" + rel; }
  // A tiny model's folder (trainer_support's write_config), written by rank 0 while the others
  // wait.
  std::string model(const std::string& type, int layers = 2) const {
    if (world().rank() == 0) write_config(*owned, type, 0.0, layers);
    world().barrier();
    return *this / (type + "_model");
  }
};

// A config whose head and MLP counts 2 and 3 divide: 6 query heads (llama: 12 query heads in
// groups of two over 6 key/value heads); `layers` blocks. A vocabulary of 131 (a prime): tensor
// ranks split it with padding.
inline nlohmann::json divisible_config(const std::string& type, double dropout, int layers = 2) {
  if (type == "gpt2")
    return {{"model_type", "gpt2"},   {"vocab_size", 131},     {"n_embd", 48},
            {"n_layer", layers},      {"n_head", 6},           {"n_positions", 64},
            {"resid_pdrop", dropout}, {"embd_pdrop", dropout}, {"attn_pdrop", dropout}};
  if (type == "llama")
    return {{"model_type", "llama"},       {"vocab_size", 131},
            {"hidden_size", 48},           {"num_hidden_layers", layers},
            {"num_attention_heads", 12},   {"num_key_value_heads", 6},
            {"intermediate_size", 60},     {"max_position_embeddings", 64},
            {"tie_word_embeddings", false}};
  return {{"model_type", "bert"},
          {"vocab_size", 131},
          {"hidden_size", 48},
          {"num_hidden_layers", layers},
          {"num_attention_heads", 6},
          {"intermediate_size", 66},
          {"max_position_embeddings", 64},
          {"hidden_dropout_prob", dropout},
          {"attention_probs_dropout_prob", dropout}};
}

// divisible_config's model folder, written by rank 0 while the others wait.
inline std::string write_model(const SharedDir& dir, const std::string& type, double dropout,
                               int layers = 2) {
  const std::string folder = dir / (type + "_model");
  if (world().rank() == 0) {
    std::filesystem::create_directories(folder);
    std::ofstream(folder + "/config.json") << divisible_config(type, dropout, layers).dump();
  }
  world().barrier();
  return folder;
}

// A file's whole text ("" when it cannot be read).
inline std::string read_text(const std::string& path) {
  std::ifstream f(path);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// The total_flos a run wrote in its trainer_state.json (the whole model's operations, as
// Trainer counts them).
inline double total_flos(const std::string& out) {
  return read_json_file(out + "/trainer_state.json", "trainer state")["total_flos"].get<double>();
}

struct Logged {
  std::vector<double> losses;
  std::string checkpoint;
};

inline Logged run(const TrainOptions& o, const Dataset* data, Communicator* comm) {
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

// The run `got` trains as `want`: the same logged losses and final weights, within `tolerance`
// (relative; sums taken in another order).
inline void expect_trains_as(const Logged& got, const Logged& want, double tolerance = 1e-5) {
  ASSERT_EQ(got.losses.size(), want.losses.size());
  for (size_t i = 0; i < want.losses.size(); ++i)
    EXPECT_NEAR(got.losses[i], want.losses[i], tolerance * std::abs(want.losses[i]))
        << "step " << i + 1;
  const std::vector<float> a = checkpoint_weights(got.checkpoint),
                           b = checkpoint_weights(want.checkpoint);
  ASSERT_EQ(a.size(), b.size());
  EXPECT_LE(rel_error(a.data(), b.data(), static_cast<int64_t>(a.size())), tolerance);
}

// Runs `o` on the world's ranks for 2 steps of 2 micro-batches of 2 rows, every batch padded
// to the planned 12 tokens (set in `o`), and returns its parallel statistic `name` (a byte or
// second count train_results reports), -1 if absent.
inline std::vector<double> statistics_of_two_steps(TrainOptions& o, const Dataset* data,
                                                   const std::vector<std::string>& names) {
  o.per_device_train_batch_size = 2;
  o.gradient_accumulation_steps = 2;
  o.max_steps = 2;
  o.pad_to_max_length = true;
  const TrainSummary s = train(
      o, [](const nlohmann::json&) {}, data, {}, &world());
  std::vector<double> values(names.size(), -1);
  for (const auto& [statistic, value] : s.parallel)
    for (size_t i = 0; i < names.size(); ++i)
      if (statistic == names[i]) values[i] = value;
  return values;
}
inline double statistic_of_two_steps(TrainOptions& o, const Dataset* data,
                                     const std::string& name) {
  return statistics_of_two_steps(o, data, {name})[0];
}

// The runs writing into `got` and `want` evaluated and predicted alike: their eval_loss and
// eval_accuracy (relative 1e-5) and their predictions file, which is not empty.
inline void expect_evaluates_as(const std::filesystem::path& got,
                                const std::filesystem::path& want) {
  const nlohmann::json g = read_json_file(got / "eval_results.json", "eval results");
  const nlohmann::json w = read_json_file(want / "eval_results.json", "eval results");
  for (const char* metric : {"eval_loss", "eval_accuracy"})
    EXPECT_NEAR(g[metric].get<double>(), w[metric].get<double>(),
                1e-5 * std::abs(w[metric].get<double>()))
        << metric;
  const std::string predicted = read_text(got / "predict_results.txt");
  EXPECT_EQ(predicted, read_text(want / "predict_results.txt"));
  EXPECT_FALSE(predicted.empty());
}

// A resumed run `got` ends as the uninterrupted `want`: its steps' losses are want's last ones,
// its final weights want's.
inline void expect_resumes_as(const Logged& got, const Logged& want, double tolerance = 1e-5) {
  ASSERT_LE(got.losses.size(), want.losses.size());
  const size_t skipped = want.losses.size() - got.losses.size();
  for (size_t i = 0; i < got.losses.size(); ++i)
    EXPECT_NEAR(got.losses[i], want.losses[skipped + i],
                tolerance * std::abs(want.losses[skipped + i]))
        << "step " << skipped + i + 1;
  const std::vector<float> a = checkpoint_weights(got.checkpoint),
                           b = checkpoint_weights(want.checkpoint);
  ASSERT_EQ(a.size(), b.size());
  EXPECT_LE(rel_error(a.data(), b.data(), static_cast<int64_t>(a.size())), tolerance);
}

// Checkpoint `got`'s optimizer state against `want`'s, tensor for tensor: the same names and
// sizes, then check(name, got's values, want's) for each.
inline void for_each_state_pair(
    const std::string& got, const std::string& want,
    const std::function<void(const std::string&, const std::vector<float>&,
                             const std::vector<float>&)>& check) {
  const auto a = optimizer_state(got), b = optimizer_state(want);
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, values] : b) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(a.contains(name));
    const std::vector<float>& v = a.at(name);
    ASSERT_EQ(v.size(), values.size());
    check(name, v, values);
  }
}

// Checkpoint `got`'s optimizer state is `want`'s, tensor for tensor within `tolerance`.
inline void expect_state_as(const std::string& got, const std::string& want, double tolerance) {
  for_each_state_pair(
      got, want,
      [&](const std::string&, const std::vector<float>& v, const std::vector<float>& values) {
        EXPECT_LE(rel_error(v.data(), values.data(), static_cast<int64_t>(v.size())), tolerance);
      });
}

// 8-bit moments round to the nearest of 256 codes, so the last-bit differences of another
// summation order (tensor ranks' partial products, data replicas' gradient sums) move a moment
// near the midpoint of two codes onto the other, whose step moves the next gradients a little.
// The optimizer state of checkpoint `got` is `want`'s: its float32 tensors (moments, block
// maxima) within relative 1e-4 (measured up to 2e-5 after 4 steps at learning rate 0.01); each
// 8-bit code's value (a fraction of its block's maximum) within twice the map's widest gap
// between neighbours of want's, at most one code in a hundred differing (measured after 4 steps
// on 4 ranks: 36 of 34 thousand, by up to one gap).
inline void expect_quantized_state_as(const std::string& got, const std::string& want) {
  for_each_state_pair(
      got, want,
      [](const std::string& name, const std::vector<float>& v, const std::vector<float>& values) {
        if (!name.ends_with("_codes")) {
          EXPECT_LE(rel_error(v.data(), values.data(), static_cast<int64_t>(v.size())), 1e-4);
          return;
        }
        const std::array<float, 256> map = dynamic_quant_map(!name.starts_with("exp_avg_sq"));
        float gap = 0;
        for (size_t c = 1; c < map.size(); ++c) gap = std::max(gap, map[c] - map[c - 1]);
        size_t differ = 0;
        for (size_t i = 0; i < v.size(); ++i) {
          const float got_value = map[static_cast<uint8_t>(v[i])];
          const float want_value = map[static_cast<uint8_t>(values[i])];
          EXPECT_LE(std::abs(got_value - want_value), 2 * gap) << "code " << i;
          differ += v[i] != values[i];
        }
        EXPECT_LE(differ, v.size() / 100);
      });
}

// Checkpoints across layouts: `o` (the world's ranks, saving at step 2 into its output_dir) and
// `one` (one process, the same run) train; the ranks resume one process's checkpoint-2 and one
// process the ranks', each ending as one process's uninterrupted run (within `tolerance`).
inline void expect_resumes_across_layouts(const TrainOptions& o, const TrainOptions& one,
                                          const Dataset* data, double tolerance = 1e-5) {
  const std::unique_ptr<Communicator> alone = make_single_process();
  const Logged ranks = run(o, data, &world());
  Logged single;
  if (world().rank() == 0) single = run(one, data, alone.get());
  world().barrier();  // one process's checkpoints are written
  TrainOptions from_one = o;
  from_one.output_dir = o.output_dir + "_from_one";
  from_one.resume_from_checkpoint = one.output_dir + "/checkpoint-2";
  const Logged resumed_on_ranks = run(from_one, data, &world());
  if (world().rank() != 0) return;
  TrainOptions from_ranks = one;
  from_ranks.output_dir = one.output_dir + "_from_ranks";
  from_ranks.resume_from_checkpoint = o.output_dir + "/checkpoint-2";
  const Logged resumed_alone = run(from_ranks, data, alone.get());
  expect_trains_as(ranks, single, tolerance);
  {
    SCOPED_TRACE("the ranks from one process's checkpoint");
    expect_resumes_as(resumed_on_ranks, single, tolerance);
  }
  {
    SCOPED_TRACE("one process from the ranks' checkpoint");
    expect_resumes_as(resumed_alone, single, tolerance);
  }
}

// On GPUs through NCCL (`nccl`: the run's NCCL communicator): a tiny llama on the world's ranks,
// `replicas` data replicas of per-device batch 2 / replicas (3 micro-batches, 3 steps) laid out
// by `layout` (which one process's options go without), trains plain and under ZeRO 2 as one
// GPU process; in folders named after `name`.
inline void expect_nccl_ranks_train_as_one_process(
    Communicator& nccl, const std::string& name, int replicas,
    const std::function<void(TrainOptions&)>& layout,
    const std::function<void(TrainOptions&)>& training = {}) {
  const std::unique_ptr<Communicator> alone = make_single_process();
  SharedDir dir(name);
  const std::string model = write_model(dir, "llama", 0.0);
  UnequalLengths data;
  TrainOptions one = tiny_options(model, dir / "one", "cuda");
  one.per_device_train_batch_size = 2;
  one.gradient_accumulation_steps = 3;
  one.max_steps = 3;
  if (training) training(one);  // what both runs train (adapters, ...)
  TrainOptions o = one;
  o.output_dir = dir / "ranks";
  o.per_device_train_batch_size = 2 / replicas;
  layout(o);
  const Logged ranks = run(o, &data, &nccl);
  TrainOptions z = o;
  z.output_dir = dir / "zero2";
  z.zero_stage = 2;
  const Logged zero = run(z, &data, &nccl);
  world().barrier();
  if (world().rank() != 0) return;
  const Logged single = run(one, &data, alone.get());
  expect_trains_as(ranks, single);
  expect_trains_as(zero, single);
}

}  // namespace brisk::testing
