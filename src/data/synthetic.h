// The seeds' dummy dataset: random token ids in [100, 30000) and labels as the seeds draw them
// (np.random.randint(0, 1) is always 0), generated per sample from (seed, index) so it needs no
// storage. For causal LM the labels are the input ids.
#pragma once

#include <cstdint>

#include "models/model.h"

namespace brisk {

struct SyntheticOptions {
  int64_t dataset_size = 512;
  int64_t seq_len = 512;
  int32_t id_low = 100;
  int32_t id_high = 30000;  // exclusive; clipped to the vocabulary
  uint64_t seed = 42;
};

class SyntheticDataset {
 public:
  SyntheticDataset(const SyntheticOptions& options, const ModelConfig& config);
  int64_t size() const { return options_.dataset_size; }
  int64_t seq_len() const { return options_.seq_len; }
  // Writes sample `index` into row `row` of the model's batch buffers.
  void fill_row(int64_t index, const Batch& batch, int64_t row) const;

 private:
  SyntheticOptions options_;
  bool causal_lm_;
};

}  // namespace brisk
