// Best-fit-decreasing packing (see packing.h).
#include "data/packing.h"

#include <algorithm>
#include <numeric>
#include <set>
#include <utility>

#include "core/error.h"

namespace brisk {

PackedRows best_fit_decreasing(std::span<const int64_t> lengths, int64_t capacity) {
  BRISK_CHECK(capacity >= 1, "packing into rows of ", capacity, " tokens");
  std::vector<int64_t> by_length(lengths.size());
  std::iota(by_length.begin(), by_length.end(), 0);
  std::stable_sort(by_length.begin(), by_length.end(),
                   [&](int64_t a, int64_t b) { return lengths[a] > lengths[b]; });
  std::vector<std::vector<int64_t>> rows;
  std::set<std::pair<int64_t, int64_t>> room;  // (tokens left, row) of rows with room
  for (const int64_t s : by_length) {
    const int64_t len = lengths[static_cast<size_t>(s)];
    BRISK_CHECK(len >= 1 && len <= capacity, "sample ", s, " of ", len,
                " tokens does not fit a packed row of ", capacity);
    auto fit = room.lower_bound({len, -1});
    int64_t row = static_cast<int64_t>(rows.size()), left = capacity;
    if (fit != room.end()) {
      std::tie(left, row) = *fit;
      room.erase(fit);
    } else {
      rows.emplace_back();
    }
    rows[static_cast<size_t>(row)].push_back(s);
    if (left > len) room.insert({left - len, row});
  }
  PackedRows packed;
  for (const std::vector<int64_t>& r : rows) {
    packed.samples.insert(packed.samples.end(), r.begin(), r.end());
    packed.offsets.push_back(static_cast<int64_t>(packed.samples.size()));
  }
  return packed;
}

PackedDataset::PackedDataset(std::unique_ptr<Dataset> inner, int64_t row_length)
    : inner_(std::move(inner)), row_length_(row_length) {
  BRISK_CHECK(inner_->packed_lengths(0).empty(), "packing a packed dataset");
  std::vector<int64_t> lengths(static_cast<size_t>(inner_->size()));
  for (int64_t s = 0; s < inner_->size(); ++s)
    lengths[static_cast<size_t>(s)] = std::clamp<int64_t>(inner_->length(s), 1, row_length);
  rows_ = best_fit_decreasing(lengths, row_length);
  lengths_.reserve(rows_.samples.size());
  for (const int64_t s : rows_.samples) lengths_.push_back(lengths[static_cast<size_t>(s)]);
}

std::span<const int64_t> PackedDataset::packed_lengths(int64_t index) const {
  const auto first = static_cast<size_t>(rows_.offsets[static_cast<size_t>(index)]);
  const auto end = static_cast<size_t>(rows_.offsets[static_cast<size_t>(index) + 1]);
  return std::span<const int64_t>(lengths_).subspan(first, end - first);
}

void PackedDataset::fill_row(int64_t index, int64_t epoch, const Batch& batch, int64_t row) const {
  const int64_t T = batch.input_ids.dim(1);
  int64_t at = 0;
  for (int64_t k = rows_.offsets[static_cast<size_t>(index)];
       k < rows_.offsets[static_cast<size_t>(index) + 1]; ++k) {
    const int64_t len = lengths_[static_cast<size_t>(k)];
    inner_->fill_row(rows_.samples[static_cast<size_t>(k)], epoch,
                     token_view(batch, row * T + at, len, row), 0);
    at += len;
  }
}

int64_t PackedDataset::count_targets(int64_t index, int64_t epoch) const {
  int64_t n = 0;
  for (int64_t k = rows_.offsets[static_cast<size_t>(index)];
       k < rows_.offsets[static_cast<size_t>(index) + 1]; ++k)
    n += inner_->count_targets(rows_.samples[static_cast<size_t>(k)], epoch);
  return n;
}

double PackedDataset::fill_ratio() const {
  const int64_t tokens = std::accumulate(lengths_.begin(), lengths_.end(), int64_t{0});
  return static_cast<double>(tokens) /
         static_cast<double>(std::max<int64_t>(1, size()) * row_length_);
}

}  // namespace brisk
