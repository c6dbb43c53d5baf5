// Evaluation and prediction as Trainer.evaluate / predict and the example scripts do them: during
// training (eval_strategy), at the end (do_eval), without training, the best model loaded at the
// end, and predict_results.txt.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "test_support.h"
#include "train/assembly.h"
#include "train/trainer.h"
#include "trainer_support.h"

namespace brisk::testing {
namespace {

namespace fs = std::filesystem;

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  return nlohmann::json::parse(in);
}

std::vector<nlohmann::json> train_logging(const TrainOptions& o, TrainSummary* summary = nullptr) {
  std::vector<nlohmann::json> records;
  const TrainSummary s = train(o, [&](const nlohmann::json& j) { records.push_back(j); });
  if (summary) *summary = s;
  return records;
}

TrainOptions learnable(const std::string& model, const std::string& out) {
  TrainOptions o = tiny_options(model, out);
  o.synthetic_task = "learnable";
  o.seq_len = 16;
  o.dataset_size = 256;
  o.eval_dataset_size = 60;  // not a multiple of the batch: the last one is partial
  o.per_device_train_batch_size = 8;
  o.max_steps = 120;
  o.logging_steps = 40;
  return o;
}

TEST(Evaluate, DuringAndAfterTrainingAsTheTrainerReportsIt) {
  TempDir dir("eval");
  TrainOptions o = learnable(write_config(dir, "bert", 0.0), dir / "out");
  o.eval_strategy = "steps";
  o.eval_steps = 40;
  o.do_eval = true;
  TrainSummary s;
  const auto records = train_logging(o, &s);
  std::vector<nlohmann::json> evals;
  for (const auto& r : records)
    if (r.contains("eval_loss") && r.contains("step")) evals.push_back(r);
  ASSERT_EQ(evals.size(), 3u);  // steps 40, 80, 120
  for (const auto& e : evals) {
    for (const char* key : {"eval_accuracy", "eval_f1", "eval_runtime", "eval_samples_per_second",
                            "eval_steps_per_second", "epoch"})
      EXPECT_TRUE(e.contains(key)) << key << " in " << e.dump();
  }
  EXPECT_EQ(evals[0]["step"], 40);
  // The learnable task is learned: held-out accuracy ends far above chance.
  EXPECT_GT(evals.back()["eval_accuracy"].get<double>(), 0.9) << evals.back().dump();
  EXPECT_LT(evals.back()["eval_loss"].get<double>(), evals.front()["eval_loss"].get<double>());
  // do_eval at the end: the last weights' metrics, in eval_results.json and all_results.json.
  const nlohmann::json results = read_json(o.output_dir + "/eval_results.json");
  EXPECT_EQ(results["eval_samples"], 60);
  EXPECT_DOUBLE_EQ(results["eval_loss"].get<double>(), evals.back()["eval_loss"].get<double>());
  EXPECT_EQ(s.eval_metrics["eval_accuracy"], results["eval_accuracy"]);
  const nlohmann::json all = read_json(o.output_dir + "/all_results.json");
  EXPECT_TRUE(all.contains("train_runtime") && all.contains("eval_accuracy")) << all.dump();
  // The logged history in the checkpoint holds the evaluations too.
  const nlohmann::json state = read_json(s.last_checkpoint + "/trainer_state.json");
  int eval_entries = 0;
  for (const auto& r : state["log_history"]) eval_entries += r.contains("eval_loss");
  EXPECT_EQ(eval_entries, 3);

  // Evaluating the saved model without training: the same metrics, in another batch size.
  TrainOptions only = o;
  only.model_name_or_path = o.output_dir;  // the final model train saved there
  only.output_dir = dir / "eval_only";
  only.do_train = false;
  only.eval_strategy = "no";
  only.per_device_eval_batch_size = 7;
  TrainSummary e;
  train_logging(only, &e);
  EXPECT_NEAR(e.eval_metrics["eval_loss"].get<double>(), results["eval_loss"].get<double>(), 1e-5);
  EXPECT_EQ(e.eval_metrics["eval_accuracy"], results["eval_accuracy"]);
  EXPECT_FALSE(fs::exists(only.output_dir + "/train_results.json"));
  EXPECT_FALSE(fs::exists(only.output_dir + "/model.safetensors"));
  // It planned no gradients and no optimizer state (the Trainer allocates neither to evaluate);
  // resuming a checkpoint's state, or a layout that reads them (ZeRO), still plans both.
  auto planned = [](const TrainOptions& t, Category c) {
    return assemble_run(t, Device::cpu, nullptr)->plan.bytes_by_category()[static_cast<int>(c)];
  };
  TrainOptions zero = only;
  zero.zero_stage = 1;
  TrainOptions resumed = only;
  resumed.resume_from_checkpoint = s.last_checkpoint;
  for (Category c : {Category::gradients, Category::optimizer_state}) {
    EXPECT_EQ(planned(only, c), 0u) << category_name(c);
    EXPECT_GT(planned(o, c), 0u) << category_name(c);
    EXPECT_EQ(planned(zero, c), planned(o, c)) << category_name(c);
    EXPECT_EQ(planned(resumed, c), planned(o, c)) << category_name(c);
  }
  // Nor activations for a backward pass: its blocks share one set of internals, and in the
  // training run's evaluation batch it gives that run's final evaluation bit for bit. Nor the
  // buffers only a backward pass writes.
  EXPECT_LT(planned(only, Category::activations), planned(o, Category::activations));
  for (const char* name :
       {"grad.hidden", "block_scratch.d_ctx", "block_scratch.d_qkv", "block_scratch.d_fc"}) {
    auto has = [&](const TrainOptions& t) {
      const auto run = assemble_run(t, Device::cpu, nullptr);
      for (const BufferSpec& b : run->plan.buffers())
        if (b.name == name) return true;
      return false;
    };
    EXPECT_FALSE(has(only)) << name;
    EXPECT_TRUE(has(o)) << name;
  }
  TrainOptions same = only;
  same.output_dir = dir / "eval_same_batch";
  same.per_device_eval_batch_size = o.per_device_eval_batch_size;
  TrainSummary b;
  train_logging(same, &b);
  EXPECT_EQ(b.eval_metrics["eval_loss"], results["eval_loss"]);
  // fp16: no master copy either, the weights rounded once; the metrics up to that rounding.
  TrainOptions fp16 = only;
  fp16.fp16 = true;
  fp16.output_dir = dir / "eval_fp16_weights";
  TrainOptions fp16_training = o;
  fp16_training.fp16 = true;
  EXPECT_EQ(planned(fp16, Category::master_weights), 0u);
  EXPECT_GT(planned(fp16_training, Category::master_weights), 0u);
  TrainSummary h;
  train_logging(fp16, &h);
  EXPECT_NEAR(h.eval_metrics["eval_loss"].get<double>(), results["eval_loss"].get<double>(),
              0.02 * results["eval_loss"].get<double>());
  // Fewer rows than one evaluation batch: one partial batch, the same metrics.
  TrainOptions wide = only;
  wide.output_dir = dir / "eval_wide";
  wide.per_device_eval_batch_size = 64;
  TrainSummary w;
  train_logging(wide, &w);
  EXPECT_NEAR(w.eval_metrics["eval_loss"].get<double>(), results["eval_loss"].get<double>(), 1e-5);
  EXPECT_EQ(w.eval_metrics["eval_samples"], 60);

  // bf16_full_eval / fp16_full_eval: 16-bit throughout, the same metrics up to its rounding.
  for (bool bf16 : {true, false}) {
    TrainOptions half = only;
    half.output_dir = dir / (bf16 ? "eval_bf16" : "eval_fp16");
    (bf16 ? half.bf16_full_eval : half.fp16_full_eval) = true;
    TrainSummary h;
    train_logging(half, &h);
    const double want = results["eval_loss"].get<double>();
    EXPECT_NEAR(h.eval_metrics["eval_loss"].get<double>(), want, 0.02 * want) << bf16;
    EXPECT_NE(h.eval_metrics["eval_loss"].get<double>(), e.eval_metrics["eval_loss"].get<double>())
        << "rounded to 16 bits";
    // Nothing is kept for a backward pass: the blocks' shared working set, as the float32 run's.
    EXPECT_EQ(planned(half, Category::activations), planned(only, Category::activations));
  }
}

TEST(Evaluate, CausalLmPerplexityIsTheExponentOfTheLoss) {
  TempDir dir("eval_lm");
  TrainOptions o = learnable(write_config(dir, "gpt2", 0.0), dir / "out");
  o.max_steps = 30;
  o.do_eval = true;
  TrainSummary s;
  train_logging(o, &s);
  const double loss = s.eval_metrics["eval_loss"];
  EXPECT_NEAR(s.eval_metrics["perplexity"].get<double>(), std::exp(loss), 1e-9 * std::exp(loss));
  EXPECT_FALSE(s.eval_metrics.contains("eval_accuracy"));
  o.do_predict = true;
  expect_error([&] { train(o, [](const nlohmann::json&) {}); }, "a causal LM has no labels");
}

// load_best_model_at_end ends with the weights of the checkpoint whose evaluation was best, and
// rotation never deletes it.
TEST(Evaluate, TheBestModelIsLoadedAtTheEnd) {
  TempDir dir("best");
  TrainOptions o = learnable(write_config(dir, "bert", 0.0), dir / "out");
  o.max_steps = 60;
  o.learning_rate = 3e-2;  // unstable on purpose: the last evaluation need not be the best
  o.eval_strategy = "steps";
  o.eval_steps = 10;
  o.save_steps = 10;
  o.save_total_limit = 1;
  o.load_best_model_at_end = true;
  o.metric_for_best_model = "accuracy";
  TrainSummary s;
  const auto records = train_logging(o, &s);
  double best = -1;
  int64_t best_step = -1;
  for (const auto& r : records)
    if (r.contains("eval_accuracy") && r.contains("step") && r["eval_accuracy"] > best) {
      best = r["eval_accuracy"];
      best_step = r["step"];
    }
  ASSERT_NE(best_step, 60) << "the seeded run should peak before its end, or nothing is loaded";
  const std::string want = o.output_dir + "/checkpoint-" + std::to_string(best_step);
  EXPECT_EQ(s.best_model_checkpoint, want);
  ASSERT_TRUE(fs::exists(want + "/model.safetensors"));  // kept through rotation
  SafetensorsFile final_model(o.output_dir + "/model.safetensors");
  SafetensorsFile best_model(want + "/model.safetensors");
  for (const auto& name : best_model.names()) {
    const Tensor& a = final_model.get(name);
    const Tensor& b = best_model.get(name);
    ASSERT_EQ(a.bytes(), b.bytes());
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.bytes()), 0) << name;
  }
  const nlohmann::json state = read_json(s.last_checkpoint + "/trainer_state.json");
  EXPECT_EQ(state["best_model_checkpoint"], want);
  EXPECT_DOUBLE_EQ(state["best_metric"].get<double>(), best);
  // Options that cannot work are refused up front.
  TrainOptions bad = o;
  bad.save_strategy = "epoch";
  expect_error([&] { train(bad, [](const nlohmann::json&) {}); },
               "load_best_model_at_end needs eval_strategy and save_strategy to be equal");
  bad = o;
  bad.save_steps = 15;
  expect_error([&] { train(bad, [](const nlohmann::json&) {}); },
               "must be a multiple of eval_steps");
  bad = o;
  bad.metric_for_best_model = "mse";  // a regression's metric
  expect_error([&] { train(bad, [](const nlohmann::json&) {}); },
               "metric_for_best_model \"eval_mse\" is not among the evaluation's metrics");
  // A name brisk never computes is refused before anything runs, with or without
  // load_best_model_at_end.
  bad = o;
  bad.metric_for_best_model = "bleu";
  bad.load_best_model_at_end = false;
  expect_error([&] { validate_options(bad); },
               "metric_for_best_model \"bleu\" is none of brisk's metrics");
}

