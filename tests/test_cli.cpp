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

TEST(Cli, EstimatePrintsThePlanByCategory) {
  const CliRun fp32 =
      run_brisk("estimate --model bert-large-uncased --per_device_train_batch_size 4");
  ASSERT_EQ(fp32.exit_code, 0) << fp32.err;
  EXPECT_NE(fp32.out.find("335143938 parameters"), std::string::npos) << fp32.out;
  EXPECT_NE(fp32.out.find("optimizer_state    2556.9 MiB"), std::string::npos) << fp32.out;
  const CliRun bf16 = run_brisk("estimate --model gpt2 --bf16 --seq_len 1024");
  ASSERT_EQ(bf16.exit_code, 0) << bf16.err;
  EXPECT_NE(bf16.out.find("master_weights"), std::string::npos);
  expect_refused("estimate --fp16 --bf16", "contradict");
}

// A run on a text file plans its rows' length (max_seq_length), and the first line says so.
TEST(Cli, EstimateOfATextFileRunShowsItsRowLength) {
  TempDir dir("cli_estimate_text");
  std::ofstream(dir / "train.csv") << "sentence,label\ngood film,1\nbad film,0\n";
  std::ofstream(dir / "config.json")
      << R"({"model_type": "bert", "vocab_size": 1200, "hidden_size": 32,
             "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 48,
             "max_position_embeddings": 64})";
  const CliRun r = run_brisk(
      "estimate --model " + (dir / "config.json") + " --tokenizer_name " +
      fixture("tokenizer/wordpiece") + " --train_file " + (dir / "train.csv") +
      " --max_seq_length 24 --per_device_train_batch_size 2 --output_dir " + (dir / "out"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("batch 2 x 24, fp32"), std::string::npos) << r.out;
  // A run that only evaluates: its evaluation batch, and no optimizer.
  std::ofstream(dir / "validation.csv") << "sentence,label\ngood film,1\nbad film,0\n";
  const CliRun e =
      run_brisk("estimate --model " + (dir / "config.json") + " --tokenizer_name " +
                fixture("tokenizer/wordpiece") + " --validation_file " + (dir / "validation.csv") +
                " --do_train false --do_eval --max_seq_length 24 --per_device_eval_batch_size 3 "
                "--output_dir " +
                (dir / "out"));
  ASSERT_EQ(e.exit_code, 0) << e.err;
  EXPECT_NE(e.out.find("batch 3 x 24, fp32, evaluation only"), std::string::npos) << e.out;
}

// The optimizer-state line of `brisk estimate`, in MiB.
double optimizer_state_mib(const std::string& args) {
  const CliRun r = run_brisk("estimate --model bert-large-uncased " + args);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  const size_t at = r.out.find("optimizer_state");
  if (at == std::string::npos) {
    ADD_FAILURE() << r.out;
    return 0;
  }
  return std::stod(r.out.substr(at + 15));
}

