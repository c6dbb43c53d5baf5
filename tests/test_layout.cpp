// The parallel layout's arithmetic and refusals: the degrees validated once, each rank's place,
// the replicas, the sequence multiple, and the options' names in every refusal
// (tests/parallel runs the layouts themselves on several ranks).
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "parallel/communicator.h"
#include "parallel/layout.h"
#include "test_support.h"
#include "train/options.h"

namespace brisk::testing {
namespace {

TEST(Layout, OneProcessHasEveryDimensionOff) {
  const ParallelLayout one;
  EXPECT_EQ(one.world(), 1);
  EXPECT_EQ(one.replicas(), 1);
  EXPECT_FALSE(one.model_parallel());
  for (MeshDim d :
       {MeshDim::pipeline, MeshDim::data, MeshDim::sequence, MeshDim::tensor, MeshDim::expert})
    EXPECT_FALSE(one.on(d));
  EXPECT_EQ(one.sequence_multiple(), 1);
  EXPECT_EQ(one.str(), "tp 1 x dp 1 z0");
}

TEST(Layout, DegreesOfZeroAreOneAndTheDataTakesTheRest) {
  ParallelDegrees d;
  d.tp_size = 2;
  d.pp_size = 0;
  d.sp_size = 3;
  d.zero_stage = 2;
  const ParallelLayout l(12, d);
  EXPECT_EQ(l.mesh().str(), "pipeline 1 x data 2 x sequence 3 x tensor 2");
  EXPECT_EQ(l.replicas(), 6);  // data x sequence
  EXPECT_TRUE(l.zero());
  EXPECT_EQ(l.sequence_multiple(), 3);
  d.tp_sequence_parallel = true;
  EXPECT_EQ(ParallelLayout(12, d).sequence_multiple(), 6);
  EXPECT_EQ(l.str(), "tp 2 x sp 3 x dp 2 z2");
  EXPECT_EQ(d.fewest_ranks(), 6);
}

TEST(Layout, EveryRankHasOnePlace) {
  ParallelDegrees d;
  d.tp_size = 2;
  d.pp_size = 2;
  const ParallelLayout l(8, d);
  std::set<std::array<int, 4>> seen;
  for (int r = 0; r < 8; ++r) {
    const RankPlace p = l.place(r);
    EXPECT_EQ(mesh_rank(l.mesh(), {p.stage, p.data, p.sequence, p.tensor}), r);
    EXPECT_EQ(p.replica, p.data);
    seen.insert({p.stage, p.data, p.sequence, p.tensor});
  }
  EXPECT_EQ(seen.size(), 8u);
  EXPECT_EQ(l.first_rank_of_stage(1), 4);  // pipeline slowest
  expect_error([&] { l.place(8); }, "rank 8 is not one of the run's 8");
}

TEST(Layout, ExpertRunsDivideTheDataRanks) {
  ParallelDegrees d;
  d.ep_size = 2;
  d.zero_stage = 1;
  const ParallelLayout l(6, d);
  EXPECT_TRUE(l.on(MeshDim::expert));
  EXPECT_EQ(l.mesh().str(), "pipeline 1 x data 6 (expert 2) x sequence 1 x tensor 1");
  EXPECT_EQ(l.replicas(), 3);  // the ranks holding the same experts
  for (int r = 0; r < 6; ++r) {
    EXPECT_EQ(l.place(r).expert, r % 2);
    EXPECT_EQ(l.place(r).replica, r / 2);
    EXPECT_EQ(l.place(r).data, r);
  }
  expect_error(
      [] {
        ParallelLayout(3, ParallelDegrees{1, 1, 1, 2, 0, false, {}});
      },
      "--ep_size 2 does not divide the 3 data-parallel ranks");
}

TEST(Layout, RefusalsNameTheOptionsAsGiven) {
  expect_error(
      [] {
        ParallelLayout(6, ParallelDegrees{2, 2, 1, 1, 0, false, {}});
      },
      "--tp_size 2 x --pp_size 2 = 4 does not divide the run's 6 ranks");
  expect_error(
      [] {
        ParallelLayout(1, ParallelDegrees{1, 1, 1, 1, 4, false, {}});
      },
      "--zero_stage must be 0, 1, 2 or 3, got 4");
  expect_error(
      [] {
        ParallelLayout(1, ParallelDegrees{-1, 1, 1, 1, 0, false, {}});
      },
      "--tp_size must lie in [0, 4096], got -1");
  expect_error([] { ParallelLayout(0, {}); }, "a run of 0 ranks");
  TrainOptions o;
  o.sp_size = 2;
  o.set_by["sp_size"] = "--parallelism_config 'pc.json': sp_size";
  expect_error([&] { parallel_layout(o, 3); },
               "--parallelism_config 'pc.json': sp_size 2 does not divide the run's 3 ranks");
  EXPECT_EQ(parallel_layout(o, 0).world(), 2);  // the fewest the degrees take
}

TEST(Layout, AMeshOfOneProcessHasItsExpertGroups) {
  const std::unique_ptr<Communicator> one = make_single_process();
  DeviceMesh mesh(*one, ParallelLayout().mesh());
  EXPECT_EQ(mesh.group(MeshDim::expert).size(), 1);
  EXPECT_EQ(mesh.coordinate(MeshDim::expert), 0);
  EXPECT_EQ(mesh.expert_replicas().size(), 1);
  EXPECT_EQ(&mesh.replicas(), one.get());  // a group of every rank is the world itself
}

}  // namespace
}  // namespace brisk::testing
