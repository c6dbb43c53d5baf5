// PEFT's adapter_config.json for LoRA: read (the keys brisk runs, the rest only at PEFT's
// defaults) and written as PEFT's save_pretrained writes it.
#include <cmath>
#include <set>

#include "adapters/lora.h"
#include "core/error.h"

namespace brisk {
namespace {

// Keys PEFT writes whose values brisk follows or that change nothing in a LoRA run.
const std::set<std::string>& followed_keys() {
  static const std::set<std::string> keys = {
      "peft_type",
      "r",
      "lora_alpha",
      "lora_dropout",
      "target_modules",
      "target_parameters",
      "rank_pattern",
      "alpha_pattern",
      "modules_to_save",
      "use_rslora",
      "fan_in_fan_out",
      "bias",
      "base_model_name_or_path",
      "task_type",
      "inference_mode",
      "init_lora_weights",
      "peft_version",
      "revision",
      "auto_mapping",
      "megatron_core",
      "qalora_group_size"};  // the last read only with use_qalora
  return keys;
}

// A key of PEFT's that brisk does not run is accepted at the value PEFT writes when it is off.
bool at_its_default(const nlohmann::json& v) {
  return v.is_null() || v == false || (v.is_object() && v.empty()) || (v.is_array() && v.empty()) ||
         (v.is_string() && v.get<std::string>().empty());
}

std::vector<std::string> string_list(const nlohmann::json& v, const std::string& origin,
                                     const char* key) {
  std::vector<std::string> names;
  if (v.is_null()) return names;
  BRISK_CHECK(v.is_array(), origin, ": ", key, " must be a list of module names");
  for (const nlohmann::json& n : v) {
    BRISK_CHECK(n.is_string(), origin, ": ", key, " must be a list of module names");
    names.push_back(n.get<std::string>());
  }
  return names;
}

double number(const nlohmann::json& j, const char* key, double fallback,
              const std::string& origin) {
  if (!j.contains(key)) return fallback;
  BRISK_CHECK(j[key].is_number(), origin, ": ", key, " must be a number");
  return j[key].get<double>();
}

// PEFT's rank_pattern or alpha_pattern: an object of patterns and their positive values (ranks
// whole numbers).
// (`where` names it in messages: the file and key, or the option.)
std::vector<std::pair<std::string, double>> patterns(const nlohmann::json& v,
                                                     const std::string& where, bool whole) {
  std::vector<std::pair<std::string, double>> out;
  if (v.is_null()) return out;
  BRISK_CHECK(v.is_object(), where, " must be an object of patterns and numbers");
  for (const auto& [pattern, value] : v.items()) {
    BRISK_CHECK(value.is_number() && value.get<double>() > 0 &&
                    (!whole || (value.get<double>() <= 65536 &&
                                value.get<double>() == std::floor(value.get<double>()))),
                where, "[\"", excerpt(pattern), "\"] must be a positive ",
                whole ? "whole number up to 65536" : "number");
    out.emplace_back(pattern, value.get<double>());
  }
  return out;
}

nlohmann::json pattern_json(const std::vector<std::pair<std::string, double>>& patterns);

// A whole number as an integer (as PEFT writes lora_alpha = 16), any other as itself.
nlohmann::json whole_or_real(double v) {
  if (std::abs(v) < 1e15 && v == std::floor(v)) return static_cast<int64_t>(v);
  return v;
}

}  // namespace

std::vector<std::pair<std::string, double>> pattern_option(const std::string& text,
                                                           const char* option, bool whole) {
  if (text.empty()) return {};
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  BRISK_CHECK(!j.is_discarded(), option, " \"", excerpt(text),
              "\" is not JSON (give an object of patterns and numbers, {\"q_proj\": 8})");
  return patterns(j, option, whole);
}

LoraConfig read_adapter_config(const nlohmann::json& j, const std::string& origin) {
  BRISK_CHECK(j.is_object(), origin, ": an adapter config must be a JSON object");
  BRISK_CHECK(j.value("peft_type", nlohmann::json()) == "LORA", origin,
              ": peft_type must be \"LORA\" (brisk runs LoRA adapters only)");
  for (const auto& [key, value] : j.items())
    BRISK_CHECK(followed_keys().count(key) || at_its_default(value), origin, ": ", excerpt(key),
                " is set, which brisk does not run yet (only plain LoRA adapters)");
  BRISK_CHECK(j.value("bias", nlohmann::json("none")) == "none", origin,
              ": bias must be \"none\" (brisk trains no biases with the adapters)");
  LoraConfig c;
  const double r = number(j, "r", 8, origin);
  BRISK_CHECK(r >= 1 && r <= 65536 && r == static_cast<double>(static_cast<int64_t>(r)), origin,
              ": r must be a whole number in [1, 65536]");
  c.r = static_cast<int64_t>(r);
  c.alpha = number(j, "lora_alpha", 8, origin);
  BRISK_CHECK(c.alpha > 0, origin, ": lora_alpha must be positive");
  c.dropout = number(j, "lora_dropout", 0, origin);
  BRISK_CHECK(c.dropout >= 0 && c.dropout < 1, origin, ": lora_dropout must lie in [0, 1)");
  const nlohmann::json targets = j.value("target_modules", nlohmann::json());
  if (targets.is_string()) {
    const std::string t = targets.get<std::string>();
    c.all_linear = t == "all-linear" || t == "ALL-LINEAR";
    if (!c.all_linear) c.target_pattern = t;
  } else {
    c.target_modules = string_list(targets, origin, "target_modules");
  }
  c.target_parameters =
      string_list(j.value("target_parameters", nlohmann::json()), origin, "target_parameters");
  BRISK_CHECK(c.target_parameters.empty() || c.dropout == 0, origin,
              ": lora_dropout must be 0 with target_parameters (as PEFT requires)");
  c.modules_to_save =
      string_list(j.value("modules_to_save", nlohmann::json()), origin, "modules_to_save");
  const nlohmann::json rs = j.value("use_rslora", nlohmann::json(false));
  BRISK_CHECK(rs.is_boolean(), origin, ": use_rslora must be true or false");
  c.use_rslora = rs.get<bool>();
  c.rank_pattern =
      patterns(j.value("rank_pattern", nlohmann::json()), origin + ": rank_pattern", true);
  c.alpha_pattern =
      patterns(j.value("alpha_pattern", nlohmann::json()), origin + ": alpha_pattern", false);
  BRISK_CHECK(!c.use_rslora || (c.rank_pattern.empty() && c.alpha_pattern.empty()), origin,
              ": use_rslora with rank_pattern or alpha_pattern (PEFT refuses them together)");
  const nlohmann::json base = j.value("base_model_name_or_path", nlohmann::json());
  if (base.is_string()) c.base_model_name_or_path = base.get<std::string>();
  const nlohmann::json task = j.value("task_type", nlohmann::json());
  if (task.is_string()) c.task_type = task.get<std::string>();
  return c;
}

nlohmann::json adapter_config_json(const LoraConfig& c) {
  nlohmann::json targets = c.all_linear                ? nlohmann::json("all-linear")
                           : !c.target_pattern.empty() ? nlohmann::json(c.target_pattern)
                                                       : nlohmann::json(c.target_modules);
  return {{"peft_type", "LORA"},
          {"r", c.r},
          {"lora_alpha", whole_or_real(c.alpha)},
          {"lora_dropout", c.dropout},
          {"target_modules", targets},
          {"target_parameters",
           c.target_parameters.empty() ? nlohmann::json() : nlohmann::json(c.target_parameters)},
          {"modules_to_save",
           c.modules_to_save.empty() ? nlohmann::json() : nlohmann::json(c.modules_to_save)},
          {"use_rslora", c.use_rslora},
          {"fan_in_fan_out", c.fan_in_fan_out},
          {"bias", "none"},
          {"init_lora_weights", true},
          {"inference_mode", true},
          {"base_model_name_or_path", c.base_model_name_or_path},
          {"task_type", c.task_type.empty() ? nlohmann::json() : nlohmann::json(c.task_type)},
          {"use_dora", false},
          {"layers_to_transform", nullptr},
          {"layers_pattern", nullptr},
          {"rank_pattern", pattern_json(c.rank_pattern)},
          {"alpha_pattern", pattern_json(c.alpha_pattern)}};
}

namespace {
nlohmann::json pattern_json(const std::vector<std::pair<std::string, double>>& patterns) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [pattern, value] : patterns) j[pattern] = whole_or_real(value);
  return j;
}
}  // namespace

}  // namespace brisk