// Evaluating without training a folder that holds no weights says so (it runs on random weights,
// as Trainer evaluates a model made from its config) instead of passing in silence.
// A run that does not train on a folder without weights (or a config.json alone) is refused
// before any work, as transformers' from_pretrained refuses it; a built-in name evaluates its
// random weights, with a note.
TEST(Evaluate, EvaluatingAFolderWithoutWeightsIsRefused) {
  TempDir dir("eval_random");
  TrainOptions o = tiny_options(write_config(dir, "bert", 0.0), dir / "out");
  o.do_train = false;
  o.do_eval = true;
  o.eval_dataset_size = 8;
  for (const std::string& model : {dir.path.string(), dir / "config.json"}) {
    o.model_name_or_path = model;
    expect_error(
        [&] { train(o, [](const nlohmann::json&) {}); },
        "'" + model + "' holds no model.safetensors: evaluating or predicting without training");
  }
  o.model_name_or_path = "bert-tiny";
  std::string note;
  train(o, [&](const nlohmann::json& j) {
    if (j.contains("note")) note += j["note"].get<std::string>();
  });
  EXPECT_NE(note.find("built-in configuration"), std::string::npos) << note;
}

// A validation file of a header alone is named as such, not as a missing --validation_file.
TEST(Evaluate, AValidationFileWithoutRowsIsNamed) {
  TempDir dir("eval_header_only");
  std::ofstream(dir / "dev.csv") << "sentence,label\n";
  TrainOptions o = tiny_options(write_wordpiece_bert(dir), dir / "out");
  o.tokenizer_name = fixture("tokenizer/wordpiece");
  o.train_file = write_varied_csv(dir, "train.csv", 16);
  o.validation_file = dir / "dev.csv";
  o.max_seq_length = 16;
  o.do_eval = true;
  expect_error([&] { train(o, [](const nlohmann::json&) {}); },
               "validation file '" + o.validation_file + "' holds no rows to evaluate");
}

