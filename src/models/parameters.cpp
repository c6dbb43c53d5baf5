// ParameterSet bookkeeping and views into the flat buffers.
#include "models/parameters.h"

#include <algorithm>

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

void ParameterSet::bind(const Tensor& flat_weights, const Tensor& flat_grads,
                        std::vector<int64_t> grad_offsets) {
  const bool own_layout = !grad_offsets.empty();
  BRISK_CHECK(!own_layout || grad_offsets.size() == params_.size(),
              "internal error: ", grad_offsets.size(), " gradient offsets for ", params_.size(),
              " parameters");
  int64_t grad_extent = own_layout ? 0 : total_;
  for (size_t i = 0; own_layout && i < params_.size(); ++i) {
    BRISK_CHECK(grad_offsets[i] >= 0, "internal error: negative gradient offset");
    grad_extent = std::max(grad_extent, grad_offsets[i] + params_[i].shape.numel());
  }
  BRISK_CHECK(flat_weights.numel() == total_ &&
                  (flat_grads.empty() ||
                   (own_layout ? flat_grads.numel() >= grad_extent : flat_grads.numel() == total_)),
              "parameter buffers hold ", flat_weights.numel(), " and ", flat_grads.numel(),
              " values; the model has ", total_);
  weights_ = flat_weights;
  grads_ = flat_grads;
  grad_offsets_ = std::move(grad_offsets);
}

Tensor ParameterSet::view(const Tensor& flat, int first, int last, Shape shape, bool grads) const {
  BRISK_CHECK(!flat.empty(), "parameters are not bound to memory yet");
  const ParamInfo& a = params_.at(first);
  const ParamInfo& b = params_.at(last);
  const int64_t n = b.offset + b.shape.numel() - a.offset;
  if (shape.rank() == 0 && first == last) shape = a.shape;
  BRISK_CHECK(shape.numel() == n, "parameter span '", a.name, "'..'", b.name, "' holds ", n,
              " values, not ", shape.str());
  if (!grads || grad_offsets_.empty())
    return Tensor(flat.f32() + a.offset, shape, DType::f32, flat.device());
  const auto at = [&](int i) { return grad_offsets_[static_cast<size_t>(i)]; };
  BRISK_CHECK(at(last) - at(first) == b.offset - a.offset, "internal error: the gradients of '",
              a.name, "'..'", b.name, "' are not together");
  return Tensor(flat.f32() + at(first), shape, DType::f32, flat.device());
}

Tensor ParameterSet::weight_span(int first, int last, Shape shape) const {
  return view(weights_, first, last, shape);
}

Tensor ParameterSet::grad_span(int first, int last, Shape shape) const {
  return view(grads_, first, last, shape, true);
}

}  // namespace brisk
