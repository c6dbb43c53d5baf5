#include "adapters/lora.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>

#include "core/error.h"

namespace brisk {
namespace {

std::vector<std::string> split_names(const std::string& text) {
  std::vector<std::string> names;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = std::min(text.find(',', start), text.size());
    std::string name = text.substr(start, comma - start);
    const size_t first = name.find_first_not_of(" \t");
    const size_t last = name.find_last_not_of(" \t");
    if (first != std::string::npos) names.push_back(name.substr(first, last - first + 1));
    start = comma + 1;
  }
  return names;
}

bool is_all_linear(const std::vector<std::string>& names) {
  return names.size() == 1 && (names[0] == "all-linear" || names[0] == "ALL-LINEAR");
}

// One regular expression matched against whole names (PEFT's re.fullmatch), bounded in work.
class FullMatch {
 public:
  FullMatch(const std::string& pattern, const std::string& origin,
            const char* key = "target_modules") {
    int err = 0;
    PCRE2_SIZE offset = 0;
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                          PCRE2_ANCHORED | PCRE2_ENDANCHORED, &err, &offset, nullptr);
    if (code_ == nullptr) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(err, message, sizeof message);
      BRISK_FAIL(origin, ": ", key, " \"", excerpt(pattern), "\" is not a regular expression (at ",
                 offset, ": ", reinterpret_cast<const char*>(message), ")");
    }
    context_ = pcre2_match_context_create(nullptr);
    pcre2_set_match_limit(context_, 1000000);
    data_ = pcre2_match_data_create_from_pattern(code_, nullptr);
  }
  ~FullMatch() {
    pcre2_match_data_free(data_);
    pcre2_match_context_free(context_);
    pcre2_code_free(code_);
  }
  FullMatch(const FullMatch&) = delete;
  FullMatch& operator=(const FullMatch&) = delete;
  bool operator()(const std::string& name) const {
    return pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(name.data()), name.size(), 0, 0, data_,
                       context_) >= 0;
  }

 private:
  pcre2_code* code_ = nullptr;
  pcre2_match_context* context_ = nullptr;
  pcre2_match_data* data_ = nullptr;
};

bool ends_with_part(const std::string& name, const std::string& part) {
  return name == part || (name.size() > part.size() &&
                          name.compare(name.size() - part.size(), part.size(), part) == 0 &&
                          name[name.size() - part.size() - 1] == '.');
}

// The distinct last parts of the first layer's linears' names ("q_proj,k_proj,..."), for a
// message naming what a model offers.
std::string first_layer_names(const std::vector<LinearDecl>& linears) {
  std::string s;
  const auto first = std::find_if(linears.begin(), linears.end(),
                                  [](const LinearDecl& l) { return l.layer >= 0; });
  for (const LinearDecl& l : linears) {
    if (first == linears.end() || l.layer != first->layer || l.expert) continue;
    const std::string part = l.module.substr(l.module.rfind('.') + 1);
    if (("," + s + ",").find("," + part + ",") == std::string::npos)
      s += (s.empty() ? "" : ",") + part;
  }
  return s;
}

// PEFT's defaults by model type (its TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING).
std::vector<std::string> default_targets(const std::string& model_type,
                                         const std::vector<LinearDecl>& linears) {
  static const std::map<std::string, std::vector<std::string>> defaults = {
      {"bert", {"query", "value"}},      {"gpt2", {"c_attn"}},
      {"llama", {"q_proj", "v_proj"}},   {"mistral", {"q_proj", "v_proj"}},
      {"mixtral", {"q_proj", "v_proj"}}, {"qwen2", {"q_proj", "v_proj"}}};
  const auto it = defaults.find(model_type);
  BRISK_CHECK(it != defaults.end(), "--lora_target_modules is needed: PEFT has no default ",
              "target modules for model_type \"", model_type,
              "\"; name the linears to adapt (its blocks have ", first_layer_names(linears),
              ") or give all-linear");
  return it->second;
}

std::string joined(const std::vector<std::string>& names) {
  std::string s;
  for (const std::string& n : names) s += (s.empty() ? "" : ",") + n;
  return s;
}

}  // namespace

double LoraConfig::scale() const {
  return use_rslora ? alpha / std::sqrt(static_cast<double>(r)) : alpha / static_cast<double>(r);
}

namespace {
// The value of the first pattern whose match ends `name` at a part's start (PEFT's
// get_pattern_key: "(.*\.)?(pattern)$"), else `fallback`.
double by_pattern(const std::vector<std::pair<std::string, double>>& patterns,
                  const std::string& name, double fallback, const char* key) {
  for (const auto& [pattern, value] : patterns)
    if (FullMatch("(?:.*\\.)?(?:" + pattern + ")", "the adapter's config", key)(name)) return value;
  return fallback;
}
}  // namespace