TEST(Evaluate, PredictionsAreWrittenAsRunGlueWritesThem) {
  TempDir dir("predict");
  TrainOptions o = learnable(write_config(dir, "bert", 0.0), dir / "out");
  o.max_steps = 60;
  o.do_predict = true;
  train_logging(o);
  std::ifstream in(o.output_dir + "/predict_results.txt");
  std::string line;
  std::getline(in, line);
  EXPECT_EQ(line, "index\tprediction");
  int rows = 0;
  while (std::getline(in, line)) {
    EXPECT_EQ(line.rfind(std::to_string(rows) + "\t", 0), 0u) << line;
    const std::string label = line.substr(line.find('\t') + 1);
    EXPECT_TRUE(label == "0" || label == "1") << line;  // no id2label in this config
    ++rows;
  }
  EXPECT_EQ(rows, 60);
}

}  // namespace
}  // namespace brisk::testing

namespace brisk::testing {
namespace {

// The example scripts' jobs on the user's files: a classifier on a CSV (run_glue) and a causal LM
// on a text file (run_clm), with the fixture tokenizers.
// A learnable task: the first word decides the label (positive when (i * 7 + seed) % 3 != 0).
void write_review_csv(const TempDir& dir, const std::string& name, int rows, int seed,
                      bool labels) {
  const char* good[] = {"good", "great", "fine", "lovely"};
  const char* bad[] = {"bad", "awful", "poor", "dull"};
  std::ofstream f(dir / name);
  f << (labels ? "sentence,label\n" : "sentence\n");
  for (int i = 0; i < rows; ++i) {
    const bool pos = (i * 7 + seed) % 3 != 0;
    f << "\"" << (pos ? good : bad)[(i + seed) % 4] << " film, the plot " << (i % 5)
      << " and the end\"";
    if (labels) f << "," << (pos ? "positive" : "negative");
    f << "\n";
  }
}

// A run_glue-style run of the fixture WordPiece BERT on dir's train.csv, dev.csv and test.csv
// (sequences of 16, batches of 8, evaluated at the end).
TrainOptions glue_options(const TempDir& dir, const std::string& out) {
  TrainOptions o = tiny_options(write_wordpiece_bert(dir), dir / out);
  o.tokenizer_name = fixture("tokenizer/wordpiece");
  o.train_file = dir / "train.csv";
  o.validation_file = dir / "dev.csv";
  o.test_file = dir / "test.csv";
  o.max_seq_length = 16;
  o.per_device_train_batch_size = 8;
  o.do_eval = true;
  return o;
}

// A folder whose config names BertForMaskedLM (as bert-base-uncased's does) trains its masked-LM
// head on a text file without --mlm, as the pipelines would load it, and a classifier on
// labelled files (or the labelled synthetic data), as run_glue loads any checkpoint;
// `architectures` that is not a list of names is refused by name.
TEST(Evaluate, TheHeadFollowsArchitecturesUnlessTheFilesAreLabelled) {
  TempDir dir("architectures");
  const std::string model = write_model_folder(
      dir, "bert_mlm",
      R"({"model_type": "bert", "architectures": ["BertForMaskedLM"], "vocab_size": 1200,
          "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
          "intermediate_size": 48, "max_position_embeddings": 64})");
  TrainOptions o = tiny_options(model, dir / "text");
  o.tokenizer_name = fixture("tokenizer/wordpiece");
  o.train_file = write_fixture_text(dir, "text.txt");
  o.max_seq_length = 32;
  o.max_steps = 2;
  train_logging(o, nullptr);
  EXPECT_EQ(read_json(o.output_dir + "/config.json")["architectures"],
            nlohmann::json::array({"BertForMaskedLM"}));
  o.output_dir = dir / "labelled";
  write_review_csv(dir, "train.csv", 16, 1, true);
  o.train_file = dir / "train.csv";
  train_logging(o, nullptr);
  EXPECT_EQ(read_json(o.output_dir + "/config.json")["architectures"],
            nlohmann::json::array({"BertForSequenceClassification"}));
  // The synthetic data is labelled too.
  TrainOptions synthetic = tiny_options(model, dir / "synthetic");
  synthetic.max_steps = 1;
  train_logging(synthetic, nullptr);
  EXPECT_EQ(read_json(synthetic.output_dir + "/config.json")["architectures"],
            nlohmann::json::array({"BertForSequenceClassification"}));
  const std::string bad = write_model_folder(
      dir, "bad", R"({"model_type": "bert", "architectures": "BertForMaskedLM", "vocab_size": 1200,
                     "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
                     "intermediate_size": 48, "max_position_embeddings": 64})");
  o.model_name_or_path = bad;
  o.output_dir = dir / "bad_out";
  expect_error([&] { train(o, [](const nlohmann::json&) {}); },
               "\"architectures\" must be a list of class names");
}

