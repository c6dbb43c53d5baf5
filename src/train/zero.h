// ZeRO stage 1 (Rajbhandari et al. 2020): the optimizer state partitioned among the ranks of a
// data-parallel run. Each rank keeps the state of one contiguous run of the flat parameters and
// updates only those; the updated weights are then gathered from their owners. Optimizers whose
// state is per element (AdamW, SGD) take equal runs, cut anywhere, as DeepSpeed does; the others
// take runs of whole parameters, so that Adafactor's per-matrix row and column statistics and
// 8-bit AdamW's per-parameter choice of 8 or 32 bits and its blocks never straddle two ranks.
// Every optimizer lays its state out element after element, parameter after parameter, so the
// ranks' states laid end to end are one process's state: what checkpoints hold, whatever the
// number of ranks.
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
  int first = 0, last = 0;  // the parameters [first, last) it holds all or part of
  ElementRange elements;    // its elements in the flat buffers
};

// `ranks` contiguous runs of the parameters. Split (`split_parameters`): equal runs of elements,
// the last shorter. Otherwise runs of whole parameters, each ending at the parameter boundary
// nearest to its share (a rank's run may be empty when a parameter outweighs the rest).
std::vector<ParamShard> partition_params(const ParameterSet& params, int ranks,
                                         bool split_parameters);
// The shard's elements as a set of parameters of their own (offsets from the shard's first
// element; a parameter cut by the shard's ends becomes its piece, flat, under its name): what a
// rank's optimizer is planned for.
ParameterSet shard_params(const ParameterSet& params, const ParamShard& shard);

// The optimizer state of every rank laid end to end in rank order, name by name (host copies,
// on every rank): one process's state.
std::vector<std::pair<std::string, std::vector<uint8_t>>> gather_optimizer_state(
    Communicator& comm, const Optimizer& optimizer);

}  // namespace brisk
