#include "parallel/mesh.h"

#include "core/error.h"

namespace brisk {

namespace {
const char* const kNames[kMeshDims] = {"pipeline", "data", "sequence", "tensor"};
}  // namespace

std::string MeshShape::str() const {
  std::string s;
  for (int d = 0; d < kMeshDims; ++d)
    s += (d ? " x " : "") + std::string(kNames[d]) + " " + std::to_string(size[d]);
  return s;
}

MeshShape mesh_shape(int world_size, int tp_size, int pp_size, int sp_size) {
  BRISK_CHECK(tp_size >= 1 && pp_size >= 1 && sp_size >= 1, "--tp_size ", tp_size, ", --pp_size ",
              pp_size, " and --sp_size ", sp_size, " must be at least 1");
  const int64_t model = int64_t{tp_size} * pp_size * sp_size;
  BRISK_CHECK(world_size % model == 0, "--tp_size ", tp_size, " x --pp_size ", pp_size,
              " x --sp_size ", sp_size, " = ", model, " does not divide the run's ", world_size,
              " ranks");
  MeshShape s;
  s.size = {pp_size, static_cast<int>(world_size / model), sp_size, tp_size};
  return s;
}

int mesh_rank(const MeshShape& shape, const std::array<int, kMeshDims>& coordinate) {
  int rank = 0;
  for (int d = 0; d < kMeshDims; ++d) rank = rank * shape.size[d] + coordinate[d];
  return rank;
}

std::array<int, kMeshDims> mesh_coordinate(const MeshShape& shape, int rank) {
  std::array<int, kMeshDims> c{};
  for (int d = kMeshDims - 1; d >= 0; --d) {
    c[d] = rank % shape.size[d];
    rank /= shape.size[d];
  }
  return c;
}

// A group's color is the rank with its coordinate along d set to 0 (the same for every member,
// different between groups); its key, the coordinate along d.
DeviceMesh::DeviceMesh(Communicator& world, const MeshShape& shape)
    : shape_(shape), coordinate_(mesh_coordinate(shape, world.rank())) {
  BRISK_CHECK(shape.ranks() == world.size(), "the mesh ", shape.str(), " holds ", shape.ranks(),
              " ranks, the run ", world.size());
  for (int d = 0; d < kMeshDims; ++d) {
    if (shape.size[d] == 1) {
      groups_[d] = make_single_process();
      continue;
    }
    std::array<int, kMeshDims> first = coordinate_;
    first[d] = 0;
    groups_[d] = world.split(mesh_rank(shape, first), coordinate_[d]);
  }
  // The replicas: data and sequence coordinates vary.
  const int data = static_cast<int>(MeshDim::data), sequence = static_cast<int>(MeshDim::sequence);
  if (shape.size[sequence] == 1) return;
  std::array<int, kMeshDims> first = coordinate_;
  first[data] = first[sequence] = 0;
  replicas_ = world.split(mesh_rank(shape, first), replica());
}

std::vector<int> replica_ranks(const MeshShape& shape, int stage, int tensor) {
  std::vector<int> ranks;
  for (int d = 0; d < shape[MeshDim::data]; ++d)
    for (int s = 0; s < shape[MeshDim::sequence]; ++s)
      ranks.push_back(mesh_rank(shape, {stage, d, s, tensor}));
  return ranks;
}

Communicator& DeviceMesh::replicas() {
  return replicas_ ? *replicas_ : group(MeshDim::data);
}

}  // namespace brisk