TEST(Evaluate, RunGlueOnACsvFile) {
  TempDir dir("glue");
  auto write_csv = [&](const std::string& name, int rows, int seed, bool labels) {
    write_review_csv(dir, name, rows, seed, labels);
  };
  write_csv("train.csv", 96, 1, true);
  write_csv("dev.csv", 30, 2, true);
  write_csv("test.csv", 10, 3, false);
  TrainOptions o = glue_options(dir, "out");
  o.max_steps = 60;
  o.learning_rate = 3e-3;
  o.do_predict = true;
  TrainSummary s;
  train_logging(o, &s);
  EXPECT_GT(s.eval_metrics["eval_accuracy"].get<double>(), 0.9) << s.eval_metrics.dump();
  EXPECT_EQ(s.eval_metrics["eval_samples"], 30);
  // The saved folder is a complete transformers folder: labels named, tokenizer beside it.
  const nlohmann::json config = read_json(o.output_dir + "/config.json");
  EXPECT_EQ(config["id2label"], (nlohmann::json{{"0", "negative"}, {"1", "positive"}}));
  EXPECT_EQ(config["label2id"], (nlohmann::json{{"negative", 0}, {"positive", 1}}));
  EXPECT_TRUE(fs::exists(o.output_dir + "/tokenizer.json"));
  std::ifstream pred(o.output_dir + "/predict_results.txt");
  std::string line;
  std::getline(pred, line);
  EXPECT_EQ(line, "index\tprediction");
  int rows = 0, right = 0;
  while (std::getline(pred, line)) {
    const bool pos = (rows * 7 + 3) % 3 != 0;
    right += line == std::to_string(rows) + "\t" + (pos ? "positive" : "negative");
    ++rows;
  }
  EXPECT_EQ(rows, 10);
  EXPECT_GE(right, 9);
  // The fine-tuned folder evaluates on its own: tokenizer and label names come with it.
  TrainOptions again;
  again.model_name_or_path = o.output_dir;
  again.output_dir = dir / "again";
  again.validation_file = o.validation_file;
  again.max_seq_length = 16;
  again.do_train = false;
  again.do_eval = true;
  again.disable_tqdm = true;
  again.device = "cpu";
  TrainSummary e;
  train_logging(again, &e);
  EXPECT_NEAR(e.eval_metrics["eval_loss"].get<double>(), s.eval_metrics["eval_loss"].get<double>(),
              1e-5);
  // Fewer rows than one evaluation batch (8): one partial batch, as the Trainer evaluates them
  // (a run that does not train has no training loader to refuse them).
  write_csv("two.csv", 2, 4, true);
  TrainOptions two = again;
  two.validation_file = dir / "two.csv";
  two.output_dir = dir / "two";
  TrainSummary t;
  train_logging(two, &t);
  EXPECT_EQ(t.eval_metrics["eval_samples"], 2);
  EXPECT_TRUE(std::isfinite(t.eval_metrics["eval_loss"].get<double>())) << t.eval_metrics.dump();
  // Bad data ends with a message naming the file and line.
  std::ofstream(dir / "bad.csv") << "sentence,label\n\"unclosed,positive\n";
  o.validation_file = dir / "bad.csv";
  expect_error([&] { train(o, [](const nlohmann::json&) {}); }, "bad.csv:2: a quoted field");
}

