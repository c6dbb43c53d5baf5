// Expert parallelism (models/moe_layer.h over parallel/expert_parallel.h) on every rank of the
// job: each rank routes its own tokens and holds E / ranks experts; its outputs, its input's and
// router's gradients equal one process's with every expert on the same tokens, and its experts'
// gradients equal the sum over the ranks of one process's. Float32 sums of the same terms in
// another order (a rank's rows arrive in blocks): 1e-5 relative to max(1, |want|).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend_support.h"
#include "models/moe_layer.h"
#include "parallel/expert_parallel.h"
#include "parallel/test_world.h"
#include "parallel/train_ranks.h"
#include "test_support.h"

namespace brisk::testing {
namespace {

using FVec = std::vector<float>;

FVec randn(size_t n, std::mt19937& rng, float scale) {
  std::normal_distribution<float> d(0.0f, scale);
  FVec v(n);
  for (float& x : v) x = d(rng);
  return v;
}

void expect_near(const FVec& got, const FVec& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], 1e-5 * std::max(1.0f, std::abs(want[i])))
        << what << " element " << i;
}

// One layer's weights and their gradients (every expert's, or this rank's), and its buffers.
struct Layer {
  MoeWeights w, g;
  MoeSaved saved;
  MoeScratch scratch;
};

// The layer for shape s in d: weights [E or local, ...] from the full ones (this rank's experts'
// rows where s splits them), gradients and buffers starting as NaNs (every one must be written).
Layer make_layer(DeviceBuffers& d, const MoeShape& s, int rank, const FVec& router,
                 const FVec& gate_up, const FVec& down) {
  const int64_t C = s.hidden, F = s.inner, E = s.experts, L = moe_local_experts(s);
  const auto first = static_cast<int64_t>(s.expert_ranks > 1 ? rank : 0) * L;
  auto experts = [&](const FVec& all, int64_t per) {
    return FVec(all.begin() + first * per, all.begin() + (first + L) * per);
  };
  const float nan = std::nanf("");
  Layer l;
  l.w = {d.put(router, {E, C}), d.put(experts(gate_up, 2 * F * C), {L, 2 * F, C}),
         d.put(experts(down, C * F), {L, C, F})};
  l.g = {d.put(FVec(E * C, nan), {E, C}), d.put(FVec(L * 2 * F * C, nan), {L, 2 * F, C}),
         d.put(FVec(L * C * F, nan), {L, C, F})};
  int64_t largest = L * 2 * F * C;
  const auto alloc = [&](Tensor* t, const std::string&, DType dtype, Shape shape) {
    *t = dtype == DType::f32 ? d.put(FVec(shape.numel(), nan), shape) : d.alloc(shape, dtype);
    largest = std::max(largest, shape.numel());
  };
  declare_moe_saved(s, l.saved, alloc);
  declare_moe_scratch(s, l.scratch, alloc);
  d.workspace(largest);
  return l;
}

struct Case {
  int64_t experts_per_rank, top_k;
  bool normalize;
  bool last_rank_idle;   // no token chooses the last rank's experts
  int64_t capacity = 0;  // each rank's, over its own tokens
};

