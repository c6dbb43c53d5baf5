// `brisk estimate` end to end: the plan it prints and writes as JSON by category, for each
// optimizer, mixture of experts, ZeRO stage and LoRA, equal to what train allocates.
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

}  // namespace
}  // namespace brisk::testing
