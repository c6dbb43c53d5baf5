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

// Tensor parallelism over the mesh's tensor dimension (of more than one rank) around `inner`, the
// policy over the mesh's replicas (made from the buffers: ZeRO's partition of this rank's share
// among them, or none). The model's blocks get their group, and the optimizer, where its state is
// not one value per parameter element, the group to sum a split parameter's statistics over
// (Optimizer::join_split_group); refused where it cannot (its step would depend on how the
// parameters are split).
std::unique_ptr<ParallelPolicy> make_tensor_parallel(const ParallelContext& c,
                                                     std::unique_ptr<ParallelPolicy> inner);

// The tensor group the policy gives the model, over `comm` (which outlives it).
std::unique_ptr<TensorGroup> make_tensor_group(Communicator& comm);

}  // namespace brisk