void check_case(const Case& c) {
  const int P = world().size(), r = world().rank();
  SCOPED_TRACE("experts per rank " + std::to_string(c.experts_per_rank) + ", top " +
               std::to_string(c.top_k) + (c.last_rank_idle ? ", last rank idle" : "") +
               ", capacity " + std::to_string(c.capacity));
  MoeShape one{7, 6, 5, c.experts_per_rank * P, c.top_k, c.normalize};
  one.capacity = c.capacity;
  MoeShape split = one;
  split.expert_ranks = P;
  const int64_t N = one.tokens, C = one.hidden, F = one.inner, E = one.experts;
  std::mt19937 shared(11);  // the same weights on every rank
  FVec router = randn(E * C, shared, 0.7f), gate_up = randn(E * 2 * F * C, shared, 0.5f);
  const FVec down = randn(E * C * F, shared, 0.5f);
  std::mt19937 own(100 + r);  // this rank's tokens
  FVec x = randn(N * C, own, 1.0f);
  const FVec dy = randn(N * C, own, 1.0f);
  if (c.last_rank_idle) {
    for (int64_t e = E - c.experts_per_rank; e < E; ++e)
      for (int64_t i = 0; i < C; ++i) router[e * C + i] = 0.0f;
    for (int64_t e = 0; e < E - c.experts_per_rank; ++e) router[e * C] = 6.0f + 0.1f * e;
    for (int64_t n = 0; n < N; ++n) x[n * C] = std::abs(x[n * C]) + 1.0f;
  }

  auto be = make_backend(kHostDevice);
  DeviceBuffers d(*be);
  const Tensor xs = d.put(x, {N, C}), dys = d.put(dy, {N, C});
  // One process with every expert.
  Layer whole = make_layer(d, one, r, router, gate_up, down);
  const Tensor y1 = d.alloc({N, C}), dx1 = d.alloc({N, C});
  std::vector<int32_t> counts1;
  moe_forward(*be, one, whole.w, xs, whole.saved, whole.scratch, y1, counts1);
  moe_backward(*be, one, whole.w, whole.g, xs, whole.saved, whole.scratch, counts1, dys, Tensor(),
               dx1, false);
  // The experts split over the ranks.
  CommunicatorExpertGroup group(world());
  Layer part = make_layer(d, split, r, router, gate_up, down);
  const Tensor y = d.alloc({N, C}), dx = d.alloc({N, C});
  std::vector<int32_t> counts;
  moe_forward(*be, split, part.w, xs, part.saved, part.scratch, y, counts, {}, &group);
  moe_backward(*be, split, part.w, part.g, xs, part.saved, part.scratch, counts, dys, Tensor(), dx,
               false, {}, &group);

  EXPECT_EQ(std::vector<int32_t>(counts.begin(), counts.begin() + E), counts1);
  if (c.capacity > 0) EXPECT_GT(moe_dropped(one, counts1), 0);
  if (c.last_rank_idle && r == P - 1 && P > 1)
    EXPECT_EQ(std::vector<int32_t>(counts.begin() + E, counts.end()),
              std::vector<int32_t>(counts.size() - E, 0));
  expect_near(d.get(y), d.get(y1), "output");
  expect_near(d.get(dx), d.get(dx1), "input's gradient");
  expect_near(d.get(part.g.router), d.get(whole.g.router), "router's gradient");
  // This rank's experts' gradients: the sum over the ranks of one process's.
  for (const auto& [mine, all, what] : {std::tuple{part.g.gate_up, whole.g.gate_up, "gate_up"},
                                        std::tuple{part.g.down, whole.g.down, "down"}}) {
    FVec sum = d.get(all);
    world().all_reduce_sum(Tensor(sum.data(), Shape{static_cast<int64_t>(sum.size())}, DType::f32));
    const auto per = static_cast<int64_t>(sum.size()) / E, first = r * c.experts_per_rank * per;
    expect_near(d.get(mine), FVec(sum.begin() + first, sum.begin() + first + mine.numel()),
                std::string(what) + "'s gradient");
  }
}

TEST(ExpertParallel, ALayerComputesAsOneProcessWithEveryExpert) {
  NEEDS_MPI();
  check_case({2, 2, true, false});
  check_case({1, 1, false, false});
  check_case({3, 4, true, false});     // a token sends up to 3 rows to one rank
  check_case({2, 2, false, true});     // the last rank's experts get no row and write zeros
  check_case({1, 2, true, false, 2});  // pairs past 2 per expert dropped by their own rank
}

TEST(ExpertParallel, TheGroupMustFitTheExperts) {
  NEEDS_MPI();
  const int P = world().size();
  auto be = make_backend(kHostDevice);
  DeviceBuffers d(*be);
  MoeShape s{3, 4, 2, 2 * P, 2, true};
  s.expert_ranks = P;
  const FVec router(2 * P * 4, 0.1f), gate_up(2 * P * 4 * 4, 0.1f), down(2 * P * 4 * 2, 0.1f);
  Layer l = make_layer(d, s, world().rank(), router, gate_up, down);
  const Tensor x = d.put(FVec(12, 0.5f), {3, 4}), y = d.alloc({3, 4});
  std::vector<int32_t> counts;
  // Without its group, or experts that do not split evenly.
  EXPECT_THROW(moe_forward(*be, s, l.w, x, l.saved, l.scratch, y, counts), Error);
  s.experts += 1;
  CommunicatorExpertGroup group(world());
  EXPECT_THROW(moe_forward(*be, s, l.w, x, l.saved, l.scratch, y, counts, {}, &group), Error);
}

// A model made for expert rank r of `ep` declares only its experts (by their names in the whole)
// and loads them from the checkpoint; run on the same batch as one process with every expert, its
// loss and dense gradients are that process's and its experts' gradients `ep` times theirs (every
// rank of the group routed the same tokens to them). The world's ranks as expert groups: all of
// them where the fixtures' six experts split so, else pairs.
TEST(ExpertParallel, AModelHoldsItsExpertsAndComputesAsOneProcess) {
  NEEDS_MPI();
  const int P = world().size(), r = world().rank(), ep = 6 % P == 0 ? P : 2;
  const std::unique_ptr<Communicator> ranks = world().split(r / ep, r);
  CommunicatorExpertGroup group(*ranks);
  for (const char* name : {"moe/qwen2_moe_tiny", "moe/olmoe_tiny"}) {
    SCOPED_TRACE(name);
    const std::string folder = fixture(name);
    LoadedModel whole(folder);
    LoadedModel part(folder, {}, false, DType::f32, 0, false, [&](ModelConfig& c) {
      c.moe.expert_rank = group.rank();
      c.moe.expert_ranks = ep;
    });
    part.model->set_parallelism({nullptr, nullptr, &group});
    const double loss = part.step(false), want = whole.step(false);
    EXPECT_NEAR(loss, want, 1e-6 * std::abs(want));
    int64_t experts = 0, all_experts = 0;
    for (const ParamInfo& p : whole.model->params().list()) all_experts += p.expert;
    const std::vector<ParamInfo>& params = part.model->params().list();
    for (size_t i = 0; i < params.size(); ++i) {
      const ParamInfo& p = params[i];
      SCOPED_TRACE(p.name);
      const int k = whole.model->params().index(p.name);
      experts += p.expert;
      FVec want_grad = to_host(*whole.be, whole.model->params().grad(k));
      for (float& v : want_grad) v *= p.expert ? static_cast<float>(ep) : 1.0f;
      expect_near(to_host(*part.be, part.model->params().grad(static_cast<int>(i))), want_grad,
                  "gradient");
    }
    EXPECT_EQ(experts * ep, all_experts);
  }
}

