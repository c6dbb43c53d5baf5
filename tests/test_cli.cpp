// The brisk program end to end: forward-backward reproduces the fixtures through files, train
// runs on the built-in data, and every kind of bad input ends with one clear message and a
// non-zero exit (never a signal).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <vector>

#include "cli_support.h"
#include "test_support.h"
#include "trainer_support.h"

namespace brisk::testing {
namespace {

// forward-backward on a fixture folder (its weights and batch) matches transformers' loss and
// logits in its expected.safetensors; `more` checks further outputs before the file is removed.
void expect_forward_backward_matches(
    const std::string& name,
    const std::function<void(const SafetensorsFile&, const SafetensorsFile&)>& more = {}) {
  SCOPED_TRACE(name);
  const std::string folder = fixture(name);
  const std::string out = (std::filesystem::temp_directory_path() /
                           ("brisk_fb_" + name + std::to_string(::getpid()) + ".safetensors"))
                              .string();
  const CliRun r =
      run_brisk("forward-backward --config " + folder + " --weights " + folder +
                "/model.safetensors --batch " + folder + "/batch.safetensors --output " + out);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  {
    SafetensorsFile got(out), want(folder + "/expected.safetensors");
    EXPECT_NEAR(got.get("loss").f32()[0], want.get("loss").f32()[0], 1e-4);
    const Tensor& gl = got.get("logits");
    ASSERT_EQ(gl.numel(), want.get("logits").numel());
    EXPECT_LE(rel_error(gl.f32(), want.get("logits").f32(), gl.numel()), 1e-4);
    if (more) more(got, want);
  }
  std::filesystem::remove(out);
}

TEST(Cli, ForwardBackwardWritesLossLogitsAndGradients) {
  expect_forward_backward_matches("gpt2_tiny", [](const SafetensorsFile& got,
                                                  const SafetensorsFile& want) {
    const Tensor& gw = got.get("grad.transformer.wte.weight");
    EXPECT_LE(rel_error(gw.f32(), want.get("grad.transformer.wte.weight").f32(), gw.numel()), 1e-4);
  });
}

// The head follows config.json's `architectures`, as transformers' pipelines choose it: the
// bert_mlm and distilbert_mlm folders (BertForMaskedLM, DistilBertForMaskedLM) run as masked LMs
// without --mlm, reproducing transformers' loss and logits.
TEST(Cli, ForwardBackwardTakesTheHeadFromArchitectures) {
  for (const char* name : {"bert_mlm", "distilbert_mlm"}) expect_forward_backward_matches(name);
}

// forward-backward reports every row's logits, whatever the labels: the fixture's 3 rows of 10
// tokens repeated 3 times (90 rows, 21 labelled: fewer than a masked LM's training pass decodes)
// give transformers' logits for each repeat.
TEST(Cli, ForwardBackwardOfAMaskedLmWritesEveryRowsLogits) {
  const std::string folder = fixture("bert_mlm");
  TempDir dir("fb_mlm_rows");
  std::vector<std::pair<std::string, Tensor>> tiled;
  std::vector<std::vector<int32_t>> columns;
  {
    SafetensorsFile batch(folder + "/batch.safetensors");
    for (const std::string& name : batch.names()) {
      const Tensor& t = batch.get(name);
      std::vector<int32_t>& v = columns.emplace_back();
      for (int repeat = 0; repeat < 3; ++repeat) v.insert(v.end(), t.i32(), t.i32() + t.numel());
      tiled.emplace_back(name, Tensor(v.data(), Shape{3 * t.dim(0), t.dim(1)}, DType::i32));
    }
    write_safetensors(dir / "batch.safetensors", tiled);
  }
  const CliRun r = run_brisk("forward-backward --config " + folder + " --weights " + folder +
                             "/model.safetensors --batch " + dir / "batch.safetensors" +
                             " --output " + dir / "out.safetensors");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  SafetensorsFile got(dir / "out.safetensors"), want(folder + "/expected.safetensors");
  const Tensor& w = want.get("logits");
  ASSERT_EQ(got.get("logits").numel(), 3 * w.numel());
  for (int repeat = 0; repeat < 3; ++repeat)
    EXPECT_LE(rel_error(got.get("logits").f32() + repeat * w.numel(), w.f32(), w.numel()), 1e-4)
        << "repeat " << repeat;
}

TEST(Cli, TrainRunsOnTheBuiltInDataAndPrintsTheSummary) {
  const std::string out =
      (std::filesystem::temp_directory_path() / ("brisk_cli_train_" + std::to_string(::getpid())))
          .string();
  const CliRun r = run_brisk(
      "train --model bert-tiny --max_steps 3 --per_device_train_batch_size 2 --seq_len 16 "
      "--dataset_size 8 --logging_steps 1 --output_dir " +
      out);
  std::filesystem::remove_all(out);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* key :
       {"\"step\":3", "train_runtime", "train_samples_per_second", "train_steps_per_second",
        "train_loss", "total_flos", "activations", "optimizer_state", "process peak"})
    EXPECT_NE(r.out.find(key), std::string::npos) << "missing " << key << " in\n" << r.out;
}

// One row per class of bad input found by trying brisk as an attacker would (issue 11): each is
// refused with exit 1 and one short line naming the problem.
TEST(Cli, EveryClassOfBadInputEndsWithOneShortLine) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("brisk_bad_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  auto file = [&](const std::string& name, const std::string& text) {
    const std::string path = (dir / name).string();
    std::ofstream(path, std::ios::binary) << text;
    return path;
  };
  auto safetensors = [&](const std::string& name, const std::string& header,
                         const std::string& data, int64_t declared = -1) {
    if (declared < 0) declared = static_cast<int64_t>(header.size());
    std::string bytes(8, '\0');
    for (int i = 0; i < 8; ++i)
      bytes[i] = static_cast<char>(static_cast<uint64_t>(declared) >> (8 * i));
    return file(name, bytes + header + data);
  };
  const std::string bert = fixture("bert_tiny/");
  const std::string fb_weights =
      "forward-backward --config " + bert + " --batch " + bert + "batch.safetensors --weights ";
  const std::string tensor = R"("w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  const std::string one = "{" + tensor + "} ";
  // A checkpoint to tamper with.
  const std::string ckpt_dir = (dir / "run").string();
  const std::string tiny = "--model gpt2-tiny --seq_len 16 --dataset_size 16 --disable_tqdm ";
  ASSERT_EQ(run_brisk("train " + tiny + "--max_steps 2 --save_steps 2 --output_dir " + ckpt_dir)
                .exit_code,
            0);
  const std::string state = ckpt_dir + "/checkpoint-2/trainer_state.json";
  std::ifstream in(state);
  nlohmann::json ts = nlohmann::json::parse(in);
  in.close();
  ts["sample_position"] = -3;
  std::ofstream(state) << ts.dump();

