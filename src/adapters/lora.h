// LoRA as PEFT defines it (peft's LoraConfig and its adapter_config.json): which of a model's
// linears (models/linears.h) take low-rank adapters, which modules train in full beside them,
// and the numbers of the adapters. The model declares its linears; this layer picks and wraps
// them from outside.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "models/linears.h"

namespace brisk {

struct LoraConfig {
  int64_t r = 16;
  double alpha = 32;
  double dropout = 0.05;
  // PEFT's target_modules: names (a module whose name is one of them or ends with "." + one),
  // "all-linear" (every linear but the output layer), or one regular expression that must match
  // a module's whole name (PEFT's string form). None of them: PEFT's default for the model type.
  std::vector<std::string> target_modules;
  bool all_linear = false;
  std::string target_pattern;
  // PEFT's target_parameters: a mixture's fused expert weights by name ("mlp.experts.gate_up_proj",
  // "mlp.experts.down_proj": a weight whose name is one, or ends with "." + one), each expert
  // its own A and B (no dropout). None beside them and no target_modules: the experts alone.
  std::vector<std::string> target_parameters;
  // PEFT's rank_pattern and alpha_pattern: a target whose name (a linear's module, an expert
  // weight's parameter) ends with a match of a pattern takes its r or alpha, the first such.
  std::vector<std::pair<std::string, double>> rank_pattern, alpha_pattern;
  // Modules trained in full and saved with the adapter (PEFT's modules_to_save).
  std::vector<std::string> modules_to_save;
  bool use_rslora = false;
  // The targets' weights stored [in, out] (GPT-2's Conv1D), as PEFT records it; brisk reads each
  // linear's own layout from the model.
  bool fan_in_fan_out = false;
  std::string base_model_name_or_path;
  std::string task_type;  // PEFT's TaskType: SEQ_CLS, CAUSAL_LM, or empty
  // The adapters' output scale: alpha / r, or alpha / sqrt(r) with use_rslora.
  double scale() const;
  // Target `name`'s rank and scale, rank_pattern and alpha_pattern applied.
  int64_t rank_of(const std::string& name) const;
  double scale_of(const std::string& name) const;
};

// transformers 5 fuses a mixture's per-expert linears (Mixtral's w1, w3, w2; OLMoE's gate_proj,
// up_proj, down_proj), which PEFT then adapts as the fused weights: listed target_modules naming
// them become target_parameters (gate_up_proj, down_proj; gate and up only together, at twice the
// rank and alpha through rank_pattern and alpha_pattern), as PEFT converts a config for
// `model_type`; all-linear there adds the router ("gate.weight") and both fused weights, as PEFT
// converts it. A listed router ("gate") is refused by name (no nn.Linear in transformers 5:
// target_parameters adapts it), and so is a regular expression (PEFT resolves it into leaf names
// of every layer before converting).
LoraConfig with_fused_experts(LoraConfig c, const std::string& model_type);

// From the options' values (lists comma-separated; "all-linear" as PEFT's shorthand), checked.
LoraConfig lora_config(int64_t r, double alpha, double dropout, const std::string& target_modules,
                       const std::string& modules_to_save, bool use_rslora,
                       const std::string& target_parameters = "");

// PEFT's rank_pattern (`whole`: ranks) or alpha_pattern from an option's JSON text (an object
// of patterns and positive numbers; empty: none), refused naming `option`.
std::vector<std::pair<std::string, double>> pattern_option(const std::string& text,
                                                           const char* option, bool whole);

// PEFT's adapter_config.json read (`origin` names the file in messages) and written. Reading
// refuses what brisk does not run (another peft_type, DoRA, bias, layers_to_transform, ...) by
// the key's name.
LoraConfig read_adapter_config(const nlohmann::json& j, const std::string& origin);
nlohmann::json adapter_config_json(const LoraConfig& c);

// The linears the config adapts, in the model's order: a linear matching a target (and no
// module to save; a routed expert's is not adapted). `model_type` (config.json's) picks PEFT's
// default targets when none are given. Refused: no default for the model type, targets that
// match no linear at all; listed names that match none while others do are `unmatched`
// (skipped, as PEFT skips them).
// A mixture's router (LinearDecl::router) is adapted where target_parameters names its weight
// ("gate.weight"), as PEFT adapts it (`routers` counts them), and refused where a target
// module names it.
struct LoraTargets {
  std::vector<LinearDecl> linears;
  std::vector<std::string> unmatched;
  int routers = 0;
};
LoraTargets lora_targets(const std::vector<LinearDecl>& linears, const LoraConfig& c,
                         const std::string& model_type);

// The fused expert weights (models/linears.h) target_parameters names, in the model's order, each
// with PEFT's name of its wrapper: "<module>" nested in a ".base_layer" for each weight of the
// same module wrapped after it (PEFT wraps a module's weights in their declaration order, each
// around the last). Refused: target_parameters that match none, nor any of `routers` routers
// (LoraTargets::routers).
struct ExpertTarget {
  ExpertWeightsDecl weights;
  std::string module;
};
std::vector<ExpertTarget> expert_targets(const std::vector<ExpertWeightsDecl>& weights,
                                         const LoraConfig& c, int routers);

// Whether parameter `name` (transformers' state-dict name) belongs to one of the modules to save.
bool saved_in_full(const std::string& name, const std::vector<std::string>& modules_to_save);

}  // namespace brisk