// Training with --ep_size 2 (the world's ranks in pairs, each holding two of a tiny Mixtral's four
// experts; on 4 ranks two pairs, each expert's holders summing its gradients) trains as plain
// data parallelism on the same ranks, with the load-balancing loss (each rank's own micro-batch's,
// as under DDP): the same losses and the same whole model saved, the experts read from their
// ranks. Under ZeRO 1, 2 and 3 too (the states sharded over each expert's holders). To the sums'
// order (1e-5).
TEST(ExpertParallel, TrainsAsDataParallelismAndSavesTheWholeModel) {
  NEEDS_MPI();
  if (world().size() % 2 != 0) GTEST_SKIP() << "expert parallelism here pairs the ranks";
  SharedDir dir("ep_train");
  if (world().rank() == 0)
    write_tiny_mixtral(*dir.owned, R"("router_aux_loss_coef": 0.1, "output_router_logits": true)",
                       4);
  world().barrier();
  TrainOptions o = tiny_options(dir / "mixtral", dir / "ddp");
  o.per_device_train_batch_size = 2;
  o.max_steps = 3;
  const Logged ddp = run(o, nullptr, &world());
  for (const int64_t zero : {0, 1, 2, 3}) {
    SCOPED_TRACE("zero stage " + std::to_string(zero));
    TrainOptions e = o;
    e.output_dir = dir / ("ep_zero" + std::to_string(zero));
    e.ep_size = 2;
    e.zero_stage = zero;
    const Logged experts = run(e, nullptr, &world());
    if (world().rank() == 0) expect_trains_as(experts, ddp);
  }
}

// Checkpoints hold the whole model and one process's optimizer state: the --ep_size ranks (under
// ZeRO 2 on 4 ranks: gathered from each share's runs) resume one process's checkpoint and one
// process resumes theirs, each ending as the run that went on. No load-balancing loss, so that
// the ranks train as one process with their rows.
TEST(ExpertParallel, CheckpointsResumeOnAnotherLayout) {
  NEEDS_MPI();
  const int N = world().size();
  if (N % 2 != 0) GTEST_SKIP() << "expert parallelism here pairs the ranks";
  SharedDir dir("ep_resume");
  if (world().rank() == 0) write_tiny_mixtral(*dir.owned, "", 4);
  world().barrier();
  TrainOptions o = tiny_options(dir / "mixtral", dir / "ranks");
  o.per_device_train_batch_size = 2;
  o.max_steps = 4;
  o.save_steps = 2;
  o.ep_size = 2;
  o.zero_stage = 2;
  TrainOptions one = o;
  one.output_dir = dir / "one";
  one.per_device_train_batch_size = 2 * N;
  one.ep_size = 1;
  one.zero_stage = 0;
  expect_resumes_across_layouts(o, one, nullptr);
}

// The rows' bytes a run reports: per step, micro-batch and sparse layer each rank passes its N k
// routed rows out and their gradients back, and the rows it received back and their gradients
// out: summed over the ranks, 4 N k rows of C float32 each.
TEST(ExpertParallel, TheRunReportsTheRowsItExchanged) {
  NEEDS_MPI();
  const int N = world().size();
  if (N % 2 != 0) GTEST_SKIP() << "expert parallelism here pairs the ranks";
  SharedDir dir("ep_bytes");
  if (world().rank() == 0) write_tiny_mixtral(*dir.owned, "", 4);
  world().barrier();
  TrainOptions o = tiny_options(dir / "mixtral", dir / "out");
  o.ep_size = 2;
  o.dataset_size = 16 * N;  // every micro-batch whole
  double bytes = statistic_of_two_steps(o, nullptr, "expert_all_to_all_bytes");
  world().all_reduce_sum(Tensor(&bytes, Shape{1}, DType::f64));
  // 2 steps x 2 micro-batches x 2 sparse layers; 2 x 12 tokens, top 2, C = 16.
  EXPECT_EQ(bytes, 2.0 * 2 * 2 * N * (4 * 24 * 2) * 16 * 4);
}

}  // namespace
}  // namespace brisk::testing