  const std::vector<std::pair<std::string, std::string>> cases = {
      // Size arithmetic: a size beyond its bound, a plan beyond memory, a shape that overflows.
      {"estimate --model " + file("huge.json",
                                  R"({"model_type":"gpt2","vocab_size":4611686018427387904,)"
                                  R"("n_embd":64,"n_layer":1,"n_head":2,"n_positions":64})"),
       "is outside [1, 2147483647]"},
      {"train --device cpu --seq_len 8 --model " +
           file("bounds.json", R"({"model_type":"gpt2","vocab_size":2147483647,"n_embd":131072,)"
                               R"("n_layer":4096,"n_head":4096,"n_positions":4194304})"),
       "of host memory but only"},
      {"estimate --model " + file("layers.json",
                                  R"({"model_type":"gpt2","vocab_size":64,"n_embd":64,)"
                                  R"("n_layer":1000000000,"n_head":2,"n_positions":64})"),
       "\"n_layer\" = 1000000000 is outside [1, 4096]"},
      {fb_weights + safetensors("wide.safetensors",
                                R"({"w":{"dtype":"F32","shape":[2305843009213693952,8],)"
                                R"("data_offsets":[0,0]}})",
                                ""),
       "too large"},
      // JSON nested without bound.
      {"estimate --model " +
           file("deep.json", R"({"model_type":"gpt2","x":)" + std::string(100000, '[') +
                                 std::string(100000, ']') + "}"),
       "nested deeper than 32 levels"},
      // Exceptions that used to escape main.
      {"estimate --options_file " + dir.string(), "is not a regular file (a folder)"},
      // Checkpoint state trusted on resume.
      {"train " + tiny + "--max_steps 3 --output_dir " + (dir / "resumed").string() +
           " --resume_from_checkpoint " + ckpt_dir + "/checkpoint-2",
       "\"sample_position\" must be a whole number"},
      {"train " + tiny + "--output_dir " + (dir / "empty").string() +
           " --resume_from_checkpoint last",
       "holds no complete checkpoint"},
      // Safetensors looser than the reference library.
      {fb_weights + safetensors("short.safetensors", one, std::string(8, '\0'),
                                static_cast<int64_t>(one.size()) - 1),
       "covers 8 bytes of the data section's 9"},
      {fb_weights + safetensors("overlap.safetensors",
                                R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                                std::string(12, '\0')),
       "the previous tensor's data ends at 8"},
      // Host allocations outside the plan.
      {"train --model gpt2-tiny --seq_len 8 --dataset_size 1099511627776",
       "of host memory but only"},
      // Float-to-integer casts and out-of-range numbers.
      {"estimate --num_train_epochs 1e300", "num_train_epochs must be at most 1e12"},
      {"estimate --warmup_steps 1e300", "warmup_steps"},
      {"estimate --seed -1", "--seed"},
      {"estimate --learning_rate inf", "learning_rate must be a finite number"},
      {"estimate --options_file " + file("cast.json", R"({"seq_len": 7.9})"),
       "option \"seq_len\" must be a whole number, got 7.9"},
      {"estimate --options_file " + file("max.json", R"({"max_steps": 1e300})"),
       "option \"max_steps\" must be a whole number"},
      // Messages: a huge value is shown as an excerpt (expect_refused bounds the line).
      {"estimate --options_file " +
           file("long.json", R"({"optim": ")" + std::string(17 << 20, 'x') + "\"}"),
       "larger than 16.0 MiB"},
      {"estimate --options_file " +
           file("long2.json", R"({"optim": ")" + std::string(3000, 'x') + "\"}"),
       "unknown optim \"xxx"},
      {"estimate --seq_len " + std::string(100000, '9'), "--seq_len: \"999"},
      {"estimate --options_file " +
           file("path.json", R"({"output_dir": ")" + std::string(100000, 'd') + "\"}"),
       "output_dir is 100000 characters long (at most 4096)"},
      {"estimate --optim sgd --optim_args momentum=" + std::string(3000, '9') + "x",
       "optim_args: momentum must be a number"},
  };
  for (const auto& [args, needle] : cases) expect_refused(args, needle);
  fs::remove_all(dir);
}