// GLUE's exports as datasets' to_csv and pandas write them: 0/1 labels (-1 throughout a test
// split) and an index column: "pandas" a leading unnamed one, "glue" a trailing idx, "" none.
void write_glue_csv(const TempDir& dir, const std::string& name, int rows, int seed,
                    const std::string& index, bool test) {
  std::ofstream f(dir / name);
  f << (index == "pandas" ? "," : "") << "sentence,label" << (index == "glue" ? ",idx" : "")
    << "\n";
  for (int i = 0; i < rows; ++i) {
    const bool pos = (i * 7 + seed) % 3 != 0;
    if (index == "pandas") f << i << ",";
    f << (pos ? "good" : "bad") << " film number " << i % 5 << "," << (test ? -1 : pos ? 1 : 0);
    f << (index == "glue" ? "," + std::to_string(i) : "") << "\n";
  }
}

// The notes of a run on GLUE files with pandas' index in train.csv and idx in dev/test.csv.
const std::vector<std::string> kGlueIndexNotes = {
    "column \"Unnamed: 0\" of train.csv holds whole numbers: skipped as an index column, not read "
    "as text",
    "column \"idx\" of dev.csv, test.csv holds whole numbers: skipped as an index column, not "
    "read as text"};

// The rows of a predict_results.txt, its header aside.
int prediction_rows(const std::string& path) {
  std::ifstream pred(path);
  std::string line;
  int rows = -1;
  while (std::getline(pred, line)) ++rows;
  return rows;
}

// A GLUE test split (label -1) is predicted without predict metrics; index columns are skipped
// with one note per column name, and the run trains exactly as on the files without them.
TEST(Evaluate, GlueExportsWithIndexColumnsAndUnlabelledTestRows) {
  TempDir dir("glue_export");
  auto run = [&](const std::string& train_index, const std::string& other_index,
                 const std::string& out, std::vector<nlohmann::json>* records) {
    write_glue_csv(dir, "train.csv", 48, 1, train_index, false);
    write_glue_csv(dir, "dev.csv", 12, 2, other_index, false);
    write_glue_csv(dir, "test.csv", 10, 3, other_index, true);
    TrainOptions o = glue_options(dir, out);
    o.max_steps = 6;
    o.do_predict = true;
    TrainSummary s;
    *records = train_logging(o, &s);
    return s.train_loss;
  };
  std::vector<nlohmann::json> records, plain_records;
  const double loss = run("pandas", "glue", "indexed", &records);
  EXPECT_EQ(run("", "", "plain", &plain_records), loss);
  std::vector<std::string> notes;
  bool predicted = false;
  for (const nlohmann::json& r : records) {
    if (r.contains("data_files")) notes.push_back(r["data_files"]);
    if (r.contains("predict_runtime")) predicted = true;
    EXPECT_FALSE(r.contains("predict_loss") || r.contains("predict_accuracy")) << r.dump();
  }
  EXPECT_TRUE(predicted);
  EXPECT_EQ(notes, kGlueIndexNotes);
  for (const nlohmann::json& r : plain_records) EXPECT_FALSE(r.contains("data_files")) << r.dump();
  EXPECT_EQ(prediction_rows(dir / "indexed/predict_results.txt"), 10);
}

