#pragma once

#include "dist/communicator.h"

namespace brisk::testing {

// The communicator of this mpirun job (dist_main.cpp).
Communicator& world();

}  // namespace brisk::testing