// brisk tokenize prints each line's ids as the library gives them (the fixture's expectations).
TEST(Cli, TokenizePrintsEachLinesIds) {
  const std::string in = (std::filesystem::temp_directory_path() /
                          ("brisk_tok_in_" + std::to_string(::getpid()) + ".txt"))
                             .string();
  std::ofstream(in) << "Hello, world! This is a TEST of the tokenizer.\n\n";
  const CliRun r =
      run_brisk("tokenize --tokenizer " + fixture("tokenizer/wordpiece") + " --input " + in);
  std::filesystem::remove(in);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::ifstream f(fixture("tokenizer/expected_cli.txt"));
  std::stringstream want;
  want << f.rdbuf();
  EXPECT_EQ(r.out, want.str());
  expect_refused("tokenize --tokenizer /nonexistent", "no tokenizer at '/nonexistent'");
}

TEST(Cli, HelpShowsTheBooleansRealDefaults) {
  for (const char* sub : {"train", "estimate"}) {
    const CliRun r = run_brisk(std::string(sub) + " --help");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    for (const char* flag :
         {"--fp16 [BOOLEAN=false]", "--bf16 [BOOLEAN=false]",
          "--gradient_checkpointing [BOOLEAN=false]", "--tf32 [BOOLEAN=false]",
          "--disable_tqdm [BOOLEAN=false]", "--bf16_master_weights [BOOLEAN=true]"})
      EXPECT_NE(r.out.find(flag), std::string::npos) << sub << ": no " << flag << " in\n" << r.out;
  }
}

