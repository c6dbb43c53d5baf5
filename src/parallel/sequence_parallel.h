// Sequence parallelism's group (models/sequence_parallel.h) over a communicator: the mesh's
// sequence dimension, whose all-to-alls exchange tokens for heads around attention.
#pragma once

#include <memory>

#include "models/config.h"
#include "models/sequence_parallel.h"
#include "parallel/communicator.h"

namespace brisk {

// The group over `comm` (which outlives it), counting the bytes it exchanges.
class CommunicatorSequenceGroup final : public SequenceGroup {
 public:
  explicit CommunicatorSequenceGroup(Communicator& comm) : comm_(comm) {}
  int rank() const override { return comm_.rank(); }
  int size() const override { return comm_.size(); }
  void all_to_all(Backend& be, const Tensor& in, const Tensor& out) override;
  // The bytes this rank sent (its own chunk included) and the seconds the exchanges took (all of
  // them waited for: an all-to-all blocks), since the start.
  double bytes() const { return bytes_; }
  double seconds() const { return seconds_; }

 private:
  Communicator& comm_;
  double bytes_ = 0, seconds_ = 0;
};

// The bytes one rank of `ranks` passes to all_to_all per step (its own chunk included; it sends
// (ranks - 1) / ranks of them): each block of each of `micro_batches` micro-batches of
// [batch, seq] exchanges its qkv and attention output forward (again in backward under gradient
// checkpointing, but for the last block), and its attention output's gradient, the output itself
// (`ctx_bytes` an element: its saved type) and the qkv gradient backward, float32 but the saved
// output; key/value heads fewer than the ranks count once per copy. `c` is the config of a
// tensor rank's share where there is one.
double sequence_exchange_bytes(const ModelConfig& c, int64_t batch, int64_t seq, int ranks,
                               int64_t micro_batches, bool checkpointing, int64_t ctx_bytes);

}  // namespace brisk
