// The optimizer factory, optim_args and the parameter tables the optimizers share.
#include "optim/optimizer.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>

#include "optim/adamw.h"

namespace brisk {

std::string canonical_optimizer_name(const std::string& name) {
  if (name == "adamw_torch" || name == "adamw_torch_fused") return "adamw_torch";
  if (name == "adamw_8bit" || name == "adamw_bnb_8bit") return "adamw_8bit";
  if (name == "adafactor" || name == "sgd") return name;
  BRISK_FAIL("unknown optim \"", excerpt(name), "\" (valid: ", kOptimizerNames, ")");
}

std::unique_ptr<Optimizer> make_optimizer(const OptimizerConfig& config) {
  const std::string name = canonical_optimizer_name(config.name);
  OptimArgs args(config.args, config.name);
  std::unique_ptr<Optimizer> opt;
  if (name == "adamw_torch")
    opt = std::make_unique<AdamW>(
        AdamWOptions{static_cast<float>(config.beta1), static_cast<float>(config.beta2),
                     static_cast<float>(config.epsilon), static_cast<float>(config.weight_decay)});
  else if (name == "sgd")
    opt = make_sgd(config, args);
  else if (name == "adafactor")
    opt = make_adafactor(config, args);
  else
    opt = make_adamw_8bit(config, args);
  args.finish();
  return opt;
}

OptimArgs::OptimArgs(const std::string& text, std::string optimizer)
    : optimizer_(std::move(optimizer)) {
  size_t at = 0;
  while (at < text.size()) {
    size_t end = text.find(',', at);
    if (end == std::string::npos) end = text.size();
    const std::string item = text.substr(at, end - at);
    at = end + 1;
    if (item.find_first_not_of(' ') == std::string::npos) continue;
    const size_t eq = item.find('=');
    BRISK_CHECK(eq != std::string::npos && eq > 0 && eq + 1 < item.size(), "optim_args: \"",
                excerpt(item), "\" is not key=value");
    const std::string key = item.substr(0, eq);
    BRISK_CHECK(!values_.count(key), "optim_args: \"", excerpt(key), "\" is given twice");
    values_[key] = item.substr(eq + 1);
  }
}

double OptimArgs::number(const std::string& key, double fallback) {
  auto it = values_.find(key);
  if (it == values_.end()) return fallback;
  const std::string text = it->second;
  values_.erase(it);
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  BRISK_CHECK(end != text.c_str() && *end == '\0' && std::isfinite(v), "optim_args: ", excerpt(key),
              " must be a number, got \"", excerpt(text), "\"");
  return v;
}

bool OptimArgs::flag(const std::string& key, bool fallback) {
  auto it = values_.find(key);
  if (it == values_.end()) return fallback;
  const std::string text = it->second;
  values_.erase(it);
  std::string lower = text;
  for (char& ch : lower) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  // The spellings transformers accepts for SGD's nesterov, and their opposites.
  if (lower == "true" || lower == "1" || lower == "yes") return true;
  if (lower == "false" || lower == "0" || lower == "no") return false;
  BRISK_FAIL("optim_args: ", excerpt(key), " must be true or false, got \"", excerpt(text), "\"");
}

void OptimArgs::finish() const {
  if (values_.empty()) return;
  BRISK_FAIL("optim_args: \"", excerpt(values_.begin()->first), "\" is not a setting of ",
             optimizer_);
}

std::vector<int64_t> decay_ranges(const ParameterSet& params) {
  std::vector<int64_t> r;
  for (const ParamInfo& p : params.list()) {
    if (!p.decay) continue;
    const int64_t begin = p.offset, end = p.offset + p.shape.numel();
    if (!r.empty() && r.back() == begin)
      r.back() = end;
    else
      r.insert(r.end(), {begin, end});
  }
  return r;
}

std::vector<ParamSlot> param_slots(const ParameterSet& params) {
  std::vector<ParamSlot> slots;
  for (const ParamInfo& p : params.list()) {
    ParamSlot s;
    s.offset = p.offset;
    s.numel = p.shape.numel();
    s.cols = p.shape.rank() ? p.shape[p.shape.rank() - 1] : 1;
    s.rows = s.cols ? s.numel / s.cols : 0;
    s.factored = p.shape.rank() >= 2;
    s.decay = p.decay;
    slots.push_back(s);
  }
  return slots;
}

SplitSlot split_slot(const ParamInfo& p, ParamSlot& s, size_t index) {
  s.share = true;
  const Shape whole = p.full_shape();
  SplitSlot x;
  x.slot = index;
  x.whole_cols = whole.rank() ? whole[whole.rank() - 1] : 1;
  x.whole_rows = whole.numel() / x.whole_cols;
  x.row.assign(static_cast<size_t>(s.rows), -1);
  x.col.assign(static_cast<size_t>(s.cols), -1);
  // Each row's place from its first placed element; the columns' from the first placed row.
  for (int64_t r = 0; r < s.rows; ++r)
    for_each_split_run(p, r * s.cols, s.cols, [&](int64_t, int64_t full, int64_t) {
      if (x.row[static_cast<size_t>(r)] < 0) x.row[static_cast<size_t>(r)] = full / x.whole_cols;
    });
  const auto placed = std::find_if(x.row.begin(), x.row.end(), [](int64_t r) { return r >= 0; });
  const int64_t first = placed - x.row.begin();
  if (placed != x.row.end())
    for_each_split_run(p, first * s.cols, s.cols, [&](int64_t local, int64_t full, int64_t n) {
      for (int64_t k = 0; k < n; ++k)
        x.col[static_cast<size_t>(local - first * s.cols + k)] = (full + k) % x.whole_cols;
    });
  return x;
}

void declare_decay_ranges(MemoryPlan& plan, BufferBinder& binder, const ParameterSet& params,
                          Tensor* view, const std::string& name, Placement placement) {
  const int64_t ranges = static_cast<int64_t>(decay_ranges(params).size() / 2);
  binder.declare(plan, view, name, Category::optimizer_state, DType::i64, Shape{ranges, 2},
                 placement);
}

void fill_decay_ranges(Backend& be, const ParameterSet& params, const Tensor& table) {
  const std::vector<int64_t> r = decay_ranges(params);
  with_host_view(be, table, false, true,
                 [&](const Tensor& t) { std::copy(r.begin(), r.end(), t.as<int64_t>()); });
}

}  // namespace brisk
