#include "core/segment_layout.h"

#include <algorithm>

#include "core/error.h"

namespace brisk {
namespace {

int64_t total_of(const std::vector<ElementRange>& segments) {
  int64_t total = 0;
  for (const ElementRange& s : segments) total += s.count;
  return total;
}

}  // namespace

SegmentLayout SegmentLayout::plain(const std::vector<ElementRange>& segments) {
  SegmentLayout l;
  l.segments_ = segments;
  l.length_ = total_of(segments);
  return l;
}

int64_t SegmentLayout::block_elements(const std::vector<ElementRange>& segments, int slots) {
  const size_t blocks = segments.size() >= 3 ? segments.size() - 2 : 0;
  if (slots < 1 || blocks <= static_cast<size_t>(slots)) return 0;
  for (size_t i = 1; i <= blocks; ++i)
    if (segments[i].count != segments[1].count) return 0;
  return segments[1].count;
}

SegmentLayout SegmentLayout::staged(const std::vector<ElementRange>& segments, int slots,
                                    bool embeddings_apart, bool resident_ends,
                                    const std::vector<ElementRange>& holes) {
  SegmentLayout l = plain(segments);
  int64_t block = block_elements(segments, slots);
  if (block == 0) return l;
  int64_t end = 0;
  for (const ElementRange& h : holes) {
    BRISK_CHECK(h.offset >= end && h.count > 0 && h.offset + h.count <= block,
                "internal error: slot holes out of order or outside a block");
    end = h.offset + h.count;
    l.hole_elements_ += h.count;
  }
  l.holes_ = holes;
  block -= l.hole_elements_;
  const int64_t E = segments.back().count, H = segments.front().count;
  const bool apart = embeddings_apart || resident_ends;
  const int64_t slots_at = apart ? E : 0;
  const int64_t length =
      resident_ends ? E + slots * block + H : slots_at + std::max(slots * block, apart ? H : E + H);
  if (length >= l.length_) return l;
  l.slots_ = slots;
  l.block_ = block;
  l.slots_at_ = slots_at;
  l.length_ = length;
  l.embeddings_at_ = apart ? 0 : length - E;
  l.head_at_ = length - H - (apart ? 0 : E);
  l.embeddings_end_ = E;
  l.head_start_ = segments.front().offset;
  return l;
}

int64_t SegmentLayout::offset(int64_t at) const {
  if (slots_ == 0) return at;
  if (at < embeddings_end_) return embeddings_at_ + at;
  if (at >= head_start_) return head_at_ + (at - head_start_);
  const int64_t in_blocks = at - embeddings_end_, whole = block_ + hole_elements_;
  int64_t rel = in_blocks % whole;
  const int64_t in_slot = rel;
  for (const ElementRange& h : holes_) {
    if (in_slot < h.offset) break;
    if (in_slot < h.offset + h.count) return -1;
    rel -= h.count;
  }
  return slots_at_ + in_blocks / whole % slots_ * block_ + rel;
}

ElementRange SegmentLayout::place(int segment) const {
  BRISK_CHECK(segment >= 0 && static_cast<size_t>(segment) < segments_.size(),
              "internal error: segment ", segment, " of ", segments_.size());
  const ElementRange r = segments_[static_cast<size_t>(segment)];
  const bool block = slots_ > 0 && r.offset >= embeddings_end_ && r.offset < head_start_;
  if (block && hole_elements_ > 0)  // its slot's start: the element at a block's start or after
    return {slots_at_ + (r.offset - embeddings_end_) / (block_ + hole_elements_) % slots_ * block_,
            block_};
  return {offset(r.offset), r.count};
}

bool SegmentLayout::overlap(int a, int b) const {
  const ElementRange x = place(a), y = place(b);
  return x.offset < y.offset + y.count && y.offset < x.offset + x.count;
}

}  // namespace brisk
