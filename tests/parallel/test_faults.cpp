// Faults across ranks, each run as a job of its own that must fail (tests/CMakeLists.txt runs
// them through expect_failure.sh, which checks the exit code, the time and the message): they are
// DISABLED_ in the ordinary run of brisk_dist_tests.
#include <gtest/gtest.h>

#include <chrono>
#include <csignal>
#include <memory>
#include <thread>

#include "parallel/test_world.h"

namespace brisk::testing {
namespace {

// Collectives time out after 2 s, and rank 1 then hangs (far longer than the test's limit).
void rank_one_hangs() {
  world().set_timeout(2);
  world().barrier();
  if (world().rank() == 1) std::this_thread::sleep_for(std::chrono::seconds(60));
}

// Rank 1 hangs; the others wait in an all-reduce until the timeout ends the run.
TEST(Faults, DISABLED_AStuckRankEndsTheRunAtTheTimeout) {
  rank_one_hangs();
  float x = 1;
  world().all_reduce_sum(Tensor(&x, Shape{1}, DType::f32));
}

// A started (overlapped) all-reduce is watched as well.
TEST(Faults, DISABLED_AStuckRankEndsAStartedSum) {
  rank_one_hangs();
  float x = 1;
  world().start_all_reduce_sum(Tensor(&x, Shape{1}, DType::f32));
  world().wait_started();
}

// A group split from the world (as the mesh's are) whose rank 1 then hangs, as rank_one_hangs.
std::unique_ptr<Communicator> group_with_rank_one_stuck() {
  world().set_timeout(2);
  std::unique_ptr<Communicator> group = world().split(0, world().rank());
  group->barrier();
  if (world().rank() == 1) std::this_thread::sleep_for(std::chrono::seconds(60));
  return group;
}

// A sum over a group split from the world (tensor parallelism's, the mesh's) is watched as well.
TEST(Faults, DISABLED_AStuckRankEndsASumOverASplitGroup) {
  const std::unique_ptr<Communicator> group = group_with_rank_one_stuck();
  float x = 1;
  group->all_reduce_sum(Tensor(&x, Shape{1}, DType::f32));
}

// A pipeline stage waiting for its neighbour's activations (a receive on the mesh's pipeline
// group) is watched as well: the neighbour stuck, the run ends at the timeout.
TEST(Faults, DISABLED_AStuckStageEndsAReceive) {
  const std::unique_ptr<Communicator> stages = group_with_rank_one_stuck();
  float x = 1;
  if (world().rank() == 0) stages->receive(Tensor(&x, Shape{1}, DType::f32), 1);
}

// Rank 1 is killed: the launcher ends the others, naming the rank.
TEST(Faults, DISABLED_AKilledRankEndsTheRun) {
  world().barrier();
  if (world().rank() == 1) std::raise(SIGKILL);
  float x = 1;
  world().all_reduce_sum(Tensor(&x, Shape{1}, DType::f32));
}

}  // namespace
}  // namespace brisk::testing
