// Where a model's parameters lie for the passes that move them by segment: the gradient
// segments backward reports (the head, the blocks from last to first, the embeddings) and the
// staged buffers of partitioned data parallelism, whose slots the blocks use in turn.
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
void Model::find_grad_segments() {
  const int64_t total = params_.total_elements();
  segments_.assign(1, ElementRange{0, total});
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
      return;
    blocks.push_back({lo, hi - lo});
  }
  if (blocks.empty()) return;
  const int64_t first = blocks.front().offset;
  const int64_t end = blocks.back().offset + blocks.back().count;
  segments_.assign(1, ElementRange{end, total - end});
  segments_.insert(segments_.end(), blocks.rbegin(), blocks.rend());
  segments_.push_back({0, first});
}

// Staged buffers (partitioned data parallelism): the blocks' parameters in `slots` slots used in
// turn (block b in slot b mod slots), the head's and the embeddings' side by side at the end of the
// slots' space (or after it where they are longer). Possible when the blocks are laid out alike
// (every model here) and outnumber the slots. A tied head's gradient and the embeddings' are one
// tensor that the head's chunks start in forward and the embeddings' backward ends: the embeddings'
// gradients are then kept apart, before the slots.
int64_t Model::block_elements(int slots) const {
  const size_t L = segments_.size() >= 3 ? segments_.size() - 2 : 0;
  if (slots < 1 || L <= static_cast<size_t>(slots)) return 0;
  for (size_t i = 1; i <= L; ++i)
    if (segments_[i].count != segments_[1].count) return 0;
  return segments_[1].count;
}

Model::StagedLayout Model::staged_layout(int slots, bool embeddings_apart) const {
  StagedLayout l;
  const int64_t block = block_elements(slots);
  if (block == 0) return l;
  const int64_t E = segments_.back().count, H = segments_.front().count;
  l.slots = slots;
  l.block = block;
  l.slots_at = embeddings_apart ? E : 0;
  const int64_t space = std::max(slots * block, embeddings_apart ? H : E + H);
  l.length = l.slots_at + space;
  l.embeddings_at = embeddings_apart ? 0 : l.length - E;
  l.head_at = l.length - H - (embeddings_apart ? 0 : E);
  return l;
}

int64_t Model::staged_offset(int64_t at, const StagedLayout& l) const {
  if (l.slots == 0) return at;
  const int64_t first = segments_.back().count;  // the embeddings: [0, first)
  const int64_t end = segments_.front().offset;  // the head: [end, total)
  if (at < first) return l.embeddings_at + at;
  if (at >= end) return l.head_at + (at - end);
  return l.slots_at + (at - first) / l.block % l.slots * l.block + (at - first) % l.block;
}

int64_t Model::staged_weight_elements(int slots) const {
  const StagedLayout l = staged_layout(slots, false);
  return l.slots > 0 ? l.length : params_.total_elements();
}

int64_t Model::staged_gradient_elements(int slots) const {
  const StagedLayout l = staged_layout(slots, head_reads_embeddings());
  return l.slots > 0 ? l.length : params_.total_elements();
}

// Segment i of L + 2 (L: the blocks, a pipeline stage's) is the head (0), block L - i counted from
// the first, or the embeddings (L + 1); its place in a buffer of `layout`.
ElementRange Model::place(int segment, const StagedLayout& layout) const {
  const ElementRange r = segments_.at(static_cast<size_t>(segment));
  return {staged_offset(r.offset, layout), r.count};
}

bool Model::places_overlap(int a, int b, const StagedLayout& layout) const {
  const ElementRange x = place(a, layout), y = place(b, layout);
  return x.offset < y.offset + y.count && y.offset < x.offset + x.count;
}

Tensor Model::grad_segment(int segment) const {
  const ElementRange r = place(segment, grad_layout_);
  return element_range(flat_grads_, r.offset, r.count);
}

Tensor Model::weight_segment(int segment) const {
  const ElementRange r = place(segment, weight_layout_);
  return element_range(flat_weights_, r.offset, r.count);
}

void Model::need_weights(int segment, int next) const {
  if (!weight_source_) return;
  weight_source_->need(segment);
  if (next >= 0 && !weights_overlap(segment, next)) weight_source_->prefetch(next);
}

int Model::segment_of(int64_t at) const {
  for (size_t s = 0; s < segments_.size(); ++s)
    if (at >= segments_[s].offset && at < segments_[s].offset + segments_[s].count)
      return static_cast<int>(s);
  BRISK_FAIL("internal error: element ", at, " is in no segment");
}

void Model::written(size_t i) const {
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
