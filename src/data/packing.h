// TRL's packing ("bfd"): a dataset's samples placed whole into rows of a fixed length by best-fit
// decreasing, each row then one sample of the packed dataset. The rows keep their samples apart
// (Dataset::packed_lengths: the model attends and numbers positions within each), so a packed
// batch computes what its samples would alone, on fixed shapes; an epoch takes as many rows as
// the samples fill.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "data/dataset.h"

namespace brisk {

// Rows of `capacity` tokens filled with samples of the given lengths (each 1..capacity), longest
// first, each into the row it leaves the least room in (the earliest of equals), else a new row.
// Row r holds samples[offsets[r] .. offsets[r + 1]) in the order they were placed.
struct PackedRows {
  std::vector<int64_t> offsets{0};
  std::vector<int64_t> samples;
  int64_t rows() const { return static_cast<int64_t>(offsets.size()) - 1; }
};
PackedRows best_fit_decreasing(std::span<const int64_t> lengths, int64_t capacity);

class PackedDataset final : public Dataset {
 public:
  // `inner`'s samples (lengths at most row_length) packed into rows of row_length tokens.
  PackedDataset(std::unique_ptr<Dataset> inner, int64_t row_length);
  int64_t size() const override { return rows_.rows(); }
  int64_t seq_len() const override { return row_length_; }
  int64_t length(int64_t) const override { return row_length_; }
  // The row's samples end to end from token 0, each as `inner` writes it; the rest as reset.
  void fill_row(int64_t index, int64_t epoch, const Batch& batch, int64_t row) const override;
  int64_t count_targets(int64_t index, int64_t epoch) const override;
  std::span<const int64_t> packed_lengths(int64_t index) const override;
  // Tokens of the samples over tokens of the rows.
  double fill_ratio() const;

 private:
  std::unique_ptr<Dataset> inner_;
  int64_t row_length_;
  PackedRows rows_;
  std::vector<int64_t> lengths_;  // the samples' lengths, in rows_.samples order
};

}  // namespace brisk
