// Padding-free and packed batches: the samples a batch lays end to end, as the backends check
// them (the attention over them is in the conformance suite: cases_attention.cpp), and training
// on them against the padded batches of the same samples.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "test_support.h"
#include "train/trainer.h"
#include "trainer_support.h"

namespace brisk::testing {
namespace {

// A run's logged losses, step by step, then its final evaluation's loss and accuracy (0
// without them).
std::vector<double> step_losses(const TrainOptions& o, const Dataset* data = nullptr) {
  std::vector<double> losses;
  const TrainSummary s = train(
      o,
      [&](const nlohmann::json& j) {
        if (j.contains("loss")) losses.push_back(j["loss"]);
      },
      data);
  const bool evaluated = s.eval_metrics.is_object();
  losses.push_back(evaluated ? s.eval_metrics.value("eval_loss", 0.0) : 0.0);
  losses.push_back(evaluated ? s.eval_metrics.value("eval_accuracy", 0.0) : 0.0);
  return losses;
}

std::string read_file(const std::string& path) {
  std::ifstream f(path);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// The padding-free run's losses against the padded run's, step by step (fp32, dropout 0), and
// its evaluation (padding-free too) and predictions against the padded run's.
void expect_same_losses(TrainOptions o, const Dataset* data = nullptr) {
  const std::vector<double> padded = step_losses(o, data);
  const std::string padded_predictions =
      o.do_predict ? read_file(o.output_dir + "/predict_results.txt") : "";
  o.padding_free = true;
  o.output_dir += "_padding_free";
  const std::vector<double> free = step_losses(o, data);
  ASSERT_EQ(free.size(), padded.size());
  ASSERT_GT(padded.size(), 2u);
  for (size_t s = 0; s < padded.size(); ++s)
    EXPECT_NEAR(free[s], padded[s], 2e-5 * std::abs(padded[s]))
        << (s + 2 < padded.size() ? "step " + std::to_string(s + 1) : "evaluation");
  if (o.do_predict) {
    EXPECT_FALSE(padded_predictions.empty());
    EXPECT_EQ(read_file(o.output_dir + "/predict_results.txt"), padded_predictions);
  }
}

TEST(PackedSamples, CoverTheBatchRowByRow) {
  const PackedSamples good{{0, 3, 4, 8, 10, 16}};  // rows of 8: [3, 1, 4] and [2, 6]
  EXPECT_EQ(good.count(), 5);
  EXPECT_EQ(good.length(1), 1);
  Backend::check_packed_samples(good, 2, 8, "op");
  expect_error(
      [] {
        Backend::check_packed_samples(PackedSamples{{0, 3, 9, 16}}, 2, 8, "op");
      },
      "op: packed sample 1 (tokens 3..9) is empty or crosses a row");
  expect_error(
      [] {
        Backend::check_packed_samples(PackedSamples{{0, 3, 3, 16}}, 2, 8, "op");
      },
      "op: packed sample 1 (tokens 3..3) is empty or crosses a row");
  expect_error(
      [] {
        Backend::check_packed_samples(PackedSamples{{0, 3, 8}}, 2, 8, "op");
      },
      "op: the packed samples do not cover the batch's 2 x 8 tokens");
  expect_error([] { Backend::check_packed_samples(PackedSamples{}, 1, 8, "op"); },
               "op: the packed samples do not cover the batch's 1 x 8 tokens");
}

// Causal LMs on samples of unequal length: GPT-2's learned positions and Llama's rotary ones
// restart at each sample, the shifted labels stay within it; a mixture's routing sees the same
// tokens.
TEST(PaddingFree, CausalLmsTrainAsOnPaddedRows) {
  for (const std::string type : {"gpt2", "llama", "mixtral"}) {
    SCOPED_TRACE(type);
    TempDir dir("padding_free_lm");
    const std::string model = type == "gpt2" ? write_config(dir, "gpt2", 0.0)
                              : type == "mixtral"
                                  ? write_tiny_mixtral(dir)
                                  : write_model_folder(dir, "llama",
                                                       R"({"model_type": "llama", "vocab_size": 128,
                                                     "hidden_size": 32, "intermediate_size": 48,
                                                     "num_attention_heads": 4,
                                                     "num_key_value_heads": 2,
                                                     "num_hidden_layers": 2})");
    UnequalLengths data;
    TrainOptions o = tiny_options(model, dir / "out");
    o.max_steps = 6;
    expect_same_losses(o, &data);
  }
}

// run_glue's classification and regression on rows of 2 to 41 tokens (BERT's and DistilBERT's
// first token of each sample classifies it), and run_mlm's masked LM one sample per line.
TEST(PaddingFree, EncodersTrainAsOnPaddedRows) {
  for (const std::string task : {"classification", "regression", "distilbert", "mlm"}) {
    SCOPED_TRACE(task);
    TempDir dir("padding_free_encoder");
    std::ofstream f(dir / "train.csv");
    f << "sentence,label\n";
    for (int i = 0; i < 48; ++i) {
      const bool pos = (i * 7 + 1) % 3 != 0;
      f << (pos ? "good" : "bad") << " film";
      for (int w = 0; w < (i * 5 + 1) % 13; ++w) f << " and the plot";
      if (task == "regression")
        f << "," << (pos ? 1.5 : -0.5) + 0.125 * (i % 3) << "\n";
      else
        f << "," << (pos ? "positive" : "negative") << "\n";
    }
    f.close();
    const std::string model =
        task == "distilbert"
            ? write_model_folder(dir, "distilbert",
                                 R"({"model_type": "distilbert", "vocab_size": 1200, "dim": 32,
                                     "n_layers": 2, "n_heads": 2, "hidden_dim": 48,
                                     "max_position_embeddings": 64, "dropout": 0.0,
                                     "attention_dropout": 0.0, "seq_classif_dropout": 0.0})")
            : write_wordpiece_bert(dir);
    TrainOptions o = tiny_options(model, dir / "out");
    o.tokenizer_name = fixture("tokenizer/wordpiece");
    o.train_file = task == "mlm" ? write_fixture_text(dir, "text.txt") : dir / "train.csv";
    o.mlm = task == "mlm";
    o.line_by_line = task == "mlm";
    o.max_seq_length = 48;
    o.per_device_train_batch_size = 8;
    o.max_steps = 6;
    o.save_strategy = "no";
    o.validation_file = o.train_file;
    o.do_eval = true;
    if (task == "classification") {  // predictions too, padding-free as the evaluation
      o.test_file = o.train_file;
      o.do_predict = true;
    }
    expect_same_losses(o);
  }
}

// run_mlm's lines packed into rows of max_seq_length train as the lines one per row: all of them
// in one batch either way, the same masks (drawn per sample and position).
TEST(Packing, MaskedLmLinesTrainAsUnpacked) {
  TempDir dir("packing_mlm");
  TrainOptions o = tiny_options(write_wordpiece_bert(dir), dir / "out");
  o.tokenizer_name = fixture("tokenizer/wordpiece");
  o.train_file = write_fixture_text(dir, "text.txt");
  o.mlm = o.line_by_line = true;
  o.max_seq_length = 48;
  o.save_strategy = "no";
  o.tokenized_cache_dir = "none";
  // How many lines pack into how many rows: the run's note.
  o.packing = true;
  o.per_device_train_batch_size = 1;
  o.max_steps = 1;
  int64_t samples = 0, rows = 0;
  train(o, [&](const nlohmann::json& j) {
    if (j.contains("data_files"))
      std::sscanf(j["data_files"].get<std::string>().c_str(),
                  "--packing: %ld training samples in %ld rows", &samples, &rows);
  });
  ASSERT_GT(samples, rows);
  ASSERT_GT(rows, 1);
  o.max_steps = 3;
  o.per_device_train_batch_size = rows;
  const std::vector<double> packed = step_losses(o);
  o.packing = false;
  o.per_device_train_batch_size = samples;
  const std::vector<double> lines = step_losses(o);
  ASSERT_EQ(packed.size(), lines.size());
  for (size_t s = 0; s + 2 < lines.size(); ++s)
    EXPECT_NEAR(packed[s], lines[s], 2e-5 * lines[s]) << "step " << s + 1;
}

TEST(PaddingFree, ContradictingOptionsAreRefused) {
  TrainOptions o;
  o.padding_free = true;
  o.pad_to_max_length = true;
  expect_error([&] { train(o, [](const nlohmann::json&) {}); },
               "--padding_free and --pad_to_max_length contradict each other");
  o.pad_to_max_length = false;
  o.group_by_length = true;
  expect_error([&] { train(o, [](const nlohmann::json&) {}); },
               "--group_by_length is meaningless with --padding_free");
}

}  // namespace
}  // namespace brisk::testing
