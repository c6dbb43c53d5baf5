// Tensor parallelism's policy (tensor_parallel.h): data parallelism's, with the gradients' norm
// counted once per element of the whole model and saves that write full parameters.
#include "parallel/tensor_parallel.h"

#include <chrono>
#include <cstring>
#include <utility>

#include "backend/backend.h"
#include "optim/optimizer.h"
#include "parallel/communicator.h"
#include "parallel/layered_policy.h"
#include "parallel/part_reads.h"
#include "parallel/split_bands.h"
#include "parallel/zero.h"
#include "precision/mixed_precision.h"

namespace brisk {

namespace {

// A save's reads of the full parameters and the optimizer state from the tensor ranks' shares:
// tensor rank t's whole i is part i of the world ranks holders[t] laid end to end (its data
// replicas in order: ZeRO's runs, or the first replica's whole). A split parameter's full tensor
// (and its per-element state) is read a band at a time from every share (SplitBands); the rest
// from tensor rank 0's.
class SplitReads final : public GatheredReads {
 public:
  // `shares`: the optimizer's StateLayout over params (their shares, alike on every tensor rank);
  // `full`: one process's, the checkpoint's. `weights`: the parameters' elements a tensor rank's
  // whole 0 holds (all, or a LoRA's trained run).
  SplitReads(Communicator& world, std::vector<Tensor> parts, const ParameterSet& params,
             std::vector<std::vector<int>> holders, StateLayout shares, StateLayout full,
             ElementRange weights)
      : GatheredReads(world, std::move(parts)),
        params_(params),
        holders_(std::move(holders)),
        shares_(std::move(shares)),
        full_(std::move(full)),
        weights_(weights) {}

  void read_param(const ParamInfo& p, size_t at, size_t n, void* dst) override {
    const auto bytes = static_cast<size_t>(weight_bytes());
    read_full(0, p, static_cast<size_t>(p.offset - weights_.offset) * bytes, bytes, at, n, dst);
  }

  int64_t state_bytes(size_t i) const override { return full_.total[i] * full_.element_bytes[i]; }

  // Each full parameter's state in turn: a split one's per-element state from every tensor
  // rank's share, any other tensor rank 0's (its replicas' runs of it in order).
  void read_state(size_t i, size_t at, size_t n, void* dst) override {
    const auto bytes = static_cast<size_t>(full_.element_bytes[i]);
    auto* out = static_cast<char*>(dst);
    for (size_t k = 0; k < params_.list().size() && n > 0; ++k) {
      const auto begin = static_cast<size_t>(full_.at[i][k]) * bytes;
      const size_t end = begin + static_cast<size_t>(full_.length[i][k]) * bytes;
      if (at >= end) continue;
      const size_t take = std::min(n, end - at);
      const auto share = static_cast<size_t>(shares_.at[i][k]) * bytes;
      if (shares_.per_element[i][k])
        read_full(i + 1, params_.list()[k], share, bytes, at - begin, take, out);
      else
        read_share(i + 1, 0, share + at - begin, take, out);
      out += take;
      at += take;
      n -= take;
    }
  }

 private:
  // Bytes [at, at + n) of tensor rank t's whole `whole`, from the parts of its holders.
  void read_share(size_t whole, size_t t, size_t at, size_t n, char* dst) {
    read_across(whole, holders_[t], at, n, dst, "a tensor rank");
  }

  // The bytes of a weight (of the master copy, where there is one).
  int64_t weight_bytes() const {
    int64_t bytes = 0;
    for (int r : holders_[0]) bytes += part_bytes(0, r);
    BRISK_CHECK(weights_.count > 0 && bytes % weights_.count == 0,
                "internal error: a save part of ", bytes, " bytes for ", weights_.count,
                " parameter elements");
    return bytes / weights_.count;
  }

  // Bytes [at, at + n) of p's full tensor in whole `whole`, whose share starts at byte `share`
  // of each tensor rank's (`bytes` per element): a split parameter's a band at a time from the
  // tensor ranks' shares (the first of a slice's copies).
  void read_full(size_t whole, const ParamInfo& p, size_t share, size_t bytes, size_t at, size_t n,
                 void* dst) {
    if (!p.split.split()) {
      read_share(whole, 0, share + at, n, static_cast<char*>(dst));
      return;
    }
    if (banded_whole_ != whole || banded_param_ != &p) bands_.forget();
    banded_whole_ = whole;
    banded_param_ = &p;
    bands_.read(p, bytes, at, n, static_cast<char*>(dst),
                [&](int slice, size_t local, size_t count, char* out) {
                  read_share(whole, static_cast<size_t>(slice * p.split.copies), share + local,
                             count, out);
                });
  }

