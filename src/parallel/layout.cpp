#include "parallel/layout.h"

#include <algorithm>
#include <utility>

#include "core/error.h"
#include "parallel/pipeline_parallel.h"
#include "parallel/tensor_parallel.h"

namespace brisk {

namespace {
constexpr int64_t kMaxDegree = 4096;
constexpr int64_t kMaxRanks = int64_t{1} << 24;

std::string named(const ParallelDegrees& d, const std::string& name) {
  return d.source ? d.source(name) : "--" + name;
}

// A degree in [0, kMaxDegree], 0 taken as 1.
int degree_of(const ParallelDegrees& d, const std::string& name, int64_t size) {
  BRISK_CHECK(size >= 0 && size <= kMaxDegree, named(d, name), " must lie in [0, ", kMaxDegree,
              "], got ", size);
  return static_cast<int>(size < 1 ? 1 : size);
}

// The tensor, pipeline and sequence degrees given (above 1) divide the world.
void check_divides(const ParallelDegrees& d, int world, int tp, int pp, int sp) {
  std::string degrees;
  int64_t product = 1;
  int given = 0;
  for (const auto& [name, size] :
       {std::pair<const char*, int>{"tp_size", tp}, {"pp_size", pp}, {"sp_size", sp}}) {
    if (size <= 1) continue;
    degrees += (given++ ? " x " : "") + named(d, name) + " " + std::to_string(size);
    product *= size;
  }
  BRISK_CHECK(world % product == 0, degrees, given > 1 ? " = " + std::to_string(product) : "",
              " does not divide the run's ", world, world == 1 ? " rank" : " ranks");
}
}  // namespace

int64_t ParallelDegrees::fewest_ranks() const {
  int64_t n = 1;
  for (const int64_t size : {tp_size, pp_size, sp_size, ep_size})
    n *= std::clamp<int64_t>(size, 1, kMaxDegree);
  return n;
}

ParallelLayout::ParallelLayout(int64_t ranks, const ParallelDegrees& d)
    : zero_stage_(d.zero_stage), tensor_sequence_parallel_(d.tp_sequence_parallel) {
  BRISK_CHECK(ranks >= 1 && ranks <= kMaxRanks, "a run of ", ranks, " ranks (brisk runs 1 to ",
              kMaxRanks, ")");
  const auto world = static_cast<int>(ranks);
  BRISK_CHECK(d.zero_stage >= 0 && d.zero_stage <= 3, named(d, "zero_stage"),
              " must be 0, 1, 2 or 3, got ", d.zero_stage);
  const int tp = degree_of(d, "tp_size", d.tp_size), pp = degree_of(d, "pp_size", d.pp_size);
  const int sp = degree_of(d, "sp_size", d.sp_size), ep = degree_of(d, "ep_size", d.ep_size);
  check_divides(d, world, tp, pp, sp);
  const int data = world / (tp * pp * sp);
  BRISK_CHECK(data % ep == 0, named(d, "ep_size"), " ", ep, " does not divide the ", data,
              " data-parallel rank", data == 1 ? "" : "s");
  shape_ = mesh_shape(world, tp, pp, sp, ep);
}

int64_t ParallelLayout::sequence_multiple() const {
  return int64_t{degree(MeshDim::sequence)} *
         (tensor_sequence_parallel_ ? degree(MeshDim::tensor) : 1);
}

RankPlace ParallelLayout::place(int rank) const {
  BRISK_CHECK(rank >= 0 && rank < world(), "rank ", rank, " is not one of the run's ", world());
  const std::array<int, kMeshDims> c = mesh_coordinate(shape_, rank);
  RankPlace p;
  p.stage = c[static_cast<int>(MeshDim::pipeline)];
  p.data = c[static_cast<int>(MeshDim::data)];
  p.sequence = c[static_cast<int>(MeshDim::sequence)];
  p.tensor = c[static_cast<int>(MeshDim::tensor)];
  p.expert = p.data % shape_.experts;
  p.replica = replica_rank(p.data, p.sequence, degree(MeshDim::sequence)) / shape_.experts;
  return p;
}

int ParallelLayout::first_rank_of_stage(int stage) const {
  BRISK_CHECK(stage >= 0 && stage < degree(MeshDim::pipeline), "stage ", stage, " of ",
              degree(MeshDim::pipeline));
  return mesh_rank(shape_, {stage, 0, 0, 0});
}

std::string ParallelLayout::str() const {
  auto part = [&](const char* name, MeshDim d) {
    return on(d) ? std::string(" x ") + name + " " + std::to_string(degree(d)) : std::string();
  };
  return "tp " + std::to_string(degree(MeshDim::tensor)) + part("pp", MeshDim::pipeline) +
         part("sp", MeshDim::sequence) + part("ep", MeshDim::expert) + " x dp " +
         std::to_string(degree(MeshDim::data)) + " z" + std::to_string(zero() ? zero_stage_ : 0);
}

ModelConfig rank_share(const ModelConfig& whole, const ParallelLayout& layout,
                       const RankPlace& at) {
  const int tp = layout.degree(MeshDim::tensor), pp = layout.degree(MeshDim::pipeline);
  const int sp = layout.degree(MeshDim::sequence), ep = layout.degree(MeshDim::expert);
  ModelConfig share = tp > 1 ? tensor_parallel_share(whole, at.tensor, tp) : whole;
  share.tensor_slices_tokens = tp > 1 && layout.tensor_sequence_parallel();
  if (sp > 1) share = sequence_parallel_share(share, at.sequence, sp);
  if (pp > 1) share = pipeline_share(share, at.stage, pp);
  if (ep > 1) share = expert_parallel_share(share, at.expert, ep);
  return share;
}

std::vector<ParallelRun::Exchange> ParallelRun::exchanges() const {
  std::vector<Exchange> out;
  if (sequence) out.push_back({"sequence", sequence->bytes(), sequence->seconds()});
  if (experts) out.push_back({"expert", experts->bytes(), experts->seconds()});
  return out;
}

ParallelRun::ParallelRun(ParallelRun&& other) noexcept
    : model(std::exchange(other.model, nullptr)),
      tensor(std::move(other.tensor)),
      sequence(std::move(other.sequence)),
      experts(std::move(other.experts)),
      policy(std::move(other.policy)) {}

ParallelRun::~ParallelRun() {
  if (model) model->set_parallelism({});
}

ParallelRun make_parallel(const ParallelLayout& layout, const ParallelContext& c) {
  ParallelRun run;
  run.model = &c.model;
  if (layout.on(MeshDim::tensor))
    run.tensor = std::make_unique<CommunicatorTensorGroup>(c.mesh.group(MeshDim::tensor));
  if (layout.on(MeshDim::sequence))
    run.sequence = std::make_unique<CommunicatorSequenceGroup>(c.mesh.group(MeshDim::sequence));
  if (layout.on(MeshDim::expert))
    run.experts = std::make_unique<CommunicatorExpertGroup>(c.mesh.group(MeshDim::expert));
  c.model.set_parallelism({run.tensor.get(), run.sequence.get(), run.experts.get()});
  run.policy = make_data_parallel(c, c.mesh.expert_replicas());
  if (layout.on(MeshDim::tensor))
    run.policy = make_tensor_parallel(c, *run.tensor, std::move(run.policy));
  if (layout.on(MeshDim::expert)) run.policy = make_expert_parallel(c, std::move(run.policy));
  if (layout.on(MeshDim::pipeline)) run.policy = make_pipeline_parallel(c, std::move(run.policy));
  return run;
}

}  // namespace brisk
