// The Hugging Face guides' dummy dataset: random token ids in [100, 30000) and labels as the guides
// draw them (np.random.randint(0, 1) is always 0), generated per sample from (seed, index) so it
// needs no storage. For causal LM the labels are the input ids.
#pragma once

#include <cstdint>
#include <string>

#include "data/dataset.h"

namespace brisk {

struct SyntheticOptions {
  int64_t dataset_size = 512;
  int64_t seq_len = 512;
  int32_t id_low = 100;
  int32_t id_high = 30000;  // exclusive; clipped to the vocabulary
  uint64_t seed = 42;
  // "random": the guides' dummy data (nothing to learn but the constant label). "learnable": for
  // classification the label says whether the first token is in the lower half of the id range;
  // for causal LM each sequence counts up by a fixed stride from a random start, so every token
  // after the second is predictable.
  std::string task = "random";
};

class SyntheticDataset final : public Dataset {
 public:
  // Samples for a model of `vocab_size` tokens: causal-LM samples (labels per token) when
  // `causal_lm`, else classification samples.
  SyntheticDataset(const SyntheticOptions& options, int64_t vocab_size, bool causal_lm);
  int64_t size() const override { return options_.dataset_size; }
  int64_t seq_len() const override { return options_.seq_len; }
  void fill_row(int64_t index, int64_t epoch, const Batch& batch, int64_t row) const override;
  int64_t count_targets(int64_t, int64_t) const override {
    return causal_lm_ ? options_.seq_len - 1 : 1;
  }

 private:
  SyntheticOptions options_;
  bool causal_lm_;
};

}  // namespace brisk