  const ParameterSet& params_;
  std::vector<std::vector<int>> holders_;
  StateLayout shares_, full_;
  ElementRange weights_;
  SplitBands bands_;
  size_t banded_whole_ = 0;
  const ParamInfo* banded_param_ = nullptr;
};

class TensorParallel final : public LayeredPolicy {
 public:
  TensorParallel(const ParallelContext& c, CommunicatorTensorGroup& group,
                 std::unique_ptr<ParallelPolicy> inner)
      : LayeredPolicy(c, std::move(inner)), group_(group) {
    const std::vector<ParamInfo>& params = model_.params().list();
    for (size_t i = 0; i < params.size(); ++i) {
      if (params[i].split.split()) split_.push_back(static_cast<int>(i));
      if (params[i].split.copies > 1) copied_.push_back(static_cast<int>(i));
      if (params[i].split.partial) partial_.push_back(static_cast<int>(i));
    }
    // The tensor ranks that hold the same key/value heads, which sum those heads' gradients.
    if (!copied_.empty()) {
      const int copies = params[static_cast<size_t>(copied_[0])].split.copies;
      const int t = mesh_.coordinate(MeshDim::tensor);
      copies_ = mesh_.group(MeshDim::tensor).split(t / copies, t);
      copies_group_ = std::make_unique<CommunicatorTensorGroup>(*copies_);
      first_copy_ = t % copies == 0;
    }
    share_ = full_layout_share();
  }

  // The data replicas' sums, and the step's sums over the tensor group (blocking: all waited).
  SyncSeconds finish_gradients() override {
    SyncSeconds s = inner().finish_gradients();
    if (!copied_.empty()) sum_gradients(copied_, *copies_group_);
    sum_gradients(partial_, group_);
    const double tensor =
        group_.take_seconds() + (copies_group_ ? copies_group_->take_seconds() : 0.0);
    s.ran += tensor;
    s.waited += tensor;
    return s;
  }
  std::vector<std::pair<std::string, double>> statistics() const override {
    std::vector<std::pair<std::string, double>> out = inner().statistics();
    out.emplace_back("tensor_parallel_sum_bytes", group_.bytes());
    out.emplace_back("tensor_parallel_token_bytes", group_.token_bytes());
    if (copies_group_) out.emplace_back("tensor_parallel_copies_sum_bytes", copies_group_->bytes());
    return out;
  }

  // Tensor rank 0 counts every element of its gradients, the others only their shares of the
  // split parameters: the rest they hold alike. Under ZeRO's stage 2 and 3 the gradients are
  // this data rank's run of them.
  double gradient_sum_squares(const Tensor& acc, int skip) override {
    const Tensor& grads = inner().gradients();
    const int64_t base = held_base();
    if (mesh_.coordinate(MeshDim::tensor) == 0) {
      sum_squares_except(be_, model_.params(), grads, base, skip, acc);
    } else {
      for (int i : split_) {
        if (i == skip) continue;
        const ParamInfo& p = model_.params().list()[static_cast<size_t>(i)];
        if (p.split.copies > 1 && !first_copy_) continue;  // its first copy counts it
        const ElementRange r = held_range(p, base, grads.numel());
        if (r.count > 0) be_.sum_squares(element_range(grads, r.offset, r.count), acc);
      }
    }
    return sum_over_gradients_then(acc, mesh_.group(MeshDim::tensor));
  }

  // A checkpoint's state is laid out as the full parameters: this rank's elements, run by run.
  const StateShare* state_share() const override { return &share_; }

