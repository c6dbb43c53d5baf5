// Where a model's parameter segments lie in one of its flat buffers (weights or gradients):
// plain (each where it is among the parameters) or staged in slots. Partitioned data parallelism
// (parallel/parallel_plan) chooses the slots; the model reads and writes its segments at the
// places this value gives, and ZeRO asks it which places overlap.
//
// Segments are numbered as the model reports them: the head (0), the blocks from last to first,
// the embeddings (last), each starting where the next ends. Staged: the blocks' parameters in
// `slots` slots used in turn (block b in slot b mod slots), the head's and the embeddings' side by
// side at the end of the slots' space (or after it where they are longer; or, resident, the
// embeddings' before the slots and the head's after them). Possible when the
// blocks are laid out alike and outnumber the slots. With `embeddings_apart` (a tied head, whose
// gradient and the embeddings' are one tensor) the embeddings' part lies before the slots.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace brisk {

class SegmentLayout {
 public:
  SegmentLayout() = default;
  // Each segment at its own place (the buffer as long as the parameters).
  static SegmentLayout plain(const std::vector<ElementRange>& segments);
  // Staged in `slots` slots where the segments allow it and that takes fewer elements than the
  // parameters; else plain. `resident_ends`: the embeddings' part before the slots and the
  // head's after them, neither sharing elements with a block's (where nothing but the blocks is
  // brought back into place: QLoRA's 4-bit blocks).
  // `holes`: ranges of every block's segment (from its start, sorted, apart) that the slots do
  // not hold (QLoRA's 4-bit linears, which their products read where they are kept): a block's
  // other elements lie in its slot in their order, closed up. Their offsets are -1.
  static SegmentLayout staged(const std::vector<ElementRange>& segments, int slots,
                              bool embeddings_apart, bool resident_ends = false,
                              const std::vector<ElementRange>& holes = {});
  // The elements of one block's segment when `segments` can be staged in `slots` slots; else 0.
  static int64_t block_elements(const std::vector<ElementRange>& segments, int slots);

  bool is_staged() const { return slots_ > 0; }
  int slots() const { return slots_; }
  // The buffer's elements.
  int64_t length() const { return length_; }
  // Where element `at` of the parameters lies in the buffer (-1: in a hole), and segment i (a
  // block's: its elements outside the holes).
  int64_t offset(int64_t at) const;
  ElementRange place(int segment) const;
  // Whether two segments' places share elements (staged: they use the buffer in turn).
  bool overlap(int a, int b) const;

 private:
  std::vector<ElementRange> segments_;
  std::vector<ElementRange> holes_;
  int64_t hole_elements_ = 0;
  int slots_ = 0;
  int64_t block_ = 0, length_ = 0, slots_at_ = 0, head_at_ = 0, embeddings_at_ = 0;
  int64_t embeddings_end_ = 0, head_start_ = 0;
};

}  // namespace brisk