// The same with files pandas wrote (scripts/make_glue_fixtures.py): to_csv's default index in
// train.csv, GLUE's idx and withheld labels (-1) in dev.csv and test.csv.
TEST(Evaluate, GlueFilesAsPandasWritesThem) {
  TempDir dir("glue_pandas");
  TrainOptions o = tiny_options(write_wordpiece_bert(dir), dir / "out");
  o.tokenizer_name = fixture("tokenizer/wordpiece");
  o.train_file = fixture("glue_pandas/train.csv");
  o.validation_file = fixture("glue_pandas/dev.csv");
  o.test_file = fixture("glue_pandas/test.csv");
  o.tokenized_cache_dir = "none";
  o.max_seq_length = 16;
  o.max_steps = 3;
  o.do_eval = true;
  o.do_predict = true;
  std::vector<std::string> notes;
  nlohmann::json eval, predict;
  train(o, [&](const nlohmann::json& r) {
    if (r.contains("data_files")) notes.push_back(r["data_files"]);
    if (r.contains("predict_runtime")) predict = r;
    if (r.contains("eval_accuracy")) eval = r;
  });
  EXPECT_EQ(notes, kGlueIndexNotes);
  EXPECT_FALSE(eval.is_null());
  ASSERT_FALSE(predict.is_null());
  EXPECT_FALSE(predict.contains("predict_accuracy")) << predict.dump();
  EXPECT_EQ(prediction_rows(dir / "out/predict_results.txt"), 6);
}

// DistilBERT fine-tuned on the same files: no token types reach it, its saved folder is a
// DistilBertForSequenceClassification with the label names.
TEST(Evaluate, RunGlueWithDistilBert) {
  TempDir dir("glue_distil");
  write_review_csv(dir, "train.csv", 96, 1, true);
  write_review_csv(dir, "dev.csv", 30, 2, true);
  const std::string model = write_model_folder(
      dir, "distilbert",
      R"({"model_type": "distilbert", "vocab_size": 1200, "dim": 32, "n_layers": 2,
          "n_heads": 2, "hidden_dim": 48, "max_position_embeddings": 64, "dropout": 0.0,
          "attention_dropout": 0.0, "seq_classif_dropout": 0.0})");
  TrainOptions o = tiny_options(model, dir / "out");
  o.tokenizer_name = fixture("tokenizer/wordpiece");
  o.train_file = dir / "train.csv";
  o.validation_file = dir / "dev.csv";
  o.max_seq_length = 16;
  o.per_device_train_batch_size = 8;
  o.max_steps = 60;
  o.do_eval = true;
  TrainSummary s;
  train_logging(o, &s);
  EXPECT_GT(s.eval_metrics["eval_accuracy"].get<double>(), 0.9) << s.eval_metrics.dump();
  const nlohmann::json config = read_json(o.output_dir + "/config.json");
  EXPECT_EQ(config["model_type"], "distilbert");
  EXPECT_EQ(config["id2label"], (nlohmann::json{{"0", "negative"}, {"1", "positive"}}));
  SafetensorsFile saved(o.output_dir + "/model.safetensors");
  EXPECT_TRUE(saved.has("distilbert.transformer.layer.1.ffn.lin2.weight"));
  EXPECT_TRUE(saved.has("pre_classifier.weight"));
  EXPECT_FALSE(saved.has("distilbert.embeddings.token_type_embeddings.weight"));
}

// Dynamic padding (the default) computes each batch at its longest row: the same training and
// evaluation as padding every batch to max_seq_length, up to rounding; group_by_length reorders
// the batches and still learns.
TEST(Evaluate, DynamicPaddingTrainsAsPaddingToTheMaximum) {
  TempDir dir("padding");
  auto write_csv = [&](const std::string& name, int rows, int seed) {
    std::ofstream f(dir / name);
    f << "sentence,label\n";
    for (int i = 0; i < rows; ++i) {
      const bool pos = (i * 7 + seed) % 3 != 0;
      f << (pos ? "good" : "bad") << " film";
      for (int w = 0; w < (i * 5 + seed) % 13; ++w) f << " and the plot";  // 2 to 41 tokens
      f << "," << (pos ? "positive" : "negative") << "\n";
    }
  };
  write_csv("train.csv", 64, 1);
  write_csv("dev.csv", 20, 2);
  const std::string model = write_wordpiece_bert(dir);
  auto run = [&](bool pad_to_max_length, bool group_by_length, int steps) {
    TrainOptions o = tiny_options(model, dir / "out");
    o.tokenizer_name = fixture("tokenizer/wordpiece");
    o.train_file = dir / "train.csv";
    o.validation_file = dir / "dev.csv";
    o.max_seq_length = 48;
    o.per_device_train_batch_size = 8;
    o.max_steps = steps;
    o.learning_rate = 3e-3;
    o.do_eval = true;
    o.save_strategy = "no";
    o.pad_to_max_length = pad_to_max_length;
    o.group_by_length = group_by_length;
    TrainSummary s;
    train_logging(o, &s);
    return s;
  };
  const TrainSummary padded = run(true, false, 8), dynamic = run(false, false, 8);
  EXPECT_NEAR(dynamic.train_loss, padded.train_loss, 1e-5 * padded.train_loss);
  EXPECT_NEAR(dynamic.eval_metrics["eval_loss"].get<double>(),
              padded.eval_metrics["eval_loss"].get<double>(),
              1e-5 * padded.eval_metrics["eval_loss"].get<double>());
  const TrainSummary grouped = run(false, true, 80);
  EXPECT_GT(grouped.eval_metrics["eval_accuracy"].get<double>(), 0.9)
      << grouped.eval_metrics.dump();
}

