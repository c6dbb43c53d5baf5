// Launch information from the environment (MPI launchers, torchrun-style variables), and the
// single-process communicator. The collectives across processes are tests/dist/ (run by mpirun).
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "dist/communicator.h"
#include "dist/launch.h"
#include "test_support.h"

namespace brisk::testing {
namespace {

LaunchInfo launch(const std::map<std::string, std::string>& vars) {
  return launch_info_from_env([&](const std::string& name) -> std::optional<std::string> {
    const auto it = vars.find(name);
    return it == vars.end() ? std::nullopt : std::optional<std::string>(it->second);
  });
}

TEST(Launch, NoLauncherIsOneProcess) {
  const LaunchInfo l = launch({});
  EXPECT_EQ(l.launcher, Launcher::none);
  EXPECT_EQ(l.rank, 0);
  EXPECT_EQ(l.size, 1);
}

TEST(Launch, MpiLaunchersAreRead) {
  LaunchInfo l = launch({{"OMPI_COMM_WORLD_RANK", "2"},
                         {"OMPI_COMM_WORLD_SIZE", "4"},
                         {"OMPI_COMM_WORLD_LOCAL_RANK", "0"}});
  EXPECT_EQ(l.launcher, Launcher::mpi);
  EXPECT_EQ(l.rank, 2);
  EXPECT_EQ(l.size, 4);
  EXPECT_EQ(l.local_rank, 0);
  l = launch({{"PMI_RANK", "1"}, {"PMI_SIZE", "3"}, {"MPI_LOCALRANKID", "1"}});  // MPICH
  EXPECT_EQ(l.launcher, Launcher::mpi);
  EXPECT_EQ(l.rank, 1);
  EXPECT_EQ(l.size, 3);
  EXPECT_EQ(l.local_rank, 1);
  // torchrun-style variables that agree with the MPI launcher are fine.
  l = launch({{"OMPI_COMM_WORLD_RANK", "1"},
              {"OMPI_COMM_WORLD_SIZE", "2"},
              {"RANK", "1"},
              {"WORLD_SIZE", "2"},
              {"MASTER_ADDR", "node7"},
              {"MASTER_PORT", "29500"}});
  EXPECT_EQ(l.launcher, Launcher::mpi);
  EXPECT_EQ(l.master_addr, "node7");
  EXPECT_EQ(l.master_port, 29500);
}

TEST(Launch, TorchrunStyleVariablesAreRead) {
  const LaunchInfo l =
      launch({{"RANK", "3"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "3"}, {"MASTER_PORT", "1"}});
  EXPECT_EQ(l.launcher, Launcher::torchrun);
  EXPECT_EQ(l.rank, 3);
  EXPECT_EQ(l.size, 8);
  EXPECT_EQ(l.local_rank, 3);
}

TEST(Launch, BadOrContradictingVariablesAreRefusedByName) {
  expect_error(
      [] {
        launch({{"RANK", "x"}, {"WORLD_SIZE", "2"}});
      },
      "RANK=\"x\" is not a whole number");
  expect_error([] { launch({{"RANK", "-1"}, {"WORLD_SIZE", "2"}}); }, "RANK=\"-1\"");
  expect_error(
      [] {
        launch({{"RANK", "2"}, {"WORLD_SIZE", "2"}});
      },
      "RANK=2 is not below WORLD_SIZE=2");
  expect_error([] { launch({{"RANK", "0"}, {"WORLD_SIZE", "0"}}); }, "WORLD_SIZE=0 is outside");
  expect_error([] { launch({{"RANK", "1"}}); }, "WORLD_SIZE is missing (RANK is set)");
  expect_error(
      [] {
        launch({{"OMPI_COMM_WORLD_SIZE", "2"}});
      },
      "OMPI_COMM_WORLD_RANK is missing (OMPI_COMM_WORLD_SIZE is set)");
  expect_error(
      [] {
        launch({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "5"}});
      },
      "local rank 5 is not below the number of ranks 2");
  expect_error(
      [] {
        launch({{"RANK", "0"}, {"WORLD_SIZE", "99999999999"}});
      },
      "WORLD_SIZE=\"99999999999\" is not a whole number");
  expect_error([] { launch({{"MASTER_PORT", "70000"}}); }, "MASTER_PORT=70000 is outside");
  expect_error(
      [] {
        launch({{"OMPI_COMM_WORLD_RANK", "1"},
                {"OMPI_COMM_WORLD_SIZE", "2"},
                {"RANK", "0"},
                {"WORLD_SIZE", "2"}});
      },
      "rank 0 of 2 (RANK, WORLD_SIZE) but the MPI launcher rank 1 of 2");
}

// torchrun-style launches of several CPU processes have no transport: refused, naming mpirun.
TEST(Launch, SeveralTorchrunProcessesAreRefusedOnTheCpu) {
  expect_error(
      [] {
        make_communicator(launch({{"RANK", "0"}, {"WORLD_SIZE", "2"}}));
      },
      "start them with mpirun -np 2");
  EXPECT_EQ(make_communicator(launch({{"RANK", "0"}, {"WORLD_SIZE", "1"}}))->size(), 1);
}

TEST(Launch, AnMpiLaunchWithoutMpiBuiltInIsRefused) {
  if (mpi_built_in()) GTEST_SKIP() << "this brisk has MPI; tests/dist/ runs it under mpirun";
  expect_error(
      [] {
        make_communicator(launch({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}}));
      },
      "built without MPI");
}

// One process: reductions leave the buffer, scatters and gathers copy.
TEST(SingleProcess, CollectivesAreCopies) {
  auto comm = make_single_process();
  EXPECT_EQ(comm->rank(), 0);
  EXPECT_EQ(comm->size(), 1);
  std::vector<float> a = {1.5f, -2.f, 3.f}, b(3, 0.f);
  comm->all_reduce_sum(Tensor(a.data(), Shape{3}, DType::f32));
  EXPECT_EQ(a, (std::vector<float>{1.5f, -2.f, 3.f}));
  comm->reduce_scatter_sum(Tensor(a.data(), Shape{3}, DType::f32),
                           Tensor(b.data(), Shape{3}, DType::f32));
  EXPECT_EQ(b, a);
  std::fill(b.begin(), b.end(), 0.f);
  comm->all_gather(Tensor(a.data(), Shape{3}, DType::f32), Tensor(b.data(), Shape{3}, DType::f32));
  EXPECT_EQ(b, a);
  comm->broadcast(Tensor(a.data(), Shape{3}, DType::f32), 0);
  comm->barrier();
  expect_error([&] { comm->broadcast(Tensor(a.data(), Shape{3}, DType::f32), 1); }, "root 1");
  expect_error(
      [&] {
        comm->all_gather(Tensor(a.data(), Shape{3}, DType::f32),
                         Tensor(b.data(), Shape{2}, DType::f32));
      },
      "3 elements in and 2 out");
  std::vector<int32_t> ints(3);
  expect_error([&] { comm->all_reduce_sum(Tensor(ints.data(), Shape{3}, DType::i32)); },
               "float32, bf16 or float64 buffers only");
}

}  // namespace
}  // namespace brisk::testing
