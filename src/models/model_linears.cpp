// The linears the model declares (linears.h), derived from its parameters: every weight that is
// an operand of a product and not an embedding table, named after its module.
#include <string_view>

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
  return out;
}

void Model::freeze_except(const std::function<bool(const ParamInfo&)>& trained) {
  const std::vector<ParamInfo>& list = params_.list();
  for (size_t i = 0; i < list.size(); ++i)
    if (!trained(list[i])) params_.freeze(static_cast<int>(i));
}

}  // namespace brisk