TEST(Cli, EstimatePlansEachOptimizersState) {
  const double adamw = optimizer_state_mib("");
  EXPECT_NEAR(adamw, 2556.9, 0.1);
  // 8-bit AdamW: 2 bytes per parameter plus block maxima, but 8 for the 31.8M embedding values
  // (and for the ~0.2M values of biases and LayerNorms, the 2 MiB margin).
  EXPECT_NEAR(optimizer_state_mib("--optim adamw_bnb_8bit"),
              (2 * (335143938.0 - 31782912) * (1 + 4.0 / 256) + 8 * 31782912 + 2048) / (1 << 20),
              2.0);
  EXPECT_LT(optimizer_state_mib("--optim adafactor"), 0.005 * adamw);
  EXPECT_NEAR(optimizer_state_mib("--optim sgd --optim_args momentum=0.9"), adamw / 2, 0.1);
  const CliRun direct = run_brisk("estimate --model gpt2 --bf16 --bf16_master_weights false");
  ASSERT_EQ(direct.exit_code, 0) << direct.err;
  EXPECT_NE(direct.out.find("without master weights"), std::string::npos) << direct.out;
  EXPECT_NE(direct.out.find("master_weights        0.0 MiB"), std::string::npos) << direct.out;
  expect_refused("estimate --optim adam", "unknown optim \"adam\"");
  expect_refused("estimate --bf16_master_weights false", "applies to --bf16 training only");
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

// `brisk estimate <args> --output_json F`: the JSON it wrote (the run's output in *out).
nlohmann::json estimate_json(const std::string& args, CliRun* out = nullptr) {
  namespace fs = std::filesystem;
  const std::string json =
      (fs::temp_directory_path() / ("brisk_cli_estimate_" + std::to_string(::getpid()) + ".json"))
          .string();
  const CliRun r = run_brisk("estimate " + args + " --output_json " + json);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  if (out) *out = r;
  if (r.exit_code != 0) return nlohmann::json::object();
  nlohmann::json j = read_json(json);
  fs::remove(json);
  return j;
}

// A mixture of experts' estimate names its active parameters and the routed experts' part of the
// plan: 2 layers x 4 experts x 3 x 8 x 16 = 3072 of 8912 parameters, their float32 weights and
// gradients exactly, AdamW's two moments within the optimizer's tables' share. A dense model has
// no such line.
TEST(Cli, EstimateShowsTheExpertsPartOfThePlan) {
  TempDir dir("cli_moe");
  const std::string folder = write_tiny_mixtral(dir, "", 4);
  CliRun r;
  const nlohmann::json j =
      estimate_json("--model " + folder + " --seq_len 16 --per_device_train_batch_size 2", &r);
  EXPECT_NE(r.out.find("8912 parameters (7376 active per token)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("of which the routed experts' (3072 parameters, 34.5%)"), std::string::npos)
      << r.out;
  EXPECT_EQ(j["expert_parameters"], 3072);
  EXPECT_EQ(j["expert_bytes"]["weights"], 3072 * 4);
  EXPECT_EQ(j["expert_bytes"]["gradients"], 3072 * 4);
  EXPECT_NEAR(j["expert_bytes"]["optimizer_state"].get<double>(), 3072 * 8, 3072 * 8 * 0.01);
  const nlohmann::json dense = estimate_json("--model gpt2-tiny --seq_len 16", &r);
  EXPECT_EQ(r.out.find("routed experts"), std::string::npos);
  EXPECT_EQ(dense["expert_parameters"], 0);
}

// estimate --ep_size: the plan is expert rank 0's, with half the experts; its experts' buffers
// hold the rows every rank may send them (2 ranks x 32 tokens x min(top 2, 2 experts)); ZeRO
// partitions over the ranks that hold the same experts. Layouts it cannot take are refused.
TEST(Cli, EstimatePlansAnExpertRanksShare) {
  TempDir dir("cli_ep");
  const std::string folder = write_tiny_mixtral(dir, "", 4);
  const std::string model = "--model " + folder + " --seq_len 16 --per_device_train_batch_size 2 ";
  CliRun r;
  const nlohmann::json j = estimate_json(model + "--world_size 4 --ep_size 2 --zero_stage 2", &r);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("expert parallel over 2 ranks: each holds 2 of every sparse layer's 4 "
                       "experts (1536 expert parameters"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(j["parameters"], 8912 - 1536);
  EXPECT_EQ(j["expert_parameters"], 1536);
  EXPECT_EQ(j["expert_parallel"]["receive_rows_bound"], 128);
  EXPECT_EQ(j["data_parallel"]["ranks"].size(), 2u);
  int rows = 0;
  for (const auto& b : j["memory"]["buffers"])
    if (b["name"] == "moe.0.saved.rows") {
      ++rows;
      EXPECT_EQ(b["shape"], "[128, 16]");
    }
  EXPECT_EQ(rows, 1);
  // A capacity bounds what each rank sends each expert: ceil(1.0 x 32 x 2 / 4) = 16 rows each.
  CliRun capped;
  const nlohmann::json c =
      estimate_json(model + "--world_size 4 --ep_size 2 --moe_capacity_factor 1.0", &capped);
  EXPECT_EQ(c["expert_parallel"]["receive_rows_bound"], 64);
  EXPECT_NE(capped.out.find("64 (each rank sends each of the 4 experts at most its capacity, 16 "
                            "rows)"),
            std::string::npos)
      << capped.out;
  expect_refused("estimate " + model + "--world_size 3 --ep_size 3",
                 "--ep_size 3 does not divide the mixtral config's num_local_experts = 4");
  expect_refused("estimate " + model + "--world_size 2 --ep_size 4",
                 "--ep_size 4 does not divide the 2 data-parallel ranks");
  expect_refused("estimate " + model + "--world_size 4 --ep_size 2 --tp_size 2",
                 "--ep_size with tensor, pipeline or sequence parallelism is not supported yet");
  expect_refused("estimate --model gpt2-tiny --world_size 2 --ep_size 2",
                 "--ep_size needs a mixture-of-experts model; gpt2 has no experts");
}

// estimate --output_json lists every buffer of the plan; they add up to each category's bytes.
// GPT-2's LM head holds 256 of the 1024 rows' logits at a time on the CPU (64 MiB at most), and
// the products' operand buffers are sized by that chunk.
TEST(Cli, EstimateListsEveryBufferOfThePlan) {
  const nlohmann::json j = estimate_json(
      "--model gpt2 --per_device_train_batch_size 4 --seq_len 256 --bf16 --device cpu");
  const nlohmann::json& m = j["memory"];
  ASSERT_TRUE(m.contains("buffers"));
  std::map<std::string, size_t> sums;
  int logits = 0;
  for (const auto& b : m["buffers"]) {
    sums[b["category"].get<std::string>()] += b["bytes"].get<size_t>();
    if (b["name"] == "logits") {
      ++logits;
      EXPECT_EQ(b["shape"], "[256, 50257]");
      EXPECT_EQ(b["bytes"], 256u * 50257u * 4u);
    }
    // Products' operands rounded to bf16: A at most a chunk of the logits' gradient, B the MLP's
    // widest activation, the head's weight its own buffer while held: on bf16 units two copies in
    // blocked layouts (each side padded by up to 64), on a CPU without them one plain copy
    // (float32 holding bf16 values, as the others are there).
    const bool units = b["dtype"] == "bfloat16";
    const size_t bf16_bytes = units ? 2 : 4;
    if (b["name"] == "backend.bf16_pack_a") EXPECT_EQ(b["bytes"], 256u * 50257u * bf16_bytes);
    if (b["name"] == "backend.bf16_pack_b") EXPECT_EQ(b["bytes"], 1024u * 3072u * bf16_bytes);
    if (b["name"] == "backend.bf16_held_weight")
      EXPECT_EQ(b["bytes"], units ? 2u * (50257u + 64u) * (768u + 64u) * 2u : 50257u * 768u * 4u);
  }
  EXPECT_EQ(logits, 1) << m["buffers"].dump();
  for (const auto& [category, bytes] : m["planned_bytes"].items())
    EXPECT_EQ(sums[category], bytes.get<size_t>()) << category;
}

// The LM head's chunk of logits by device: the CPU's 256 of GPT-2's 4096 rows, a GPU's 2048 (its
// weight gradient's product then reads and writes dW once per 2048 rows), its rows padded to
// 50304 columns on a GPU in bf16 (Model::declare_lm_logits).
TEST(Cli, EstimateSizesTheLogitsChunkByPrecisionAndDevice) {
  struct Case {
    std::string flags;
    int rows, width;
  };
  for (const auto& [flags, rows, width] :
       std::vector<Case>{{"--device cpu", 256, 50257},
                         {"--device cpu --bf16", 256, 50257},
                         {"--device cuda", 2048, 50257},
                         {"--device cuda --bf16", 2048, 50304}}) {
    SCOPED_TRACE(flags);
    const nlohmann::json j =
        estimate_json("--model gpt2 --per_device_train_batch_size 4 --seq_len 1024 " + flags);
    int logits = 0;
    for (const auto& b : j["memory"]["buffers"])
      if (b["name"] == "logits") {
        ++logits;
        EXPECT_EQ(b["shape"], "[" + std::to_string(rows) + ", " + std::to_string(width) + "]");
      }
    EXPECT_EQ(logits, 1);
  }
}

// estimate --world_size N --zero_stage 1: each rank's share of the optimizer state, the shares
// adding up to the whole; model states per rank as the ZeRO formula gives them (the unpartitioned
// bytes plus the optimizer's divided by N).
TEST(Cli, EstimatePlansEachRanksShareUnderZero) {
  namespace fs = std::filesystem;
  CliRun r;
  const nlohmann::json j =
      estimate_json("--model bert-large-uncased --world_size 3 --zero_stage 1", &r);
  EXPECT_NE(r.out.find("data parallel over 3 ranks, zero_stage 1"), std::string::npos) << r.out;
  const nlohmann::json& dp = j["data_parallel"];
  ASSERT_EQ(dp["ranks"].size(), 3u);
  double state = 0, params = 0;
  for (const nlohmann::json& rank : dp["ranks"]) {
    state += rank["optimizer_state_bytes"].get<double>();
    params += rank["parameters"].get<double>();
    EXPECT_LT(rank["optimizer_state_bytes"].get<double>(), 0.45 * 2556.9 * (1 << 20));
  }
  EXPECT_EQ(params, 335143938.0);
  EXPECT_NEAR(state / (1 << 20), 2556.9, 0.2);  // AdamW: 8 bytes per parameter, split three ways
  EXPECT_NEAR(dp["optimizer_bytes_per_param"].get<double>(), 8.0, 0.01);
  EXPECT_NEAR(dp["model_state_bytes_per_param"].get<double>(),
              dp["weight_bytes_per_param"].get<double>() +
                  dp["master_bytes_per_param"].get<double>() +
                  dp["gradient_bytes_per_param"].get<double>() + 8.0 / 3,
              0.01);
  EXPECT_EQ(dp["master_bytes_per_param"].get<double>(), 0.0);            // float32: no master copy
  EXPECT_NEAR(dp["gradient_bytes_per_param"].get<double>(), 4.0, 0.01);  // whole on every rank
  // Rank 0's own plan holds rank 0's share.
  EXPECT_NEAR(j["memory"]["planned_bytes"]["optimizer_state"].get<double>(),
              dp["ranks"][0]["optimizer_state_bytes"].get<double>(), 4096);
  // The same from a DeepSpeed config, as Trainer's --deepspeed.
  const std::string ds =
      (fs::temp_directory_path() / ("brisk_cli_ds_" + std::to_string(::getpid()) + ".json"))
          .string();
  std::ofstream(ds) << R"({"train_micro_batch_size_per_gpu": "auto",
                          "zero_optimization": {"stage": 1, "overlap_comm": true}})";
  const CliRun d =
      run_brisk("estimate --model bert-large-uncased --world_size 3 --deepspeed " + ds);
  // A flag contradicting the config, and a misspelled key, are refused naming them.
  expect_refused("estimate --world_size 3 --zero_stage 2 --deepspeed " + ds,
                 "zero_optimization.stage is 1 but --zero_stage is 2");
  std::ofstream(ds) << R"({"zero_optimization": {"stgae": 1}})";
  expect_refused("estimate --world_size 3 --deepspeed " + ds,
                 "zero_optimization.stgae is not a DeepSpeed key (did you mean "
                 "zero_optimization.stage?)");
  fs::remove(ds);
  ASSERT_EQ(d.exit_code, 0) << d.err;
  EXPECT_NE(d.out.find("data parallel over 3 ranks, zero_stage 1"), std::string::npos) << d.out;
  expect_refused("estimate --world_size 0", "--world_size must lie in");
  expect_refused("estimate --zero_stage 3 --bf16 --bf16_master_weights false",
                 "--zero_stage 3 with --bf16 needs the float32 master copy");
}

// With fp16 the float32 master copy is partitioned with the optimizer state: each rank plans the
// master of its run, the runs adding up to 4 bytes per parameter. bf16 keeps no master copy (it
// computes with the float32 weights), on CPUs and on GPUs.
TEST(Cli, EstimatePartitionsTheMasterCopyUnderZero) {
  for (const char* device : {"cpu", "cuda"}) {
    const nlohmann::json bf16 =
        estimate_json("--model bert-large-uncased --bf16 --world_size 3 --zero_stage 1 --device " +
                      std::string(device));
    for (const nlohmann::json& rank : bf16["data_parallel"]["ranks"])
      EXPECT_EQ(rank["master_bytes"].get<double>(), 0.0) << device;
  }
  const nlohmann::json j = estimate_json(
      "--model bert-large-uncased --fp16 --world_size 3 --zero_stage 1 --device cuda");
  const nlohmann::json& dp = j["data_parallel"];
  ASSERT_EQ(dp["ranks"].size(), 3u);
  double masters = 0;
  for (const nlohmann::json& rank : dp["ranks"]) {
    EXPECT_NEAR(rank["master_bytes"].get<double>(), 4.0 * rank["parameters"].get<double>(), 1.0);
    masters += rank["master_bytes"].get<double>();
  }
  EXPECT_NEAR(masters, 4.0 * 335143938.0, 1.0);
  EXPECT_NEAR(dp["master_bytes_per_param"].get<double>(), 4.0 / 3, 0.01);
  EXPECT_NEAR(j["memory"]["planned_bytes"]["master_weights"].get<double>(),
              dp["ranks"][0]["master_bytes"].get<double>(), 1.0);
}

// estimate of a LoRA run under ZeRO stages 1 and 2: the ranks partition the trained parameters
// alone (their master copy and optimizer state, stage 2 their gradients too), the frozen base
// whole on every rank; the per-parameter figures are the whole model's.
TEST(Cli, EstimateOfLoraUnderZeroPartitionsTheAdaptersAlone) {
  for (const int stage : {0, 1, 2}) {
    SCOPED_TRACE(stage);
    CliRun r;
    const nlohmann::json j =
        estimate_json("--model gpt2 --use_peft --fp16 --device cuda --world_size 2 --zero_stage " +
                          std::to_string(stage),
                      &r);
    const auto trained = j["adapters"]["trained_parameters"].get<double>();
    const double total = trained + j["adapters"]["frozen_parameters"].get<double>();
    const nlohmann::json& dp = j["data_parallel"];
    ASSERT_EQ(dp["ranks"].size(), 2u);
    double params = 0;
    for (const nlohmann::json& rank : dp["ranks"]) {
      params += rank["parameters"].get<double>();
      // fp16: a float32 master copy and AdamW's 8 bytes, of the trained parameters.
      const double share = stage > 0 ? trained / 2 : trained;
      EXPECT_NEAR(rank["master_bytes"].get<double>(), 4 * share, 4096);
      EXPECT_NEAR(rank["optimizer_state_bytes"].get<double>(), 8 * share, 4096);
    }
    EXPECT_EQ(params, stage > 0 ? trained : 2 * total);
    EXPECT_NEAR(dp["master_bytes_per_param"].get<double>(),
                4 * trained / total / (stage > 0 ? 2 : 1), 1e-3);
    EXPECT_EQ(r.out.find("ZeRO paper"), std::string::npos) << "the paper trains every parameter";
  }
}

// Under tensor parallelism a tensor rank holds its share of the adapters (llama-2-7b's q_proj and
// v_proj, column-parallel: each A [16, 4096] whole, each B [4096, 16] by halves) and of the base,
// and says so.
TEST(Cli, EstimateOfLoraUnderTensorParallelismCountsARanksShare) {
  CliRun r;
  const nlohmann::json j = estimate_json(
      "--model llama-2-7b --use_peft --bf16 --device cuda --world_size 2 --tp_size 2", &r);
  const double layers = 32, a = 16 * 4096, b = 4096 * 16;
  EXPECT_EQ(j["adapters"]["trained_parameters"].get<double>(), layers * 2 * (a + b / 2));
  EXPECT_NE(r.out.find("frozen (a tensor rank's share)"), std::string::npos) << r.out;
}

// estimate --world_size N --zero_stage 2: each rank also holds only its shard of the summed
// gradients, plus the space the gradients are staged in (two of the 24 blocks' slots, over which
// the embeddings' and head's lie): rank 0's own plan says so, the shards add up to 4 bytes per
// parameter.
TEST(Cli, EstimatePlansEachRanksGradientShardUnderZeroStage2) {
  CliRun r;
  const nlohmann::json j =
      estimate_json("--model bert-large-uncased --world_size 3 --zero_stage 2", &r);
  EXPECT_NE(r.out.find("data parallel over 3 ranks, zero_stage 2"), std::string::npos) << r.out;
  const nlohmann::json& dp = j["data_parallel"];
  ASSERT_EQ(dp["ranks"].size(), 3u);
  const double n = 335143938.0;
  // bert-large: a block is 12,596,224 parameters; the 24 share the slots of two, and the
  // embeddings' and head's gradients (32.8M parameters, more than two blocks) lie over them. Rank
  // 0's own plan (its gradient buffers) holds exactly that and its shard.
  const double edges = n - 24 * 12596224.0;
  ASSERT_GT(edges, 2 * 12596224.0);
  const double staged = 4.0 * edges;
  EXPECT_NEAR(j["memory"]["planned_bytes"]["gradients"].get<double>(),
              staged + 4.0 * dp["ranks"][0]["parameters"].get<double>(), 1.0);
  double shards = 0;
  for (const nlohmann::json& rank : dp["ranks"]) {
    const double grads = rank["gradient_bytes"].get<double>();
    EXPECT_NEAR(grads, staged + 4.0 * rank["parameters"].get<double>(), 1.0);
    shards += grads - staged;
  }
  EXPECT_NEAR(shards, 4.0 * n, 1.0);
  EXPECT_NEAR(dp["gradient_bytes_per_param"].get<double>(), staged / n + 4.0 / 3, 0.01);
  EXPECT_LT(dp["gradient_bytes_per_param"].get<double>(), 2.1);  // stage 1: 4
}

// estimate --world_size N --zero_stage 3: each rank also holds only its shard of the weights,
// plus the space they are staged in (two blocks' slots, over which the embeddings' and head's
// lie): rank 0's own plan says so, the shards add up to 4 bytes per parameter, and the model
// states per rank fall below stage 2's.
TEST(Cli, EstimatePlansEachRanksWeightShardUnderZeroStage3) {
  CliRun r;
  const nlohmann::json j =
      estimate_json("--model bert-large-uncased --world_size 3 --zero_stage 3", &r);
  EXPECT_NE(r.out.find("data parallel over 3 ranks, zero_stage 3"), std::string::npos) << r.out;
  const nlohmann::json& dp = j["data_parallel"];
  ASSERT_EQ(dp["ranks"].size(), 3u);
  const double n = 335143938.0, block = 12596224.0;
  // The weights staged as the gradients under stage 2: the embeddings' and head's over the two
  // blocks' slots, which they outweigh here.
  const double edges = n - 24 * block;
  ASSERT_GT(edges, 2 * block);
  const double staged = 4.0 * edges;
  EXPECT_NEAR(j["memory"]["planned_bytes"]["weights"].get<double>(),
              staged + 4.0 * dp["ranks"][0]["parameters"].get<double>(), 1.0);
  double shards = 0;
  for (const nlohmann::json& rank : dp["ranks"]) {
    const double weights = rank["weight_bytes"].get<double>();
    EXPECT_NEAR(weights, staged + 4.0 * rank["parameters"].get<double>(), 1.0);
    EXPECT_NEAR(rank["gradient_bytes"].get<double>(), weights, 1.0);  // staged alike
    shards += weights - staged;
  }
  EXPECT_NEAR(shards, 4.0 * n, 1.0);
  EXPECT_NEAR(dp["weight_bytes_per_param"].get<double>(), staged / n + 4.0 / 3, 0.01);
  const nlohmann::json two =
      estimate_json("--model bert-large-uncased --world_size 3 --zero_stage 2")["data_parallel"];
  EXPECT_NEAR(two["weight_bytes_per_param"].get<double>(), 4.0, 1e-9);
  EXPECT_LT(dp["model_state_bytes_per_param"].get<double>(),
            two["model_state_bytes_per_param"].get<double>() - 1.5);
}

// Planning many ranks needs no --dataset_size: the synthetic data then holds one batch per rank
// (the default 512 samples are fewer than 1024 ranks x 8), and each rank's shard is its 1/N.
TEST(Cli, EstimatePlansManyRanksWithoutADatasetSize) {
  CliRun r;
  const nlohmann::json dp = estimate_json(
      "--model bert-large-uncased --world_size 1024 --zero_stage 3", &r)["data_parallel"];
  ASSERT_EQ(dp["ranks"].size(), 1024u) << r.out << r.err;
  EXPECT_NEAR(dp["ranks"][0]["parameters"].get<double>(), 335143938.0 / 1024, 1.0);
}

// `brisk estimate` takes train's options and plans exactly what train allocates, category by
// category, byte for byte.
TEST(Cli, EstimateEqualsThePlanTrainAllocates) {
  namespace fs = std::filesystem;
  const fs::path dir =
      fs::temp_directory_path() / ("brisk_cli_estimate_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string options_file = (dir / "options.json").string();
  std::ofstream(options_file) << R"({"optim": "sgd", "optim_args": "momentum=0.9", "seq_len": 20})";
  const std::string common = " --max_steps 1 --dataset_size 8 --seq_len 16 ";
  const std::vector<std::string> runs = {
      "--model bert-tiny --per_device_train_batch_size 2",
      // bert-tiny's largest product operand is its fused [3C, C] query/key/value weight.
      "--model bert-tiny --bf16 --per_device_train_batch_size 4",
      "--model gpt2-tiny --bf16 --gradient_checkpointing true --per_device_train_batch_size 3",
      "--model bert-tiny --fp16 true --optim adafactor --gradient_accumulation_steps 2",
      "--model gpt2-tiny --optim adamw_8bit --dataloader_num_workers 1 --bf16=true "
      "--bf16_master_weights false",
      "--model bert-tiny --options_file " + options_file + " --per_device_train_batch_size 2"};
  for (size_t i = 0; i < runs.size(); ++i) {
    const std::string out = (dir / ("run" + std::to_string(i))).string();
    const std::string json = out + ".estimate.json";
    const CliRun est =
        run_brisk("estimate --device cpu " + common + runs[i] + " --output_json " + json);
    ASSERT_EQ(est.exit_code, 0) << runs[i] << "\n" << est.err;
    const CliRun train =
        run_brisk("train --device cpu --save_strategy no --output_dir " + out + common + runs[i]);
    ASSERT_EQ(train.exit_code, 0) << runs[i] << "\n" << train.err;
    const nlohmann::json planned = read_json(json)["memory"]["planned_bytes"];
    const nlohmann::json allocated =
        read_json(out + "/train_results.json")["memory"]["planned_bytes"];
    EXPECT_EQ(planned, allocated) << runs[i];
    EXPECT_GT(planned["activations"].get<int64_t>(), 0) << runs[i];
  }
  fs::remove_all(dir);
  // Both subcommands refuse the same contradictions.
  expect_refused("estimate --fp16 true --bf16 true", "contradict each other");
  expect_refused("estimate --save_strategy sometimes", "unknown save_strategy");
  expect_refused("train --auto_find_batch_size --max_memory 6XB", "is not a size");
  // Numbers are range-checked before any cast, and text is never echoed whole.
  expect_refused("estimate --seed -1", "--seed");
  expect_refused("estimate --learning_rate inf", "learning_rate must be a finite number");
  expect_refused("estimate --num_train_epochs 1e300", "num_train_epochs must be at most 1e12");
  expect_refused("estimate --options_file " + std::filesystem::temp_directory_path().string(),
                 "is not a regular file (a folder)");
  namespace fs = std::filesystem;
  const fs::path bad_options =
      fs::temp_directory_path() / ("brisk_bad_options_" + std::to_string(::getpid()) + ".json");
  for (const auto& [text, needle] : std::vector<std::pair<std::string, std::string>>{
           {R"({"seq_len": 7.9})", "option \"seq_len\" must be a whole number, got 7.9"},
           {R"({"max_steps": 1e300})", "option \"max_steps\" must be a whole number"},
           {R"({"seed": -1})", "option \"seed\" must be a whole number >= 0"},
           {R"({"learning_rate": "fast"})", "option \"learning_rate\" must be a finite number"},
           {R"({"bf16": 1})", "option \"bf16\" must be true or false"},
           {R"({"optim": [)" + std::string(5000, '1') + "]}", "..."}}) {
    std::ofstream(bad_options) << text;
    const CliRun r = run_brisk("estimate --options_file " + bad_options.string());
    EXPECT_NE(r.exit_code, 0) << text;
    EXPECT_NE(r.err.find(needle), std::string::npos) << text << " -> " << r.err;
    EXPECT_LT(r.err.size(), 300u) << "the message echoes too much: " << r.err.size();
  }
  fs::remove(bad_options);
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

TEST(Cli, EstimatePlansAGpuRunWithoutAGpu) {
  const std::string run = "estimate --model bert-large-uncased --per_device_train_batch_size 4 ";
  const CliRun gpu = run_brisk(run + "--device cuda");
  ASSERT_EQ(gpu.exit_code, 0) << gpu.err;
  EXPECT_NE(gpu.out.find("on cuda"), std::string::npos) << gpu.out;
  EXPECT_NE(gpu.out.find("GPU: context, kernels, libraries"), std::string::npos) << gpu.out;
  EXPECT_NE(gpu.out.find("expect \"GPU memory occupied\" near"), std::string::npos) << gpu.out;
  const CliRun cpu = run_brisk(run + "--device cpu");
  ASSERT_EQ(cpu.exit_code, 0) << cpu.err;
  EXPECT_NE(cpu.out.find("expect a process peak near"), std::string::npos) << cpu.out;
  // Both keep one log-sum-exp per attention row (no [T, T] probabilities): the same activations.
  auto activations_mib = [](const std::string& out) {
    return std::stod(out.substr(out.find("activations") + 11));
  };
  EXPECT_EQ(activations_mib(cpu.out), activations_mib(gpu.out));
  EXPECT_GT(activations_mib(cpu.out), 0.0);
}

// A GPU's bf16 run computes with float32 weights, no master copy (4 bytes a parameter, never more
// than a 16-bit compute copy and a master), and its products read a bf16 copy of them (2 bytes
// more) where that holds no more than the master would: on one rank and under ZeRO 1 on 2 ranks;
// not under ZeRO 1 on 3 ranks (a master of 4/3), offloaded (none on the GPU) or under ZeRO 3
// (staged weights). fp16 keeps a compute copy and a master.
TEST(Cli, EstimateOfAGpuBf16RunPlansAWeightsCopyWhereItHoldsNoMoreThanAMaster) {
  const double n = 335143938.0;
  struct Layout {
    std::string args;
    bool float32_weights, copy;
  };
  const std::vector<Layout> layouts = {{"--bf16", true, true},
                                       {"--bf16 --world_size 2 --zero_stage 1", true, true},
                                       {"--bf16 --world_size 3 --zero_stage 1", true, false},
                                       {"--bf16 --world_size 3 --zero_stage 3", true, false},
                                       {"--bf16 --offload_optimizer cpu", true, false},
                                       {"--fp16", false, false}};
  for (const Layout& l : layouts) {
    CliRun r;
    const nlohmann::json j =
        estimate_json("--model bert-large-uncased --device cuda " + l.args, &r);
    double copy = 0, master_on_gpu = 0;
    for (const nlohmann::json& b : j["memory"]["buffers"]) {
      if (b["name"] == "backend.weights_copy") copy = b["bytes"].get<double>();
      if (b["category"] == "master_weights" && b["placement"] == "device")
        master_on_gpu += b["bytes"].get<double>();
    }
    EXPECT_EQ(r.out.find("with float32 weights") != std::string::npos, l.float32_weights) << l.args;
    EXPECT_EQ(master_on_gpu == 0.0,
              l.float32_weights || l.args.find("offload") != std::string::npos)
        << l.args;
    EXPECT_NEAR(copy, l.copy ? 2.0 * n : 0.0, 1.0) << l.args;
  }
}

// offload_optimizer cpu (in a DeepSpeed config or as the option) plans a GPU run's float32 master
// copy and optimizer state in host memory, with a host copy of the gradients: the GPU's plan
// loses exactly the first two, the host's gains all three; under ZeRO each rank's share. On the
// CPU it changes nothing. (fp16: a bf16 run on one GPU has no master copy to move.)
TEST(Cli, EstimatePlansAnOffloadedOptimizerInHostMemory) {
  const std::string run = "--model bert-large-uncased --fp16 --device cuda";
  const nlohmann::json on_gpu = estimate_json(run);
  CliRun r;
  const nlohmann::json off = estimate_json(run + " --offload_optimizer cpu", &r);
  EXPECT_NE(r.out.find("offload_optimizer cpu, in host memory: master_weights"), std::string::npos)
      << r.out;
  const double n = 335143938.0;
  auto bytes = [](const nlohmann::json& j, const char* key) {
    return j["memory"][key].get<double>();
  };
  auto category = [](const nlohmann::json& j, const char* key) {
    return j["memory"]["planned_bytes"][key].get<double>();
  };
  const double moved = category(on_gpu, "master_weights") + category(on_gpu, "optimizer_state");
  EXPECT_GT(moved, 12.0 * n);
  EXPECT_NEAR(bytes(on_gpu, "planned_device_bytes") - bytes(off, "planned_device_bytes"), moved,
              4096.0);
  EXPECT_NEAR(bytes(off, "planned_host_bytes") - bytes(on_gpu, "planned_host_bytes"),
              moved + 4.0 * n, 4096.0);
  std::set<std::string> host_before;  // staging for batches, the step's statistics
  for (const nlohmann::json& b : on_gpu["memory"]["buffers"])
    if (b["placement"] == "host") host_before.insert(b["name"].get<std::string>());
  for (const nlohmann::json& b : off["memory"]["buffers"]) {
    const std::string name = b["name"], category = b["category"];
    const bool host = host_before.count(name) || name.starts_with("offload.") ||
                      category == "optimizer_state" || category == "master_weights";
    EXPECT_EQ(b["placement"], host ? "host" : "device") << name;
  }
  // ZeRO stage 2 on 3 ranks: each rank's run of the master copy, state and gradients on the host.
  const nlohmann::json zero =
      estimate_json(run + " --offload_optimizer cpu --world_size 3 --zero_stage 2");
  for (const nlohmann::json& rank : zero["data_parallel"]["ranks"]) {
    const double p = rank["parameters"].get<double>();
    EXPECT_NEAR(
        rank["host_bytes"].get<double>(),
        rank["master_bytes"].get<double>() + rank["optimizer_state_bytes"].get<double>() + 4.0 * p,
        1.0);
    EXPECT_NEAR(rank["master_bytes"].get<double>(), 4.0 * p, 1.0);
  }
  EXPECT_NEAR(bytes(zero, "planned_host_bytes") - bytes(on_gpu, "planned_host_bytes"),
              zero["data_parallel"]["ranks"][0]["host_bytes"].get<double>(), 4096.0);
  // The CPU: the state is in host memory already; nothing moves or is added.
  const std::string cpu = "--model bert-large-uncased --bf16 --device cpu";
  EXPECT_EQ(bytes(estimate_json(cpu + " --offload_optimizer cpu"), "planned_total_bytes"),
            bytes(estimate_json(cpu), "planned_total_bytes"));
  // --fit: GPT-2 in bf16 does not fit 3 GiB of GPU memory with its optimizer on the GPU (the
  // message says what would); offloaded it does, predicted slower than on a large GPU by at
  // least the copies (4 bytes per parameter each way at the assumed 25 GB/s).
  const std::string fit =
      "--model gpt2 --device cuda --bf16 --per_device_train_batch_size 4 "
      "--seq_len 256 --fit --fit_optims adamw_torch ";
  expect_refused("estimate " + fit + "--max_memory 3GiB",
                 "or the optimizer in host memory (--offload_optimizer cpu)");
  const nlohmann::json offloaded = estimate_json(fit + "--max_memory 3GiB --offload_optimizer cpu");
  const nlohmann::json ample = estimate_json(fit + "--max_memory 30GiB");
  ASSERT_FALSE(offloaded["fit"].empty());
  ASSERT_FALSE(ample["fit"].empty());
  EXPECT_GT(offloaded["fit"][0]["predicted_step_seconds"].get<double>(),
            ample["fit"][0]["predicted_step_seconds"].get<double>() + 2 * 4 * 124439808.0 / 25e9);
}

// estimate --pp_size: each stage's plan. GPT-2's 12 blocks over 3 stages, 4 each; the first holds
// the embeddings, the last the head and the tied embeddings again; the middle stage keeps the
// inputs of its 2 micro-batches in flight; each boundary passes every micro-batch's activations.
TEST(Cli, EstimatePlansEachPipelineStage) {
  const std::string json = (std::filesystem::temp_directory_path() /
                            ("brisk_pp_stages_" + std::to_string(::getpid()) + ".json"))
                               .string();
  const CliRun r = run_brisk(
      "estimate --device cpu --model gpt2 --seq_len 128 --per_device_train_batch_size 2 "
      "--gradient_accumulation_steps 4 --world_size 3 --pp_size 3 --output_json " +
      json);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("pipeline: 3 stages, 1F1B over 4 micro-batches"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("each boundary passes 3.0 MiB"), std::string::npos) << r.out;
  const nlohmann::json whole = read_json(json), stages = whole["pipeline_stages"];
  std::filesystem::remove(json);
  ASSERT_EQ(stages.size(), 3u);
  // The headline is the largest stage's: the last, with the head and its logits.
  int64_t largest = 0;
  for (const auto& s : stages) largest = std::max(largest, s["peak_bytes"].get<int64_t>());
  EXPECT_EQ(whole["planned_stage"], 2);
  EXPECT_EQ(stages[2]["peak_bytes"], largest);
  EXPECT_EQ(whole["memory"]["planned_total_bytes"], stages[2]["planned_total_bytes"]);
  EXPECT_EQ(whole["parameters"], stages[2]["parameters"]);
  EXPECT_NE(r.out.find("the plan of pipeline stage 2 of 3, the largest rank's"), std::string::npos)
      << r.out;
  const int64_t block = 7087872, wte = 50257 * 768, wpe = 1024 * 768, ln_f = 2 * 768;
  EXPECT_EQ(stages[0]["parameters"], wte + wpe + 4 * block);
  EXPECT_EQ(stages[1]["parameters"], 4 * block);
  EXPECT_EQ(stages[2]["parameters"], wte + 4 * block + ln_f);
  for (int s = 0; s < 3; ++s) {
    EXPECT_EQ(stages[s]["first_layer"], 4 * s);
    EXPECT_EQ(stages[s]["end_layer"], 4 * s + 4);
  }
  // The middle stage's planned inputs: 2 micro-batches of [2, 128, 768] float32.
  EXPECT_GE(stages[1]["activations_bytes"].get<int64_t>(), int64_t{2} * 2 * 128 * 768 * 4);
}

// The bytes of buffer `name` in an estimate's plan (-1: none).
int64_t planned_bytes(const nlohmann::json& j, const std::string& name) {
  for (const auto& b : j["memory"]["buffers"])
    if (b["name"] == name) return b["bytes"].get<int64_t>();
  return -1;
}

// Adafactor under tensor parallelism plans the whole second moment of every parameter on each
// tensor rank (a split matrix's whole row and column statistics: GPT-2's 321617 values, as one
// process's), and the float64 sums of the split parameters' statistics: per block c_attn
// (768 + 2304 and its 2304-value bias), attn.c_proj (768 + 768), c_fc (768 + 3072 and 3072) and
// mlp.c_proj (3072 + 768), each with its weights' squares; wte (50257 + 768 + 1); then one update
// sum per split parameter.
TEST(Cli, EstimatePlansAdafactorsWholeStatisticsOnEachTensorRank) {
  const std::string common = "--device cpu --model gpt2 --optim adafactor --seq_len 128 ";
  const nlohmann::json one = estimate_json(common);
  const nlohmann::json two = estimate_json(common + "--world_size 2 --tp_size 2");
  EXPECT_EQ(planned_bytes(one, "adafactor.exp_avg_sq"), 321617 * 4);
  EXPECT_EQ(planned_bytes(two, "adafactor.exp_avg_sq"), 321617 * 4);
  EXPECT_EQ(planned_bytes(one, "adafactor.split_sums"), -1);
  const int64_t block = (3072 + 1) + (2304 + 1) + (1536 + 1) + (3840 + 1) + (3072 + 1) + (3840 + 1);
  EXPECT_EQ(planned_bytes(two, "adafactor.split_sums"), (12 * block + 51025 + 1 + 12 * 6 + 1) * 8);
}

// 8-bit AdamW's blocks are the full parameters': each tensor rank plans the codes of its share
// and the maxima of every block of its split parameters (GPT-2's four matrices per block; the
// rest too small for 8 bits, or embeddings), and room for both moments' new maxima.
TEST(Cli, EstimatePlansEightBitBlockMaximaOfTheFullParameters) {
  const std::string common = "--device cpu --model gpt2 --optim adamw_8bit --seq_len 128 ";
  const nlohmann::json one = estimate_json(common);
  const nlohmann::json two = estimate_json(common + "--world_size 2 --tp_size 2");
  const int64_t matrices = 768 * 2304 + 768 * 768 + 2 * 768 * 3072;  // a block's
  const int64_t blocks = 12 * matrices / 256;
  EXPECT_EQ(planned_bytes(one, "adamw_8bit.exp_avg_codes"), 12 * matrices);
  EXPECT_EQ(planned_bytes(two, "adamw_8bit.exp_avg_codes"), 12 * matrices / 2);
  for (const nlohmann::json* j : {&one, &two})
    EXPECT_EQ(planned_bytes(*j, "adamw_8bit.exp_avg_sq_absmax"), blocks * 4);
  EXPECT_EQ(planned_bytes(one, "adamw_8bit.split_maxima"), -1);
  EXPECT_EQ(planned_bytes(two, "adamw_8bit.split_maxima"), 2 * blocks * 4);
}

// estimate --tp_size: each rank's plan holds its share of the blocks and of the vocabulary
// (GPT-2 over 4 ranks: 12565 of the 50257 rows each, the last with 3 of padding), and the sums
// over the tensor group per step are printed (SummedBytesAreTheEstimates checks them against a
// run).
TEST(Cli, EstimatePlansEachTensorRanksShare) {
  const std::string common =
      "--device cpu --model gpt2 --seq_len 1024 --per_device_train_batch_size 2 --world_size 4 "
      "--tp_size 4";
  CliRun four, whole_tokens;
  const nlohmann::json j = estimate_json(common + " --tp_sequence_parallel false", &whole_tokens);
  ASSERT_EQ(whole_tokens.exit_code, 0) << whole_tokens.err;
  EXPECT_NE(whole_tokens.out.find("tensor parallel over 4 ranks: each holds 1/4 of every block's "
                                  "attention heads and MLP width and of the vocabulary"),
            std::string::npos)
      << whole_tokens.out;
  // Per block 1/4 of c_attn, c_fc and both c_proj weights (and the first two's biases), whole
  // norms and row-parallel biases; 12565 rows of wte; wpe and ln_f whole.
  const int64_t split = (768 * 2304 + 2304 + 768 * 768 + 768 * 3072 + 3072 + 3072 * 768) / 4;
  const int64_t whole = 4 * 768 + 2 * 768;
  EXPECT_EQ(j["parameters"], 12 * (split + whole) + 12565 * 768 + 1024 * 768 + 2 * 768);
  EXPECT_EQ(j["tensor_parallel"]["vocabulary_rows_per_rank"], 12565);
  // 12 blocks' 4 sums and 2 more of [2, 1024, 768] float32, and 2048 rows' 3 statistics from
  // each of the 4 ranks.
  const double A = 2.0 * 1024 * 768 * 4, stats = 2048.0 * 3 * 4 * 4;
  EXPECT_EQ(j["tensor_parallel"]["sums_bytes_per_step"].get<double>(), (4.0 * 12 + 2) * A + stats);
  EXPECT_NE(whole_tokens.out.find("sums over the tensor group per step: 300.1 MiB"),
            std::string::npos)
      << whole_tokens.out;
  // Megatron's sequence parallelism (the default): the blocks' sums become 10 whole tensors
  // gathered or reduce-scattered per block (and the ends' 2); the 12 blocks' 4 norm parameters'
  // gradients are summed once. The residual stream's saved tensors fall by 4 too.
  const nlohmann::json sliced = estimate_json(common, &four);
  ASSERT_EQ(four.exit_code, 0) << four.err;
  EXPECT_EQ(sliced["tensor_parallel"]["sums_bytes_per_step"].get<double>(),
            2 * A + stats + 12 * 4 * 768 * 4);
  EXPECT_EQ(sliced["tensor_parallel"]["gathered_and_scattered_bytes_per_step"].get<double>(),
            (10.0 * 12 + 2) * A);
  EXPECT_NE(four.out.find("each rank holds 1/4 of the tokens there; per step it gathers and "
                          "reduce-scatters 732.0 MiB"),
            std::string::npos)
      << four.out;
  const double a_whole = j["memory"]["activations_per_block_bytes"].get<double>();
  const double a_sliced = sliced["memory"]["activations_per_block_bytes"].get<double>();
  // A block's input, residual sum and MLP input [2, 1024, 768] and its 4 norm statistics
  // [2, 1024] float32, each 3/4 smaller.
  EXPECT_EQ(a_whole - a_sliced, 0.75 * (3 * A + 4 * 2048.0 * 4));
}

// estimate --sp_size: each rank's plan holds its share of the tokens (GPT-2's activations per
// block fall by about the degree: all but attention's statistics and the exchange's buffers),
// the ZeRO partitions span the data and sequence ranks together, and the all-to-alls' bytes
// are printed (ExchangedBytesAreTheEstimates checks the formula against a run).
TEST(Cli, EstimatePlansEachSequenceRanksTokens) {
  const std::string common =
      "--device cpu --model gpt2 --seq_len 1024 --per_device_train_batch_size 2 "
      "--zero_stage 1 --world_size 4";
  CliRun one, four;
  const nlohmann::json whole = estimate_json(common, &one);
  const nlohmann::json split = estimate_json(common + " --sp_size 4", &four);
  ASSERT_EQ(four.exit_code, 0) << four.err;
  EXPECT_NE(four.out.find("sequence parallel over 4 ranks: each holds 256 of every sequence's "
                          "1024 tokens, attention on all of them for 3 of 12 heads"),
            std::string::npos)
      << four.out;
  EXPECT_NE(four.out.find("all-to-alls per step: 162.0 MiB"), std::string::npos) << four.out;
  const double a1 = whole["memory"]["activations_per_block_bytes"].get<double>();
  const double a4 = split["memory"]["activations_per_block_bytes"].get<double>();
  EXPECT_LT(a4, 0.3 * a1);
  EXPECT_GT(a4, 0.2 * a1);
  EXPECT_EQ(split["data_parallel"]["ranks"].size(), 4u);  // ZeRO over the 4 sequence ranks
  // 12 blocks x 512 tokens x (qkv 2304 + output 768 forward, + 768 backward) float32 values.
  EXPECT_EQ(split["sequence_parallel"]["all_to_all_bytes_per_step"].get<double>(),
            12.0 * 512 * ((2304 + 768) * 2 + 768) * 4);
  expect_refused("estimate --model gpt2 --world_size 2 --sp_size 2 --tp_size 2",
                 "does not divide the run's 2 ranks");
  expect_refused("estimate --model gpt2 --world_size 2 --sp_size 2 --seq_len 1023",
                 "sequences of 1023 tokens do not split evenly among --sp_size 2");
}

// estimate --fit --world_size searches the layouts of the ranks too: tensor parallelism's
// degrees, pipeline depths and sequence-parallel degrees the model allows, data parallelism over
// the rest under each ZeRO stage (pipelines too), the global batch kept; one process's layout
// does not fit here, others do.
TEST(Cli, EstimateFitSearchesTheLayoutsOfTheRanks) {
  const std::string json = (std::filesystem::temp_directory_path() /
                            ("brisk_fit_layouts_" + std::to_string(::getpid()) + ".json"))
                               .string();
  const CliRun r = run_brisk(
      "estimate --device cpu --model gpt2 --seq_len 128 --per_device_train_batch_size 2 "
      "--world_size 4 --fit --max_memory 1800MiB --output_json " +
      json);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("over 4 ranks"), std::string::npos) << r.out;
  const nlohmann::json fit = read_json(json)["fit"];
  std::filesystem::remove(json);
  ASSERT_FALSE(fit.empty());
  std::set<int64_t> degrees, stages, depths, sequences, pipeline_stages;
  double previous = 0;
  for (const auto& c : fit) {
    const int64_t tp = c["tp_size"], pp = c["pp_size"], sp = c["sp_size"], dp = c["data_ranks"];
    EXPECT_EQ(tp * pp * sp * dp, 4);
    depths.insert(pp);
    sequences.insert(sp);
    if (pp > 1 && dp * sp > 1) pipeline_stages.insert(c["zero_stage"].get<int64_t>());
    EXPECT_EQ(c["per_device_train_batch_size"].get<int64_t>() *
                  c["gradient_accumulation_steps"].get<int64_t>() * dp,
              8);
    EXPECT_LE(c["needed_bytes"].get<size_t>(), size_t{1800} << 20);
    EXPECT_GE(c["predicted_step_seconds"].get<double>(), previous);
    previous = c["predicted_step_seconds"];
    EXPECT_FALSE(tp == 1 && pp == 1 && sp == 1 && c["zero_stage"] == 0)
        << "one process's layout needs more";
    degrees.insert(tp);
    if (dp * sp > 1) stages.insert(c["zero_stage"].get<int64_t>());
  }
  EXPECT_GT(degrees.size(), 1u) << fit.dump();
  EXPECT_GT(depths.size(), 1u) << fit.dump();
  EXPECT_GT(sequences.size(), 1u) << fit.dump();
  EXPECT_TRUE(stages.count(3)) << fit.dump();
  EXPECT_TRUE(pipeline_stages.count(3)) << fit.dump();
}

// estimate --fit lists only configurations of the same global batch that fit, fastest first,
// over the precisions and optimizers allowed; and says so when none fits.
TEST(Cli, EstimateFitRanksWhatFitsTheBudget) {
  const std::string json = (std::filesystem::temp_directory_path() /
                            ("brisk_fit_" + std::to_string(::getpid()) + ".json"))
                               .string();
  const CliRun r = run_brisk(
      "estimate --device cpu --model bert-tiny --seq_len 128 --per_device_train_batch_size 8 "
      "--gradient_accumulation_steps 2 --fit --max_memory 250MiB --fit_precisions fp32,bf16 "
      "--fit_optims adamw_torch,adafactor,sgd --output_json " +
      json);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("predicted/step"), std::string::npos) << r.out;
  const nlohmann::json fit = read_json(json)["fit"];
  std::filesystem::remove(json);
  ASSERT_GT(fit.size(), 4u);
  std::set<std::string> optims, precisions;
  std::set<int> checkpointing;
  double previous = 0;
  for (const auto& c : fit) {
    EXPECT_EQ(c["per_device_train_batch_size"].get<int64_t>() *
                  c["gradient_accumulation_steps"].get<int64_t>(),
              16);
    EXPECT_LE(c["needed_bytes"].get<size_t>(), size_t{250} << 20);
    EXPECT_GE(c["predicted_step_seconds"].get<double>(), previous);
    previous = c["predicted_step_seconds"];
    optims.insert(c["optim"].get<std::string>());
    precisions.insert(c["precision"].get<std::string>());
    checkpointing.insert(c["gradient_checkpointing"].get<bool>() ? 2
                         : c["selective_recompute"].get<bool>()  ? 1
                                                                 : 0);
  }
  EXPECT_EQ(optims.size(), 3u);
  EXPECT_EQ(precisions.size(), 2u);
  EXPECT_EQ(checkpointing.size(), 3u);
  // --html draws the candidates: one bar each, self-contained (inline SVG, no scripts).
  const std::string html = json + ".html";
  const CliRun drawn = run_brisk(
      "estimate --device cpu --model bert-tiny --seq_len 128 --per_device_train_batch_size 8 "
      "--fit --max_memory 250MiB --html " +
      html);
  ASSERT_EQ(drawn.exit_code, 0) << drawn.err;
  std::ifstream in(html);
  const std::string page((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::filesystem::remove(html);
  EXPECT_NE(page.find("<svg"), std::string::npos);
  EXPECT_NE(page.find("#1 "), std::string::npos);
  EXPECT_NE(page.find("optimizer_state"), std::string::npos);
  EXPECT_EQ(page.find("<script"), std::string::npos);
  EXPECT_EQ(page.find("http://"), page.find("http://www.w3.org/2000/svg"));
  expect_refused("estimate --model bert-tiny --fit --max_memory 1MB", "no configuration");
  expect_refused("estimate --model bert-tiny --fit --max_memory 1GB --fit_precisions fp8",
                 "unknown precision \"fp8\"");
}

// --fit_methods: LoRA and QLoRA weighed beside full fine-tuning. Adapters train under data
// parallelism with ZeRO up to stage 2 (LoRA under tensor parallelism too, and some candidate
// takes it); at the same batch, recomputation and layout an adapter run
// needs less memory (QLoRA's less again) and is predicted faster than full fine-tuning (no weight
// gradients). By default the run's own method alone, and a budget nothing fits points at the other
// methods.
TEST(Cli, EstimateFitWeighsLoraAndQloraBesideFullFineTuning) {
  const std::string json = (std::filesystem::temp_directory_path() /
                            ("brisk_fit_lora_" + std::to_string(::getpid()) + ".json"))
                               .string();
  const std::string run =
      "estimate --device cpu --model gpt2 --seq_len 64 --per_device_train_batch_size 2 --fit "
      "--world_size 2 --max_memory 8GB --output_json " +
      json;
  const CliRun r = run_brisk(run + " --fit_methods full,lora,qlora");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find(" lora "), std::string::npos) << r.out;
  const nlohmann::json fit = read_json(json)["fit"];
  // A configuration's key apart from its method.
  auto key = [](const nlohmann::json& c) {
    return c["tp_size"].dump() + c["pp_size"].dump() + c["sp_size"].dump() +
           c["zero_stage"].dump() + c["per_device_train_batch_size"].dump() +
           c["gradient_checkpointing"].dump() + c["selective_recompute"].dump();
  };
  std::map<std::string, std::map<std::string, nlohmann::json>> by_key;
  std::set<int> full_stages, adapter_stages;
  for (const auto& c : fit) {
    const std::string method = c["method"];
    by_key[key(c)][method] = c;
    if (method == "full") {
      full_stages.insert(c["zero_stage"].get<int>());
      continue;
    }
    // LoRA under tensor parallelism too, QLoRA not; ZeRO 3 for LoRA alone, without it.
    EXPECT_EQ(c["pp_size"].get<int>() * c["sp_size"].get<int>(), 1);
    if (method == "qlora") EXPECT_EQ(c["tp_size"].get<int>(), 1);
    if (c["zero_stage"].get<int>() == 3) {
      EXPECT_EQ(method, "lora");
      EXPECT_EQ(c["tp_size"].get<int>(), 1);
    }
    adapter_stages.insert(c["zero_stage"].get<int>());
  }
  EXPECT_EQ(adapter_stages, (std::set<int>{0, 1, 2, 3}));
  EXPECT_TRUE(std::any_of(fit.begin(), fit.end(), [](const nlohmann::json& c) {
    return c["method"] == "lora" && c["tp_size"].get<int>() == 2;
  }));
  EXPECT_EQ(full_stages.size(), 4u);
  int compared = 0;
  for (auto& [k, m] : by_key) {
    if (!m.count("lora") || !m.count("qlora") || !m.count("full")) continue;
    ++compared;
    EXPECT_LT(m["lora"]["needed_bytes"].get<size_t>(), m["full"]["needed_bytes"].get<size_t>());
    EXPECT_LT(m["qlora"]["needed_bytes"].get<size_t>(), m["lora"]["needed_bytes"].get<size_t>());
    EXPECT_LT(m["lora"]["predicted_step_seconds"].get<double>(),
              m["full"]["predicted_step_seconds"].get<double>());
  }
  // ZeRO 0 to 2 x batch 1 and 2 (of 4 over 2 replicas) x 3 recomputations.
  EXPECT_EQ(compared, 18);
  // Stage 3 holds less of a LoRA's frozen base than stage 2 does.
  int staged = 0;
  for (auto& [k, m] : by_key) {
    if (!m.count("lora") || m["lora"]["zero_stage"] != 2) continue;
    nlohmann::json at_three = m["lora"];
    at_three["zero_stage"] = 3;
    const std::string three = key(at_three);
    if (!by_key.count(three) || !by_key[three].count("lora")) continue;
    ++staged;
    EXPECT_LT(by_key[three]["lora"]["needed_bytes"].get<size_t>(),
              m["lora"]["needed_bytes"].get<size_t>());
  }
  EXPECT_GT(staged, 0);
  const CliRun own = run_brisk(run + " --use_peft");
  ASSERT_EQ(own.exit_code, 0) << own.err;
  // Adapters on row-parallel linears with dropout: tensor parallelism is left out, not refused.
  const CliRun all = run_brisk(run + " --use_peft --lora_target_modules all-linear");
  ASSERT_EQ(all.exit_code, 0) << all.err;
  const nlohmann::json all_fit = read_json(json)["fit"];
  for (const auto& c : all_fit) EXPECT_EQ(c["tp_size"], 1);
  const nlohmann::json own_fit = read_json(json)["fit"];
  for (const auto& c : own_fit) EXPECT_EQ(c["method"], "lora");
  std::filesystem::remove(json);
  expect_refused("estimate --device cpu --model gpt2 --fit --max_memory 900MiB",
                 "LoRA or QLoRA (--fit_methods full,lora,qlora)");
  expect_refused("estimate --model gpt2 --fit --max_memory 1GB --fit_methods full,dora",
                 "unknown method \"dora\" in fit_methods (valid: full, lora, qlora)");
  expect_refused(
      "estimate --model gpt2 --fit --max_memory 1GB --fit_methods full "
      "--adapter_name_or_path " +
          fixture("lora/merge_gpt2"),
      "full fine-tuning beside --adapter_name_or_path");
}

// estimate --max_memory says whether the planned run fits and by how much (the headline a QLoRA
// user checks before renting a GPU), in its output and its JSON.
TEST(Cli, EstimateSaysWhetherTheRunFitsMaxMemory) {
  const std::string json = (std::filesystem::temp_directory_path() /
                            ("brisk_budget_" + std::to_string(::getpid()) + ".json"))
                               .string();
  const std::string run =
      "estimate --device cpu --model gpt2 --seq_len 64 --per_device_train_batch_size 2 "
      "--max_memory 1GB --output_json " +
      json;
  const CliRun full = run_brisk(run);
  ASSERT_EQ(full.exit_code, 0) << full.err;
  EXPECT_NE(full.out.find("does NOT fit within 953.7 MiB (--max_memory 1GB)"), std::string::npos)
      << full.out;
  nlohmann::json b = read_json(json)["budget"];
  EXPECT_FALSE(b["fits"].get<bool>());
  EXPECT_GT(b["needed_bytes"].get<size_t>(), size_t{1000000000});
  const CliRun qlora = run_brisk(run + " --use_peft --load_in_4bit");
  ASSERT_EQ(qlora.exit_code, 0) << qlora.err;
  b = read_json(json)["budget"];
  std::filesystem::remove(json);
  EXPECT_TRUE(b["fits"].get<bool>());
  const auto spare =
      static_cast<double>(b["budget_bytes"].get<size_t>() - b["needed_bytes"].get<size_t>()) /
      (1 << 20);
  char line[64];
  std::snprintf(line, sizeof line, "%.1f MiB to spare", spare);
  EXPECT_NE(qlora.out.find(line), std::string::npos) << qlora.out;
}

// estimate of a LoRA run: the parameters its adapters train (r x (in + out) per adapted linear)
// and their states apart from the frozen base; QLoRA's store at its bytes per parameter (4-bit
// codes and a float32 absmax per 64, or nested an 8-bit one and a float32 per 256 of those).
TEST(Cli, EstimateShowsTheAdaptersAndTheFrozenBase) {
  const std::string json = (std::filesystem::temp_directory_path() /
                            ("brisk_adapters_" + std::to_string(::getpid()) + ".json"))
                               .string();
  const std::string run =
      "estimate --device cpu --model gpt2 --seq_len 64 --use_peft --lora_r 8 "
      "--output_json " +
      json;
  const CliRun lora = run_brisk(run);
  ASSERT_EQ(lora.exit_code, 0) << lora.err;
  EXPECT_NE(lora.out.find("LoRA r 8 on c_attn: 294912 parameters trained"), std::string::npos)
      << lora.out;
  nlohmann::json a = read_json(json)["adapters"];
  EXPECT_EQ(a["trained_parameters"], 12 * 8 * (768 + 3 * 768));
  EXPECT_EQ(a["trained_weights_bytes"], 4 * a["trained_parameters"].get<int64_t>());
  EXPECT_EQ(a["gradients_bytes"], a["trained_weights_bytes"]);
  EXPECT_FALSE(a.contains("store"));
  for (const bool nested : {false, true}) {
    const CliRun q = run_brisk(run + " --load_in_4bit" + (nested ? " --use_bnb_nested_quant" : ""));
    ASSERT_EQ(q.exit_code, 0) << q.err;
    a = read_json(json)["adapters"];
    const nlohmann::json& s = a["store"];
    // Every block linear of GPT-2 small: 12 x (3 + 1 + 4 + 4) x 768^2 values, blocks of 64.
    const int64_t n = 12 * 12 * 768 * 768;
    EXPECT_EQ(s["parameters"], n);
    const double want = nested ? 0.5 + 1.0 / 64 + 4.0 / (64 * 256) : 0.5 + 4.0 / 64;
    EXPECT_NEAR(s["bytes_per_parameter"].get<double>(), want, 1e-4) << nested;
    EXPECT_EQ(s["nested"], nested);
  }
  std::filesystem::remove(json);
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
