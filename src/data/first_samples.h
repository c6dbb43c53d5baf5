// The first samples of another dataset: the example scripts' max_train_samples,
// max_eval_samples and max_predict_samples (dataset.select(range(n))).
#pragma once

#include <algorithm>
#include <memory>

#include "data/dataset.h"

namespace brisk {

class FirstSamples : public Dataset {
 public:
  FirstSamples(std::unique_ptr<Dataset> inner, int64_t count)
      : inner_(std::move(inner)), size_(std::min(count, inner_->size())) {}
  int64_t size() const override { return size_; }
  int64_t seq_len() const override { return inner_->seq_len(); }
  void fill_row(int64_t index, int64_t epoch, const Batch& batch, int64_t row) const override {
    inner_->fill_row(index, epoch, batch, row);
  }
  int64_t count_targets(int64_t index, int64_t epoch) const override {
    return inner_->count_targets(index, epoch);
  }
  int64_t length(int64_t index) const override { return inner_->length(index); }

 private:
  std::unique_ptr<Dataset> inner_;
  int64_t size_;
};

// `data` cut to its first `count` samples; `count` 0 (or null data) keeps it whole.
inline std::unique_ptr<Dataset> first_samples(std::unique_ptr<Dataset> data, int64_t count) {
  if (!data || count <= 0 || count >= data->size()) return data;
  return std::make_unique<FirstSamples>(std::move(data), count);
}

}  // namespace brisk
