// The collectives' test program, started on several ranks by mpirun, or as torchrun starts them
// (launch_env.sh, torchrun.sh; tests/CMakeLists.txt): every rank runs every test; rank 0 prints
// gtest's progress, the others only their failures; the job fails when any rank's test does.
#include <gtest/gtest.h>

#include <iostream>

#include "backend/backend.h"
#include "parallel/test_world.h"

namespace brisk::testing {

Communicator& world() {
  static std::unique_ptr<Communicator> comm = make_communicator(launch_info_from_env());
  return *comm;
}

std::unique_ptr<Communicator> nccl_world(std::string* why) {
  if (!nccl_built_in()) {
    *why = "brisk was built without NCCL";
    return nullptr;
  }
  if (!cuda_available(why)) {
    *why = "no usable GPU: " + *why;
    return nullptr;
  }
  const int N = world().size();
  if (cuda_device_count() < N) {
    *why = std::to_string(cuda_device_count()) + " GPUs for " + std::to_string(N) +
           " ranks on this host (NCCL takes one GPU per rank)";
    return nullptr;
  }
  LaunchInfo launch;
  launch.launcher = Launcher::mpi;
  launch.rank = world().rank();
  launch.size = N;
  launch.local_rank = world().rank();
  return make_nccl(launch, &world(), Device::cuda, 60.0);
}

}  // namespace brisk::testing

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  brisk::Communicator& world = brisk::testing::world();
  if (world.rank() != 0) {
    // The other ranks print only what failed, under their rank.
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    struct Failures : ::testing::EmptyTestEventListener {
      int rank;
      explicit Failures(int r) : rank(r) {}
      void OnTestPartResult(const ::testing::TestPartResult& r) override {
        if (r.failed())
          std::cerr << "rank " << rank << ": " << (r.file_name() ? r.file_name() : "") << ":"
                    << r.line_number() << ": " << r.summary() << "\n";
      }
    };
    listeners.Append(new Failures(world.rank()));
  }
  float failed = RUN_ALL_TESTS() != 0 ? 1.f : 0.f;
  world.all_reduce_sum(brisk::Tensor(&failed, brisk::Shape{1}, brisk::DType::f32));
  if (world.rank() == 0 && failed > 0)
    std::cerr << failed << " of " << world.size() << " ranks had failures\n";
  return failed > 0 ? 1 : 0;
}