// The command line as a Trainer user types it: argparse's rules (the last of a repeated flag
// wins), TrainingArguments' other keys accepted where they change nothing and listed as
// ignored, a typo answered with the option meant, --help in headed groups, and first records
// saying when the run trains on synthetic data or from random weights.
TEST(Cli, TrainTakesATrainerUsersCommandLine) {
  const std::string out =
      (std::filesystem::temp_directory_path() / ("brisk_cli_trainer_" + std::to_string(::getpid())))
          .string();
  const CliRun r = run_brisk(
      "train --model gpt2-tiny --seq_len 16 --dataset_size 8 --per_device_train_batch_size 4 "
      "--max_steps 5 --max_steps 2 --logging_steps 1 --save_strategy no --output_dir " +
      out + " --run_name demo --torch_compile --push_to_hub false --evaluation_strategy no");
  std::filesystem::remove_all(out);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("\"step\":2"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("\"step\":3"), std::string::npos) << "--max_steps 5 won over 2";
  EXPECT_EQ(r.out.find("{\"options_without_effect\":[\"run_name\",\"torch_compile\","
                       "\"push_to_hub\"]}"),
            0u)
      << r.out;
  EXPECT_NE(r.out.find("training on synthetic data (8 random sequences of 16 tokens"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("'gpt2-tiny' is brisk's built-in configuration"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("epoch                      = 1"), std::string::npos) << r.out;
  // A refused option is all a run says: no note about its data or weights before it.
  const CliRun refused = run_brisk(
      "train --model gpt2-tiny --seq_len 16 --dataset_size 8 "
      "--per_device_train_batch_size -1 --output_dir " +
      out);
  EXPECT_EQ(refused.exit_code, 1) << refused.err;
  EXPECT_EQ(refused.out, "") << "printed before refusing";
  EXPECT_NE(refused.err.find("per_device_train_batch_size must be positive"), std::string::npos)
      << refused.err;
  std::filesystem::remove_all(out);
  expect_refused("train --lerning_rate 1e-4", "(did you mean --learning_rate?)");
  expect_refused("train --push_to_hub", "push_to_hub = true is not implemented in brisk");
  expect_refused("train --task_name mrpc", "brisk reads no dataset hub");
  expect_refused("train --model google-bert/bert-base-uncased",
                 "brisk downloads nothing: run `huggingface-cli download "
                 "google-bert/bert-base-uncased --local-dir DIR` where a hub is reachable");
  const CliRun help = run_brisk("train --help");
  ASSERT_EQ(help.exit_code, 0);
  size_t last = 0;
  for (const char* heading :
       {"Model:", "Data:", "Training:", "Memory and device:", "Precision:", "Checkpoints:",
        "Evaluation and prediction:", "Logging:", "Several processes:"}) {
    const size_t at = help.out.find(heading);
    EXPECT_NE(at, std::string::npos) << heading << " in\n" << help.out;
    last = std::max(last, at);
  }
  EXPECT_EQ(help.out.find("--hub_token"), std::string::npos) << "the ignored keys are listed";
}

// Every input path that must be a regular file is checked as one without blocking: a FIFO (or a
// symlink to one) as data, tokenizer, options, DeepSpeed config, model config, weights, batch,
// token file or tokenize input is refused at once, naming it (opening a FIFO waits for a writer).
TEST(Cli, SpecialFilesAreRefusedWithoutBlocking) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("brisk_fifo_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string fifo = (dir / "fifo").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  auto link = [&](const std::string& name) {
    fs::create_symlink(fifo, dir / name);
    return (dir / name).string();
  };
  const std::string csv = link("train.csv"), json = link("options.json"),
                    weights = link("model.safetensors"), tok = link("tokenizer.json");
  std::ofstream(dir / "ok.csv") << "sentence,label\ngood film,1\nbad film,0\n";
  const std::string ok = (dir / "ok.csv").string(), bert = fixture("bert_tiny/");
  const std::string wp = " --tokenizer_name " + fixture("tokenizer/wordpiece");
  const std::string out = " --output_dir " + (dir / "out").string();
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"train --model bert-tiny --train_file " + csv + wp + out, "data file '" + csv + "'"},
      {"train --model bert-tiny --train_file " + ok + " --validation_file " + csv + wp + out,
       "data file '" + csv + "'"},
      {"train --model bert-tiny --train_file " + ok + " --tokenizer_name " + tok + out,
       "tokenizer file '" + tok + "'"},
      {"train --options_file " + json, "options file '" + json + "'"},
      {"train --deepspeed " + json + out, "'" + json + "'"},
      {"estimate --model " + json, "'" + json + "'"},
      {"train --model gpt2-tiny --dataset " + fifo + out, "token file '" + fifo + "'"},
      {"forward-backward --config " + bert + " --weights " + weights + " --batch " + bert +
           "batch.safetensors",
       "safetensors file '" + weights + "'"},
      {"forward-backward --config " + bert + " --batch " + fifo, "safetensors file '" + fifo + "'"},
      {"tokenize --tokenizer " + fixture("tokenizer/wordpiece") + " --input " + fifo,
       "input '" + fifo + "'"}};
  for (const auto& [args, names] : cases) {
    SCOPED_TRACE(args);
    expect_refused(args, names + " is not a regular file (a FIFO)");
  }
  fs::remove_all(dir);
}

