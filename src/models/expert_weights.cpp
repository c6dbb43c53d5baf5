// The experts' tensors of a weights file against the config (see expert_weights.h).
#include "models/expert_weights.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"

namespace brisk {
namespace {

// A name of the form [prefix]layers.<layer>.<rest>, split; layer -1 where it is not one.
struct LayerName {
  int64_t layer = -1;
  std::string rest;
};
LayerName layer_name(const std::string& name) {
  const size_t at = name.rfind("layers.", 0) == 0 ? 0 : name.find(".layers.");
  if (at == std::string::npos) return {};
  const size_t digits = name.find_first_not_of("0123456789", at == 0 ? 7 : at + 8);
  const size_t first = at == 0 ? 7 : at + 8;
  if (digits == std::string::npos || digits == first || name[digits] != '.' || digits - first > 6)
    return {};
  return {std::stoll(name.substr(first, digits - first)), name.substr(digits + 1)};
}

bool starts(const std::string& s, const char* prefix) {
  return s.rfind(prefix, 0) == 0;
}

// Whether `rest` (after layers.<l>.) is a router's, an expert's or a shared expert's tensor.
bool is_expert_tensor(const std::string& rest) {
  return starts(rest, "mlp.experts.") || starts(rest, "block_sparse_moe.") ||
         rest == "mlp.gate.weight" || starts(rest, "mlp.shared_expert");
}

// Each sparse layer's layouts as the file gives them: its packed gate_up_proj (by name), its
// packed down_proj, its experts one by one.
struct Layouts {
  std::map<int64_t, std::string> packed_gate_up;
  std::set<int64_t> packed_down, per_expert;
};

// What is wrong with expert tensor `name` (`rest` after layers.<l>.), "" when nothing; notes its
// layout.
std::string expert_problem(const ModelConfig& c, int64_t l, const std::string& name,
                           const std::string& rest, Layouts& layouts) {
  const MoeConfig& m = c.moe;
  if (m.experts == 0) return "the config has no experts";
  if (l >= c.num_layers) return "the config has " + std::to_string(c.num_layers) + " layers";
  if (!m.sparse(l)) return "layer " + std::to_string(l) + " is dense in the config";
  if (starts(rest, "mlp.shared_expert"))
    return m.shared_inner > 0 ? "" : "the config has no shared expert";
  if (rest == "mlp.gate.weight" || rest == "block_sparse_moe.gate.weight") return "";
  const bool mixtral = c.model_type == ModelType::mixtral;
  if (rest == "mlp.experts.gate_up_proj") {
    layouts.packed_gate_up.emplace(l, name);
    return "";
  }
  if (rest == "mlp.experts.down_proj") {
    layouts.packed_down.insert(l);
    return "";
  }
  const size_t e_at = rest.find("experts.") + 8;
  const size_t dot = rest.find('.', e_at);
  if (rest.find("experts.") == std::string::npos || dot == std::string::npos || dot == e_at ||
      rest.find_first_not_of("0123456789", e_at) != dot || dot - e_at > 6)
    return "not a tensor of the " + std::string(c.type_name()) + " experts";
  if (std::stoll(rest.substr(e_at, dot - e_at)) >= m.experts)
    return "the config has " + std::to_string(m.experts) + " experts";
  const std::string leaf = rest.substr(dot + 1);
  const std::vector<std::string> leaves =
      mixtral ? std::vector<std::string>{"w1.weight", "w2.weight", "w3.weight"}
              : std::vector<std::string>{"gate_proj.weight", "up_proj.weight", "down_proj.weight"};
  if (std::find(leaves.begin(), leaves.end(), leaf) == leaves.end())
    return "not a projection of the " + std::string(c.type_name()) + " experts";
  layouts.per_expert.insert(l);
  return "";
}

}  // namespace

void check_expert_tensors(const ModelConfig& config, const WeightFiles& file) {
  std::vector<std::string> extra;
  std::string why;
  Layouts layouts;
  for (const std::string& name : file.names()) {
    const LayerName n = layer_name(name);
    if (n.layer < 0 || !is_expert_tensor(n.rest)) continue;
    const std::string problem = expert_problem(config, n.layer, name, n.rest, layouts);
    if (problem.empty()) continue;
    if (extra.empty()) why = problem;
    extra.push_back(name);
  }
  const std::string& path = file.path();
  BRISK_CHECK(extra.empty(), "weights file '", path, "' holds ", extra.size(), " expert tensor",
              extra.size() == 1 ? "" : "s", " the ", config.type_name(), " config does not have: '",
              extra.empty() ? "" : extra.front(), "' (", why, ")",
              extra.size() > 1 ? " and " + std::to_string(extra.size() - 1) + " more" : "");
  for (const int64_t l : layouts.per_expert)
    BRISK_CHECK(!layouts.packed_gate_up.count(l) && !layouts.packed_down.count(l), "weights file '",
                path, "' gives layer ", l,
                "'s experts in two layouts, one by one and packed (mlp.experts.gate_up_proj, "
                "down_proj): keep one");
  for (const auto& [l, gate_up] : layouts.packed_gate_up) {
    const std::string down = gate_up.substr(0, gate_up.size() - 12) + "down_proj";
    BRISK_CHECK(layouts.packed_down.count(l), "weights file '", path, "' lacks tensor '", down,
                "' of layer ", l, "'s packed experts (it holds their gate_up_proj)");
  }
}

}  // namespace brisk
