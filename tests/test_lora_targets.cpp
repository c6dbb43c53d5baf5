// LoRA's choice of linears against PEFT's (tests/fixtures/lora/targets.json, written by
// scripts/make_lora_fixtures.py from transformers + PEFT): for each tiny model and each
// target_modules value, the modules PEFT wraps are the ones brisk adapts, and where PEFT finds
// none brisk refuses. Also PEFT's adapter_config.json read, written and read back, the refusals
// of what brisk does not run, and the options' checks.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "adapters/lora.h"
#include "core/json_file.h"
#include "models/model.h"
#include "test_support.h"
#include "train/options.h"

namespace brisk::testing {
namespace {

// transformers 5 holds a mixture's experts as fused parameters, which PEFT adapts through
// target_parameters (listing the experts' module) whenever a listed target or all-linear names
// an expert's linear, as brisk converts them too (with_fused_experts); a regular expression on
// Mixtral and OLMoE, which PEFT resolves into names of every layer first, brisk refuses. So
// those are not compared.
bool compared(const nlohmann::json& c) {
  const std::string model = c["model"];
  const bool converted = model == "moe/mixtral_tiny" || model == "moe/olmoe_tiny";
  return !converted || !c["target_modules"].is_string() || c["target_modules"] == "all-linear";
}

LoraConfig config_of(const nlohmann::json& c, const ModelConfig& model) {
  LoraConfig l;
  l.dropout = 0;  // PEFT's default, the fixture's
  const nlohmann::json& t = c["target_modules"];
  if (t == "all-linear")
    l.all_linear = true;
  else if (t.is_string())
    l.target_pattern = t.get<std::string>();
  else if (t.is_array())
    l.target_modules = t.get<std::vector<std::string>>();
  if (model.task == ModelTask::sequence_classification) l.modules_to_save = {"classifier", "score"};
  return l;
}

TEST(LoraTargets, TheLinearsPeftWrapsOnEveryArchitecture) {
  const nlohmann::json cases = read_json_file(fixture("lora/targets.json"), "fixture")["cases"];
  int wrapped = 0, refused = 0;
  for (const nlohmann::json& c : cases) {
    if (!compared(c)) continue;
    const std::string name = c["model"];
    const ModelConfig config = load_config(fixture(name + "/config.json"));
    const std::unique_ptr<Model> model = Model::create(config);
    const std::vector<LinearDecl> linears = model->linears();
    SCOPED_TRACE(name + " " + c["target_modules"].dump());
    if (c.contains("wrapped")) {
      const LoraConfig lora = with_fused_experts(config_of(c, config), config.type_name());
      const LoraTargets targets = lora_targets(linears, lora, config.type_name());
      std::vector<std::string> names = module_names(targets.linears);
      for (const ExpertTarget& t : expert_targets(model->expert_weights(), lora, targets.routers))
        names.push_back(t.module);
      std::sort(names.begin(), names.end());
      EXPECT_EQ(names, c["wrapped"].get<std::vector<std::string>>());
      ++wrapped;
    } else {
      const std::string error = c["error"];
      if (error.find("modules_to_save cannot be applied") != std::string::npos) continue;
      // PEFT refuses; brisk refuses too, except where it has a default PEFT's mapping lists.
      if (c["target_modules"].is_null() && config.type_name() == "mixtral") continue;
      const LoraConfig lora = config_of(c, config);
      EXPECT_THROW(
          lora_targets(linears, with_fused_experts(lora, config.type_name()), config.type_name()),
          Error);
      ++refused;
    }
  }
  EXPECT_GT(wrapped, 25);
  EXPECT_GT(refused, 50);
}

TEST(LoraTargets, TheOutputLayerAndTheFormOfEachLinear) {
  const ModelConfig gpt2 = load_config(fixture("gpt2_tiny/config.json"));
  const std::vector<LinearDecl> g = Model::create(gpt2)->linears();
  ASSERT_FALSE(g.empty());
  EXPECT_EQ(g.front().module, "transformer.h.0.attn.c_attn");
  EXPECT_TRUE(g.front().fan_in_fan_out);  // Conv1D: [in, out]
  EXPECT_EQ(g.front().in, gpt2.hidden_size);
  EXPECT_EQ(g.front().out, 3 * gpt2.hidden_size);
  EXPECT_EQ(g.front().layer, 0);
  const ModelConfig llama = load_config(fixture("llama_tiny/config.json"));
  const std::vector<LinearDecl> l = Model::create(llama)->linears();
  ASSERT_FALSE(l.empty());
  EXPECT_EQ(l.front().module, "model.layers.0.self_attn.q_proj");
  EXPECT_FALSE(l.front().fan_in_fan_out);
  EXPECT_EQ(l.front().out, llama.num_heads * llama.head_dim());
  if (!llama.tied_lm_head) {
    EXPECT_EQ(l.back().module, "lm_head");
    EXPECT_TRUE(l.back().output);
    EXPECT_EQ(l.back().layer, -1);
  }
  const ModelConfig bert = load_config(fixture("bert_tiny/config.json"));
  const std::vector<LinearDecl> b = Model::create(bert)->linears();
  EXPECT_EQ(b.back().module, "classifier");
  EXPECT_TRUE(b.back().output);
  EXPECT_FALSE(b[b.size() - 2].output);  // the pooler
}

TEST(LoraTargets, RefusalsNameTheTarget) {
  const ModelConfig llama = load_config(fixture("llama_tiny/config.json"));
  const std::vector<LinearDecl> l = Model::create(llama)->linears();
  LoraConfig c;
  c.target_modules = {"q_proj", "qproj"};
  const LoraTargets some = lora_targets(l, c, "llama");
  EXPECT_EQ(some.linears.size(), 2u);  // a q_proj per layer
  EXPECT_EQ(some.unmatched, std::vector<std::string>{"qproj"});
  c.target_modules = {"qproj"};
  expect_error([&] { lora_targets(l, c, "llama"); },
               "--lora_target_modules qproj matches no linear");
  c.target_modules.clear();
  c.target_pattern = "(";
  expect_error([&] { lora_targets(l, c, "llama"); }, "is not a regular expression");
  const ModelConfig distil = load_config(fixture("distilbert_tiny/config.json"));
  expect_error([&] { lora_targets(Model::create(distil)->linears(), LoraConfig(), "distilbert"); },
               "PEFT has no default target modules for model_type \"distilbert\"");
}

TEST(LoraTargets, ModulesToSaveAsPeftMatchesThem) {
  const std::vector<std::string> saved = {"classifier", "score"};
  EXPECT_TRUE(saved_in_full("classifier.weight", saved));
  EXPECT_TRUE(saved_in_full("score.weight", saved));
  EXPECT_TRUE(saved_in_full("model.score.bias", saved));
  EXPECT_FALSE(saved_in_full("pre_classifier.weight", saved));
  EXPECT_FALSE(saved_in_full("bert.pooler.dense.weight", saved));
}

TEST(LoraConfig, PeftsAdapterConfigReadWrittenAndReadBack) {
  const LoraConfig c =
      read_adapter_config(read_json_file(fixture("lora/adapter_config.json"), "fixture"), "peft");
  EXPECT_EQ(c.r, 4);
  EXPECT_EQ(c.alpha, 8);
  EXPECT_DOUBLE_EQ(c.dropout, 0.05);
  EXPECT_EQ(c.target_modules, (std::vector<std::string>{"q_proj", "v_proj"}));
  EXPECT_EQ(c.task_type, "CAUSAL_LM");
  EXPECT_DOUBLE_EQ(c.scale(), 2.0);
  LoraConfig rs = c;
  rs.use_rslora = true;
  EXPECT_DOUBLE_EQ(rs.scale(), 4.0);
  const LoraConfig back = read_adapter_config(adapter_config_json(c), "brisk");
  EXPECT_EQ(back.r, c.r);
  EXPECT_EQ(back.alpha, c.alpha);
  EXPECT_EQ(back.target_modules, c.target_modules);
  LoraConfig all = c;
  all.all_linear = true;
  EXPECT_TRUE(read_adapter_config(adapter_config_json(all), "brisk").all_linear);
  // PEFT's rank_pattern and alpha_pattern: the first pattern ending a target's name at a part.
  LoraConfig patterned = c;
  patterned.rank_pattern = {{".*\\.gate_up_proj", 8}, {"v_proj", 6}};
  patterned.alpha_pattern = {{"v_proj", 3}};
  const LoraConfig p = read_adapter_config(adapter_config_json(patterned), "brisk");
  EXPECT_EQ(p.rank_of("model.layers.0.mlp.experts.gate_up_proj"), 8);
  EXPECT_EQ(p.rank_of("model.layers.0.self_attn.v_proj"), 6);
  EXPECT_EQ(p.rank_of("model.layers.0.self_attn.xv_proj"), 4);  // not at a part's start
  EXPECT_EQ(p.rank_of("model.layers.0.self_attn.q_proj"), 4);
  EXPECT_DOUBLE_EQ(p.scale_of("model.layers.0.self_attn.v_proj"), 0.5);
  EXPECT_DOUBLE_EQ(p.scale_of("model.layers.0.mlp.experts.gate_up_proj"), 1.0);
  EXPECT_DOUBLE_EQ(p.scale_of("model.layers.0.self_attn.q_proj"), 2.0);
}

TEST(LoraConfig, WhatBriskDoesNotRunIsRefusedByItsKey) {
  nlohmann::json j = read_json_file(fixture("lora/adapter_config.json"), "fixture");
  auto refused = [&](const char* key, nlohmann::json value, const std::string& expected) {
    nlohmann::json k = j;
    k[key] = std::move(value);
    expect_error([&] { read_adapter_config(k, "adapter_config.json"); }, expected);
  };
  refused("use_dora", true, "use_dora is set, which brisk does not run");
  refused("layers_to_transform", {0}, "layers_to_transform is set");
  refused("peft_type", "IA3", "peft_type must be \"LORA\"");
  refused("r", 0, "r must be a whole number");
  refused("r", 2.5, "r must be a whole number");
  refused("lora_alpha", "eight", "lora_alpha must be a number");
  refused("bias", "all", "bias must be \"none\"");
  refused("target_modules", 7, "target_modules must be a list");
  refused("rank_pattern", {{"q_proj", 0}}, "rank_pattern[\"q_proj\"] must be a positive whole");
  refused("rank_pattern", {{"q_proj", 2.5}}, "rank_pattern[\"q_proj\"] must be a positive whole");
  refused("alpha_pattern", {{"q_proj", "x"}}, "alpha_pattern[\"q_proj\"] must be a positive");
  refused("rank_pattern", 3, "rank_pattern must be an object");
  nlohmann::json rs = j;
  rs["use_rslora"] = true;
  rs["rank_pattern"] = {{"q_proj", 8}};
  expect_error([&] { read_adapter_config(rs, "a.json"); }, "use_rslora with rank_pattern");
  expect_error([&] { read_adapter_config(nlohmann::json::array(), "a.json"); },
               "must be a JSON object");
}

TEST(LoraOptions, CheckedAndForgottenFlagsNamed) {
  TrainOptions o;
  o.lora_r = 8;
  expect_error([&] { validate_options(o); }, "--lora_r is set but --use_peft is not");
  o.use_peft = true;
  EXPECT_NO_THROW(validate_options(o));
  o.lora_r = 0;
  expect_error([&] { validate_options(o); }, "lora_r must lie in [1, 65536], got 0");
  o.lora_r = 8;
  o.lora_dropout = 1;
  expect_error([&] { validate_options(o); }, "lora_dropout must lie in [0, 1)");
  const LoraConfig c = lora_config(8, 16, 0, " q_proj, v_proj ", "score", false);
  EXPECT_EQ(c.target_modules, (std::vector<std::string>{"q_proj", "v_proj"}));
  EXPECT_EQ(c.modules_to_save, (std::vector<std::string>{"score"}));
  EXPECT_TRUE(lora_config(8, 16, 0, "all-linear", "", false).all_linear);
  // PEFT's rank_pattern and alpha_pattern as JSON objects.
  o.lora_dropout = 0;
  o.lora_rank_pattern = R"({"v_proj": 2, ".*\\.gate_up_proj": 16})";
  EXPECT_NO_THROW(validate_options(o));
  EXPECT_EQ(
      pattern_option(o.lora_rank_pattern, "--lora_rank_pattern", true),
      (std::vector<std::pair<std::string, double>>{{".*\\.gate_up_proj", 16}, {"v_proj", 2}}));
  o.use_rslora = true;
  expect_error([&] { validate_options(o); }, "--use_rslora with --lora_rank_pattern");
  o.use_rslora = false;
  for (const auto& [text, message] :
       {std::pair{"{", "--lora_rank_pattern \"{\" is not JSON"},
        {"[8]", "--lora_rank_pattern must be an object of patterns and numbers"},
        {R"({"q_proj": 0.5})", R"(--lora_rank_pattern["q_proj"] must be a positive whole)"}}) {
    o.lora_rank_pattern = text;
    expect_error([&] { validate_options(o); }, message);
  }
  o.lora_rank_pattern.clear();
  o.lora_alpha_pattern = R"({"q_proj": -1})";
  expect_error([&] { validate_options(o); },
               R"(--lora_alpha_pattern["q_proj"] must be a positive)");
  TrainOptions forgotten;
  forgotten.lora_alpha_pattern = R"({"q_proj": 4})";
  expect_error([&] { validate_options(forgotten); }, "--lora_alpha_pattern is set but --use_peft");
}

}  // namespace
}  // namespace brisk::testing
