#include "parallel/launch.h"

#include <cstdlib>
#include <string>

#include "core/error.h"

namespace brisk {
namespace {

constexpr int kMaxRanks = 1 << 20;

// The value of `name` as an integer in [lo, hi]; empty when unset.
std::optional<int> int_var(const EnvLookup& env, const std::string& name, int lo, int hi) {
  const std::optional<std::string> v = env(name);
  if (!v) return std::nullopt;
  BRISK_CHECK(
      !v->empty() && v->size() <= 9 && v->find_first_not_of("0123456789") == std::string::npos,
      "environment variable ", name, "=\"", excerpt(*v), "\" is not a whole number");
  const int x = std::stoi(*v);
  BRISK_CHECK(x >= lo && x <= hi, "environment variable ", name, "=", x, " is outside [", lo, ", ",
              hi, "]");
  return x;
}

struct Triple {
  std::optional<int> rank, size, local;
  const char *rank_name, *size_name;
  bool any() const { return rank || size || local; }
};

// A launcher's rank and size, both or neither; rank below size.
void check_triple(const Triple& t) {
  BRISK_CHECK(t.rank.has_value() == t.size.has_value(), "environment variable ",
              t.rank ? t.size_name : t.rank_name, " is missing (",
              t.rank ? t.rank_name : t.size_name, " is set)");
  if (t.rank)
    BRISK_CHECK(*t.rank < *t.size, "environment variable ", t.rank_name, "=", *t.rank,
                " is not below ", t.size_name, "=", *t.size);
}

}  // namespace

const char* launcher_name(Launcher l) {
  switch (l) {
    case Launcher::none:
      return "none";
    case Launcher::mpi:
      return "MPI";
    case Launcher::torchrun:
      return "torchrun-style environment";
  }
  return "?";
}

LaunchInfo launch_info_from_env(const EnvLookup& lookup) {
  const EnvLookup env =
      lookup ? lookup : [](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    return v ? std::optional<std::string>(v) : std::nullopt;
  };
  // Open MPI's mpirun; MPICH's Hydra (mpiexec); then torchrun and its kin.
  Triple ompi{int_var(env, "OMPI_COMM_WORLD_RANK", 0, kMaxRanks),
              int_var(env, "OMPI_COMM_WORLD_SIZE", 1, kMaxRanks),
              int_var(env, "OMPI_COMM_WORLD_LOCAL_RANK", 0, kMaxRanks), "OMPI_COMM_WORLD_RANK",
              "OMPI_COMM_WORLD_SIZE"};
  Triple pmi{int_var(env, "PMI_RANK", 0, kMaxRanks), int_var(env, "PMI_SIZE", 1, kMaxRanks),
             int_var(env, "MPI_LOCALRANKID", 0, kMaxRanks), "PMI_RANK", "PMI_SIZE"};
  Triple torch{int_var(env, "RANK", 0, kMaxRanks), int_var(env, "WORLD_SIZE", 1, kMaxRanks),
               int_var(env, "LOCAL_RANK", 0, kMaxRanks), "RANK", "WORLD_SIZE"};
  check_triple(ompi);
  check_triple(pmi);
  check_triple(torch);
  const Triple* mpi = ompi.rank ? &ompi : pmi.rank ? &pmi : nullptr;
  LaunchInfo info;
  if (mpi) {
    info.launcher = Launcher::mpi;
    info.rank = *mpi->rank;
    info.size = *mpi->size;
    info.local_rank = mpi->local.value_or(0);
    // A torchrun-style environment inside an MPI launch must agree with it.
    if (torch.rank)
      BRISK_CHECK(*torch.rank == info.rank && *torch.size == info.size,
                  "the environment says rank ", *torch.rank, " of ", *torch.size,
                  " (RANK, WORLD_SIZE) but the MPI launcher rank ", info.rank, " of ", info.size,
                  " (", mpi->rank_name, ", ", mpi->size_name, ")");
  } else if (torch.rank) {
    info.launcher = Launcher::torchrun;
    info.rank = *torch.rank;
    info.size = *torch.size;
    info.local_rank = torch.local.value_or(0);
  }
  BRISK_CHECK(info.local_rank < info.size, "the local rank ", info.local_rank,
              " is not below the number of ranks ", info.size);
  if (const auto addr = env("MASTER_ADDR")) info.master_addr = *addr;
  info.master_port = int_var(env, "MASTER_PORT", 1, 65535).value_or(0);
  if (const auto port = int_var(env, "BRISK_RENDEZVOUS_PORT", 1, 65535)) {
    BRISK_CHECK(*port != info.master_port, "environment variable BRISK_RENDEZVOUS_PORT=", *port,
                " is MASTER_PORT, which torchrun's own store holds: choose another port");
    info.rendezvous_port = *port;
  } else if (info.master_port > 0 && info.master_port < 65535) {
    info.rendezvous_port = info.master_port + 1;
  }
  return info;
}

}  // namespace brisk
