// The groups a model's share runs in, which its layers exchange over: one value, filled from
// outside by the run's parallel layout (parallel/layout.h's make_parallel) and consulted by the
// model and its blocks alone. The groups' interfaces are the model's (sequence_parallel.h,
// moe_layer.h); their communicator versions are parallel/'s.
#pragma once

#include "models/sequence_parallel.h"

namespace brisk {

class ExpertGroup;  // moe_layer.h

// The groups a model's share of a parallel layout runs in; none (nullptr) where the layout does
// not split the model that way.
struct ModelParallelism {
  // Tensor parallelism (config().tensor_ranks ranks): the blocks sum their partial products over
  // it; under Megatron's sequence parallelism the residual stream holds this rank's slice of the
  // tokens.
  TensorGroup* tensor = nullptr;
  // Sequence parallelism (config().sequence_ranks ranks, sequence_parallel.h): the batch the
  // loader writes holds whole sequences; the model computes on its rank's tokens of them (the
  // planned length must split evenly), attention on every token of its share of the heads.
  SequenceGroup* sequence = nullptr;
  // Expert parallelism (config().moe.expert_ranks ranks, models/moe_layer.h): the ranks hold the
  // experts between them, this model its rank's.
  ExpertGroup* experts = nullptr;
};

}  // namespace brisk
