// The build without Gloo: CPU ranks of a torchrun-style launch are refused with a message saying
// why and what else starts them.
#include "core/error.h"
#include "parallel/communicator.h"

namespace brisk {

std::unique_ptr<Communicator> make_gloo(const LaunchInfo& launch, double /*timeout_seconds*/) {
  BRISK_FAIL("this process is rank ", launch.rank, " of ", launch.size,
             " of a torchrun-style launch (RANK, WORLD_SIZE) on the CPU, whose ranks communicate "
             "through Gloo, but brisk was built without Gloo (install libgloo-dev and rebuild, "
             "or start the ranks with mpirun -np ",
             launch.size, ")");
}

bool gloo_built_in() {
  return false;
}

}  // namespace brisk
