// Expert parallelism's group (models/moe_layer.h) over a communicator: the ranks that hold a
// mixture-of-experts layer's experts between them, exchanging routed rows by all-to-all.
#pragma once

#include <cstdint>
#include <vector>

#include "models/moe_layer.h"
#include "parallel/communicator.h"

namespace brisk {

// The group over `comm` (which outlives it), counting the bytes it sends.
class CommunicatorExpertGroup final : public ExpertGroup {
 public:
  explicit CommunicatorExpertGroup(Communicator& comm) : comm_(comm) {}
  int rank() const override { return comm_.rank(); }
  int size() const override { return comm_.size(); }
  std::vector<int32_t> all_gather(const std::vector<int32_t>& counts) override;
  void all_to_all_v(Backend& be, const Tensor& in, const std::vector<int64_t>& send,
                    const Tensor& out, const std::vector<int64_t>& receive) override;
  // The bytes of rows this rank passed to the exchanges (its own included) and the seconds they
  // took (all waited for), since the start.
  double bytes() const { return bytes_; }
  double seconds() const { return seconds_; }

 private:
  Communicator& comm_;
  double bytes_ = 0, seconds_ = 0;
};

}  // namespace brisk
