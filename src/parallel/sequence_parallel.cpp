// Sequence parallelism's all-to-all over a communicator.
#include "parallel/sequence_parallel.h"

#include <algorithm>
#include <chrono>

namespace brisk {

void CommunicatorSequenceGroup::all_to_all(Backend&, const Tensor& in, const Tensor& out) {
  const auto start = std::chrono::steady_clock::now();
  comm_.all_to_all(in, out);
  seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  bytes_ += static_cast<double>(in.bytes());
}

double sequence_exchange_bytes(const ModelConfig& c, int64_t batch, int64_t seq, int ranks,
                               int64_t micro_batches, bool checkpointing, int64_t ctx_bytes) {
  const double tokens = static_cast<double>(batch) * static_cast<double>(seq / ranks);
  // Key/value heads fewer than the ranks: each rank receives a copy of one.
  const auto kv = static_cast<double>(std::max<int64_t>(c.kv_heads(), ranks));
  const double qkv =
      (static_cast<double>(c.num_heads) + 2 * kv) * static_cast<double>(c.head_dim());
  const auto ctx = static_cast<double>(c.attention_width());
  const double forward = tokens * (qkv + ctx) * 4;
  const double backward = tokens * ((qkv + ctx) * 4 + ctx * static_cast<double>(ctx_bytes));
  const auto layers = static_cast<double>(c.num_layers);
  const double again = checkpointing ? (layers - 1) * forward : 0;
  return static_cast<double>(micro_batches) * (layers * (forward + backward) + again);
}

}  // namespace brisk
