// brisk's own rendezvous for torchrun-style launches without MPI (torchrun, Slurm setups that
// give every process RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT): rank 0 serves a small
// key/value store over TCP on LaunchInfo::rendezvous_port, BRISK_RENDEZVOUS_PORT or else
// MASTER_PORT + 1, never MASTER_PORT itself, which torchrun's own store already holds. Every
// other rank connects to MASTER_ADDR on that port and greets rank 0 with the protocol's magic,
// its rank and the world size, which rank 0 checks (one connection per rank, the same world
// size). NCCL's unique id and Gloo's addresses go through it. Every wait is bounded by the
// timeout and fails with a message saying what was missing.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "parallel/launch.h"

namespace brisk {

class RendezvousStore {
 public:
  // Rank 0 listens (a port already taken is refused, naming it and the way to choose another)
  // and serves from a thread of its own; the others connect, trying again until rank 0 listens.
  // Everything waits at most `timeout_seconds` from here.
  RendezvousStore(const LaunchInfo& launch, double timeout_seconds);
  ~RendezvousStore();
  RendezvousStore(const RendezvousStore&) = delete;
  RendezvousStore& operator=(const RendezvousStore&) = delete;

  void set(const std::string& key, const std::vector<uint8_t>& value);
  // Waits until some rank has set `key`, and returns its value.
  std::vector<uint8_t> get(const std::string& key);
  // Rank 0: returns when every other rank has connected and hung up (each is done with the
  // store), or throws what went wrong while serving (a stranger on the port, a rank connecting
  // twice, another world size) or which ranks did not come in time. Other ranks: hang up.
  void finish();

 private:
  struct Server;
  struct Client;
  std::unique_ptr<Server> server_;  // rank 0
  std::unique_ptr<Client> client_;  // the others
};

// Rank 0: sends `blob` to every other rank and returns it. Other ranks: return the `blob_size`
// bytes rank 0 sent (their `blob` is ignored). Through a RendezvousStore.
std::vector<uint8_t> rendezvous_share(const LaunchInfo& launch, const std::vector<uint8_t>& blob,
                                      size_t blob_size, double timeout_seconds);

// Whether the connected socket `fd` is connected to itself: a connection to a port of this host
// that nobody listens on yet may be given that port as its own (TCP's simultaneous open), and
// would then keep rank 0 from listening there. Other ranks' connections to it are retried.
bool connected_to_itself(int fd);

}  // namespace brisk
