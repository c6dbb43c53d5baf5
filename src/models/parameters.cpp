// ParameterSet bookkeeping and views into the flat buffers.
#include "models/parameters.h"

#include "core/checked.h"

namespace brisk {

int ParameterSet::add(std::string name, Shape shape, ParamRole role) {
  BRISK_CHECK(find(name) < 0, "parameter '", name, "' declared twice");
  by_name_.emplace(name, static_cast<int>(params_.size()));
  params_.push_back(
      ParamInfo{std::move(name), shape, role.decay, total_, role.embedding, role.product});
  total_ = checked_add(total_, shape.numel(), "the parameter count");
  return static_cast<int>(params_.size() - 1);
}

int ParameterSet::find(const std::string& name) const {
  const auto it = by_name_.find(name);
  return it == by_name_.end() ? -1 : it->second;
}

int ParameterSet::index(const std::string& name) const {
  int i = find(name);
  BRISK_CHECK(i >= 0, "the model has no parameter named '", name, "'");
  return i;
}

void ParameterSet::bind(const Tensor& flat_weights, const Tensor& flat_grads) {
  BRISK_CHECK(
      flat_weights.numel() == total_ && (flat_grads.empty() || flat_grads.numel() == total_),
      "parameter buffers hold ", flat_weights.numel(), " and ", flat_grads.numel(),
      " values; the model has ", total_);
  weights_ = flat_weights;
  grads_ = flat_grads;
}

Tensor ParameterSet::view(const Tensor& flat, int first, int last, Shape shape) const {
  BRISK_CHECK(!flat.empty(), "parameters are not bound to memory yet");
  const ParamInfo& a = params_.at(first);
  const ParamInfo& b = params_.at(last);
  const int64_t n = b.offset + b.shape.numel() - a.offset;
  if (shape.rank() == 0 && first == last) shape = a.shape;
  BRISK_CHECK(shape.numel() == n, "parameter span '", a.name, "'..'", b.name, "' holds ", n,
              " values, not ", shape.str());
  return Tensor(flat.f32() + a.offset, shape, DType::f32, flat.device());
}

Tensor ParameterSet::weight_span(int first, int last, Shape shape) const {
  return view(weights_, first, last, shape);
}

Tensor ParameterSet::grad_span(int first, int last, Shape shape) const {
  return view(grads_, first, last, shape);
}

}  // namespace brisk
