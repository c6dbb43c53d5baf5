// What the trainer reads samples from: a fixed number of samples, each written into one row of
// a batch's buffers (input ids, attention mask, labels, token types).
#pragma once

#include <cstdint>
#include <span>

#include "data/batch.h"

namespace brisk {

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  virtual int64_t seq_len() const = 0;
  // Writes sample `index` as drawn in `epoch` into row `row` of `batch` (rows are reset to
  // defaults beforehand). Most samples are the same in every epoch; a masked LM's masks are
  // drawn anew per epoch, as the data collator draws them per batch. Evaluation reads epoch 0.
  virtual void fill_row(int64_t index, int64_t epoch, const Batch& batch, int64_t row) const = 0;
  // Loss targets the sample contributes in `epoch` (1 for classification; for causal LM the
  // positions t >= 1 with a label; for masked LM the masked tokens), so the loss of an
  // accumulated batch can be normalized up front.
  virtual int64_t count_targets(int64_t index, int64_t epoch) const = 0;
  // Tokens of sample `index` before padding (what dynamic padding and group_by_length read);
  // the full sequence length unless the dataset knows better.
  virtual int64_t length(int64_t index) const {
    (void)index;
    return seq_len();
  }
  // A packed dataset's (data/packing.h): the lengths of the samples sample `index` lays end to
  // end from its first token, which attend and number their positions apart. Empty: the sample
  // is one.
  virtual std::span<const int64_t> packed_lengths(int64_t index) const {
    (void)index;
    return {};
  }
};

}  // namespace brisk
