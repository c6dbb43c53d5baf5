// Tensor parallelism (Megatron-LM's) around data parallelism: the ranks of the mesh's tensor
// dimension hold each block's heads and MLP width between them (a model made from
// tensor_parallel_share, models/config.h) and the rest of the model alike; the mesh's data
// dimension runs the data-parallel policy (DDP or ZeRO) over the replicas. This policy counts the
// gradients' norm once per element and saves the full parameters, gathered from the tensor ranks'
// shares (and their ZeRO runs).
#pragma once

#include <memory>

#include "models/model.h"
#include "parallel/policy.h"

namespace brisk {

// The tensor group over a communicator, counting the bytes it sums (all-reduces), the bytes of
// the whole tensors it gathers and reduce-scatters (Megatron's sequence parallelism), and the
// seconds that takes.
class CommunicatorTensorGroup final : public TensorGroup {
 public:
  explicit CommunicatorTensorGroup(Communicator& comm) : comm_(comm) {}
  int rank() const override { return comm_.rank(); }
  int size() const override { return comm_.size(); }
  void all_reduce_sum(Backend&, const Tensor& buf) override {
    timed([&] { comm_.all_reduce_sum(buf); });
    bytes_ += static_cast<double>(buf.bytes());
  }
  void all_gather(Backend&, const Tensor& in, const Tensor& out) override {
    timed([&] { comm_.all_gather(in, out); });
    token_bytes_ += static_cast<double>(out.bytes());
  }
  void reduce_scatter_sum(Backend&, const Tensor& in, const Tensor& out) override {
    timed([&] { comm_.reduce_scatter_sum(in, out); });
    token_bytes_ += static_cast<double>(in.bytes());
  }
  double bytes() const { return bytes_; }
  double token_bytes() const { return token_bytes_; }
  // The seconds since the last call.
  double take_seconds() { return std::exchange(seconds_, 0.0); }

 private:
  Communicator& comm_;
  double bytes_ = 0, token_bytes_ = 0, seconds_ = 0;

  template <typename Op>
  void timed(Op op) {
    const auto start = std::chrono::steady_clock::now();
    op();
    seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
};

// Tensor parallelism over the mesh's tensor dimension (of more than one rank) around `inner`, the
// policy over the mesh's replicas (made from the buffers: ZeRO's partition of this rank's share
// among them, or none), summing over `group`, the model's tensor group. The optimizer, where its
// state is not one value per parameter element, the group to sum a split parameter's statistics
// over (Optimizer::join_split_group); refused where it cannot (its step would depend on how the
// parameters are split).
std::unique_ptr<ParallelPolicy> make_tensor_parallel(const ParallelContext& c,
                                                     CommunicatorTensorGroup& group,
                                                     std::unique_ptr<ParallelPolicy> inner);

// The tensor group the policy gives the model, over `comm` (which outlives it).
std::unique_ptr<TensorGroup> make_tensor_group(Communicator& comm);

}  // namespace brisk
