#include "parallel/mesh.h"

#include "core/error.h"

namespace brisk {

namespace {
const char* const kNames[kMeshDims] = {"pipeline", "data", "sequence", "tensor"};
}  // namespace

std::string MeshShape::str() const {
  std::string s;
  for (int d = 0; d < kMeshDims; ++d) {
    s += (d ? " x " : "") + std::string(kNames[d]) + " " + std::to_string(size[d]);
    if (d == static_cast<int>(MeshDim::data) && experts > 1)
      s += " (expert " + std::to_string(experts) + ")";
  }
  return s;
}

MeshShape mesh_shape(int world_size, int tp_size, int pp_size, int sp_size, int ep_size) {
  BRISK_CHECK(tp_size >= 1 && pp_size >= 1 && sp_size >= 1, "--tp_size ", tp_size, ", --pp_size ",
              pp_size, " and --sp_size ", sp_size, " must be at least 1");
  const int64_t model = int64_t{tp_size} * pp_size * sp_size;
  BRISK_CHECK(world_size % model == 0, "--tp_size ", tp_size, " x --pp_size ", pp_size,
              " x --sp_size ", sp_size, " = ", model, " does not divide the run's ", world_size,
              " ranks");
  const auto data = static_cast<int>(world_size / model);
  BRISK_CHECK(ep_size >= 1 && data % ep_size == 0, "--ep_size ", ep_size, " does not divide the ",
              data, " data-parallel rank", data == 1 ? "" : "s");
  MeshShape s;
  s.size = {pp_size, data, sp_size, tp_size};
  s.experts = ep_size;
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

// A group's color is the world rank of its first member (the same for every member, different
// between groups); its key, the member's place in it. A group of one rank needs no
// communication, one of every rank is the world.
DeviceMesh::DeviceMesh(Communicator& world, const MeshShape& shape)
    : world_(world), shape_(shape), coordinate_(mesh_coordinate(shape, world.rank())) {
  BRISK_CHECK(shape.ranks() == world.size(), "the mesh ", shape.str(), " holds ", shape.ranks(),
              " ranks, the run ", world.size());
  for (int d = 0; d < kMeshDims; ++d) {
    std::array<int, kMeshDims> first = coordinate_;
    first[d] = 0;
    groups_[d] = &split(mesh_rank(shape, first), coordinate_[d], shape.size[d]);
  }
  const int data = static_cast<int>(MeshDim::data), sequence = static_cast<int>(MeshDim::sequence);
  const int ep = shape.experts, sp = shape.size[sequence];
  // The replicas: data and sequence coordinates vary (the data group without sequence ranks).
  std::array<int, kMeshDims> first = coordinate_;
  first[data] = first[sequence] = 0;
  replicas_ = sp == 1 ? groups_[data]
                      : &split(mesh_rank(shape, first), replica(), int64_t{shape.size[data]} * sp);
  // An expert run: ep neighbouring data coordinates.
  first = coordinate_;
  first[data] = coordinate_[data] / ep * ep;
  groups_[static_cast<int>(MeshDim::expert)] =
      &split(mesh_rank(shape, first), coordinate_[data] % ep, ep);
  // The replicas holding the same experts: the same place in their runs.
  first = coordinate_;
  first[data] = coordinate_[data] % ep;
  first[sequence] = 0;
  expert_replicas_ =
      ep == 1 ? replicas_
              : &split(mesh_rank(shape, first), replica(), int64_t{shape.size[data]} / ep * sp);
}

int DeviceMesh::coordinate(MeshDim d) const {
  if (d == MeshDim::expert) return coordinate_[static_cast<int>(MeshDim::data)] % shape_.experts;
  return coordinate_[static_cast<size_t>(d)];
}

Communicator& DeviceMesh::split(int color, int key, int64_t size) {
  if (size == world_.size()) return world_;
  owned_.push_back(size == 1 ? make_single_process() : world_.split(color, key));
  return *owned_.back();
}

std::vector<int> replica_ranks(const MeshShape& shape, int stage, int tensor) {
  std::vector<int> ranks;
  for (int d = 0; d < shape[MeshDim::data]; ++d)
    for (int s = 0; s < shape[MeshDim::sequence]; ++s)
      ranks.push_back(mesh_rank(shape, {stage, d, s, tensor}));
  return ranks;
}

}  // namespace brisk
