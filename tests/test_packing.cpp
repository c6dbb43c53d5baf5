// TRL's packing ("bfd"): best-fit-decreasing rows, the packed dataset's rows, and the loader's
// packed batches (each row's samples, then its padding, as the model's PackedSamples).
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>

#include "data/loader.h"
#include "data/packing.h"
#include "trainer_support.h"

namespace brisk::testing {
namespace {

// TRL's documented example (rows of 4; samples of 4, 2, 3 and 1 tokens): [0], [2, 3], [1].
TEST(Packing, BestFitDecreasingPlacesAsTrlDoes) {
  const std::vector<int64_t> lengths{4, 2, 3, 1};
  const PackedRows p = best_fit_decreasing(lengths, 4);
  EXPECT_EQ(p.offsets, (std::vector<int64_t>{0, 1, 3, 4}));
  EXPECT_EQ(p.samples, (std::vector<int64_t>{0, 2, 3, 1}));
  expect_error([] { best_fit_decreasing(std::vector<int64_t>{5}, 4); },
               "sample 0 of 5 tokens does not fit a packed row of 4");
}

// Random lengths: every sample in exactly one row, no row over capacity, each sample in the row
// it left the least room in when placed (checked by replaying the placement), and no two rows
// that one could hold.
TEST(Packing, BestFitDecreasingRowsAreFullAndBestFit) {
  std::mt19937_64 gen(11);
  for (int trial = 0; trial < 20; ++trial) {
    const int64_t capacity = 8 + static_cast<int64_t>(gen() % 40);
    std::vector<int64_t> lengths(1 + gen() % 300);
    for (int64_t& l : lengths) l = 1 + static_cast<int64_t>(gen() % capacity);
    const PackedRows p = best_fit_decreasing(lengths, capacity);
    std::vector<int64_t> seen = p.samples;
    std::sort(seen.begin(), seen.end());
    std::vector<int64_t> all(lengths.size());
    std::iota(all.begin(), all.end(), 0);
    ASSERT_EQ(seen, all);
    std::vector<int64_t> used(static_cast<size_t>(p.rows()), 0), row_of(lengths.size());
    for (int64_t r = 0; r < p.rows(); ++r)
      for (int64_t k = p.offsets[r]; k < p.offsets[r + 1]; ++k) {
        used[r] += lengths[p.samples[k]];
        row_of[p.samples[k]] = r;
      }
    for (int64_t u : used) EXPECT_LE(u, capacity);
    int64_t emptiest = capacity, second = capacity;  // the two least-filled rows fill no row
    for (int64_t u : used) {
      if (u < emptiest) std::swap(u, emptiest);
      if (u < second) second = u;
    }
    if (p.rows() >= 2) EXPECT_GT(emptiest + second, capacity);
    // Replay: longest first (the earlier sample among equals), each to the best-fitting row.
    std::vector<int64_t> order = all;
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return lengths[a] > lengths[b]; });
    std::vector<int64_t> left;
    for (int64_t s : order) {
      int64_t best = -1;
      for (size_t r = 0; r < left.size(); ++r)
        if (left[r] >= lengths[s] && (best < 0 || left[r] < left[best])) best = r;
      if (best < 0) {
        best = static_cast<int64_t>(left.size());
        left.push_back(capacity);
      }
      left[best] -= lengths[s];
      EXPECT_EQ(row_of[s], best) << "sample " << s;
    }
  }
}

