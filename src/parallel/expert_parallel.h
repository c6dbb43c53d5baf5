// Expert parallelism's group (models/moe_layer.h) over a communicator: the ranks that hold a
// mixture-of-experts layer's experts between them, exchanging routed rows by all-to-all.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "models/config.h"
#include "models/model.h"
#include "models/moe_layer.h"
#include "parallel/communicator.h"
#include "parallel/policy.h"

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

// Expert parallelism (DeepSpeed-MoE's, over the mesh's expert runs of data ranks) around `inner`,
// the policy over the ranks that hold the same experts (the model is its expert rank's share of
// the whole model of config `full`, expert_parallel_share): the experts' gradients are those
// ranks' sums; the rest, alike on every rank, are summed over `experts` too (so over every rank),
// as are the step's statistics. The gradients' norm counts each element of the whole model once;
// saves write the whole model, each expert read from its rank (and its ZeRO runs), and a
// checkpoint's optimizer state is laid out as one process's.
std::unique_ptr<ParallelPolicy> make_expert_parallel(const ParallelContext& c,
                                                     std::unique_ptr<ParallelPolicy> inner);

}  // namespace brisk
