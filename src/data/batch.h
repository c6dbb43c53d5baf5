// What the data code fills and a model reads: the batch's buffers (views of the arena), their
// shape, and what a model declares its batches hold. Data knows no architecture; a model knows no
// dataset.
#pragma once

#include <cstdint>

#include "core/packed_samples.h"
#include "core/tensor.h"

namespace brisk {

struct BatchShape {
  int64_t batch = 0;
  int64_t seq = 0;
};

// Views of the arena's data buffers; whoever feeds the model writes into them.
struct Batch {
  Tensor input_ids;       // int32 [B,T]
  Tensor attention_mask;  // int32 [B,T], 1 for real tokens, 0 for padding
  Tensor token_type_ids;  // int32 [B,T] (BERT only; empty for GPT-2)
  Tensor labels;          // int32 [B] (classification) or [B,T] (causal LM), kIgnoreIndex = none
  Tensor label_values;    // float32 [B]: regression targets, NaN = none (labels is then empty)
};

// Tokens [at, at + len) of the batch's B * T tokens taken row after row (within one row) as a
// batch of one row, its label (classification, regression) that of row `label_row`: where a
// padding-free or packed batch's sample is written.
Batch token_view(const Batch& batch, int64_t at, int64_t len, int64_t label_row);

// A regression target's "no label", as kIgnoreIndex is a class label's.
inline bool no_label_value(float y) {
  return y != y;
}
// Sets every regression target of the batch (if it has them) to "no label".
void reset_label_values(const Batch& batch);
// Whether attention mask [B,T] is right-padded: each row keeps (nonzero) its first n keys, n >= 1,
// and no later one. If so, each row's n into lengths (int32 [B]); if not, lengths is left part
// written.
bool right_padded_lengths(const Tensor& mask, const Tensor& lengths);

// What a model's batches hold, as the model declares it: the data code fills them without knowing
// the architecture.
struct BatchLayout {
  int64_t batch = 0, seq = 0;
  bool token_types = false;       // token_type_ids (BERT)
  bool labels_per_token = false;  // causal LM: labels [B,T]; classification: [B]
  bool regression = false;        // label_values [B] instead of labels
};

// What a DataLoader fills: a model's batch buffers, shaped per micro-batch.
class BatchTarget {
 public:
  virtual ~BatchTarget() = default;
  // The buffers shaped for rows of `seq` tokens (1 to the planned length).
  virtual void use_seq(int64_t seq) = 0;
  // The next batch's samples laid end to end (padding-free), or none (rows of one sample each);
  // after use_seq, which drops them.
  virtual void use_samples(const PackedSamples& samples) = 0;
  virtual const Batch& batch() const = 0;
};

}  // namespace brisk
