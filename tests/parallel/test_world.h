#pragma once

#include <memory>
#include <string>

#include "parallel/communicator.h"
#include "parallel/launch.h"

namespace brisk::testing {

// Whether this job's ranks talk through MPI (mpirun), not Gloo (torchrun), which has no
// sub-communicators, point to point or all-to-all yet: the tests of what needs them skip there.
inline bool on_mpi() {
  return launch_info_from_env().launcher == Launcher::mpi;
}
#define NEEDS_MPI()                                                                          \
  if (!on_mpi())                                                                             \
  GTEST_SKIP() << "Gloo has no sub-communicators, point to point or all-to-all yet (tensor " \
                  "parallelism runs on MPI)"

// The communicator of this job (dist_main.cpp): MPI's under mpirun, else Gloo's.
Communicator& world();

// An NCCL communicator of the job's ranks (bootstrapped through world(), one GPU per rank), or
// null with the reason there is none (no NCCL in this build, no usable GPU, fewer GPUs than
// ranks) in `why`: the same answer on every rank.
std::unique_ptr<Communicator> nccl_world(std::string* why);

}  // namespace brisk::testing
