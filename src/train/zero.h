// ZeRO stage 1 (Rajbhandari et al. 2020): the optimizer state partitioned among the ranks of a
// data-parallel run. Each rank keeps the state of one contiguous run of whole parameters and
// updates only those; the updated weights are then gathered from their owners. Shards end at
// parameter boundaries so that every optimizer works sharded as it is: Adafactor's per-matrix
// row and column statistics and 8-bit AdamW's per-parameter blocks never straddle two ranks, and
// every optimizer lays its state out parameter after parameter, so the ranks' states laid end
// to end are one process's state (what checkpoints hold, whatever the number of ranks).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "models/parameters.h"

namespace brisk {

class Communicator;
class Optimizer;

struct ParamShard {
  int first = 0, last = 0;  // parameters [first, last)
  ElementRange elements;    // their elements in the flat buffers
};

// `ranks` contiguous runs of whole parameters, each as close to 1/ranks of the elements as the
// parameter boundaries allow (a rank's share may be empty when a parameter outweighs the rest).
std::vector<ParamShard> partition_params(const ParameterSet& params, int ranks);
// The parameters of `shard` as a set of their own (offsets from the shard's first element):
// what a rank's optimizer is planned for.
ParameterSet shard_params(const ParameterSet& params, const ParamShard& shard);

// The optimizer state of every rank laid end to end in rank order, name by name (host copies,
// on every rank): one process's state.
std::vector<std::pair<std::string, std::vector<uint8_t>>> gather_optimizer_state(
    Communicator& comm, const Optimizer& optimizer);

}  // namespace brisk
