// The model states each rank of a data-parallel run holds (`brisk estimate` over several ranks):
// weights, float32 master copy, gradients and optimizer state, from rank 0's plan and the
// partition of the parameters (ZeRO), per rank and per parameter as the ZeRO paper's formula.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "core/memory_plan.h"
#include "parallel/zero.h"

namespace brisk {

struct RankSharesInput {
  int world = 1;
  std::array<size_t, kNumCategories> planned{};  // rank 0's plan, by category
  size_t host_gradient_bytes = 0;       // offload_optimizer: rank 0's host copy of its gradients
  int64_t params = 0;                   // the whole model's parameter elements
  int64_t trained = -1;                 // the trained ones ZeRO partitions (-1: all of them)
  std::vector<ParamShard> shards;       // every rank's parameters; empty: nothing partitioned
  bool sharded_weights = false;         // stage 3: a rank keeps its shard of the weights
  bool sharded_gradients = false;       // stage 2: a rank keeps its shard of the summed gradients
  bool sharded_master = false;          // the float32 master copy partitioned with the optimizer
  bool offload = false;                 // master, optimizer state and a gradient copy on the host
  std::vector<double> optimizer_state;  // bytes per rank (world values)
};

struct RankShare {
  int rank = 0;
  double params = 0, weights = 0, master = 0, gradients = 0, optimizer_state = 0, host = 0;
  double total() const { return weights + master + gradients + optimizer_state; }
};

// Bytes per parameter, per rank, by the stage's formula (each partitioned state 4 / world).
struct RankShares {
  std::vector<RankShare> ranks;
  double weights = 0, master = 0, gradients = 0, optimizer = 0, model_states = 0;
  double host = 0, device = 0;  // offload_optimizer: on the host, and the rest on the device
  // What every rank holds alike, before its share of a partitioned state: the weights the model
  // keeps whole (stage 3: embeddings, head, slots), the master copy unpartitioned, the gradients
  // staged.
  double weights_alike = 0, master_alike = 0, gradients_alike = 0;
  double largest = 0;  // the largest rank's model states
};

RankShares rank_shares(const RankSharesInput& in);

}  // namespace brisk
