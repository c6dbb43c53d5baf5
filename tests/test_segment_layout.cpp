// The segment layout's arithmetic against a brute-force placement: every element of the
// parameters mapped into a staged buffer, segments of one block sharing a slot in turn, the
// head's and the embeddings' parts apart from each other, and the refusals to stage
// (tests/test_models.cpp checks the models' staged buffers themselves).
#include <gtest/gtest.h>

#include <set>
#include <vector>

#include "core/segment_layout.h"

namespace brisk::testing {
namespace {

// Segments as a model reports them: the head, `blocks` blocks from the last, the embeddings.
std::vector<ElementRange> segments(int64_t embeddings, int blocks, int64_t block, int64_t head) {
  std::vector<ElementRange> s;
  const int64_t end = embeddings + blocks * block;
  s.push_back({end, head});
  for (int b = blocks - 1; b >= 0; --b) s.push_back({embeddings + b * block, block});
  s.push_back({0, embeddings});
  return s;
}

TEST(SegmentLayout, PlainPlacesEachSegmentWhereItIs) {
  const auto s = segments(7, 3, 5, 4);
  const SegmentLayout l = SegmentLayout::plain(s);
  EXPECT_FALSE(l.is_staged());
  EXPECT_EQ(l.length(), 26);
  for (int i = 0; i < static_cast<int>(s.size()); ++i) {
    EXPECT_EQ(l.place(i).offset, s[static_cast<size_t>(i)].offset);
    for (int j = 0; j < static_cast<int>(s.size()); ++j) EXPECT_EQ(l.overlap(i, j), i == j);
  }
}

TEST(SegmentLayout, StagedBlocksTakeTheirSlotsInTurn) {
  for (const bool apart : {false, true}) {
    for (const int slots : {1, 2}) {
      const auto s = segments(6, 5, 10, 3);
      const SegmentLayout l = SegmentLayout::staged(s, slots, apart);
      ASSERT_TRUE(l.is_staged());
      EXPECT_EQ(l.slots(), slots);
      const int64_t expected =
          apart ? 6 + std::max<int64_t>(slots * 10, 3) : std::max<int64_t>(slots * 10, 9);
      EXPECT_EQ(l.length(), expected);
      // Every element lands inside the buffer, a segment's elements on distinct places.
      for (size_t i = 0; i < s.size(); ++i) {
        std::set<int64_t> seen;
        for (int64_t e = s[i].offset; e < s[i].offset + s[i].count; ++e) {
          const int64_t at = l.offset(e);
          EXPECT_GE(at, 0);
          EXPECT_LT(at, l.length());
          seen.insert(at);
        }
        EXPECT_EQ(static_cast<int64_t>(seen.size()), s[i].count);
        EXPECT_EQ(l.place(static_cast<int>(i)).offset, l.offset(s[i].offset));
      }
      // Block b (segment 5 - b) shares its slot with block b + slots, never with the next one
      // when there are two slots.
      for (int b = 0; b + slots < 5; ++b) EXPECT_TRUE(l.overlap(5 - b, 5 - b - slots));
      if (slots == 2)
        for (int b = 0; b + 1 < 5; ++b) EXPECT_FALSE(l.overlap(5 - b, 4 - b)) << b;
      // The head's and the embeddings' parts never lie over each other; apart, the embeddings'
      // lie over no block.
      EXPECT_FALSE(l.overlap(0, 6));
      if (apart)
        for (int i = 1; i <= 5; ++i) EXPECT_FALSE(l.overlap(6, i)) << i;
    }
  }
}

// Resident ends (QLoRA's 4-bit blocks): the embeddings before the slots, the head after them,
// neither over any block nor over each other; the buffer as long as the three.
TEST(SegmentLayout, ResidentEndsLieOverNoBlock) {
  for (const int slots : {1, 2}) {
    const auto s = segments(6, 5, 10, 3);
    const SegmentLayout l = SegmentLayout::staged(s, slots, false, true);
    ASSERT_TRUE(l.is_staged());
    EXPECT_EQ(l.length(), 6 + slots * 10 + 3);
    EXPECT_EQ(l.place(6).offset, 0);
    EXPECT_EQ(l.place(0).offset, 6 + slots * 10);
    for (int i = 1; i <= 5; ++i) {
      EXPECT_FALSE(l.overlap(0, i)) << i;
      EXPECT_FALSE(l.overlap(6, i)) << i;
    }
    EXPECT_FALSE(l.overlap(0, 6));
    for (int b = 0; b + slots < 5; ++b) EXPECT_TRUE(l.overlap(5 - b, 5 - b - slots));
  }
}

// Holes (QLoRA's 4-bit linears, read where they are kept): every block's other elements closed
// up in its slot in their order, the holes' at -1, the slots shorter by the holes.
TEST(SegmentLayout, HolesLeaveTheirElementsOutOfEverySlot) {
  const auto s = segments(6, 5, 10, 3);
  const std::vector<ElementRange> holes{{1, 3}, {6, 2}};  // elements 1-3 and 6-7 of each block
  const SegmentLayout l = SegmentLayout::staged(s, 2, false, true, holes);
  ASSERT_TRUE(l.is_staged());
  EXPECT_EQ(l.length(), 6 + 2 * 5 + 3);
  for (int b = 0; b < 5; ++b) {
    const ElementRange seg = s[static_cast<size_t>(5 - b)];
    const ElementRange place = l.place(5 - b);
    EXPECT_EQ(place.count, 5);
    EXPECT_EQ(place.offset, 6 + b % 2 * 5);
    std::vector<int64_t> kept;
    for (int64_t e = 0; e < seg.count; ++e) {
      const int64_t at = l.offset(seg.offset + e);
      const bool hole = (e >= 1 && e <= 3) || e == 6 || e == 7;
      if (hole) {
        EXPECT_EQ(at, -1) << e;
      } else {
        kept.push_back(at);
      }
    }
    EXPECT_EQ(kept, (std::vector<int64_t>{place.offset, place.offset + 1, place.offset + 2,
                                          place.offset + 3, place.offset + 4}));
  }
  EXPECT_EQ(l.place(6).offset, 0);
  EXPECT_EQ(l.place(0).offset, 16);
  EXPECT_EQ(l.offset(s[0].offset + 2), 18);
  EXPECT_FALSE(l.overlap(5, 4));
  EXPECT_TRUE(l.overlap(5, 3));
}

TEST(SegmentLayout, StagesOnlyWhereItSaves) {
  // Blocks unlike each other, no more blocks than slots, or no slots: plain.
  auto unlike = segments(6, 4, 10, 3);
  unlike[2].count = 9;
  unlike[1].offset -= 1;
  EXPECT_EQ(SegmentLayout::block_elements(unlike, 1), 0);
  EXPECT_FALSE(SegmentLayout::staged(unlike, 1, false).is_staged());
  EXPECT_FALSE(SegmentLayout::staged(segments(6, 2, 10, 3), 2, false).is_staged());
  EXPECT_EQ(SegmentLayout::block_elements(segments(6, 3, 10, 3), 2), 10);
  // The head's part outweighs a slot: the buffer is as long as the head's and embeddings'.
  const auto big_head = segments(2, 3, 10, 100);
  EXPECT_EQ(SegmentLayout::staged(big_head, 1, false).length(), 102);
  EXPECT_EQ(SegmentLayout::staged(big_head, 1, true).length(), 102);
  EXPECT_FALSE(SegmentLayout::staged(segments(6, 3, 10, 3), 0, false).is_staged());
}

}  // namespace
}  // namespace brisk::testing
