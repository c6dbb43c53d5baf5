// Training LoRA adapters with the trainer: steps against PEFT + a torch AdamW loop
// (tests/fixtures/lora/train_*, scripts/make_lora_fixtures.py), the files a run saves in PEFT's
// format, resume from an adapter's checkpoint, evaluation with an adapter folder, and the
// refusals.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>

#include "adapters/attach.h"
#include "adapters/lora.h"
#include "core/json_file.h"
#include "core/safetensors.h"
#include "test_support.h"
#include "train/assembly.h"
#include "train/checkpoint.h"
#include "train/fit.h"
#include "train/trainer.h"
#include "trainer_support.h"

namespace brisk::testing {
namespace {

namespace fs = std::filesystem;

const LogSink quiet = [](const nlohmann::json&) {};

// The base fixture's model folder with every dropout off (the fixture trained so).
std::string without_dropout(const TempDir& dir, const std::string& name) {
  const std::string folder = dir / (name + "_base");
  fs::create_directories(folder);
  fs::copy_file(fixture(name + "/model.safetensors"), folder + "/model.safetensors");
  nlohmann::json c = read_json_file(fixture(name + "/config.json"), "config");
  for (const char* key : {"hidden_dropout_prob", "attention_probs_dropout_prob", "resid_pdrop",
                          "embd_pdrop", "attn_pdrop", "attention_dropout"})
    if (c.contains(key)) c[key] = 0.0;
  std::ofstream(folder + "/config.json") << c.dump();
  return folder;
}

std::vector<double> train_losses(const TrainOptions& o, const Dataset* data = nullptr) {
  std::vector<double> losses;
  train(
      o,
      [&](const nlohmann::json& j) {
        if (j.contains("loss")) losses.push_back(j["loss"]);
      },
      data);
  return losses;
}

// Three steps from PEFT's initial adapter on the fixture's batch give PEFT's losses, and the
// adapter saved in output_dir holds PEFT's tensors after them, under PEFT's keys, with an
// adapter_config.json that reads back as the adapter trained.
void expect_steps_as_peft(const std::string& name, const std::string& adapter) {
  SCOPED_TRACE(name);
  TempDir dir("lora_steps");
  const std::string want_dir = fixture("lora/train_" + adapter);
  FixtureRows rows(fixture(name + "/batch.safetensors"));
  TrainOptions o = tiny_options(without_dropout(dir, name), dir / "out");
  o.adapter_name_or_path = want_dir + "/initial";
  o.seq_len = rows.seq_len();
  o.per_device_train_batch_size = rows.size();
  o.max_steps = 3;
  o.learning_rate = 1e-2;
  o.lr_scheduler_type = "constant";
  o.weight_decay = 0.01;
  o.save_steps = 3;
  const std::vector<double> losses = train_losses(o, &rows);
  const SafetensorsFile steps(want_dir + "/steps.safetensors");
  ASSERT_EQ(losses.size(), 3u);
  for (int s = 0; s < 3; ++s)
    EXPECT_NEAR(losses[s], steps.get("losses").f32()[s], 1e-4 * steps.get("losses").f32()[s])
        << "step " << s + 1;
  const SafetensorsFile want(want_dir + "/final/adapter_model.safetensors");
  for (const std::string& saved : {o.output_dir, o.output_dir + "/checkpoint-3"}) {
    const SafetensorsFile got(saved + "/adapter_model.safetensors");
    EXPECT_EQ(got.names(), want.names()) << saved;
    for (const std::string& n : want.names()) {
      ASSERT_TRUE(got.has(n)) << n;
      ASSERT_EQ(got.get(n).shape(), want.get(n).shape()) << n;
      EXPECT_LE(rel_error(got.get(n).f32(), want.get(n).f32(), want.get(n).numel()), 1e-4) << n;
    }
    const std::string config = saved + "/adapter_config.json";
    const LoraConfig c = read_adapter_config(read_json_file(config, "adapter"), config);
    const LoraConfig w = read_adapter_config(
        read_json_file(want_dir + "/final/adapter_config.json", "adapter"), "adapter");
    EXPECT_EQ(c.r, w.r);
    EXPECT_EQ(c.alpha, w.alpha);
    EXPECT_EQ(c.target_modules, w.target_modules);
    EXPECT_EQ(c.modules_to_save, w.modules_to_save);
    EXPECT_EQ(c.fan_in_fan_out, w.fan_in_fan_out);
    EXPECT_EQ(c.task_type, w.task_type);
  }
  EXPECT_FALSE(fs::exists(o.output_dir + "/model.safetensors"));  // the base is not saved
}

TEST(LoraTrain, LlamaStepsAsPeftAndTorchAdamW) {
  expect_steps_as_peft("llama_tiny", "llama");
}

TEST(LoraTrain, Gpt2sConv1DStepsAsPeftAndTorchAdamW) {
  expect_steps_as_peft("gpt2_tiny", "gpt2");
}

TEST(LoraTrain, BertWithItsClassifierStepsAsPeftAndTorchAdamW) {
  expect_steps_as_peft("bert_tiny", "bert");
}

TrainOptions lora_options(const TempDir& dir, const std::string& type) {
  TrainOptions o = tiny_options(write_config(dir, type, 0.1), dir / "out");
  o.use_peft = true;
  o.lora_r = 4;
  o.lora_alpha = 8;
  o.lora_dropout = 0.1;
  o.lora_target_modules = "all-linear";
  if (type == "bert") o.lora_target_modules = "query,key,value,attention.output.dense";
  o.learning_rate = 1e-2;
  return o;
}

// A run resumed from an adapter's checkpoint (the base from model_name_or_path, the adapter and
// its optimizer state from the checkpoint) ends with the uninterrupted run's adapter, bit for
// bit; the checkpoints hold no model.safetensors, and PEFT's files.
TEST(LoraTrain, ResumeFromAnAdaptersCheckpointContinuesExactly) {
  for (const char* type : {"gpt2", "bert"}) {
    SCOPED_TRACE(type);
    TempDir dir("lora_resume");
    TrainOptions o = lora_options(dir, type);
    o.max_steps = 4;
    o.save_steps = 2;
    train_losses(o);
    const std::string straight = o.output_dir + "/checkpoint-4/adapter_model.safetensors";
    EXPECT_FALSE(fs::exists(o.output_dir + "/checkpoint-2/model.safetensors"));
    TrainOptions resumed = resumed_in_copy(o, "checkpoint-2", dir / "resumed");
    const std::vector<double> losses = train_losses(resumed);
    EXPECT_EQ(losses.size(), 2u);
    std::ifstream a(straight, std::ios::binary);
    std::ifstream b(resumed.output_dir + "/checkpoint-4/adapter_model.safetensors",
                    std::ios::binary);
    const std::string x((std::istreambuf_iterator<char>(a)), {});
    const std::string y((std::istreambuf_iterator<char>(b)), {});
    EXPECT_FALSE(x.empty());
    EXPECT_TRUE(x == y);
    // A whole model's resume of an adapter's checkpoint is refused, naming the flag.
    TrainOptions whole = resumed;
    whole.use_peft = false;
    whole.lora_r = 16;
    whole.lora_alpha = 32;
    whole.lora_dropout = 0.05;
    whole.lora_target_modules.clear();
    expect_error([&] { train(whole, quiet); }, "holds a LoRA adapter; resume it with --use_peft");
  }
}

// Evaluating with --adapter_name_or_path (no training) gives the trained run's evaluation.
TEST(LoraTrain, EvaluatesWithAnAdapterFolder) {
  TempDir dir("lora_eval");
  TrainOptions o = lora_options(dir, "bert");
  TrainOptions full = tiny_options(o.model_name_or_path, dir / "base");  // a base with weights
  full.max_steps = 1;
  train(full, quiet);
  o.model_name_or_path = full.output_dir;
  o.max_steps = 3;
  o.do_eval = true;
  const TrainSummary trained = train(o, quiet);
  TrainOptions e = tiny_options(o.model_name_or_path, dir / "eval");
  e.do_train = false;
  e.do_eval = true;
  e.adapter_name_or_path = o.output_dir;
  const TrainSummary evaluated = train(e, quiet);
  // (A run that only evaluates plans its buffers apart: the last digit may differ.)
  EXPECT_NEAR(evaluated.eval_metrics["eval_loss"].get<double>(),
              trained.eval_metrics["eval_loss"].get<double>(), 1e-12);
  TrainOptions base = e;
  base.adapter_name_or_path.clear();
  EXPECT_GT(std::abs(train(base, quiet).eval_metrics["eval_loss"].get<double>() -
                     trained.eval_metrics["eval_loss"].get<double>()),
            1e-4);
}

TEST(LoraTrain, BadAdapterInputIsRefusedByName) {
  TempDir dir("lora_bad");
  TrainOptions o = lora_options(dir, "gpt2");
  TrainOptions both = o;
  both.adapter_name_or_path = dir / "nowhere";
  expect_error([&] { validate_options(both); }, "--lora_r is set beside --adapter_name_or_path");
  TrainOptions missing = tiny_options(o.model_name_or_path, dir / "out2");
  missing.adapter_name_or_path = dir / "nowhere";
  expect_error([&] { train(missing, quiet); }, "--adapter_name_or_path: '");
  TrainOptions empty = missing;
  fs::create_directories(dir / "empty");
  empty.adapter_name_or_path = dir / "empty";
  expect_error([&] { train(empty, quiet); }, "holds no adapter_config.json");
  // An adapter of another model: its shapes named.
  TrainOptions other = missing;
  other.adapter_name_or_path = fixture("lora/merge_gpt2");
  expect_error([&] { train(other, quiet); }, "(an adapter of another model?)");
  // Tensor parallelism: a row-parallel linear's adapter with dropout, a 4-bit base, experts.
  TrainOptions tp = o;
  tp.tp_size = 2;
  expect_error([&] { assemble_run(tp, Device::cpu, nullptr, nullptr, 0, 2); },
               "--lora_dropout 0.1 on transformer.h.0.attn.c_proj (a row-parallel linear");
  tp.lora_target_modules = "c_attn";
  EXPECT_NO_THROW(assemble_run(tp, Device::cpu, nullptr, nullptr, 0, 2));
  tp.load_in_4bit = true;
  expect_error([&] { assemble_run(tp, Device::cpu, nullptr, nullptr, 0, 2); },
               "LoRA adapters with --load_in_4bit and --tp_size");
  // ZeRO stage 3 partitions a 16- or 32-bit frozen base's blocks, not a 4-bit one's.
  TrainOptions zero = o;
  zero.zero_stage = 3;
  zero.load_in_4bit = true;
  expect_error([&] { assemble_run(zero, Device::cpu, nullptr, nullptr, 0, 2); },
               "LoRA adapters with --load_in_4bit and --zero_stage 3");
  zero.load_in_4bit = false;
  zero.tp_size = 2;
  zero.lora_target_modules = "c_attn";
  expect_error([&] { assemble_run(zero, Device::cpu, nullptr, nullptr, 0, 4); },
               "LoRA adapters with --tp_size and --zero_stage 3");
  TrainOptions embed = o;
  embed.lora_modules_to_save = "wte";
  expect_error([&] { train(embed, quiet); }, "--lora_modules_to_save: 'transformer.wte.weight'");
}

// --lora_rank_pattern and --lora_alpha_pattern give a target its own rank and alpha: the saved
// adapter holds c_proj's A and B at rank 2 beside c_attn's at 4, and its config the patterns,
// which an adapter folder read back applies again.
TEST(LoraTrain, RankAndAlphaPatternsFromTheOptions) {
  TempDir dir("lora_patterns");
  TrainOptions o = lora_options(dir, "gpt2");
  o.lora_target_modules = "c_attn,c_proj";
  o.lora_rank_pattern = R"({"mlp\\.c_proj": 2})";
  o.lora_alpha_pattern = R"({"mlp\\.c_proj": 3})";
  o.max_steps = 1;
  train(o, quiet);
  const SafetensorsFile f(o.output_dir + "/adapter_model.safetensors");
  const std::string layer = "base_model.model.transformer.h.0.";
  EXPECT_EQ(f.get(layer + "mlp.c_proj.lora_A.weight").shape()[0], 2);
  EXPECT_EQ(f.get(layer + "attn.c_proj.lora_A.weight").shape()[0], 4);
  EXPECT_EQ(f.get(layer + "attn.c_attn.lora_B.weight").shape()[1], 4);
  const LoraConfig c = read_adapter_folder(o.output_dir, "output_dir");
  EXPECT_EQ(c.rank_pattern, (std::vector<std::pair<std::string, double>>{{"mlp\\.c_proj", 2}}));
  EXPECT_EQ(c.alpha_pattern, (std::vector<std::pair<std::string, double>>{{"mlp\\.c_proj", 3}}));
  EXPECT_EQ(c.rank_of("transformer.h.1.mlp.c_proj"), 2);
  EXPECT_DOUBLE_EQ(c.scale_of("transformer.h.1.mlp.c_proj"), 1.5);
  EXPECT_DOUBLE_EQ(c.scale_of("transformer.h.1.attn.c_proj"), 2.0);
}

// ZeRO stage 3 with adapters holds each rank's run of the frozen blocks' weights and two blocks'
// slots instead of the whole base (the embeddings, the head and the adapters stay whole): the
// planned weights shrink by the blocks' elements less this rank's run and the two slots.
TEST(LoraTrain, ZeroStage3PartitionsTheFrozenBlocks) {
  TempDir dir("lora_zero3");
  TrainOptions o = lora_options(dir, "gpt2");
  o.model_name_or_path = write_config(dir, "gpt2", 0.1, 8);
  o.zero_stage = 2;
  const auto two = assemble_run(o, Device::cpu, nullptr, nullptr, 0, 2);
  o.zero_stage = 3;
  const auto three = assemble_run(o, Device::cpu, nullptr, nullptr, 0, 2);
  auto weights = [](const RunAssembly& r) {
    return r.plan.bytes_by_category()[static_cast<int>(Category::weights)];
  };
  EXPECT_TRUE(two->parallel.base_shards.empty());
  const std::vector<ParamShard>& shards = three->parallel.base_shards;
  ASSERT_EQ(shards.size(), 2u);
  EXPECT_EQ(shards[0].elements.offset + shards[0].elements.count, shards[1].elements.offset);
  const int64_t blocks = shards[0].elements.count + shards[1].elements.count;
  EXPECT_EQ(blocks % 8, 0);
  EXPECT_TRUE(three->model->staged_weights());
  EXPECT_EQ(weights(*two) - weights(*three),
            4 * (blocks - shards[0].elements.count - 2 * (blocks / 8)));
}

// A listed target that names no linear is skipped, as PEFT skips it, and said once.
TEST(LoraTrain, AnUnmatchedTargetIsSkippedAndSaid) {
  TempDir dir("lora_unmatched");
  TrainOptions o = lora_options(dir, "gpt2");
  o.lora_target_modules = "c_attn,cproj";
  o.max_steps = 1;
  std::vector<std::string> warnings;
  train(o, [&](const nlohmann::json& j) {
    if (j.contains("warning")) warnings.push_back(j["warning"]);
  });
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("no linear of the model is named 'cproj'"), std::string::npos)
      << warnings[0];
  EXPECT_EQ(read_adapter_folder(o.output_dir, "output_dir").target_modules,
            (std::vector<std::string>{"c_attn", "cproj"}));
}

// Files `got` and `want` hold the same tensor names, each of the same shape.
void expect_same_tensors(const SafetensorsFile& got, const SafetensorsFile& want) {
  std::vector<std::string> a = got.names(), b = want.names();
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  ASSERT_EQ(a, b);
  for (const std::string& name : b)
    EXPECT_EQ(got.get(name).shape(), want.get(name).shape()) << name;
}

// A mixture's routed experts adapted through PEFT's target_parameters (beside q_proj) train (as
// with gradient checkpointing) and resume exactly; the adapter saved holds the keys and shapes PEFT
// saved for the same targets (lora/experts_mixtral: each expert's B interleaved as PEFT lays it),
// and its config the targets.
TEST(LoraTrain, MixturesExpertsTrainResumeAndSaveAsPeft) {
  TempDir dir("lora_experts");
  FixtureRows rows(fixture("moe/mixtral_tiny/batch.safetensors"));
  TrainOptions o = tiny_options(fixture("moe/mixtral_tiny"), dir / "out");
  o.use_peft = true;
  o.lora_r = 2;
  o.lora_alpha = 4;
  o.lora_dropout = 0;
  o.lora_target_modules = "q_proj";
  o.lora_target_parameters = "mlp.experts.gate_up_proj,mlp.experts.down_proj";
  o.learning_rate = 1e-2;
  o.per_device_train_batch_size = 1;
  o.max_steps = 4;
  o.save_steps = 2;
  const std::vector<double> losses = train_losses(o, &rows);
  EXPECT_EQ(losses.size(), 4u);
  // Gradient checkpointing runs the experts' forward again in backward: the same steps.
  TrainOptions recomputed = o;
  recomputed.output_dir = dir / "recomputed";
  recomputed.gradient_checkpointing = true;
  const std::vector<double> again = train_losses(recomputed, &rows);
  ASSERT_EQ(again.size(), losses.size());
  for (size_t i = 0; i < losses.size(); ++i) EXPECT_NEAR(again[i], losses[i], 1e-6 * losses[i]);
  const std::string saved = o.output_dir + "/checkpoint-4/adapter_model.safetensors";
  TrainOptions resumed = resumed_in_copy(o, "checkpoint-2", dir / "resumed");
  EXPECT_EQ(train_losses(resumed, &rows).size(), 2u);
  EXPECT_EQ(checkpoint_weights(resumed.output_dir + "/checkpoint-4"),
            checkpoint_weights(o.output_dir + "/checkpoint-4"));
  const SafetensorsFile got(saved), want(fixture("lora/experts_mixtral/adapter_model.safetensors"));
  expect_same_tensors(got, want);
  const LoraConfig c = read_adapter_folder(o.output_dir, "output_dir");
  EXPECT_EQ(c.target_parameters,
            (std::vector<std::string>{"mlp.experts.gate_up_proj", "mlp.experts.down_proj"}));
  EXPECT_EQ(c.target_modules, std::vector<std::string>{"q_proj"});
  // PEFT's experts take no dropout.
  o.lora_dropout = 0.05;
  expect_error([&] { validate_options(o); }, "--lora_target_parameters needs --lora_dropout 0");
  o.lora_dropout = 0;
  o.lora_target_parameters = "mlp.experts.w9";
  expect_error([&] { train_losses(o, &rows); },
               "--lora_target_parameters mlp.experts.w9 matches no weight of the model");
  // Under tensor parallelism (a mixtral whose sizes 2 ranks divide).
  nlohmann::json config = read_json_file(fixture("moe/mixtral_tiny/config.json"), "config");
  config["num_attention_heads"] = 2;
  config["intermediate_size"] = 8;
  fs::create_directories(dir / "even");
  std::ofstream(dir / "even/config.json") << config.dump();
  o.model_name_or_path = dir / "even";
  o.lora_target_parameters = "mlp.experts.down_proj";
  o.tp_size = 2;
  expect_error([&] { assemble_run(o, Device::cpu, nullptr, nullptr, 0, 2); },
               "--lora_target_parameters with --tp_size is not built yet");
}

// A mixture's experts named by their per-expert linears (OLMoE's gate_proj, up_proj, down_proj)
// train as PEFT converts them: the adapter saved holds PEFT's keys and shapes (gate_up_proj's at
// twice the rank) and PEFT's converted config. Half a pair, the router and dropout are refused.
TEST(LoraTrain, MixturesListedExpertLinearsTrainAsPeftConvertsThem) {
  TempDir dir("lora_listed");
  FixtureRows rows(fixture("moe/olmoe_tiny/batch.safetensors"));
  TrainOptions o = tiny_options(fixture("moe/olmoe_tiny"), dir / "out");
  o.use_peft = true;
  o.lora_r = 2;
  o.lora_alpha = 4;
  o.lora_dropout = 0;
  o.lora_target_modules = "q_proj,gate_proj,up_proj,down_proj";
  o.per_device_train_batch_size = 1;
  o.max_steps = 2;
  EXPECT_EQ(train_losses(o, &rows).size(), 2u);
  const SafetensorsFile got(o.output_dir + "/adapter_model.safetensors"),
      want(fixture("lora/listed_olmoe/adapter_model.safetensors"));
  expect_same_tensors(got, want);
  const LoraConfig c = read_adapter_folder(o.output_dir, "output_dir");
  const LoraConfig peft = read_adapter_folder(fixture("lora/listed_olmoe"), "fixture");
  EXPECT_EQ(c.target_modules, peft.target_modules);
  EXPECT_EQ(std::set<std::string>(c.target_parameters.begin(), c.target_parameters.end()),
            std::set<std::string>(peft.target_parameters.begin(), peft.target_parameters.end()));
  EXPECT_EQ(c.rank_pattern, peft.rank_pattern);
  EXPECT_EQ(c.alpha_pattern, peft.alpha_pattern);
  o.lora_target_modules = "q_proj,gate_proj,down_proj";
  expect_error([&] { train_losses(o, &rows); },
               "names gate_proj without its pair: olmoe fuses each expert's gate and up");
  o.lora_target_modules = "q_proj,gate";
  expect_error([&] { train_losses(o, &rows); }, "--lora_target_modules gate: olmoe's router");
  LoraConfig pattern;  // an adapter config's string target_modules
  pattern.target_pattern = ".*\\.1\\..*proj";
  expect_error([&] { with_fused_experts(pattern, "olmoe"); },
               "a regular expression on olmoe is not built yet");
  o.lora_target_modules = "down_proj";
  o.lora_dropout = 0.05;
  expect_error([&] { train_losses(o, &rows); }, "which take no dropout: give --lora_dropout 0");
}

// all-linear on a mixture trains and saves as PEFT resolves it: Mixtral's adapter holds the keys
// and shapes PEFT saved (the router's under transformers 5's mlp.gate) and PEFT's converted
// config; Qwen2-MoE's shared expert takes dropout, with the same masks where gradient
// checkpointing runs the forward again.
TEST(LoraTrain, MixturesAllLinearTrainAndSaveAsPeft) {
  TempDir dir("lora_all_linear");
  for (const std::string f : {"mixtral", "qwen2_moe"}) {
    SCOPED_TRACE(f);
    FixtureRows rows(fixture("moe/" + f + "_tiny/batch.safetensors"));
    TrainOptions o = tiny_options(fixture("moe/" + f + "_tiny"), dir / f);
    o.use_peft = true;
    o.lora_r = 2;
    o.lora_alpha = 4;
    o.lora_dropout = f == "mixtral" ? 0.0 : 0.1;
    o.lora_target_modules = "all-linear";
    o.learning_rate = 1e-2;
    o.per_device_train_batch_size = 1;
    o.max_steps = 3;
    const std::vector<double> losses = train_losses(o, &rows);
    ASSERT_EQ(losses.size(), 3u);
    EXPECT_NE(losses[2], losses[0]);
    TrainOptions recomputed = o;
    recomputed.output_dir = dir / (f + "_recomputed");
    recomputed.gradient_checkpointing = true;
    const std::vector<double> again = train_losses(recomputed, &rows);
    ASSERT_EQ(again.size(), losses.size());
    for (size_t i = 0; i < losses.size(); ++i) EXPECT_NEAR(again[i], losses[i], 1e-6 * losses[i]);
    const std::string peft_dir = fixture("lora/all_linear_" + f);
    expect_same_tensors(SafetensorsFile(o.output_dir + "/adapter_model.safetensors"),
                        SafetensorsFile(peft_dir + "/adapter_model.safetensors"));
    const LoraConfig c = read_adapter_folder(o.output_dir, "output_dir");
    const LoraConfig peft = read_adapter_folder(peft_dir, "fixture");
    using Names = std::set<std::string>;
    EXPECT_EQ(Names(c.target_parameters.begin(), c.target_parameters.end()),
              Names(peft.target_parameters.begin(), peft.target_parameters.end()));
    EXPECT_EQ(c.rank_pattern, peft.rank_pattern);
    EXPECT_EQ(c.alpha_pattern, peft.alpha_pattern);
    if (f == "mixtral")  // (Qwen2-MoE's: PEFT writes all-linear resolved per layer)
      EXPECT_EQ(Names(c.target_modules.begin(), c.target_modules.end()),
                Names(peft.target_modules.begin(), peft.target_modules.end()));
  }
}

// --fit prices the data replicas' sums of a LoRA run's gradients as the trained parameters'
// alone: with every other rate unbounded, a step's seconds are the bytes summed, in the ratio of
// the adapters to the base model's parameters.
TEST(LoraTrain, FitPricesTheSumsOfTheAdaptersGradientsAlone) {
  TempDir dir("lora_fit_sums");
  TrainOptions full = tiny_options(write_config(dir, "gpt2", 0.0, 2), dir / "out");
  TrainOptions lora = full;
  lora.use_peft = true;
  lora.lora_r = 4;
  CostModel m;
  m.fp32_flops = m.tf32_flops = m.bf16_flops = m.fp16_flops = m.attention_flops = 1e30;
  m.bandwidth = m.elementwise = m.host_link = m.host_bandwidth = 1e30;
  m.collective = 1;
  for (const int64_t stage : {0, 1, 2}) {
    SCOPED_TRACE(stage);
    full.zero_stage = lora.zero_stage = stage;
    const auto a = assemble_run(full, Device::cpu, nullptr, nullptr, 0, 2);
    const auto b = assemble_run(lora, Device::cpu, nullptr, nullptr, 0, 2);
    const double share = static_cast<double>(b->model->params().trained_run().elements.count) /
                         static_cast<double>(a->model->params().total_elements());
    EXPECT_LT(share, 0.1);
    EXPECT_NEAR(predicted_step_seconds(*b, m) / predicted_step_seconds(*a, m), share, 1e-6 * share);
  }
}

}  // namespace
}  // namespace brisk::testing
