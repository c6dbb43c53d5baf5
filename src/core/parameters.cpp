// ParameterSet bookkeeping and views into the flat buffers.
#include "core/parameters.h"

#include <algorithm>

#include "core/checked.h"

namespace brisk {

Shape ParamInfo::full_shape() const {
  if (!split.split()) return shape;
  Shape full;
  for (int i = 0; i < shape.rank(); ++i)
    full.push_back(i != split.dim   ? shape[i]
                   : split.full > 0 ? split.full
                                    : checked_mul(shape[i], int64_t{split.ranks}, "a parameter"));
  return full;
}

SplitGeometry split_geometry(const ParamInfo& p) {
  const int d = p.split.dim;
  BRISK_CHECK(d < p.shape.rank() && p.split.pieces > 0 && p.shape[d] % p.split.pieces == 0 &&
                  (p.split.full == 0 || p.split.pieces == 1),
              "internal error: parameter '", p.name, "' is split along dimension ", d, " of ",
              p.shape.str(), " in ", p.split.pieces, " parts");
  int64_t inner = 1;
  for (int i = d + 1; i < p.shape.rank(); ++i) inner *= p.shape[i];
  const int64_t piece = p.shape[d] / p.split.pieces, full = p.full_shape()[d];
  const int64_t held =
      p.split.full > 0 ? std::clamp(full - p.split.rank * piece, int64_t{0}, piece) : piece;
  return {p.shape[d], piece, inner, full, held};
}

int ParameterSet::add(std::string name, Shape shape, ParamRole role, int64_t whole_elements,
                      ParamSplit split) {
  BRISK_CHECK(find(name) < 0, "parameter '", name, "' declared twice");
  by_name_.emplace(name, static_cast<int>(params_.size()));
  params_.push_back(ParamInfo{std::move(name), shape, role.decay, total_, role.embedding,
                              role.product, whole_elements, split});
  params_.back().expert = role.expert;
  total_ = checked_add(total_, shape.numel(), "the parameter count");
  trainable_ += shape.numel();
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

namespace {
// The extent of a buffer laid out by `offsets` (one per parameter; empty: as the parameters).
int64_t extent(const std::vector<ParamInfo>& params, const std::vector<int64_t>& offsets,
               int64_t total, const char* what) {
  if (offsets.empty()) return total;
  BRISK_CHECK(offsets.size() == params.size(), "internal error: ", offsets.size(), " ", what,
              " offsets for ", params.size(), " parameters");
  int64_t most = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i].frozen && offsets[i] < 0) continue;  // no gradient
    BRISK_CHECK(offsets[i] >= 0, "internal error: a negative ", what, " offset");
    most = std::max(most, offsets[i] + params[i].shape.numel());
  }
  return most;
}
}  // namespace

void ParameterSet::freeze(int i) {
  ParamInfo& p = params_.at(static_cast<size_t>(i));
  if (!p.frozen) trainable_ -= p.shape.numel();
  p.frozen = true;
}

std::vector<int64_t> ParameterSet::trained_offsets() const {
  std::vector<int64_t> offsets;
  int64_t at = 0;
  for (const ParamInfo& p : params_) {
    offsets.push_back(p.frozen ? -1 : at);
    if (!p.frozen) at += p.shape.numel();
  }
  return offsets;
}

ParameterSet::Run ParameterSet::trained_run() const {
  Run r{static_cast<int>(params_.size()), 0, {0, 0}};
  for (size_t i = 0; i < params_.size(); ++i) {
    if (params_[i].frozen) continue;
    const int k = static_cast<int>(i);
    if (r.first > k) r.first = k;
    BRISK_CHECK(r.last == 0 || r.last == k, "internal error: frozen parameter '",
                params_[static_cast<size_t>(r.last)].name, "' lies between trained ones");
    r.last = k + 1;
  }
  if (r.last == 0) return Run{};
  const ParamInfo& first = params_[static_cast<size_t>(r.first)];
  r.elements = {first.offset, trainable_};
  return r;
}

void ParameterSet::bind(const Tensor& flat_weights, const Tensor& flat_grads,
                        std::vector<int64_t> weight_offsets, std::vector<int64_t> grad_offsets) {
  if (frozen() && grad_offsets.empty()) grad_offsets = trained_offsets();
  const int64_t weight_extent = extent(params_, weight_offsets, total_, "weight");
  const int64_t grad_extent = extent(params_, grad_offsets, total_, "gradient");
  auto fits = [&](const Tensor& t, bool own, int64_t need) {
    return own ? t.numel() >= need : t.numel() == total_;
  };
  BRISK_CHECK(fits(flat_weights, !weight_offsets.empty(), weight_extent) &&
                  (flat_grads.empty() || fits(flat_grads, !grad_offsets.empty(), grad_extent)),
              "parameter buffers hold ", flat_weights.numel(), " and ", flat_grads.numel(),
              " values; the model has ", total_);
  weights_ = flat_weights;
  grads_ = flat_grads;
  weight_offsets_ = std::move(weight_offsets);
  grad_offsets_ = std::move(grad_offsets);
}

Tensor ParameterSet::view(const Tensor& flat, int first, int last, Shape shape, bool grads) const {
  const ParamInfo& a = params_.at(first);
  const ParamInfo& b = params_.at(last);
  if (grads && a.frozen) {  // frozen parameters have no gradient
    for (int i = first; i <= last; ++i)
      BRISK_CHECK(params_[static_cast<size_t>(i)].frozen, "internal error: the span '", a.name,
                  "'..'", b.name, "' is frozen in part");
    return Tensor();
  }
  BRISK_CHECK(!flat.empty(), "parameters are not bound to memory yet");
  const int64_t n = b.offset + b.shape.numel() - a.offset;
  if (shape.rank() == 0 && first == last) shape = a.shape;
  BRISK_CHECK(shape.numel() == n, "parameter span '", a.name, "'..'", b.name, "' holds ", n,
              " values, not ", shape.str());
  const std::vector<int64_t>& offsets = grads ? grad_offsets_ : weight_offsets_;
  if (offsets.empty()) return Tensor(flat.f32() + a.offset, shape, DType::f32, flat.device());
  const auto at = [&](int i) { return offsets[static_cast<size_t>(i)]; };
  if (at(first) < 0 || at(last) < 0) {  // kept outside the buffer
    for (int i = first; i <= last; ++i)
      BRISK_CHECK(at(i) < 0, "internal error: the weights of '", a.name, "'..'", b.name,
                  "' are outside the buffer in part");
    if (first != last) return Tensor();
    BRISK_CHECK(landing_.numel() >= n, "internal error: no room to write '", a.name, "' in");
    return Tensor(landing_.data(), shape, DType::f32, landing_.device());
  }
  BRISK_CHECK(at(last) - at(first) == b.offset - a.offset, "internal error: the ",
              grads ? "gradients" : "weights", " of '", a.name, "'..'", b.name,
              "' are not together");
  return Tensor(flat.f32() + at(first), shape, DType::f32, flat.device());
}

Tensor ParameterSet::weight_span(int first, int last, Shape shape) const {
  return view(weights_, first, last, shape);
}

Tensor ParameterSet::grad_span(int first, int last, Shape shape) const {
  return view(grads_, first, last, shape, true);
}

}  // namespace brisk
