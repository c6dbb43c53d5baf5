// The build without MPI: a run launched by mpirun is refused with a message saying why.
#include "core/error.h"
#include "parallel/communicator.h"

namespace brisk {

std::unique_ptr<Communicator> make_mpi(const LaunchInfo& launch, double /*timeout_seconds*/) {
  BRISK_FAIL("this process is rank ", launch.rank, " of ", launch.size,
             " of an MPI launch, but brisk was built without MPI (install libopenmpi-dev and "
             "rebuild)");
}

bool mpi_built_in() {
  return false;
}

}  // namespace brisk