TEST(Cli, BadInputEndsWithOneClearMessage) {
  const std::string bad = fixture("bad/");
  const std::string bert = fixture("bert_tiny/");
  const std::string fb = "forward-backward --batch " + bert + "batch.safetensors --config ";
  expect_refused(fb + bad + "not_json.json", "is not valid JSON");
  expect_refused(fb + bad + "missing_size.json", "missing required key \"hidden_size\"");
  expect_refused(fb + bad + "negative_size.json", "must be positive, got -2");
  expect_refused(fb + bad + "unknown_type.json", "unknown model_type \"mamba\"");
  expect_refused(fb + bad + "heads_not_dividing.json", "not divisible");
  expect_refused(
      "forward-backward --config " + bert + " --batch " + bad + "batch_too_long.safetensors",
      "exceeds max_position_embeddings");
  expect_refused(
      "forward-backward --config " + bert + " --batch " + bad + "batch_bad_token.safetensors",
      "token id 97");
  expect_refused("forward-backward --config " + bert + " --weights " + bad +
                     "truncated.safetensors --batch " + bert + "batch.safetensors",
                 "is corrupt");
  expect_refused("forward-backward --config " + bert + " --batch " + bert + "missing.safetensors",
                 "cannot open");
  expect_refused("train --per_device_train_batch_size 0", "per_device_train_batch_size");
  expect_refused("train --dataset_size 2 --per_device_train_batch_size 4",
                 "smaller than one batch");
  expect_refused("train --no_such_option 1", "no_such_option");
  expect_refused(
      "train --model nonexistent-model",
      "'nonexistent-model' is no folder or config.json here, and brisk downloads nothing");
  expect_refused("train --fp16 --bf16", "contradict each other");
  // Switches as argparse's string_to_bool reads them, counts exactly.
  expect_refused("train --fp16=2", "--fp16: \"2\" is not true or false");
  expect_refused("train --dataset_size 4611686018427387904",
                 "dataset_size and eval_dataset_size must be at most 2^40 samples");
  expect_refused("train --bf16 perhaps", "--bf16: \"perhaps\" is not true or false");
  expect_refused(
      "forward-backward --config " + bert + " --batch " + bert + "batch.safetensors --step -1",
      "--step: \"-1\" is not a whole number");
  expect_refused("tokenize --tokenizer " + fixture("tokenizer/wordpiece") + " --input " + bert,
                 "is not a regular file (a folder)");
  expect_refused("train --lr_scheduler_type weird", "unknown lr_scheduler_type");
  expect_refused("train --optim adam",
                 "unknown optim \"adam\" (valid: adamw_torch, adamw_torch_fused, adafactor");
  expect_refused("train --optim sgd --optim_args momentum=0.9,nesterov=perhaps",
                 "nesterov must be true or false");
  if (!cuda_available()) expect_refused("train --device cuda --max_steps 1", "--device cuda:");
  expect_refused("train --options_file " + bad + "not_json.json", "not valid JSON");
}

}  // namespace
}  // namespace brisk::testing