// Real-valued labels: regression as run_glue sets it up (num_labels 1, MSE, STS-B's metrics,
// numbers predicted), and the saved folder evaluates as a regression model again.
TEST(Evaluate, RunGlueRegressionOnACsvFile) {
  TempDir dir("glue_regression");
  const char* words[] = {"good", "bad", "fine", "awful"};
  const float scores[] = {2.5f, -1.0f, 1.5f, -2.0f};  // the first word decides the score
  auto write_csv = [&](const std::string& name, int rows, int seed, bool labels) {
    std::ofstream f(dir / name);
    f << (labels ? "sentence,label\n" : "sentence\n");
    for (int i = 0; i < rows; ++i) {
      const int w = (i * 5 + seed) % 4;
      f << words[w] << " film " << (i % 3);
      if (labels) f << "," << scores[w] + 0.125f * static_cast<float>(i % 2);
      f << "\n";
    }
  };
  write_csv("train.csv", 96, 1, true);
  write_csv("dev.csv", 24, 2, true);
  write_csv("test.csv", 8, 3, false);
  const std::string model = write_wordpiece_bert(dir);
  TrainOptions o = tiny_options(model, dir / "out");
  o.tokenizer_name = fixture("tokenizer/wordpiece");
  o.train_file = dir / "train.csv";
  o.validation_file = dir / "dev.csv";
  o.test_file = dir / "test.csv";
  o.max_seq_length = 8;
  o.per_device_train_batch_size = 8;
  o.max_steps = 160;
  o.learning_rate = 3e-3;
  o.do_eval = true;
  o.do_predict = true;
  TrainSummary s;
  train_logging(o, &s);
  const nlohmann::json& m = s.eval_metrics;
  EXPECT_LT(m["eval_mse"].get<double>(), 0.3) << m.dump();
  EXPECT_GT(m["eval_pearson"].get<double>(), 0.95) << m.dump();
  EXPECT_GT(m["eval_spearmanr"].get<double>(), 0.8) << m.dump();
  // transformers' MSELoss is the mean: the loss is the metric.
  EXPECT_NEAR(m["eval_loss"].get<double>(), m["eval_mse"].get<double>(), 1e-4);
  EXPECT_FALSE(m.contains("eval_accuracy"));
  const nlohmann::json config = read_json(o.output_dir + "/config.json");
  EXPECT_EQ(config["problem_type"], "regression");
  EXPECT_EQ(config["id2label"], (nlohmann::json{{"0", "LABEL_0"}}));
  std::ifstream pred(o.output_dir + "/predict_results.txt");
  std::string line;
  std::getline(pred, line);
  EXPECT_EQ(line, "index\tprediction");
  int rows = 0;
  while (std::getline(pred, line)) {
    const float want = scores[(rows * 5 + 3) % 4];
    const size_t tab = line.find('\t');
    ASSERT_NE(tab, std::string::npos) << line;
    EXPECT_EQ(line.substr(0, tab), std::to_string(rows));
    const std::string number = line.substr(tab + 1);
    EXPECT_EQ(number.size() - number.find('.'), 4u) << "three decimals: " << line;
    EXPECT_NEAR(std::stod(number), want, 0.75) << line;
    ++rows;
  }
  EXPECT_EQ(rows, 8);
  TrainOptions again;
  again.model_name_or_path = o.output_dir;
  again.output_dir = dir / "again";
  again.validation_file = o.validation_file;
  again.max_seq_length = 8;
  again.do_train = false;
  again.do_eval = true;
  again.disable_tqdm = true;
  again.device = "cpu";
  TrainSummary e;
  train_logging(again, &e);
  EXPECT_NEAR(e.eval_metrics["eval_mse"].get<double>(), m["eval_mse"].get<double>(), 1e-5);
  // A label that is not a number among numeric ones is refused by file and line.
  std::ofstream(dir / "mixed.csv") << "sentence,label\ngood film,1.5\nbad film,terrible\n";
  o.validation_file = dir / "mixed.csv";
  expect_error([&] { train(o, [](const nlohmann::json&) {}); }, "mixed.csv:3: label");
}

