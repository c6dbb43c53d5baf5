// Incremental decoding with a key/value cache (brisk generate): a causal LM's forward pass over
// the new tokens only, each block attending to the cached keys and values of the earlier ones.
// The model is planned with weights_only; the decoder plans the caches for `max_tokens` positions
// and the working buffers for `max_chunk` tokens fed at once (the prompt), so a generation's
// memory is known before it starts.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "core/memory_plan.h"
#include "models/model.h"
#include "models/transformer_block.h"

namespace brisk {

class Decoder {
 public:
  Decoder(const Model& model, int64_t max_tokens, int64_t max_chunk);
  void plan(MemoryPlan& plan, BufferBinder& binder);
  // After the arena is bound: forget every cached position.
  void reset() { position_ = 0; }
  // Runs ids at the next positions; returns the logits after the last one (host, float32
  // [vocab_size], valid until the next call).
  const float* feed(Backend& be, const std::vector<int32_t>& ids);
  int64_t position() const { return position_; }
  int64_t max_tokens() const { return max_tokens_; }

 private:
  const Model& model_;
  int64_t max_tokens_, max_chunk_;
  int64_t position_ = 0;
  std::vector<Tensor> k_cache_, v_cache_;  // per layer, [1, max_tokens, C]
  Tensor ids_host_, ids_;                  // int32 [1, max_chunk]; on the CPU the same buffer
  Tensor x_, y_;                           // the hidden states in and out of a block
  DecodeScratch scratch_;
  Tensor last_, normed_, mean_, rstd_, logits_, logits_host_;
};

}  // namespace brisk
