// Pipeline parallelism (GPipe's stages, run in PipeDream-Flush's 1F1B order as Megatron-LM runs
// them) around data parallelism: the ranks of the mesh's pipeline dimension hold an equal run of
// the blocks each (a model made from pipeline_share, models/config.h), the first stage the
// embeddings and the last the head, a tied head's embeddings on both. A step's micro-batches pass
// through the stages, each stage's output sent to the next and the gradient of its input back to
// the one before. A stage before the last keeps only its input of each micro-batch in flight
// (and the batch) and recomputes its forward just before the micro-batch's backward: its
// activations are one micro-batch's. The tied embeddings' gradients are summed between the first
// and last stages, so both copies take the same steps. Saves write the whole model, read from
// the stages.
#pragma once

#include <memory>

#include "models/model.h"
#include "parallel/mesh.h"
#include "parallel/policy.h"

namespace brisk {

// The stage inputs a model of config `c` keeps for backward (PlanOptions::stashed_inputs): a
// stage between the first and the last holds at most (stages - stage) micro-batches in flight;
// the first recomputes its input from the batch, and the last runs each backward right after its
// forward.
int pipeline_stashed_inputs(const ModelConfig& c);

// Pipeline parallelism over the mesh's pipeline dimension (of more than one rank) around `inner`,
// the policy over the mesh's replicas (DDP, or ZeRO stage 1 made from the buffers), or tensor
// parallelism's around it. The model is this rank's stage of the whole model of config `full`.
// Refuses an optimizer whose state is not one value per parameter element (a checkpoint lays its
// state out as one process's).
std::unique_ptr<ParallelPolicy> make_pipeline_parallel(const ParallelContext& c,
                                                       std::unique_ptr<ParallelPolicy> inner);

}  // namespace brisk
