// Synthetic samples from the counter-based RNG.
#include "data/synthetic.h"

#include <algorithm>

#include "core/rng.h"

namespace brisk {

SyntheticDataset::SyntheticDataset(const SyntheticOptions& options, int64_t vocab_size,
                                   bool causal_lm)
    : options_(options), causal_lm_(causal_lm) {
  BRISK_CHECK(options.dataset_size > 0, "synthetic dataset size must be positive");
  BRISK_CHECK(options.seq_len > 0, "synthetic sequence length must be positive");
  BRISK_CHECK(options.task == "random" || options.task == "learnable", "unknown synthetic task \"",
              excerpt(options.task), "\" (valid: random, learnable)");
  options_.id_high = static_cast<int32_t>(std::min<int64_t>(options.id_high, vocab_size));
  BRISK_CHECK(options_.id_low < options_.id_high, "the vocabulary of ", vocab_size,
              " tokens leaves no room for synthetic ids from ", options.id_low);
}

void SyntheticDataset::fill_row(int64_t index, int64_t, const Batch& batch, int64_t row) const {
  const int64_t T = batch.input_ids.dim(1);
  BRISK_CHECK(T >= options_.seq_len, "batch buffers are shorter than the synthetic sequences");
  int32_t* ids = batch.input_ids.i32() + row * T;
  int32_t* mask = batch.attention_mask.i32() + row * T;
  const uint32_t span = static_cast<uint32_t>(options_.id_high - options_.id_low);
  const RngKey key{options_.seed, static_cast<uint64_t>(index), 0x5eed};
  const bool learnable = options_.task == "learnable";
  const uint32_t start = rng_block(key, ~uint64_t{0}).v[0] % span;
  const uint32_t stride = 1 + rng_block(key, ~uint64_t{0}).v[1] % 3;
  for (int64_t t = 0; t < T; ++t) {
    const bool real = t < options_.seq_len;
    const uint32_t r = learnable && causal_lm_ ? (start + stride * static_cast<uint32_t>(t)) % span
                                               : rng_block(key, t >> 2).v[t & 3] % span;
    ids[t] = real ? options_.id_low + static_cast<int32_t>(r) : 0;
    mask[t] = real ? 1 : 0;
  }
  if (causal_lm_) {
    int32_t* labels = batch.labels.i32() + row * T;
    for (int64_t t = 0; t < T; ++t) labels[t] = mask[t] ? ids[t] : kIgnoreIndex;
  } else {
    const int32_t label =
        learnable ? (ids[0] - options_.id_low < static_cast<int32_t>(span / 2) ? 1 : 0) : 0;
    if (!batch.label_values.empty())  // regression: the same target as a number
      batch.label_values.f32()[row] = static_cast<float>(label);
    else
      batch.labels.i32()[row] = label;
    if (!batch.token_type_ids.empty())
      std::fill(batch.token_type_ids.i32() + row * T, batch.token_type_ids.i32() + (row + 1) * T,
                0);
  }
}

}  // namespace brisk
