// Expert parallelism's exchanges over a communicator.
#include "parallel/expert_parallel.h"

#include <algorithm>
#include <chrono>
#include <string>
#include <utility>

#include "backend/backend.h"
#include "core/checked.h"
#include "core/clock.h"
#include "optim/optimizer.h"
#include "parallel/layered_policy.h"
#include "parallel/part_reads.h"
#include "parallel/zero.h"
#include "precision/mixed_precision.h"

namespace brisk {

namespace {
using Clock = std::chrono::steady_clock;
}  // namespace

// As float64 (exact for counts): the communicators' buffers are floating point.
std::vector<int32_t> CommunicatorExpertGroup::all_gather(const std::vector<int32_t>& counts) {
  const auto start = Clock::now();
  const auto n = static_cast<int64_t>(counts.size());
  std::vector<double> mine(counts.begin(), counts.end());
  std::vector<double> all(static_cast<size_t>(checked_mul(n, size(), "expert counts")));
  comm_.all_gather(Tensor(mine.data(), Shape{n}, DType::f64),
                   Tensor(all.data(), Shape{static_cast<int64_t>(all.size())}, DType::f64));
  seconds_ += seconds_since(start);
  return std::vector<int32_t>(all.begin(), all.end());
}

void CommunicatorExpertGroup::all_to_all_v(Backend&, const Tensor& in,
                                           const std::vector<int64_t>& send, const Tensor& out,
                                           const std::vector<int64_t>& receive) {
  const auto start = Clock::now();
  comm_.all_to_all_v(in, send, out, receive);
  seconds_ += seconds_since(start);
  bytes_ += static_cast<double>(in.bytes());
}

}  // namespace brisk

namespace brisk {

namespace {

class ExpertParallel final : public LayeredPolicy {
 public:
  ExpertParallel(const ParallelContext& c, std::unique_ptr<ParallelPolicy> inner)
      : LayeredPolicy(c, std::move(inner)),
        experts_(c.mesh.group(MeshDim::expert)),
        full_(Model::create(c.full)) {
    const std::vector<ParamInfo>& params = model_.params().list();
    for (size_t i = 0; i < params.size(); ++i)
      (params[i].expert ? experts_of_rank_ : shared_).push_back(static_cast<int>(i));
    place_parameters(c.full);
    state_ = state_layout(optimizer_, full_->params());
    // Where this rank's optimizer state (its run's) lies in a checkpoint's.
    share_ = whole_layout_share(optimizer_, model_.params(), full_->params(), run_, state_);
  }

  // The replicas' sums, then the step's statistics and the shared parameters' gradients over
  // the expert group (blocking: all waited for).
  SyncSeconds finish_gradients() override {
    return finish_then([&] {
      experts_.all_reduce_sum(model_.step_stats());
      sum_over_experts(shared_);
    });
  }
  double sum_over_gradients(const Tensor& sums) override {
    return sum_over_gradients_then(sums, experts_);
  }
  // Expert rank 0 counts every element of its gradients, the others their experts' only: the
  // rest they hold alike.
  double gradient_sum_squares(const Tensor& acc, int skip) override {
    BRISK_CHECK(skip < 0, "internal error: expert parallelism inside another layout");
    const Tensor& grads = inner().gradients();
    const int64_t base = held_base();
    if (experts_.rank() == 0) {
      sum_squares_except(be_, model_.params(), grads, base, -1, acc);
    } else {
      for (int i : experts_of_rank_) {
        const ElementRange r =
            held_range(model_.params().list()[static_cast<size_t>(i)], base, grads.numel());
        if (r.count > 0) be_.sum_squares(element_range(grads, r.offset, r.count), acc);
      }
    }
    return sum_over_gradients(acc);
  }
  const StateShare* state_share() const override { return &share_; }
  const Model* saved_model() const override { return full_.get(); }

  // Each expert rank's share comes from its replicas: under ZeRO their runs in order, else the
  // first replica's whole.
  std::unique_ptr<GatheredReads> gather_for_save(bool checkpoint) override {
    return std::make_unique<PartReads>(world_, saved_parts(checkpoint), full_->params(), placed_,
                                       holders_, held_elements_, state_);
  }

 private:
  // The gradients of `params` (each rank's part of the batch's) summed over the expert group,
  // neighbouring parameters at once.
  void sum_over_experts(const std::vector<int>& params) {
    const Tensor& grads = inner().gradients();
    for_each_held_run(model_.params(), params, held_base(), grads.numel(), [&](ElementRange r) {
      experts_.all_reduce_sum(element_range(grads, r.offset, r.count));
    });
  }

  // Which expert rank holds each of the whole model's parameters (the shared ones: rank 0), and
  // where in its share; the holders (each expert rank's replicas), their elements together.
  void place_parameters(const ModelConfig& full) {
    const int ranks = experts_.size(), replicas = world_.size() / ranks;
    placed_.assign(full_->params().list().size(), std::vector<Placed>(1));
    for (int h = 0; h < ranks; ++h) {
      const std::unique_ptr<Model> share = Model::create(expert_parallel_share(full, h, ranks));
      std::vector<int> holder;
      for (int d = 0; d < replicas; ++d) holder.push_back(d * ranks + h);
      holders_.push_back(holder);
      held_elements_ += share->params().total_elements();
      place_part(optimizer_, share->params(), full_->params(), h, 0, placed_);  // shared: rank 0's
    }
  }

  Communicator& experts_;
  std::unique_ptr<Model> full_;                // the whole model's parameters (no buffers)
  std::vector<int> experts_of_rank_, shared_;  // this share's expert parameters, and the rest
  std::vector<std::vector<Placed>> placed_;    // by whole parameter (one tensor rank)
  std::vector<std::vector<int>> holders_;      // each expert rank's replicas
  int64_t held_elements_ = 0;
  StateLayout state_;  // the whole model's optimizer state
  StateShare share_;
};

}  // namespace

std::unique_ptr<ParallelPolicy> make_expert_parallel(const ParallelContext& c,
                                                     std::unique_ptr<ParallelPolicy> inner) {
  return std::make_unique<ExpertParallel>(c, std::move(inner));
}

}  // namespace brisk