int64_t LoraConfig::rank_of(const std::string& name) const {
  return static_cast<int64_t>(
      by_pattern(rank_pattern, name, static_cast<double>(r), "rank_pattern"));
}

double LoraConfig::scale_of(const std::string& name) const {
  LoraConfig one = *this;
  one.r = rank_of(name);
  one.alpha = by_pattern(alpha_pattern, name, alpha, "alpha_pattern");
  return one.scale();
}

namespace {
// PEFT's check of the parameters it adapts through target_parameters (its ParamWrapper).
void check_parameter_adapters(const LoraConfig& c, const std::string& model_type, bool gate_up) {
  BRISK_CHECK(c.dropout == 0, "--lora_target_modules ", c.all_linear ? "all-linear on " : "names ",
              model_type, c.all_linear ? " adapts its router and experts" : "'s experts, adapted",
              " as parameters (PEFT's target_parameters), which take no dropout: give "
              "--lora_dropout 0");
  BRISK_CHECK(!c.use_rslora || !gate_up, "--use_rslora beside ", model_type,
              "'s gate and up projections is refused (PEFT doubles their rank by rank_pattern, "
              "which it does not take with use_rslora)");
}

void double_gate_up(LoraConfig& c) {
  const std::string key = ".*\\.gate_up_proj";
  if (std::any_of(c.rank_pattern.begin(), c.rank_pattern.end(),
                  [&](const auto& p) { return p.first == key; }))
    return;  // (converted before)
  c.rank_pattern.emplace_back(key, static_cast<double>(2 * c.r));
  c.alpha_pattern.emplace_back(key, 2 * c.alpha);
}

void add_parameter(LoraConfig& c, const std::string& name) {
  if (std::find(c.target_parameters.begin(), c.target_parameters.end(), name) ==
      c.target_parameters.end())
    c.target_parameters.push_back(name);
}

// all-linear: every nn.Linear of the blocks, then, as PEFT converts it for these types, the
// router and the experts as parameters.
LoraConfig all_linear_with_experts(LoraConfig c, const std::string& model_type) {
  check_parameter_adapters(c, model_type, true);
  for (const char* name : {"down_proj", "gate.weight", "gate_up_proj"}) add_parameter(c, name);
  double_gate_up(c);
  return c;
}
}  // namespace

LoraConfig with_fused_experts(LoraConfig c, const std::string& model_type) {
  // transformers 4's names of each expert's linears, by what they are fused into.
  static const std::map<std::string, std::vector<std::pair<std::string, std::string>>> fused = {
      {"mixtral", {{"w1", "gate_up_proj"}, {"w3", "gate_up_proj"}, {"w2", "down_proj"}}},
      {"olmoe",
       {{"gate_proj", "gate_up_proj"}, {"up_proj", "gate_up_proj"}, {"down_proj", "down_proj"}}}};
  const auto names = fused.find(model_type);
  if (names == fused.end()) return c;
  if (c.all_linear) return all_linear_with_experts(std::move(c), model_type);
  BRISK_CHECK(c.target_pattern.empty(), "--lora_target_modules \"", excerpt(c.target_pattern),
              "\": a regular expression on ", model_type,
              " is not built yet (PEFT resolves it into the names it matches, in every layer, "
              "and turns the experts' into target_parameters); list the names instead");
  std::vector<std::string> kept, gate_up;
  for (const std::string& t : c.target_modules) {
    BRISK_CHECK(!ends_with_part(t, "gate"), "--lora_target_modules ", t, ": ", model_type,
                "'s router is no linear in transformers 5 (PEFT refuses it there): adapt it "
                "with --lora_target_parameters gate.weight");
    const auto old = std::find_if(names->second.begin(), names->second.end(),
                                  [&](const auto& n) { return ends_with_part(t, n.first); });
    if (old == names->second.end()) {
      kept.push_back(t);
      continue;
    }
    if (old->second == "gate_up_proj") gate_up.push_back(old->first);
    add_parameter(c, old->second);
  }
  if (kept.size() == c.target_modules.size()) return c;
  BRISK_CHECK(gate_up.size() != 1, "--lora_target_modules names ",
              gate_up.empty() ? "" : gate_up[0], " without its pair: ", model_type,
              " fuses each expert's gate and up projections into gate_up_proj (name both)");
  check_parameter_adapters(c, model_type, !gate_up.empty());
  if (!gate_up.empty()) double_gate_up(c);
  c.target_modules = kept;
  return c;
}

