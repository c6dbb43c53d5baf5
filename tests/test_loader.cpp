// The data loader's padding and ordering: dynamic padding computes each micro-batch at its
// longest sample rounded up to 8, inline and in the background alike; group_by_length orders an
// epoch in mega-batches sorted by length with the longest sample first, still visiting every
// sample once; padding-free batches lay the same samples end to end.
#include <gtest/gtest.h>

#include <algorithm>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "data/batch.h"
#include "data/loader.h"
#include "test_support.h"

namespace brisk::testing {
namespace {

constexpr int64_t kPlanned = 32, kBatch = 4, kSamples = 42;

// Samples of lengths 1..29 in a scattered order; the first id of each is its index + 1, the rest
// count up, so a row names its sample and its length.
class VaryingLengths final : public Dataset {
 public:
  explicit VaryingLengths(int64_t samples = kSamples) : samples_(samples) {}
  int64_t size() const override { return samples_; }
  int64_t seq_len() const override { return kPlanned; }
  int64_t length(int64_t index) const override { return (index * 7) % 29 + 1; }
  int64_t count_targets(int64_t, int64_t) const override { return 1; }
  void fill_row(int64_t index, int64_t, const Batch& b, int64_t row) const override {
    const int64_t T = b.input_ids.dim(1);
    for (int64_t t = 0; t < length(index); ++t) {
      b.input_ids.i32()[row * T + t] = t == 0 ? static_cast<int32_t>(index + 1) : 200;
      b.attention_mask.i32()[row * T + t] = 1;
    }
    b.labels.i32()[row] = 0;
  }

 private:
  int64_t samples_;
};

// A tiny BERT planned for kBatch x kPlanned with a loader over `data`.
struct Loading {
  std::unique_ptr<Model> model;
  std::unique_ptr<DataLoader> loader;
  MemoryPlan plan;
  BufferBinder binder;
  std::unique_ptr<Arena> arena;

