// A causal LM fine-tuned on rows, as TRL's SFTTrainer prepares a plain dataset: prompt/completion
// pairs (the loss on the completions, or on everything) and text lines, against PyTorch +
// transformers computing each row unpadded (tests/fixtures/sft, scripts/make_sft_fixtures.py);
// padded, padding-free (its evaluation too) and packed runs alike.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "core/json_file.h"
#include "data/lm_rows.h"
#include "data/packing.h"
#include "tokenizer/tokenizer.h"
#include "train/trainer.h"
#include "trainer_support.h"

namespace brisk::testing {
namespace {

const nlohmann::json& expected() {
  static const nlohmann::json e = read_json_file(fixture("sft/expected.json"), "fixture");
  return e;
}

struct SftRun {
  std::string model, tokenizer, run;
  std::string data() const { return fixture(run == "lines" ? "sft/lines.txt" : "sft/pairs.jsonl"); }
  const nlohmann::json& want() const { return expected()["runs"][model + "/" + run]; }
};

std::vector<SftRun> runs() {
  std::vector<SftRun> r;
  for (const auto& [model, tokenizer] :
       {std::pair{"gpt2", "bpe"}, std::pair{"llama", "bpe_llama3"}})
    for (const char* run : {"pairs", "pairs_all", "lines"}) r.push_back({model, tokenizer, run});
  return r;
}

// The eos each fixture model's config names.
int32_t eos_of(const SftRun& r) {
  return r.model == "gpt2" ? 0 : 1;
}

TEST(LmRows, SamplesAreTokenizedLabelledAndCutAsTrlDoes) {
  const int64_t block = expected()["block_size"];
  for (const SftRun& r : runs()) {
    SCOPED_TRACE(r.model + "/" + r.run);
    const auto tok = Tokenizer::load(fixture("tokenizer/" + r.tokenizer));
    const TextTable t = read_text_table(r.data());
    LmRowColumns c = prompt_completion_columns(t);
    if (!c.pairs()) c.text = 0;
    const LmRowsDataset d(tokenize_lm_rows(t, c, *tok, eos_of(r), 0, t.rows()), block,
                          tok->pad_id(), r.run == "pairs");
    const nlohmann::json& samples = r.want()["samples"];
    ASSERT_EQ(d.size(), static_cast<int64_t>(samples.size()));
    EXPECT_EQ(d.dropped(), r.run == "pairs" ? 1 : 0);
    for (int64_t i = 0; i < d.size(); ++i) {
      const std::vector<int32_t> ids = samples[i]["ids"];
      const int64_t unlearned = samples[i]["unlearned"];
      const auto n = static_cast<int64_t>(ids.size());
      ASSERT_EQ(d.length(i), n) << "sample " << i;
      std::vector<int32_t> in(block + 2, -7), labels(block + 2, -7), mask(block + 2, -7);
      const Batch b{Tensor(in.data(), Shape{1, block + 2}, DType::i32),
                    Tensor(mask.data(), Shape{1, block + 2}, DType::i32), Tensor(),
                    Tensor(labels.data(), Shape{1, block + 2}, DType::i32)};
      d.fill_row(i, 0, b, 0);
      for (int64_t s = 0; s < block + 2; ++s) {
        EXPECT_EQ(in[s], s < n ? ids[s] : tok->pad_id()) << "sample " << i << " token " << s;
        EXPECT_EQ(mask[s], s < n ? 1 : 0);
        EXPECT_EQ(labels[s], s < n && s >= unlearned ? ids[s] : kIgnoreIndex);
      }
      EXPECT_EQ(d.count_targets(i, 0), n - std::max<int64_t>(1, unlearned));
    }
  }
}

// Each run's options: all the rows in one batch, plain SGD as the fixture steps it.
TrainOptions sft_options(const SftRun& r, const std::string& out) {
  TrainOptions o;
  o.model_name_or_path = fixture("sft/" + r.model);
  o.tokenizer_name = fixture("tokenizer/" + r.tokenizer);
  o.output_dir = out;
  o.train_file = o.validation_file = r.data();
  o.line_by_line = r.run == "lines";
  o.completion_only_loss = r.run != "pairs_all";
  o.block_size = expected()["block_size"];
  o.per_device_train_batch_size = o.per_device_eval_batch_size =
      static_cast<int64_t>(r.want()["samples"].size());
  o.max_steps = expected()["steps"];
  o.optim = "sgd";
  o.learning_rate = expected()["learning_rate"];
  o.lr_scheduler_type = "constant";
  o.weight_decay = 0;
  o.max_grad_norm = 0;
  o.logging_steps = 1;
  o.do_eval = true;
  o.save_strategy = "no";
  o.disable_tqdm = true;
  o.tokenized_cache_dir = "none";
  return o;
}

// A run's logged losses, final evaluation loss and data notes.
struct Trained {
  std::vector<double> losses;
  double eval_loss = 0;
  std::vector<std::string> notes;
};
Trained train_logged(const TrainOptions& o) {
  Trained t;
  const TrainSummary s = train(o, [&](const nlohmann::json& j) {
    if (j.contains("loss")) t.losses.push_back(j["loss"]);
    if (j.contains("data_files")) t.notes.push_back(j["data_files"]);
  });
  t.eval_loss = s.eval_metrics.is_object() ? s.eval_metrics.value("eval_loss", 0.0) : 0.0;
  return t;
}

// The run's losses are the fixture's, step by step (and its evaluation, when it evaluated).
void expect_fixture_losses(const Trained& t, const SftRun& r) {
  const std::vector<double> want = r.want()["losses"];
  ASSERT_EQ(t.losses.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_NEAR(t.losses[i], want[i], 2e-5 * want[i]) << "step " << i + 1;
  const double eval_loss = r.want()["eval_loss"];
  if (t.eval_loss != 0) EXPECT_NEAR(t.eval_loss, eval_loss, 2e-5 * eval_loss);
}

TEST(LmRows, TrainAsTorchOnEachRowUnpaddedPaddedOrNot) {
  for (const SftRun& r : runs()) {
    for (const bool padding_free : {false, true}) {
      SCOPED_TRACE(r.model + "/" + r.run + (padding_free ? " padding-free" : " padded"));
      TempDir dir("lm_rows");
      TrainOptions o = sft_options(r, dir / "out");
      o.padding_free = padding_free;
      const Trained t = train_logged(o);
      EXPECT_NE(t.eval_loss, 0);
      expect_fixture_losses(t, r);
      // The cut said once for both files (the same rows train and validate).
      ASSERT_EQ(t.notes.size(), 1u);
      EXPECT_NE(t.notes[0].find("rows are longer than block_size 24"), std::string::npos)
          << t.notes[0];
    }
  }
}

// The rows the fixture's samples pack into at block_size.
int64_t packed_rows(const SftRun& r) {
  const auto tok = Tokenizer::load(fixture("tokenizer/" + r.tokenizer));
  const TextTable t = read_text_table(r.data());
  LmRowColumns c = prompt_completion_columns(t);
  if (!c.pairs()) c.text = 0;
  const int64_t block = expected()["block_size"];
  return PackedDataset(
             std::make_unique<LmRowsDataset>(tokenize_lm_rows(t, c, *tok, eos_of(r), 0, t.rows()),
                                             block, tok->pad_id(), r.run == "pairs"),
             block)
      .size();
}

// Gradient accumulation over micro-batches of unequal label counts: each step's loss is over the
// window's label tokens (Trainer's num_items_in_batch), as the fixture's one batch of all rows;
// padded, padding-free and packed.
TEST(LmRows, AccumulatedMicroBatchesNormalizeOverTheWindow) {
  const SftRun r{"gpt2", "bpe", "pairs"};
  for (const char* how : {"padded", "padding_free", "packing"}) {
    SCOPED_TRACE(how);
    TempDir dir("lm_rows_accumulate");
    TrainOptions o = sft_options(r, dir / "out");
    o.padding_free = std::string(how) == "padding_free";
    o.packing = std::string(how) == "packing";
    // 8 samples as 4 micro-batches of 2 (packed: their rows, one a micro-batch).
    const int64_t samples = o.per_device_train_batch_size;
    o.gradient_accumulation_steps = o.packing ? packed_rows(r) : 4;
    o.per_device_train_batch_size = o.packing ? 1 : samples / 4;
    o.do_eval = false;
    expect_fixture_losses(train_logged(o), r);
  }
}

// Packed rows (all in one batch) train as torch on each row alone; evaluation reads the rows
// unpacked.
TEST(LmRows, PackedRowsTrainAsTorchOnEachRow) {
  for (const SftRun& r : runs()) {
    SCOPED_TRACE(r.model + "/" + r.run);
    TempDir dir("lm_rows_packed");
    TrainOptions o = sft_options(r, dir / "out");
    o.packing = true;
    o.per_device_train_batch_size = packed_rows(r);
    EXPECT_LT(o.per_device_train_batch_size, static_cast<int64_t>(r.want()["samples"].size()));
    const Trained t = train_logged(o);
    EXPECT_NE(t.eval_loss, 0);
    expect_fixture_losses(t, r);
    ASSERT_EQ(t.notes.size(), 2u);  // the cut, then the packing
    const std::string& note = t.notes[1];
    EXPECT_NE(note.find(std::to_string(r.want()["samples"].size()) + " training samples in " +
                        std::to_string(o.per_device_train_batch_size) + " rows of 24 tokens"),
              std::string::npos)
        << note;
  }
}

// A packed run resumed from its checkpoint continues as the uninterrupted run: the same packed
// rows in the same seeded order (two rows a step).
TEST(LmRows, APackedRunResumesExactly) {
  TempDir dir("lm_rows_resume");
  const SftRun r{"llama", "bpe_llama3", "lines"};
  TrainOptions o = sft_options(r, dir / "out");
  o.packing = true;
  o.per_device_train_batch_size = 2;
  o.max_steps = 6;
  o.save_strategy = "steps";
  o.save_steps = 3;
  o.learning_rate = 0.05;
  o.do_eval = false;
  const std::vector<double> straight = train_logged(o).losses;
  ASSERT_EQ(straight.size(), 6u);
  const std::vector<double> resumed =
      train_logged(resumed_in_copy(o, "checkpoint-3", dir / "r")).losses;
  ASSERT_EQ(resumed.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(resumed[i], straight[i + 3]) << "step " << i + 4;
}

TEST(LmRows, PackingRefusesWhatItCannotPack) {
  TempDir dir("lm_rows_packing_bad");
  const SftRun lines{"gpt2", "bpe", "lines"};
  TrainOptions o = sft_options(lines, dir / "out");
  o.packing = true;
  o.line_by_line = false;  // run_clm's blocks
  expect_error([&] { train(o, [](const nlohmann::json&) {}); }, "--packing packs rows of text");
  o.line_by_line = true;
  o.group_by_length = true;
  expect_error([&] { train(o, [](const nlohmann::json&) {}); },
               "--group_by_length is meaningless with --packing");
  o.group_by_length = false;
  o.block_size = 64;  // the model holds 48 positions
  expect_error([&] { train(o, [](const nlohmann::json&) {}); },
               "--block_size 64 exceeds the model's max_position_embeddings 48");
  TrainOptions synthetic = tiny_options(write_config(dir, "gpt2", 0.0), dir / "synthetic");
  synthetic.packing = true;
  expect_error([&] { train(synthetic, [](const nlohmann::json&) {}); },
               "--packing packs rows of text files");
}

TEST(LmRows, BadRowsAndMissingTokensAreRefusedByName) {
  TempDir dir("lm_rows_bad");
  const SftRun pairs{"gpt2", "bpe", "pairs"};
  TrainOptions o = sft_options(pairs, dir / "out");
  std::ofstream(dir / "half.jsonl") << R"({"prompt": "a", "answer": "b"})"
                                    << "\n";
  o.train_file = o.validation_file = dir / "half.jsonl";
  expect_error([&] { train(o, [](const nlohmann::json&) {}); },
               "has a \"prompt\" column but no \"completion\" column");
  // A prompt that fills block_size leaves nothing to learn.
  std::ofstream(dir / "long.jsonl") << R"({"prompt": "a a a a a a a a", "completion": "b"})"
                                    << "\n";
  o.train_file = o.validation_file = dir / "long.jsonl";
  o.block_size = 4;
  expect_error([&] { train(o, [](const nlohmann::json&) {}); },
               "no sample keeps a completion token within block_size 4");
  // No eos_token in the tokenizer's folder nor eos_token_id in the config.
  o = sft_options(pairs, dir / "out");
  o.model_name_or_path =
      write_model_folder(dir, "no_eos", R"({"model_type": "gpt2", "vocab_size": 800,
        "n_embd": 16, "n_layer": 1, "n_head": 2, "n_positions": 32})");
  expect_error([&] { train(o, [](const nlohmann::json&) {}); },
               "names no eos_token (tokenizer_config.json) and config.json no eos_token_id");
}

TEST(LmRows, TheTokenizersEosTokenEndsTheRows) {
  TempDir dir("lm_rows_eos");
  std::filesystem::copy(fixture("tokenizer/bpe/tokenizer.json"), dir / "tokenizer.json");
  EXPECT_EQ(Tokenizer::load(dir.path.string())->eos_id(), -1);
  std::ofstream(dir / "tokenizer_config.json") << R"({"eos_token": "<|endoftext|>"})";
  EXPECT_EQ(Tokenizer::load(dir.path.string())->eos_id(), 0);
  std::ofstream(dir / "tokenizer_config.json")
      << R"({"eos_token": {"content": "<|endoftext|>", "special": true}})";
  EXPECT_EQ(Tokenizer::load(dir.path.string())->eos_id(), 0);
}

}  // namespace
}  // namespace brisk::testing