TEST(Packing, PackedRowsHoldTheirSamplesEndToEnd) {
  auto inner = std::make_unique<UnequalLengths>();  // 18 samples of 4..12 tokens, rows of 12
  const UnequalLengths& u = *inner;
  std::vector<int64_t> lengths(18);
  for (int64_t i = 0; i < 18; ++i) lengths[i] = u.length(i);
  const PackedRows want = best_fit_decreasing(lengths, 12);
  const PackedDataset d(std::move(inner), 12);
  ASSERT_EQ(d.size(), want.rows());
  EXPECT_EQ(d.seq_len(), 12);
  UnequalLengths ref;
  int64_t tokens = 0;
  for (int64_t r = 0; r < d.size(); ++r) {
    std::vector<int32_t> ids(2 * 12, 0), mask(2 * 12, 0), labels(2 * 12, kIgnoreIndex);
    const Batch b{Tensor(ids.data(), Shape{2, 12}, DType::i32),
                  Tensor(mask.data(), Shape{2, 12}, DType::i32), Tensor(),
                  Tensor(labels.data(), Shape{2, 12}, DType::i32)};
    d.fill_row(r, 0, b, 1);  // row 1 of the batch
    const std::span<const int64_t> parts = d.packed_lengths(r);
    ASSERT_EQ(static_cast<int64_t>(parts.size()), want.offsets[r + 1] - want.offsets[r]);
    int64_t at = 12, targets = 0;
    for (size_t k = 0; k < parts.size(); ++k) {
      const int64_t s = want.samples[want.offsets[r] + k];
      ASSERT_EQ(parts[k], ref.length(s));
      targets += ref.count_targets(s, 0);
      for (int64_t t = 0; t < parts[k]; ++t, ++at) {
        EXPECT_EQ(ids[at], 100 + (s * 7 + t * 3) % 28) << "row " << r << " sample " << s;
        EXPECT_EQ(mask[at], 1);
        EXPECT_EQ(labels[at], ids[at]);
      }
    }
    tokens += at - 12;
    for (; at < 24; ++at) EXPECT_EQ(mask[at], 0);           // the rest as reset
    for (int64_t t = 0; t < 12; ++t) EXPECT_EQ(ids[t], 0);  // row 0 untouched
    EXPECT_EQ(d.count_targets(r, 0), targets);
  }
  EXPECT_DOUBLE_EQ(d.fill_ratio(), static_cast<double>(tokens) / (12.0 * d.size()));
}

// What the loader tells the model: each row's samples, then the row's padding, a missing row
// all padding; the rows at full length, though the options ask for dynamic padding.
TEST(Packing, TheLoaderTellsTheModelEachRowsSamples) {
  for (const bool background : {false, true}) {
    SCOPED_TRACE(background ? "background" : "inline");
    const PackedDataset d(std::make_unique<UnequalLengths>(), 12);
    const int64_t B = 3;
    LoaderOptions lo;
    lo.background = background;
    lo.dynamic_padding = true;
    TempDir dir("packing_loader");
    std::unique_ptr<Model> model = Model::create(resolve_config(write_config(dir, "gpt2", 0.0)));
    MemoryPlan plan;
    model->plan(plan, {B, 12}, {});
    DataLoader loader(d, model->batch_layout(B, 12), 5, lo);
    BufferBinder binder;
    loader.plan(plan, binder);
    plan.finalize();
    Arena arena(plan, Device::cpu);
    model->bind(arena);
    binder.bind(arena);
    loader.start(0);
    for (int64_t m = 0; m < loader.batches_per_epoch(); ++m) {
      const LoadedBatch shape = loader.next(*model);
      EXPECT_EQ(shape.seq, 12);
      EXPECT_EQ(model->batch_shape().seq, 12);
      std::vector<int64_t> want{0};
      for (int64_t r = 0; r < B; ++r) {
        if (r < shape.rows) {
          // The row's packed sample as the data set gives it: find it by its ids.
          int64_t found = -1;
          for (int64_t i = 0; i < d.size() && found < 0; ++i) {
            std::vector<int32_t> ids(12, 0), mask(12, 0), labels(12, kIgnoreIndex);
            d.fill_row(i, 0,
                       Batch{Tensor(ids.data(), Shape{1, 12}, DType::i32),
                             Tensor(mask.data(), Shape{1, 12}, DType::i32), Tensor(),
                             Tensor(labels.data(), Shape{1, 12}, DType::i32)},
                       0);
            if (std::equal(ids.begin(), ids.end(), model->batch().input_ids.i32() + r * 12))
              found = i;
          }
          ASSERT_GE(found, 0) << "batch " << m << " row " << r;
          for (int64_t len : d.packed_lengths(found)) want.push_back(want.back() + len);
        }
        if (want.back() < (r + 1) * 12) want.push_back((r + 1) * 12);
      }
      ASSERT_NE(model->packed_samples(), nullptr);
      EXPECT_EQ(model->packed_samples()->starts, want) << "batch " << m;
    }
  }
}

}  // namespace
}  // namespace brisk::testing
