// A torchrun-style rendezvous without MPI (Slurm or torchrun setups that give every process
// RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT): rank 0 listens on MASTER_PORT and hands a
// blob of its bytes (NCCL's unique id) to every other rank, which connects to
// MASTER_ADDR:MASTER_PORT. A connecting rank first greets rank 0 with the protocol's magic, its
// rank and the world size, which rank 0 checks (one connection per rank, the same world size).
// Everything waits at most `timeout_seconds`, then fails with a message saying what was missing.
#pragma once

#include <cstdint>
#include <vector>

#include "dist/launch.h"

namespace brisk {

// Rank 0: sends `blob` to every other rank and returns it. Other ranks: return the
// `blob_size` bytes rank 0 sent (their `blob` is ignored).
std::vector<uint8_t> rendezvous_share(const LaunchInfo& launch, const std::vector<uint8_t>& blob,
                                      size_t blob_size, double timeout_seconds);

}  // namespace brisk
