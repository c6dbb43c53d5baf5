// A run's parallel layout, in the manner of torchtitan's ParallelDims: the degrees of its data,
// ZeRO, tensor, pipeline, sequence and expert parallelism over the world's ranks, validated once
// where the options are resolved. Everything else asks it: the mesh's shape, how many replicas
// sum each gradient, a rank's coordinates, the multiple a batch's length must be, whether a
// dimension is on; and make_parallel builds the policy stack that runs the layout and gives the
// model the groups its layers exchange over.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "parallel/expert_parallel.h"
#include "parallel/mesh.h"
#include "parallel/pipeline_parallel.h"
#include "parallel/policy.h"
#include "parallel/sequence_parallel.h"
#include "parallel/tensor_parallel.h"

namespace brisk {

// The degrees as given (accelerate's and DeepSpeed's names; 0 is taken as 1).
struct ParallelDegrees {
  int64_t tp_size = 1, pp_size = 1, sp_size = 1, ep_size = 1;
  int64_t zero_stage = 0;
  bool tp_sequence_parallel = false;  // Megatron's sequence parallelism inside the tensor group
  // How the user gave the option `name` ("--tp_size", or a config file's key), for messages;
  // empty: "--" + name.
  std::function<std::string(const std::string& name)> source;
  // The fewest ranks that hold the degrees: tensor x pipeline x sequence x expert.
  int64_t fewest_ranks() const;
};

// Where one rank sits in the layout.
struct RankPlace {
  int stage = 0, data = 0, sequence = 0, tensor = 0;  // its mesh coordinates
  int expert = 0;                                     // its place in its run of expert ranks
  int replica = 0;  // its place among the replicas that hold the same parameters
};

class ParallelLayout {
 public:
  // One process.
  ParallelLayout() : ParallelLayout(1, {}) {}
  // Refuses degrees out of range, tensor x pipeline x sequence degrees that do not divide
  // `world`, and an expert degree that does not divide the data ranks, naming the options.
  ParallelLayout(int64_t world, const ParallelDegrees& degrees);

  int world() const { return shape_.ranks(); }
  const MeshShape& mesh() const { return shape_; }
  int degree(MeshDim d) const { return shape_[d]; }
  bool on(MeshDim d) const { return degree(d) > 1; }
  // Tensor, pipeline or sequence parallelism: the mesh's groups are needed.
  bool model_parallel() const {
    return on(MeshDim::tensor) || on(MeshDim::pipeline) || on(MeshDim::sequence);
  }
  // The ranks that hold the same parameters and share ZeRO's partitions: the data and sequence
  // ranks, of whom one of each expert run holds a given expert's.
  int replicas() const {
    return degree(MeshDim::data) * degree(MeshDim::sequence) / degree(MeshDim::expert);
  }
  // The ZeRO stage as given, and whether the run partitions by it (several replicas).
  int64_t zero_stage() const { return zero_stage_; }
  bool zero() const { return zero_stage_ > 0 && replicas() > 1; }
  // The multiple every batch's length is padded to: Ulysses' sequence ranks, each again split
  // by the tensor ranks under Megatron's sequence parallelism.
  int64_t sequence_multiple() const;
  bool tensor_sequence_parallel() const { return tensor_sequence_parallel_; }
  RankPlace place(int rank) const;
  // The first world rank of pipeline stage `stage`: where a stage's plan is read.
  int first_rank_of_stage(int stage) const;
  // "tp 2 x pp 1 x sp 1 x dp 2 z1" for a layout's one-line summary.
  std::string str() const;

 private:
  MeshShape shape_;
  int64_t zero_stage_ = 0;
  bool tensor_sequence_parallel_ = false;
};

// The share of the whole model of config `whole` that rank `at` holds: its tensor rank's heads
// and width, its sequence rank's heads, its stage's blocks and its expert rank's experts.
ModelConfig rank_share(const ModelConfig& whole, const ParallelLayout& layout, const RankPlace& at);

// The policy stack of a layout and the groups the model's layers exchange over (which the model
// holds while it lives).
struct ParallelRun {
  ParallelRun() = default;
  ParallelRun(ParallelRun&& other) noexcept;
  ParallelRun& operator=(ParallelRun&&) = delete;
  // The model's parallelism taken back (its groups end here).
  ~ParallelRun();
  Model* model = nullptr;
  std::unique_ptr<CommunicatorTensorGroup> tensor;
  std::unique_ptr<CommunicatorSequenceGroup> sequence;
  std::unique_ptr<CommunicatorExpertGroup> experts;
  std::unique_ptr<ParallelPolicy> policy;
  // The exchanges the model's layers ran ("sequence", "expert"): their bytes and seconds.
  struct Exchange {
    std::string name;
    double bytes = 0, seconds = 0;
  };
  std::vector<Exchange> exchanges() const;
};

// Data parallelism (or ZeRO) over the replicas, wrapped in tensor, expert and pipeline
// parallelism where the layout has them on; the model given its groups (ModelParallelism).
// Resets the optimizer's state and gives the model its weights' slots; a collective.
ParallelRun make_parallel(const ParallelLayout& layout, const ParallelContext& context);

}  // namespace brisk
