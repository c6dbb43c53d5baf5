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
                                    bool embeddings_apart, bool resident_ends) {
  SegmentLayout l = plain(segments);
  const int64_t block = block_elements(segments, slots);
  if (block == 0) return l;
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
  const int64_t in_blocks = at - embeddings_end_;
  return slots_at_ + in_blocks / block_ % slots_ * block_ + in_blocks % block_;
}

ElementRange SegmentLayout::place(int segment) const {
  BRISK_CHECK(segment >= 0 && static_cast<size_t>(segment) < segments_.size(),
              "internal error: segment ", segment, " of ", segments_.size());
  const ElementRange r = segments_[static_cast<size_t>(segment)];
  return {offset(r.offset), r.count};
}

bool SegmentLayout::overlap(int a, int b) const {
  const ElementRange x = place(a), y = place(b);
  return x.offset < y.offset + y.count && y.offset < x.offset + x.count;
}

}  // namespace brisk
