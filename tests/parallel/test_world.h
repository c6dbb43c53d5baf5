#pragma once

#include <memory>
#include <string>

#include "parallel/communicator.h"

namespace brisk::testing {

// The communicator of this job (dist_main.cpp): MPI's under mpirun, else Gloo's.
Communicator& world();

// An NCCL communicator of the job's ranks (bootstrapped through world(), one GPU per rank), or
// null with the reason there is none (no NCCL in this build, no usable GPU, fewer GPUs than
// ranks) in `why`: the same answer on every rank.
std::unique_ptr<Communicator> nccl_world(std::string* why);

}  // namespace brisk::testing
