// Compiled instead of the CUDA backend when the build has no CUDA toolkit.
#include "backend/backend.h"

namespace brisk {

bool cuda_available(std::string* why_not) {
  if (why_not) *why_not = "this brisk was built without the CUDA toolkit";
  return false;
}

int cuda_device_count() {
  return 0;
}

std::unique_ptr<Backend> make_cuda_backend(const Switches&) {
  BRISK_FAIL(
      "--device cuda: this brisk was built without the CUDA toolkit; rebuild on a machine "
      "with nvcc, or use --device cpu");
}

}  // namespace brisk
