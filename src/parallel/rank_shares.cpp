#include "parallel/rank_shares.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"

namespace brisk {

namespace {

// A rank's parameters: its shard's, or the whole model's.
double rank_params(const RankSharesInput& in, int r) {
  return in.shards.empty() ? static_cast<double>(in.params)
                           : static_cast<double>(in.shards[static_cast<size_t>(r)].elements.count);
}

}  // namespace

RankShares rank_shares(const RankSharesInput& in) {
  RankShares out;
  const double n = static_cast<double>(std::max<int64_t>(in.params, 1));
  auto bytes = [&](Category c) { return static_cast<double>(in.planned[static_cast<int>(c)]); };
  const double shard0 = in.shards.empty() ? 0.0 : 4.0 * rank_params(in, 0);
  // Rank 0's plan holds its shards: what is left every rank holds alike.
  const double weights = bytes(Category::weights) - (in.sharded_weights ? shard0 : 0.0);
  const double master = bytes(Category::master_weights);
  const double host_copy = in.offload ? static_cast<double>(in.host_gradient_bytes) : 0.0;
  const double staged =
      bytes(Category::gradients) - host_copy - (in.sharded_gradients ? shard0 : 0.0);
  BRISK_CHECK(in.optimizer_state.size() == static_cast<size_t>(in.world),
              "internal error: optimizer state for ", in.optimizer_state.size(), " of ", in.world,
              " ranks");
  for (int r = 0; r < in.world; ++r) {
    RankShare s;
    s.rank = r;
    s.params = rank_params(in, r);
    s.weights = in.sharded_weights ? weights + 4.0 * s.params : weights;
    s.master = in.sharded_master ? 4.0 * s.params : master;
    const double host_grads = in.offload ? 4.0 * s.params : 0.0;
    s.gradients = (in.sharded_gradients ? staged + 4.0 * s.params : staged) + host_grads;
    s.optimizer_state = in.optimizer_state[static_cast<size_t>(r)];
    s.host = in.offload ? s.master + s.optimizer_state + host_grads : 0.0;
    out.largest = std::max(out.largest, s.total() / n);
    out.ranks.push_back(s);
  }
  // The optimizer state of the whole model: one rank's, or the ranks' shares together.
  const double whole_state = in.shards.empty() ? in.optimizer_state[0]
                                               : std::accumulate(in.optimizer_state.begin(),
                                                                 in.optimizer_state.end(), 0.0);
  const double world = static_cast<double>(in.world);
  const double sharing = in.shards.empty() ? 1.0 : world;  // ranks sharing the optimizer
  // The elements a partitioned state holds (a LoRA's adapters: the trained ones alone).
  const double trained = in.trained < 0 ? n : static_cast<double>(in.trained);
  const double master_share = in.sharded_master ? 4.0 * trained / world : master;
  const double host_share = in.offload ? 4.0 * trained / sharing : 0.0;
  const double grad_share =
      (in.sharded_gradients ? staged + 4.0 * trained / world : staged) + host_share;
  const double weight_share = in.sharded_weights ? weights + 4.0 * n / world : weights;
  out.weights = weight_share / n;
  out.master = master_share / n;
  out.gradients = grad_share / n;
  out.optimizer = whole_state / n;
  out.model_states = (weight_share + master_share + grad_share + whole_state / sharing) / n;
  out.host = in.offload ? (master_share + whole_state / sharing + host_share) / n : 0.0;
  out.device = (weight_share + grad_share - host_share) / n;
  out.weights_alike = weights / n;
  out.master_alike = master / n;
  out.gradients_alike = staged / n;
  return out;
}

}  // namespace brisk
