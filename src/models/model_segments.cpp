// Where a model's parameters lie for the passes that move them by segment: the gradient
// segments backward reports (the head, the blocks from last to first, the embeddings) and their
// views in the weight and gradient buffers, at the places of the plan's SegmentLayouts.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "backend/device_traits.h"
#include "core/checked.h"
#include "models/model.h"

namespace brisk {

// Each block's parameters (those declared after its enter_layer: BlockParams' and a sparse MLP's)
// must fill one range, the blocks one after another; the head's parameters follow the last block
// and the embeddings precede the first (the declaration order of every model here; tests check
// that each range is final when reported). Otherwise one segment: correct, without overlap.
std::vector<ElementRange> Model::segments_by_block() const {
  const int64_t total = params_.total_elements();
  const std::vector<ElementRange> whole{ElementRange{0, total}};
  const auto first_layer = static_cast<int>(config_.first_layer());
  const std::vector<ParamInfo>& list = params_.list();
  std::vector<ElementRange> blocks;
  for (int l = first_layer; l < static_cast<int>(config_.end_layer()); ++l) {
    int64_t lo = total, hi = 0, covered = 0;
    for (size_t i = 0; i < list.size(); ++i) {
      if (i >= param_sections_.size() || param_sections_[i] != l) continue;
      lo = std::min(lo, list[i].offset);
      hi = std::max(hi, list[i].offset + list[i].shape.numel());
      covered += list[i].shape.numel();
    }
    if (lo >= hi || covered != hi - lo ||
        (l > first_layer && blocks.back().offset + blocks.back().count != lo))
      return whole;
    blocks.push_back({lo, hi - lo});
  }
  if (blocks.empty()) return whole;
  const int64_t first = blocks.front().offset;
  const int64_t end = blocks.back().offset + blocks.back().count;
  std::vector<ElementRange> segments{ElementRange{end, total - end}};
  segments.insert(segments.end(), blocks.rbegin(), blocks.rend());
  segments.push_back({0, first});
  return segments;
}

void Model::find_grad_segments() {
  segments_ = segments_by_block();
  weight_layout_ = grad_layout_ = SegmentLayout::plain(segments_);
}

Tensor Model::grad_segment(int segment) const {
  const ElementRange r = grad_layout_.place(segment);
  return element_range(flat_grads_, r.offset, r.count);
}

ElementRange Model::weight_place(ElementRange e) const {
  const int64_t at = weight_layout_.offset(e.offset);
  BRISK_CHECK(e.count == 0 || weight_layout_.offset(e.offset + e.count - 1) == at + e.count - 1,
              "internal error: parameters [", e.offset, ", +", e.count,
              ") lie apart in the staged weights");
  return {at, e.count};
}

Tensor Model::weight_segment(int segment) const {
  const ElementRange r = weight_layout_.place(segment);
  return element_range(flat_weights_, r.offset, r.count);
}

void Model::need_weights(int segment, int next) const {
  if (!weight_source_) return;
  weight_source_->need(segment);
  if (next >= 0 && !weight_layout_.overlap(segment, next)) weight_source_->prefetch(next);
}

int Model::segment_of(int64_t at) const {
  for (size_t s = 0; s < segments_.size(); ++s)
    if (at >= segments_[s].offset && at < segments_[s].offset + segments_[s].count)
      return static_cast<int>(s);
  BRISK_FAIL("internal error: element ", at, " is in no segment");
}

void Model::written(size_t i) const {
  if (weight_source_) weight_source_->filled_param(static_cast<int>(i));
  if (!weight_source_ || !staged_weights()) return;
  const ParamInfo& p = params_.list()[i];
  const int64_t end = p.offset + p.shape.numel();
  for (size_t s = 0; s < segments_.size(); ++s)
    if (segments_[s].offset + segments_[s].count == end)
      weight_source_->filled(static_cast<int>(s));
}

void Model::written_all() const {
  if (!weight_source_ || staged_weights()) return;  // staged: each segment reported as written
  for (size_t s = 0; s < segments_.size(); ++s) weight_source_->filled(static_cast<int>(s));
}

}  // namespace brisk
