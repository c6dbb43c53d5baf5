// The build without NCCL (no CUDA toolkit, or one without NCCL): asking for it is refused.
#include "core/error.h"
#include "parallel/communicator.h"

namespace brisk {

std::unique_ptr<Communicator> make_nccl(const LaunchInfo&, Communicator*, Device, double) {
  BRISK_FAIL(
      "brisk was built without NCCL (it comes with the CUDA toolkit; rebuild where nvcc "
      "and nccl.h are found)");
}

bool nccl_built_in() {
  return false;
}

}  // namespace brisk
