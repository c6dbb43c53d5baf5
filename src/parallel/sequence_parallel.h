// Sequence parallelism's group (models/sequence_parallel.h) over a communicator: the mesh's
// sequence dimension, whose all-to-alls exchange tokens for heads around attention.
#pragma once

#include <memory>

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
  // The bytes this rank sent (its own chunk included) since the start.
  double bytes() const { return bytes_; }

 private:
  Communicator& comm_;
  double bytes_ = 0;
};

}  // namespace brisk