  Loading(const Dataset& data, LoaderOptions options, int64_t batch = kBatch) {
    model = Model::create(resolve_config("bert-tiny"));
    model->plan(plan, {batch, kPlanned}, {});
    loader = std::make_unique<DataLoader>(data, model->batch_layout(batch, kPlanned), 5, options);
    loader->plan(plan, binder);
    plan.finalize();
    arena = std::make_unique<Arena>(plan, Device::cpu);
    model->bind(*arena);
    binder.bind(*arena);
  }
};

struct Seen {
  int64_t sample, length;
};

// One epoch of micro-batches: each row's sample and length, checking every batch's shape.
std::vector<std::vector<Seen>> epoch(Loading& l, const Dataset& data) {
  std::vector<std::vector<Seen>> batches;
  l.loader->start(0);
  for (int64_t m = 0; m < l.loader->batches_per_epoch(); ++m) {
    const LoadedBatch got = l.loader->next(*l.model);
    const Batch& b = l.model->batch();
    EXPECT_EQ(b.input_ids.dim(1), got.seq);
    EXPECT_EQ(l.model->batch_shape().seq, got.seq);
    std::vector<Seen> rows;
    for (int64_t r = 0; r < got.rows; ++r) {
      const int64_t sample = b.input_ids.i32()[r * got.seq] - 1;
      int64_t real = 0;
      for (int64_t t = 0; t < got.seq; ++t) real += b.attention_mask.i32()[r * got.seq + t];
      EXPECT_EQ(real, data.length(sample)) << "row " << r << " of batch " << m;
      rows.push_back({sample, real});
    }
    batches.push_back(rows);
  }
  return batches;
}

int64_t longest_of(const std::vector<Seen>& rows) {
  int64_t n = 0;
  for (const Seen& s : rows) n = std::max(n, s.length);
  return n;
}

TEST(Loader, DynamicPaddingComputesEachBatchAtItsLongestSampleRoundedUpTo8) {
  EXPECT_EQ(dynamic_padded_length(1, 32), 8);
  EXPECT_EQ(dynamic_padded_length(8, 32), 8);
  EXPECT_EQ(dynamic_padded_length(9, 32), 16);
  EXPECT_EQ(dynamic_padded_length(29, 30), 30);
  VaryingLengths data;
  std::vector<std::vector<std::vector<Seen>>> runs;
  for (bool background : {false, true}) {
    Loading l(data, {background, /*dynamic_padding=*/true, 0});
    const auto batches = epoch(l, data);
    std::set<int64_t> samples;
    for (const auto& rows : batches)
      for (const Seen& s : rows) samples.insert(s.sample);
    EXPECT_EQ(samples.size(), static_cast<size_t>(kSamples));
    runs.push_back(batches);
  }
  // Inline and background loading hand out the same batches.
  ASSERT_EQ(runs[0].size(), runs[1].size());
  for (size_t m = 0; m < runs[0].size(); ++m)
    for (size_t r = 0; r < runs[0][m].size(); ++r)
      EXPECT_EQ(runs[0][m][r].sample, runs[1][m][r].sample);
  // Fixed padding: every batch at the planned length.
  Loading fixed(data, {false, false, 0});
  fixed.loader->start(0);
  EXPECT_EQ(fixed.loader->next(*fixed.model).seq, kPlanned);
}

TEST(Loader, EachBatchIsPaddedToItsOwnLongestSample) {
  VaryingLengths data;
  Loading l(data, {false, true, 0});
  l.loader->start(0);
  for (int64_t m = 0; m < l.loader->batches_per_epoch(); ++m) {
    const LoadedBatch got = l.loader->next(*l.model);
    int64_t longest = 0;
    for (int64_t r = 0; r < got.rows; ++r) {
      int64_t real = 0;
      for (int64_t t = 0; t < got.seq; ++t)
        real += l.model->batch().attention_mask.i32()[r * got.seq + t];
      longest = std::max(longest, real);
    }
    EXPECT_EQ(got.seq, dynamic_padded_length(longest, kPlanned)) << "batch " << m;
  }
}

// Padding-free: each micro-batch's samples, the padded batches' in their order, end to end over
// rows as short as hold them (inline and in the background), the model told where they lie, the
// tokens after them a padding sample of no real token.
TEST(Loader, PaddingFreeBatchesLaySamplesEndToEnd) {
  VaryingLengths data;
  Loading padded(data, {false, true, 0});
  const auto want = epoch(padded, data);
  for (bool background : {false, true}) {
    LoaderOptions options{background, true, 0};
    options.padding_free = true;
    Loading l(data, options);
    l.loader->start(0);
    ASSERT_EQ(l.loader->batches_per_epoch(), static_cast<int64_t>(want.size()));
    for (size_t m = 0; m < want.size(); ++m) {
      const LoadedBatch got = l.loader->next(*l.model);
      const PackedSamples* samples = l.model->packed_samples();
      ASSERT_NE(samples, nullptr);
      int64_t tokens = 0;
      for (const Seen& s : want[m]) tokens += s.length;
      EXPECT_EQ(got.seq, (tokens + kBatch - 1) / kBatch) << "batch " << m;
      const int32_t* ids = l.model->batch().input_ids.i32();
      const int32_t* mask = l.model->batch().attention_mask.i32();
      for (size_t r = 0; r < want[m].size(); ++r) {
        EXPECT_EQ(samples->length(static_cast<int64_t>(r)), want[m][r].length);
        EXPECT_EQ(ids[samples->starts[r]] - 1, want[m][r].sample) << "batch " << m;
      }
      const int64_t padding = kBatch * got.seq - tokens;
      EXPECT_EQ(samples->count(), static_cast<int64_t>(want[m].size()) + (padding > 0));
      EXPECT_EQ(std::count(mask, mask + kBatch * got.seq, 1), tokens);
    }
  }
}

// Each row's key count where every row keeps (nonzero) a prefix of at least one key; none for a
// row padded on the left, a hidden key between kept ones, or a row that keeps no key. The mask's
// rows are written as digits, separated by spaces. (Read at run time: GCC 12.2 with AVX-512 stores
// the constant {1, 1, 1, 1, 0, 0, 0, 0} as eight ones.)
std::optional<std::vector<int32_t>> key_counts(const std::string& rows) {
  std::vector<int32_t> mask;
  int64_t B = 1;
  for (char ch : rows) {
    if (ch == ' ')
      ++B;
    else
      mask.push_back(ch - '0');
  }
  const int64_t T = static_cast<int64_t>(mask.size()) / B;
  std::vector<int32_t> n(static_cast<size_t>(B), -1);
  if (!right_padded_lengths(Tensor(mask.data(), {B, T}, DType::i32),
                            Tensor(n.data(), {B}, DType::i32)))
    return std::nullopt;
  return n;
}

TEST(Loader, ARightPaddedBatchGivesItsRowsKeyCounts) {
  EXPECT_EQ(key_counts("1100 1111 2000"), (std::vector<int32_t>{2, 4, 1}));
  EXPECT_EQ(key_counts("1100 0111"), std::nullopt);
  EXPECT_EQ(key_counts("1010"), std::nullopt);
  EXPECT_EQ(key_counts("1111 0000"), std::nullopt);
  // The loader pads on the right: each row's count is its sample's length; a row it leaves
  // empty (the epoch's last batch) keeps no key, so that batch gives none.
  VaryingLengths data;
  Loading l(data, {false, true, 0});
  l.loader->start(0);
  for (int64_t m = 0; m < l.loader->batches_per_epoch(); ++m) {
    const LoadedBatch got = l.loader->next(*l.model);
    const Batch& b = l.model->batch();
    std::vector<int32_t> n(static_cast<size_t>(kBatch));
    const bool padded =
        right_padded_lengths(b.attention_mask, Tensor(n.data(), {kBatch}, DType::i32));
    EXPECT_EQ(padded, got.rows == kBatch) << "batch " << m << " of " << got.rows << " rows";
    for (int64_t r = 0; padded && r < kBatch; ++r)
      EXPECT_EQ(n[static_cast<size_t>(r)], data.length(b.input_ids.i32()[r * got.seq] - 1))
          << "row " << r << " of batch " << m;
  }
}

TEST(Loader, GroupByLengthSortsMegaBatchesAndPutsTheLongestFirst) {
  VaryingLengths data;
  Loading plain(data, {false, true, 0});
  Loading grouped(data, {false, true, kBatch});
  const auto a = epoch(plain, data), b = epoch(grouped, data);
  int64_t longest = 0;
  for (int64_t i = 0; i < kSamples; ++i) longest = std::max(longest, data.length(i));
  EXPECT_EQ(b[0][0].length, longest);
  // Mega-batches of min(42 / (4 * 4), 50) = 2 batches: sorted longest first (but for the
  // sample swapped to the front).
  std::vector<Seen> order;
  for (const auto& rows : b) order.insert(order.end(), rows.begin(), rows.end());
  std::set<int64_t> samples;
  for (const Seen& s : order) samples.insert(s.sample);
  EXPECT_EQ(samples.size(), static_cast<size_t>(kSamples));
  for (size_t begin = 0; begin < order.size(); begin += 2 * kBatch)
    for (size_t i = begin + 2; i < std::min(order.size(), begin + 2 * kBatch); ++i)
      EXPECT_GE(order[i - 1].length, order[i].length) << "position " << i;
  // Similar lengths per batch: less padding than plain shuffling.
  auto padded = [](const std::vector<std::vector<Seen>>& batches) {
    int64_t sum = 0;
    for (const auto& rows : batches) sum += dynamic_padded_length(longest_of(rows), kPlanned);
    return sum;
  };
  EXPECT_LT(padded(b), padded(a));
}

// Data parallelism: N ranks with batch B each draw the same epoch order and share it as torch's
// DistributedSampler does (rank r takes positions r, r + N, ...), so their micro-batch m together
// holds exactly one process's micro-batch m with batch N x B, row i of it on rank i % N; every
// rank has as many micro-batches, and count_targets counts the whole global batch on each.
TEST(Loader, RanksShareEachGlobalBatchAsOneProcessWithTheirTotalBatch) {
  for (int ranks : {2, 3}) {
    SCOPED_TRACE(::testing::Message() << ranks << " ranks");
    VaryingLengths data;  // 42 samples: divisible by 2 and 3
    Loading one(data, {false, true, 0}, kBatch * ranks);
    const auto whole = epoch(one, data);
    std::vector<std::vector<std::vector<Seen>>> shards;
    std::vector<std::unique_ptr<Loading>> loaders;
    for (int r = 0; r < ranks; ++r) {
      LoaderOptions o{r % 2 == 1, true, 0};  // background and inline loading mixed
      o.rank = r;
      o.ranks = ranks;
      loaders.push_back(std::make_unique<Loading>(data, o));
      shards.push_back(epoch(*loaders.back(), data));
      EXPECT_EQ(loaders.back()->loader->batches_per_epoch(), one.loader->batches_per_epoch());
    }
    for (size_t m = 0; m < whole.size(); ++m) {
      for (int r = 0; r < ranks; ++r)
        ASSERT_EQ(shards[r][m].size() * ranks, whole[m].size()) << "batch " << m << " rank " << r;
      for (size_t i = 0; i < whole[m].size(); ++i)
        EXPECT_EQ(shards[i % ranks][m][i / ranks].sample, whole[m][i].sample)
            << "batch " << m << " row " << i;
      for (int r = 0; r < ranks; ++r)
        EXPECT_EQ(loaders[r]->loader->count_targets(static_cast<int64_t>(m), 1),
                  one.loader->count_targets(static_cast<int64_t>(m), 1));
    }
  }
}

// A data set that does not divide among the ranks is padded by wrapping around to the epoch's
// first samples (DistributedSampler's drop_last=False): every sample is seen, every rank has as
// many rows, and only the padding repeats.
TEST(Loader, UnevenDataIsPaddedFromTheEpochsStart) {
  const int ranks = 3;
  VaryingLengths data(43);
  std::vector<int64_t> count(43, 0);
  int64_t rows = -1;
  for (int r = 0; r < ranks; ++r) {
    LoaderOptions o{false, true, 0};
    o.rank = r;
    o.ranks = ranks;
    Loading l(data, o);
    int64_t mine = 0;
    for (const auto& batch : epoch(l, data))
      for (const Seen& s : batch) ++count[s.sample], ++mine;
    if (rows >= 0) EXPECT_EQ(mine, rows) << "rank " << r;
    rows = mine;
  }
  EXPECT_EQ(rows, 15);  // ceil(43 / 3)
  int64_t repeated = 0;
  for (int64_t c : count) {
    EXPECT_GE(c, 1);
    repeated += c - 1;
  }
  EXPECT_EQ(repeated, 2);  // 45 positions for 43 samples
  LoaderOptions bad{false, false, 0};
  bad.rank = 3;
  bad.ranks = 3;
  expect_error([&] { Loading l(data, bad); }, "rank 3 of 3 ranks");
  bad.rank = 0;
  bad.ranks = 11;  // 43 / 11 = 3 samples per rank, less than a batch of 4
  expect_error([&] { Loading l(data, bad); }, "smaller than one batch of 4 on each of 11 ranks");
}

}  // namespace
}  // namespace brisk::testing
