// Whether the ranks of a launch were started alike: every rank names the values that must agree
// (its resolved layout, the options that shape a step, the model's shapes), rank 0's are sent to
// all, and the first that differs anywhere is refused on every rank, naming it and both values,
// before any rank builds a mesh or a model on it (ranks that disagree would otherwise wait for
// each other until --ddp_timeout, or train apart).
#pragma once

#include <string>
#include <vector>

#include "parallel/communicator.h"

namespace brisk {

struct AgreedValue {
  std::string name;   // as the user gave it: "--tp_size", "config.json's intermediate_size"
  std::string value;  // as text
};

// Every rank calls it with the same names in the same order (collective).
void check_ranks_agree(Communicator& comm, const std::vector<AgreedValue>& values);

// Rank `root`'s text, on every rank (collective).
std::string broadcast_text(Communicator& comm, const std::string& text, int root);

}  // namespace brisk
