// The device mesh's arithmetic and refusals, and a single process's answers to the collectives
// of tensor, pipeline and sequence parallelism (tests/parallel/test_mesh.cpp runs them on
// several ranks).
#include <gtest/gtest.h>

#include <vector>

#include "parallel/communicator.h"
#include "parallel/mesh.h"
#include "test_support.h"

namespace brisk::testing {
namespace {

TEST(Mesh, ShapesTakeTheDataDimensionFromTheRanksLeft) {
  const MeshShape s = mesh_shape(12, 2, 3, 1);
  EXPECT_EQ(s.str(), "pipeline 3 x data 2 x sequence 1 x tensor 2");
  EXPECT_EQ(s.ranks(), 12);
  // Tensor fastest, pipeline slowest, every rank once.
  EXPECT_EQ(mesh_rank(s, {0, 0, 0, 1}), 1);
  EXPECT_EQ(mesh_rank(s, {0, 1, 0, 0}), 2);
  EXPECT_EQ(mesh_rank(s, {1, 0, 0, 0}), 4);
  for (int r = 0; r < 12; ++r) EXPECT_EQ(mesh_rank(s, mesh_coordinate(s, r)), r);
}

TEST(Mesh, DegreesThatDoNotDivideTheRanksAreRefused) {
  expect_error([] { mesh_shape(3, 2, 1, 1); },
               "--tp_size 2 x --pp_size 1 x --sp_size 1 = 2 does not divide the run's 3 ranks");
  expect_error([] { mesh_shape(4, 1, 0, 1); },
               "--tp_size 1, --pp_size 0 and --sp_size 1 must be at least 1");
  const std::unique_ptr<Communicator> one = make_single_process();
  expect_error([&] { DeviceMesh(*one, mesh_shape(2, 2, 1, 1)); },
               "the mesh pipeline 1 x data 1 x sequence 1 x tensor 2 holds 2 ranks, the run 1");
}

TEST(Mesh, OneProcessIsAMeshOfOne) {
  const std::unique_ptr<Communicator> one = make_single_process();
  DeviceMesh mesh(*one, mesh_shape(1, 1, 1, 1));
  for (MeshDim d : {MeshDim::pipeline, MeshDim::data, MeshDim::sequence, MeshDim::tensor}) {
    EXPECT_EQ(mesh.coordinate(d), 0);
    EXPECT_EQ(mesh.group(d).size(), 1);
  }
  std::vector<float> in{1, 2, 3}, out(3);
  one->all_to_all(Tensor(in.data(), Shape{3}, DType::f32),
                  Tensor(out.data(), Shape{3}, DType::f32));
  EXPECT_EQ(out, in);
  expect_error([&] { one->send(Tensor(in.data(), Shape{3}, DType::f32), 0); },
               "send: rank 0 is not another rank of 1");
  EXPECT_EQ(one->split(3, 0)->size(), 1);
}

}  // namespace
}  // namespace brisk::testing
