// The linears the model declares (linears.h), derived from its parameters: every weight that is
// an operand of a product and not an embedding table, named after its module.
#include <algorithm>
#include <cmath>
#include <string_view>

#include "core/random_init.h"
#include "models/linears.h"
#include "models/model.h"

namespace brisk {
namespace {

constexpr std::string_view kWeight = ".weight";

bool is_linear_weight(const ParamInfo& p) {
  const std::string_view name = p.name;
  return p.product && !p.embedding && p.shape.rank() == 2 && name.size() > kWeight.size() &&
         name.substr(name.size() - kWeight.size()) == kWeight;
}

}  // namespace

std::vector<std::string> module_names(const std::vector<LinearDecl>& linears) {
  std::vector<std::string> names;
  names.reserve(linears.size());
  for (const LinearDecl& l : linears) names.push_back(l.module);
  return names;
}

// The output layer is the last linear outside the blocks when its outputs are the task's (the
// vocabulary of an LM head, the labels of a classifier), as transformers' get_output_embeddings
// and PEFT's classifier head names pick it.
std::vector<LinearDecl> Model::linears() const {
  std::vector<LinearDecl> out;
  const std::vector<ParamInfo>& list = params_.list();
  for (size_t i = 0; i < list.size(); ++i) {
    const ParamInfo& p = list[i];
    if (!is_linear_weight(p)) continue;
    LinearDecl l;
    l.module = p.name.substr(0, p.name.size() - kWeight.size());
    l.param = static_cast<int>(i);
    l.expert = p.expert;
    const Shape whole = p.full_shape();
    const int64_t section = i < param_sections_.size() ? param_sections_[i] : -1;
    l.layer = section >= 0 && section < config_.num_layers ? static_cast<int>(section) : -1;
    l.fan_in_fan_out = l.layer >= 0 && blocks_store_linears_transposed();
    l.in = l.fan_in_fan_out ? whole[0] : whole[1];
    l.out = l.fan_in_fan_out ? whole[1] : whole[0];
    out.push_back(std::move(l));
  }
  const bool lm = config_.task != ModelTask::sequence_classification;
  const int64_t task_outputs = lm ? config_.vocab_size : config_.num_labels;
  if (!out.empty() && out.back().layer < 0 && !out.back().expert && out.back().out == task_outputs)
    out.back().output = true;
  mark_routers(out);
  return out;
}

void Model::freeze_except(const std::function<bool(const ParamInfo&)>& trained) {
  const std::vector<ParamInfo>& list = params_.list();
  for (size_t i = 0; i < list.size(); ++i)
    if (!trained(list[i])) params_.freeze(static_cast<int>(i));
}

void Model::adapt_experts(const ExpertWeightsDecl& w, int, int, int64_t, float) {
  BRISK_FAIL("internal error: ", w.name, ": the model holds no experts");
}

namespace {
// Tensor parallelism: a LoRA's A and B split as Megatron's rule splits its linear's factors. A
// column-parallel linear's B by output rows as the linear's (in copies where those are), its A
// whole with each rank's gradient a part the group sums; a row-parallel one's A by input columns,
// its B whole and partial. Both whole where the linear is.
struct AdapterSplits {
  ParamSplit a, b;
  Shape a_shape, b_shape;
};
AdapterSplits adapter_splits(const ParamInfo& linear, const AdapterDecl& d) {
  const int out_dim = d.fan_in_fan_out ? 1 : 0;
  const int64_t out = linear.shape[out_dim], in = linear.shape[1 - out_dim];
  AdapterSplits s{{}, {}, {d.r, in}, {out, d.r}};
  if (linear.split.dim < 0) return s;
  ParamSplit partial;
  partial.partial = true;
  ParamSplit split = linear.split;
  if (linear.split.dim == out_dim) {
    split.dim = 0;
    s.a = partial;
    s.b = split;
  } else {
    split.dim = 1;
    s.a = split;
    s.b = partial;
  }
  return s;
}
}  // namespace

void Model::add_adapters(const std::vector<AdapterDecl>& decls,
                         const std::vector<ExpertAdapterDecl>& experts,
                         const std::function<bool(const ParamInfo&)>& trained) {
  BRISK_CHECK(adapters_ == nullptr, "internal error: adapters attached twice");
  adapters_ = std::make_unique<ModelAdapters>(params_);
  constexpr ParamRole kAdapter{true, false, false};  // decayed, as Trainer decays them
  enter_head();                                      // after every parameter of the base
  for (const AdapterDecl& d : decls) {
    ModelAdapters::Entry e;
    e.decl = d;
    const AdapterSplits s = adapter_splits(params_.list()[static_cast<size_t>(d.linear)], d);
    e.a = numbered(params_.add(d.module + ".lora_A.weight", s.a_shape, kAdapter, 0, s.a));
    e.b = numbered(params_.add(d.module + ".lora_B.weight", s.b_shape, kAdapter, 0, s.b));
    e.in = s.a_shape[1];
    adapters_->entries().push_back(std::move(e));
  }
  for (const ExpertAdapterDecl& d : experts) {
    ModelAdapters::ExpertEntry e;
    e.decl = d;
    const ExpertWeightsDecl& w = d.weights;
    e.a = param(d.module + ".lora_A.weight", {w.experts * d.r, w.in}, kAdapter);
    e.b = param(d.module + ".lora_B.weight", {w.experts * w.out, d.r}, kAdapter);
    adapt_experts(w, e.a, e.b, d.r, d.scale);
    adapters_->experts().push_back(std::move(e));
  }
  const int first = !adapters_->entries().empty()   ? adapters_->entries().front().a
                    : !adapters_->experts().empty() ? adapters_->experts().front().a
                                                    : 0;
  freeze_except([&](const ParamInfo& p) { return trained(p) || params_.index(p.name) >= first; });
  find_grad_segments();
}

bool Model::adapter_param(size_t i) const {
  if (!adapters_) return false;
  for (const ModelAdapters::Entry& e : adapters_->entries())
    if (static_cast<int>(i) == e.a || static_cast<int>(i) == e.b) return true;
  for (const ModelAdapters::ExpertEntry& e : adapters_->experts())
    if (static_cast<int>(i) == e.a || static_cast<int>(i) == e.b) return true;
  return false;
}

// PEFT's init: A kaiming_uniform(a = sqrt 5), U(-1/sqrt(in), 1/sqrt(in)); B zero.
void Model::init_adapter(Backend& be, size_t i, uint64_t seed) {
  if (!adapter_param(i)) return;
  const ParamInfo& p = params_.list()[i];
  const bool a = p.name.ends_with(".lora_A.weight");
  const float bound = 1.0f / std::sqrt(static_cast<float>(p.full_shape()[1]));
  write_in_pieces(be, params_.weight(static_cast<int>(i)), [&](const Tensor& piece, int64_t at) {
    if (!a) {
      std::fill(piece.f32(), piece.f32() + piece.numel(), 0.0f);
      return;
    }  // a split A's share draws its places' values in the full one
    for_each_split_run(p, at, piece.numel(), [&](int64_t local, int64_t full, int64_t length) {
      fill_uniform(seed, static_cast<uint32_t>(i), full, length, bound, piece.f32() + (local - at));
    });
  });
}

}  // namespace brisk
