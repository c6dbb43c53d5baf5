// How this process was launched: its rank among how many, as an MPI launcher (mpirun, srun with
// PMIx) or a torchrun-style launcher (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT)
// tells it through the environment. Read once at start; contradicting or out-of-range values are
// refused with a message naming the variable. BRISK_RENDEZVOUS_PORT picks the port of brisk's
// own rendezvous.
#pragma once

#include <functional>
#include <optional>
#include <string>

namespace brisk {

enum class Launcher { none, mpi, torchrun };

struct LaunchInfo {
  Launcher launcher = Launcher::none;
  int rank = 0, size = 1, local_rank = 0;
  std::string master_addr;  // torchrun-style rendezvous, where given
  int master_port = 0;
  // brisk's own rendezvous (parallel/rendezvous.h): BRISK_RENDEZVOUS_PORT, else MASTER_PORT + 1
  // (torchrun's own store holds MASTER_PORT); 0 when neither gives one.
  int rendezvous_port = 0;
};

// Looks a variable up; empty when unset. The default reads the process environment.
using EnvLookup = std::function<std::optional<std::string>(const std::string&)>;
LaunchInfo launch_info_from_env(const EnvLookup& env = {});
const char* launcher_name(Launcher l);

}  // namespace brisk
