// The ranks of a run as a grid of four dimensions: pipeline stages x data-parallel replicas x
// sequence shards x tensor shards (pipeline slowest, tensor fastest, as Megatron-LM places them:
// a tensor group's ranks are neighbours, on one host where a host holds several). A rank's
// coordinate along each dimension, and per dimension the group of ranks that differ from it in
// that dimension only: the communicator its parallelism runs over. Expert parallelism divides
// the data dimension: runs of `experts` neighbouring data ranks hold the experts between them.
#pragma once

#include <array>
#include <memory>
#include <string>
#include <vector>

#include "parallel/communicator.h"

namespace brisk {

// The grid's dimensions, then expert (a division of data, not a dimension of the grid).
enum class MeshDim { pipeline = 0, data = 1, sequence = 2, tensor = 3, expert = 4 };
inline constexpr int kMeshDims = 4;

struct MeshShape {
  std::array<int, kMeshDims> size{1, 1, 1, 1};  // by MeshDim
  int experts = 1;  // the data ranks that hold the experts between them; divides size[data]
  int operator[](MeshDim d) const {
    return d == MeshDim::expert ? experts : size[static_cast<size_t>(d)];
  }
  int ranks() const { return size[0] * size[1] * size[2] * size[3]; }
  // "pipeline 2 x data 1 x sequence 1 x tensor 2" ("data 4 (expert 2)" with experts)
  std::string str() const;
};

// The shape of `world_size` ranks for tp_size, pp_size, sp_size (accelerate's names) and ep_size
// (DeepSpeed-MoE's), the data dimension taking the ranks left over. Refuses degrees below 1 or
// that do not divide the world (ep_size: its data ranks), naming them.
MeshShape mesh_shape(int world_size, int tp_size, int pp_size, int sp_size, int ep_size = 1);

// The world rank at `coordinate` in `shape`, and the coordinates of world rank `rank`.
int mesh_rank(const MeshShape& shape, const std::array<int, kMeshDims>& coordinate);
std::array<int, kMeshDims> mesh_coordinate(const MeshShape& shape, int rank);

// The replicas: the ranks that hold the same parameters and sum their gradients, the data and
// sequence dimensions together. A rank's place among them (data slower), and the world ranks of
// the replicas at pipeline stage `stage` and tensor rank `tensor`, in that order.
inline int replica_rank(int data_rank, int sequence_rank, int sequence_ranks) {
  return data_rank * sequence_ranks + sequence_rank;
}
std::vector<int> replica_ranks(const MeshShape& shape, int stage, int tensor);

class DeviceMesh {
 public:
  // Every rank of `world` (a collective): its groups split from `world`, a dimension of one
  // rank needing no communication of its own and one of every rank being `world` itself.
  // Refuses a shape of another size than the world's.
  DeviceMesh(Communicator& world, const MeshShape& shape);
  const MeshShape& shape() const { return shape_; }
  // Along expert: the rank's place in its run of data ranks.
  int coordinate(MeshDim d) const;
  // The ranks that differ from this one along `d` only, ranked by their coordinate along it
  // (expert: the data ranks of this rank's run).
  Communicator& group(MeshDim d) { return *groups_[static_cast<size_t>(d)]; }
  // The replicas' group (replica_rank's order; the data group without sequence parallelism),
  // and this rank's place in it.
  Communicator& replicas() { return *replicas_; }
  int replica() const {
    return replica_rank(coordinate(MeshDim::data), coordinate(MeshDim::sequence),
                        shape_[MeshDim::sequence]);
  }
  // The replicas that hold the same experts (one of each expert run; all replicas without
  // expert parallelism), ranked by replica.
  Communicator& expert_replicas() { return *expert_replicas_; }

 private:
  // The group of `size` ranks this one belongs to: those of the same `color`, ranked by `key`.
  Communicator& split(int color, int key, int64_t size);

  Communicator& world_;
  MeshShape shape_;
  std::array<int, kMeshDims> coordinate_{};
  std::array<Communicator*, kMeshDims + 1> groups_{};  // by MeshDim
  Communicator* replicas_ = nullptr;
  Communicator* expert_replicas_ = nullptr;
  std::vector<std::unique_ptr<Communicator>> owned_;
};

}  // namespace brisk
