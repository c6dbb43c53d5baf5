// Padding-free and packed batches: the samples a batch lays end to end, as the backends check
// them (the attention over them is in the conformance suite: cases_attention.cpp).
#include <gtest/gtest.h>

#include "backend/backend.h"
#include "test_support.h"

namespace brisk::testing {
namespace {

TEST(PackedSamples, CoverTheBatchRowByRow) {
  const PackedSamples good{{0, 3, 4, 8, 10, 16}};  // rows of 8: [3, 1, 4] and [2, 6]
  EXPECT_EQ(good.count(), 5);
  EXPECT_EQ(good.longest(), 6);
  EXPECT_EQ(good.length(1), 1);
  Backend::check_packed_samples(good, 2, 8, "op");
  expect_error(
      [] {
        Backend::check_packed_samples(PackedSamples{{0, 3, 9, 16}}, 2, 8, "op");
      },
      "op: packed sample 1 (tokens 3..9) is empty or crosses a row");
  expect_error(
      [] {
        Backend::check_packed_samples(PackedSamples{{0, 3, 3, 16}}, 2, 8, "op");
      },
      "op: packed sample 1 (tokens 3..3) is empty or crosses a row");
  expect_error(
      [] {
        Backend::check_packed_samples(PackedSamples{{0, 3, 8}}, 2, 8, "op");
      },
      "op: the packed samples do not cover the batch's 2 x 8 tokens");
  expect_error([] { Backend::check_packed_samples(PackedSamples{}, 1, 8, "op"); },
               "op: the packed samples do not cover the batch's 1 x 8 tokens");
}

}  // namespace
}  // namespace brisk::testing