  // Each tensor rank's share comes from its replicas (data and sequence ranks): under ZeRO their
  // runs in order (as checkpoint_parts gives them), else the first replica's whole.
  std::unique_ptr<GatheredReads> gather_for_save(bool checkpoint) override {
    std::vector<std::vector<int>> holders;
    for (int t = 0; t < mesh_.shape()[MeshDim::tensor]; ++t)
      holders.push_back(replica_ranks(mesh_.shape(), 0, t));
    const ParameterSet& params = model_.params();
    // A master copy holds the trained parameters alone (a LoRA's run); the weights are all.
    const ElementRange saved = precision_.has_master() ? params.trained_run().elements
                                                       : ElementRange{0, params.total_elements()};
    return std::make_unique<SplitReads>(world_, saved_parts(checkpoint), params, std::move(holders),
                                        state_layout(optimizer_, params),
                                        full_state_layout(optimizer_, params), saved);
  }

 private:
  CommunicatorTensorGroup& group_;  // the model's tensor group (make_parallel's)
  std::vector<int> split_;          // the split parameters
  std::vector<int> copied_;         // those held in copies (key/value heads fewer than the ranks)
  std::vector<int> partial_;        // whole ones whose gradients are each rank's tokens' part
  std::unique_ptr<Communicator> copies_;  // the tensor ranks holding this rank's copies
  std::unique_ptr<CommunicatorTensorGroup> copies_group_;  // over copies_, counting what it sums
  bool first_copy_ = true;
  StateShare share_;

  // Gradients of parameters `params` each rank of `group` holds a part of, summed over it (after
  // the data replicas' sums, which commute with them), neighbouring parameters at once: each copy
  // of a key/value head got the gradient of its own query heads; under Megatron's sequence
  // parallelism each rank's norms that of its tokens.
  void sum_gradients(const std::vector<int>& params, CommunicatorTensorGroup& group) {
    const Tensor& grads = inner().gradients();
    for_each_held_run(model_.params(), params, held_base(), grads.numel(), [&](ElementRange r) {
      group.all_reduce_sum(be_, element_range(grads, r.offset, r.count));
    });
  }

  // Where the elements of this rank's optimizer state (those of its run, ZeRO's or all) lie in a
  // checkpoint's, laid out as the full parameters.
  StateShare full_layout_share() const {
    const ElementRange run = zero_ ? run_ : model_.params().trained_run().elements;
    return whole_layout_share(optimizer_, model_.params(), model_.params(), run,
                              full_state_layout(optimizer_, model_.params()));
  }
};

}  // namespace

namespace {
// Tensor parallelism's optimizer: one whose state is one value per element of the parameters it
// steps (`stepped` of them), or one that sums a split parameter's statistics over the group on
// backend `be`, the one it steps on (then joined to the group).
void join_optimizer(const Backend& be, Optimizer& optimizer, const ParameterSet& params,
                    int64_t stepped, Communicator& group) {
  if (optimizer.steps_split_parameters(be)) {
    Optimizer::SplitGroup g;
    g.sum = [&group](const Tensor& t) { group.all_reduce_sum(t); };
    g.max = [&group](const Tensor& t) { group.all_reduce_max(t); };
    g.rank = group.rank();
    optimizer.join_split_group(g);
    return;
  }
  bool elementwise = true;
  for (const ParamInfo& p : params.list()) elementwise &= optimizer.shard_granule(p) == 1;
  for (const auto& named : optimizer.state()) elementwise &= named.second.numel() == stepped;
  BRISK_CHECK(elementwise, "tensor parallelism (--tp_size) needs an optimizer that steps a split ",
              "parameter's shares as the whole (adamw_torch, sgd; adafactor and adamw_8bit on the ",
              "CPU, on a GPU with --offload_optimizer cpu); ", optimizer.name(), " on ", be.name(),
              " would depend on how the parameters are split");
}
}  // namespace

std::unique_ptr<TensorGroup> make_tensor_group(Communicator& comm) {
  return std::make_unique<CommunicatorTensorGroup>(comm);
}

std::unique_ptr<ParallelPolicy> make_tensor_parallel(const ParallelContext& c,
                                                     CommunicatorTensorGroup& group,
                                                     std::unique_ptr<ParallelPolicy> inner) {
  // An offloaded optimizer steps on the host's backend.
  const std::unique_ptr<Backend> host = c.buffers.offload ? make_backend(kHostDevice) : nullptr;
  join_optimizer(host ? *host : c.be, c.optimizer, c.model.params(), stepped_run(c).count,
                 c.mesh.group(MeshDim::tensor));
  return std::make_unique<TensorParallel>(c, group, std::move(inner));
}

}  // namespace brisk