TEST(Evaluate, RunClmOnATextFile) {
  TempDir dir("clm");
  write_fixture_text(dir, "text.txt");
  const std::string model = write_model_folder(
      dir, "gpt2",
      R"({"model_type": "gpt2", "vocab_size": 800, "n_embd": 32, "n_layer": 2, "n_head": 2,
          "n_positions": 64, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0})");
  TrainOptions o = tiny_options(model, dir / "out");
  o.tokenizer_name = fixture("tokenizer/bpe");
  o.train_file = dir / "text.txt";
  o.block_size = 32;
  o.validation_split_percentage = 10;
  o.max_steps = 20;
  o.learning_rate = 3e-3;
  o.do_eval = true;
  TrainSummary s;
  train_logging(o, &s);
  const double loss = s.eval_metrics["eval_loss"];
  EXPECT_LT(loss, std::log(800.0));  // learned something of the text
  EXPECT_NEAR(s.eval_metrics["perplexity"].get<double>(), std::exp(loss), 1e-9 * std::exp(loss));
  EXPECT_GT(s.eval_metrics["eval_samples"].get<int64_t>(), 0);
  o.block_size = 100000;
  expect_error([&] { train(o, [](const nlohmann::json&) {}); },
               "--block_size 100000 exceeds the model's max_position_embeddings 64");
}

// run_mlm on a text file: BertForMaskedLM learns the masked tokens (grouped blocks, then one
// sample per line), its evaluation reports perplexity, its folder is a BertForMaskedLM's.
TEST(Evaluate, RunMlmOnATextFile) {
  TempDir dir("mlm");
  write_fixture_text(dir, "text.txt");
  const std::string model = write_wordpiece_bert(dir);
  TrainOptions o = tiny_options(model, dir / "out");
  o.tokenizer_name = fixture("tokenizer/wordpiece");
  o.train_file = dir / "text.txt";
  o.mlm = true;
  o.max_seq_length = 32;
  o.validation_split_percentage = 10;
  o.max_steps = 120;
  o.learning_rate = 5e-3;
  o.do_eval = true;
  TrainSummary s;
  const std::vector<nlohmann::json> logs = train_logging(o, &s);
  std::vector<double> losses;
  std::string cache_notes;
  for (const auto& j : logs) {
    if (j.contains("loss")) losses.push_back(j["loss"].get<double>());
    if (j.contains("tokenized_cache")) cache_notes += j["tokenized_cache"].get<std::string>();
  }
  ASSERT_GE(losses.size(), 20u);
  // The tokenization cache says what it did, as for the other tasks.
  EXPECT_NE(cache_notes.find("tokenized, cached in"), std::string::npos) << cache_notes;
  // Mean of the last five steps well below the first five (the masks differ per step).
  const double first = (losses[0] + losses[1] + losses[2] + losses[3] + losses[4]) / 5;
  const double last =
      (losses[losses.size() - 1] + losses[losses.size() - 2] + losses[losses.size() - 3] +
       losses[losses.size() - 4] + losses[losses.size() - 5]) /
      5;
  EXPECT_LT(last, first - 1.0) << first << " -> " << last;
  const double loss = s.eval_metrics["eval_loss"];
  EXPECT_LT(loss, std::log(1200.0));
  EXPECT_NEAR(s.eval_metrics["perplexity"].get<double>(), std::exp(loss), 1e-9 * std::exp(loss));
  const nlohmann::json config = read_json(o.output_dir + "/config.json");
  EXPECT_EQ(config["architectures"], nlohmann::json::array({"BertForMaskedLM"}));
  SafetensorsFile saved(o.output_dir + "/model.safetensors");
  EXPECT_TRUE(saved.has("cls.predictions.bias"));
  EXPECT_TRUE(saved.has("cls.predictions.transform.LayerNorm.weight"));
  EXPECT_FALSE(saved.has("classifier.weight"));
  EXPECT_FALSE(saved.has("bert.pooler.dense.weight"));

  o.line_by_line = true;
  o.output_dir = dir / "out_lines";
  o.max_steps = 4;
  TrainSummary lines;
  train_logging(o, &lines);
  EXPECT_GT(lines.eval_metrics["eval_samples"].get<int64_t>(), 0);

  o.do_predict = true;
  o.test_file = o.train_file;
  expect_error([&] { train(o, [](const nlohmann::json&) {}); }, "a masked LM has no labels");
  o.do_predict = false;
  o.test_file.clear();
  o.mlm = false;
  expect_error([&] { train(o, [](const nlohmann::json&) {}); },
               "--line_by_line makes a language model's samples of lines; this model classifies");
  TrainOptions gpt2 = tiny_options(write_config(dir, "gpt2", 0.0), dir / "out_gpt2");
  gpt2.mlm = true;
  expect_error([&] { train(gpt2, [](const nlohmann::json&) {}); },
               "needs a bert or distilbert model");
}

}  // namespace
}  // namespace brisk::testing