LoraConfig lora_config(int64_t r, double alpha, double dropout, const std::string& target_modules,
                       const std::string& modules_to_save, bool use_rslora,
                       const std::string& target_parameters) {
  LoraConfig c;
  c.target_parameters = split_names(target_parameters);
  c.r = r;
  c.alpha = alpha;
  c.dropout = dropout;
  c.target_modules = split_names(target_modules);
  c.all_linear = is_all_linear(c.target_modules);
  if (c.all_linear) c.target_modules.clear();
  c.modules_to_save = split_names(modules_to_save);
  c.use_rslora = use_rslora;
  return c;
}

bool saved_in_full(const std::string& name, const std::vector<std::string>& modules_to_save) {
  for (const std::string& m : modules_to_save) {
    if (name == m || ends_with_part(name, m) || name.rfind(m + ".", 0) == 0 ||
        name.find("." + m + ".") != std::string::npos)
      return true;
  }
  return false;
}

namespace {
// Whether `name` (a weight's) is one that target_parameters names.
bool names_parameter(const std::vector<std::string>& targets, const std::string& name) {
  return std::any_of(targets.begin(), targets.end(),
                     [&](const std::string& t) { return ends_with_part(name, t); });
}

// A router matched as a module: refused, as PEFT refuses a module that is no nn.Linear.
void check_no_router(const LinearDecl& l, const std::string& target) {
  BRISK_CHECK(!l.router, "--lora_target_modules ", excerpt(target), ": ", l.module,
              " is a mixture's router, no linear in transformers 5 (PEFT refuses it there): "
              "adapt it with --lora_target_parameters gate.weight");
}
}  // namespace

LoraTargets lora_targets(const std::vector<LinearDecl>& linears, const LoraConfig& c,
                         const std::string& model_type) {
  LoraTargets t;
  std::vector<LinearDecl>& out = t.linears;
  const bool listed = !c.all_linear && c.target_pattern.empty();
  // (target_parameters alone: the experts and routers, no linear.)
  const bool parameters_only = listed && c.target_modules.empty() && !c.target_parameters.empty();
  const std::vector<std::string> names = !listed || !c.target_modules.empty() || parameters_only
                                             ? c.target_modules
                                             : default_targets(model_type, linears);
  std::optional<FullMatch> pattern;
  if (!c.target_pattern.empty()) pattern.emplace(c.target_pattern, "the adapter's config");
  for (const LinearDecl& l : linears) {
    if (l.expert || saved_in_full(l.module, c.modules_to_save)) continue;
    const bool as_parameter =
        l.router && names_parameter(c.target_parameters, l.module + ".weight");
    bool hit = as_parameter || (c.all_linear && !l.output && !l.router);
    if (pattern && (*pattern)(l.module)) {
      check_no_router(l, c.target_pattern);
      hit = true;
    }
    for (const std::string& n : listed ? names : std::vector<std::string>{}) {
      if (!ends_with_part(l.module, n)) continue;
      check_no_router(l, n);
      hit = true;
    }
    t.routers += as_parameter ? 1 : 0;
    if (hit) out.push_back(l);
  }
  // A listed name that matches no linear: skipped, as PEFT does when another one matches.
  for (const std::string& n : listed ? names : std::vector<std::string>{}) {
    bool found = false;
    for (const LinearDecl& l : out) found = found || ends_with_part(l.module, n);
    if (!found) t.unmatched.push_back(n);
  }
  BRISK_CHECK(!out.empty() || parameters_only, "--lora_target_modules ",
              c.all_linear ? std::string("all-linear")
              : pattern    ? "\"" + excerpt(c.target_pattern) + "\""
                           : joined(names),
              " matches no linear of the model (", model_type, "'s linears are named like ",
              linears.empty() ? std::string("none") : excerpt(linears.front().module, 60), ")");
  return t;
}

std::vector<ExpertTarget> expert_targets(const std::vector<ExpertWeightsDecl>& weights,
                                         const LoraConfig& c, int routers) {
  std::vector<ExpertTarget> out;
  if (c.target_parameters.empty()) return out;
  auto module_of = [](const ExpertWeightsDecl& w) { return w.name.substr(0, w.name.rfind('.')); };
  for (const ExpertWeightsDecl& w : weights)
    for (const std::string& t : c.target_parameters)
      if (ends_with_part(w.name, t)) {
        out.push_back({w, module_of(w)});
        break;
      }
  // A module's earlier weights lie inside the wrappers of its later ones.
  for (size_t i = 0; i < out.size(); ++i)
    for (size_t j = i + 1; j < out.size(); ++j)
      if (module_of(out[j].weights) == module_of(out[i].weights)) out[i].module += ".base_layer";
  BRISK_CHECK(
      !out.empty() || routers > 0, "--lora_target_parameters ", joined(c.target_parameters),
      " matches no weight of the model (a mixture's experts' weights are named like ",
      weights.empty() ? std::string("none: it has no experts") : excerpt(weights.front().name, 60),
      ")");
  return out;
}

}  // namespace brisk
