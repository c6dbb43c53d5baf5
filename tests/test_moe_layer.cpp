// The sparse mixture-of-experts MLP (models/moe_layer.h) against transformers' Mixtral, Qwen2-MoE
// (a shared expert) and OLMoE blocks (fixtures from scripts/make_moe_fixtures.py), and against an
// fp64 reference that computes each token's chosen experts one by one: the output, and every
// gradient (input, router, experts) against finite differences of that reference. Routings with
// one, two and all experts per token, normalized or not, and an expert that no token chooses (its
// gradients written as zeros). On the CPU, and on a GPU where there is one. The load-balancing loss
// and its gradient as transformers' load_balancing_loss_func gives them, over several layers with
// padded tokens.
//
// Tolerances: float32 sums over at most C + F terms against fp64: 1e-5 relative (element-wise,
// against max(1, |want|)) for the output; the gradients 1e-4 normwise against central differences
// (h = 1e-4, whose own error is about h^2 times the third derivative).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "backend_support.h"
#include "conformance/op_case.h"
#include "core/safetensors.h"
#include "models/moe_layer.h"

namespace brisk::testing {
namespace {

struct Params {
  Vec x, router, gate_up, down;
};

// fp64: y [N, C] for the layer's parameters, each token through its top-k experts.
Vec ref_moe(const MoeShape& s, const Params& p) {
  const int64_t N = s.tokens, C = s.hidden, F = s.inner, E = s.experts, k = s.top_k;
  Vec y(N * C, 0.0);
  std::vector<int64_t> taken(E, 0);  // each expert's pairs so far (capacity)
  for (int64_t n = 0; n < N; ++n) {
    const double* x = &p.x[n * C];
    Vec prob(E);
    for (int64_t e = 0; e < E; ++e) prob[e] = std::inner_product(x, x + C, &p.router[e * C], 0.0);
    const double top = *std::max_element(prob.begin(), prob.end());
    double sum = 0;
    for (double& v : prob) sum += (v = std::exp(v - top));
    for (double& v : prob) v /= sum;
    std::vector<int64_t> order(E);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return prob[a] > prob[b]; });
    double chosen = 0;
    for (int64_t j = 0; j < k; ++j) chosen += prob[order[j]];
    for (int64_t j = 0; j < k; ++j) {
      const int64_t e = order[j];
      if (s.capacity > 0 && ++taken[e] > s.capacity) continue;  // dropped
      const double w = s.normalize ? prob[e] / chosen : prob[e];
      Vec act(F);
      for (int64_t f = 0; f < F; ++f) {
        const double gate = std::inner_product(x, x + C, &p.gate_up[(e * 2 * F + f) * C], 0.0);
        const double up = std::inner_product(x, x + C, &p.gate_up[(e * 2 * F + F + f) * C], 0.0);
        act[f] = gate / (1.0 + std::exp(-gate)) * up;
      }
      for (int64_t c = 0; c < C; ++c)
        y[n * C + c] +=
            w * std::inner_product(act.begin(), act.end(), &p.down[(e * C + c) * F], 0.0);
    }
  }
  return y;
}

// The gradient of sum(ref_moe * dy) with respect to one parameter (`which` of Params), by central
// differences.
Vec fd_moe(const MoeShape& s, const Params& p, Vec Params::*which, const Vec& dy) {
  return fd_grad(p.*which, [&](const Vec& v) {
    Params q = p;
    q.*which = v;
    return dot(ref_moe(s, q), dy);
  });
}

// The last expert's logit made far below the others' for every token: the router's row for it
// zero, the others' first weight 6 and more, every token's first input above 1.
void leave_idle(Params& p, int64_t N, int64_t C, int64_t E) {
  for (int64_t c = 0; c < C; ++c) p.router[(E - 1) * C + c] = 0.0;
  for (int64_t e = 0; e + 1 < E; ++e) p.router[e * C] = 6.0 + 0.1 * static_cast<double>(e);
  for (int64_t n = 0; n < N; ++n) p.x[n * C] = std::abs(p.x[n * C]) + 1.0;
}

FVec as_floats(const Vec& v) {
  return FVec(v.begin(), v.end());
}

// The layer's saved tensors and temporaries for shape s, allocated in d.
struct LayerBuffers {
  MoeSaved saved;
  MoeScratch scratch;
};
LayerBuffers layer_buffers(DeviceBuffers& d, const MoeShape& s) {
  LayerBuffers b;
  // The products' operands: the weights and the routed rows' tensors at most.
  int64_t largest = s.experts * 2 * s.inner * s.hidden;
  // Float buffers start as NaNs: what the layer reads it must have written.
  const auto alloc = [&](Tensor* t, const std::string&, DType dtype, Shape shape) {
    *t = dtype == DType::f32 ? d.put(FVec(shape.numel(), std::nanf("")), shape)
                             : d.alloc(shape, dtype);
    largest = std::max(largest, shape.numel());
  };
  declare_moe_saved(s, b.saved, alloc);
  declare_moe_scratch(s, b.scratch, alloc);
  d.workspace(largest);
  return b;
}

void check_layer(Backend& be, const MoeShape& s, bool idle_expert, uint32_t seed) {
  SCOPED_TRACE(std::string(be.name()) + " k=" + std::to_string(s.top_k) +
               (s.normalize ? " normalized" : "") + (idle_expert ? " idle expert" : "") +
               " capacity " + std::to_string(s.capacity));
  const int64_t N = s.tokens, C = s.hidden, F = s.inner, E = s.experts;
  std::mt19937 rng(seed);
  Params p{randn_d(N * C, rng), randn_d(E * C, rng, 0.7), randn_d(E * 2 * F * C, rng, 0.5),
           randn_d(E * C * F, rng, 0.5)};
  if (idle_expert) leave_idle(p, N, C, E);
  const Vec dy = randn_d(N * C, rng);

  DeviceBuffers d(be);
  const auto [saved, scratch] = layer_buffers(d, s);
  const Tensor x = d.put(as_floats(p.x), {N, C}), y = d.alloc({N, C}), dx = d.alloc({N, C});
  const MoeWeights w{d.put(as_floats(p.router), {E, C}), d.put(as_floats(p.gate_up), {E, 2 * F, C}),
                     d.put(as_floats(p.down), {E, C, F})};
  // Gradients start as NaNs: every one must be written.
  const float nan = std::nanf("");
  const MoeWeights g{d.put(FVec(E * C, nan), {E, C}),
                     d.put(FVec(E * 2 * F * C, nan), {E, 2 * F, C}),
                     d.put(FVec(E * C * F, nan), {E, C, F})};
  std::vector<int32_t> counts;
  moe_forward(be, s, w, x, saved, scratch, y, counts);
  if (idle_expert) EXPECT_EQ(counts[E - 1], 0);
  EXPECT_EQ(std::accumulate(counts.begin(), counts.end(), int64_t{0}), N * s.top_k);
  if (s.capacity > 0) EXPECT_GT(moe_dropped(s, counts), 0);
  const Tensor dyt = d.put(as_floats(dy), {N, C});
  moe_backward(be, s, w, g, x, saved, scratch, counts, dyt, Tensor(), dx, false);

  const Vec want = ref_moe(s, p);
  EXPECT_TRUE(near(d.get(y), as_floats(want), 1e-5)) << "output";
  EXPECT_TRUE(rel_near(d.get(dx), as_floats(fd_moe(s, p, &Params::x, dy)), 1e-4)) << "dx";
  EXPECT_TRUE(rel_near(d.get(g.router), as_floats(fd_moe(s, p, &Params::router, dy)), 1e-4))
      << "router";
  EXPECT_TRUE(rel_near(d.get(g.gate_up), as_floats(fd_moe(s, p, &Params::gate_up, dy)), 1e-4))
      << "gate_up";
  EXPECT_TRUE(rel_near(d.get(g.down), as_floats(fd_moe(s, p, &Params::down, dy)), 1e-4)) << "down";
}

void check_layers(Backend& be) {
  const int64_t N = 9, C = 6, F = 5, E = 4;
  check_layer(be, MoeShape{N, C, F, E, 2, true}, false, 1);
  check_layer(be, MoeShape{N, C, F, E, 2, false}, false, 2);
  check_layer(be, MoeShape{N, C, F, E, 1, true}, false, 3);
  check_layer(be, MoeShape{N, C, F, E, 4, false}, false, 4);
  check_layer(be, MoeShape{N, C, F, E, 2, true}, true, 5);
  // Switch's capacity: 3 rows per expert of the 18 pairs (moe_capacity(0.6, 9, 2, 4)), the pairs
  // past it dropped; and the idle expert's share taken by the others.
  const int64_t capacity = moe_capacity(0.6, N, 2, E);
  EXPECT_EQ(capacity, 3);
  check_layer(be, MoeShape{N, C, F, E, 2, true, 0, false, capacity}, false, 6);
  check_layer(be, MoeShape{N, C, F, E, 2, false, 0, false, capacity}, true, 7);
}

TEST(MoeLayer, TheCapacityIsSwitchs) {
  EXPECT_EQ(moe_capacity(0, 100, 2, 8), 0);      // dropless
  EXPECT_EQ(moe_capacity(1.0, 100, 2, 8), 25);   // the even share
  EXPECT_EQ(moe_capacity(1.25, 100, 2, 8), 32);  // 31.25 rounded up
  EXPECT_EQ(moe_capacity(8.0, 100, 2, 8), 100);  // no expert takes a token twice
  EXPECT_EQ(moe_capacity(1e-9, 100, 2, 8), 1);
  MoeShape s{100, 4, 4, 3, 2, true};
  s.capacity = 60;
  EXPECT_EQ(moe_dropped(s, {80, 60, 60}), 20);
  s.capacity = 0;
  EXPECT_EQ(moe_dropped(s, {80, 60, 60}), 0);
}

// Each test on the CPU and on the GPU (skipped without one).
class MoeOn : public ::testing::TestWithParam<Device> {
 protected:
  void SetUp() override {
    if (GetParam() == Device::cuda) REQUIRE_GPU();
    be_ = make_backend(GetParam());
  }
  std::unique_ptr<Backend> be_;
};

TEST_P(MoeOn, LayerMatchesTheReferenceAndItsFiniteDifferences) {
  check_layers(*be_);
}

// A block of transformers (tests/fixtures/moe/<name>.safetensors, scripts/make_moe_fixtures.py):
// its weights, input and upstream gradient through moe_forward and moe_backward, the output and
// every gradient against transformers' (fp32 both; 1e-5 normwise).
void check_against_transformers(Backend& be, const std::string& name, int64_t E, int64_t k,
                                bool normalize) {
  SCOPED_TRACE(std::string(be.name()) + " " + name);
  const SafetensorsFile f(fixture("moe/" + name + ".safetensors"));
  auto values = [&](const std::string& key) {
    const Tensor& t = f.get(key);
    return FVec(t.f32(), t.f32() + t.numel());
  };
  // transformers' shared expert (Qwen2-MoE): gate_proj and up_proj, packed here as one [2S, C].
  const bool shared = f.has("param.shared_expert_gate.weight");
  auto both = [&](const std::string& prefix) {
    FVec v = values(prefix + "shared_expert.gate_proj.weight");
    const FVec up = values(prefix + "shared_expert.up_proj.weight");
    v.insert(v.end(), up.begin(), up.end());
    return v;
  };
  const int64_t C = f.get("x").dim(2), N = f.get("x").numel() / C;
  const int64_t F = f.get("param.experts.down_proj").dim(2);
  const int64_t S = shared ? f.get("param.shared_expert.down_proj.weight").dim(1) : 0;
  const MoeShape s{N, C, F, E, k, normalize, S};
  DeviceBuffers d(be);
  const auto [saved, scratch] = layer_buffers(d, s);
  MoeWeights w{d.put(values("param.gate.weight"), {E, C}),
               d.put(values("param.experts.gate_up_proj"), {E, 2 * F, C}),
               d.put(values("param.experts.down_proj"), {E, C, F})};
  MoeWeights g{d.alloc({E, C}), d.alloc({E, 2 * F, C}), d.alloc({E, C, F})};
  if (shared) {
    w.shared_gate_up = d.put(both("param."), {2 * S, C});
    w.shared_down = d.put(values("param.shared_expert.down_proj.weight"), {C, S});
    w.shared_gate = d.put(values("param.shared_expert_gate.weight"), {1, C});
    g.shared_gate_up = d.alloc({2 * S, C});
    g.shared_down = d.alloc({C, S});
    g.shared_gate = d.alloc({1, C});
  }
  const Tensor x = d.put(values("x"), {N, C}), y = d.alloc({N, C}), dx = d.alloc({N, C});
  std::vector<int32_t> counts;
  moe_forward(be, s, w, x, saved, scratch, y, counts);
  moe_backward(be, s, w, g, x, saved, scratch, counts, d.put(values("dy"), {N, C}), Tensor(), dx,
               false);
  EXPECT_TRUE(rel_near(d.get(y), values("y"), 1e-5)) << "output";
  EXPECT_TRUE(rel_near(d.get(dx), values("grad.x"), 1e-5)) << "dx";
  EXPECT_TRUE(rel_near(d.get(g.router), values("grad.gate.weight"), 1e-5)) << "router";
  EXPECT_TRUE(rel_near(d.get(g.gate_up), values("grad.experts.gate_up_proj"), 1e-5)) << "gate_up";
  EXPECT_TRUE(rel_near(d.get(g.down), values("grad.experts.down_proj"), 1e-5)) << "down";
  if (!shared) return;
  EXPECT_TRUE(rel_near(d.get(g.shared_gate_up), both("grad."), 1e-5)) << "shared gate_up";
  EXPECT_TRUE(rel_near(d.get(g.shared_down), values("grad.shared_expert.down_proj.weight"), 1e-5))
      << "shared down";
  EXPECT_TRUE(rel_near(d.get(g.shared_gate), values("grad.shared_expert_gate.weight"), 1e-5))
      << "shared gate";
}

void check_transformers_blocks(Backend& be) {
  check_against_transformers(be, "mixtral_block", 5, 2, true);
  check_against_transformers(be, "qwen2_moe_block", 5, 2, false);
  check_against_transformers(be, "olmoe_block", 6, 3, false);
  check_against_transformers(be, "olmoe_block_normalized", 6, 3, true);
}

TEST_P(MoeOn, LayerMatchesTransformersBlocks) {
  check_transformers_blocks(*be_);
}

// transformers' load_balancing_loss_func in fp64: the L layers' tokens concatenated, the masked
// means of each slot's one-hot expert choice and of the probabilities, their products summed over
// slots and experts, times E.
double ref_balance(const std::vector<Vec>& probs, const std::vector<Vec>& experts, const Vec& mask,
                   int64_t E, int64_t k) {
  const int64_t N = static_cast<int64_t>(mask.size());
  const double tokens =
      static_cast<double>(probs.size()) * std::accumulate(mask.begin(), mask.end(), 0.0);
  Vec chosen(k * E, 0.0), prob(E, 0.0);
  for (size_t l = 0; l < probs.size(); ++l)
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t j = 0; j < k; ++j)
        chosen[j * E + static_cast<int64_t>(experts[l][n * k + j])] += mask[n] / tokens;
      for (int64_t e = 0; e < E; ++e) prob[e] += mask[n] * probs[l][n * E + e] / tokens;
    }
  double loss = 0;
  for (int64_t j = 0; j < k; ++j)
    for (int64_t e = 0; e < E; ++e) loss += chosen[j * E + e] * prob[e];
  return loss * static_cast<double>(E);
}

// Three layers' routings of 11 tokens (3 masked out) over 5 experts, 2 each: the loss from the
// layers' statistics as transformers computes it, and each layer's probabilities' gradient
// (coef times it) against finite differences.
void check_balance(Backend& be) {
  const int64_t L = 3, N = 11, E = 5, k = 2;
  const double coef = 0.02;
  std::mt19937 rng(8);
  const Vec mask{1, 1, 0, 1, 1, 1, 0, 1, 1, 0, 1};
  std::vector<Vec> probs, experts;
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  for (int64_t l = 0; l < L; ++l) {
    Vec p(N * E);
    for (double& v : p) v = unit(rng);
    probs.push_back(p);
    Vec x;
    for (int64_t n = 0; n < N; ++n) {
      std::vector<int> pool{0, 1, 2, 3, 4};
      std::shuffle(pool.begin(), pool.end(), rng);
      x.insert(x.end(), pool.begin(), pool.begin() + k);
    }
    experts.push_back(x);
  }
  DeviceBuffers d(be);
  const Tensor m = d.put(IVec(mask.begin(), mask.end()), {N});
  std::vector<std::vector<float>> stats;
  std::vector<Tensor> p_t;
  for (int64_t l = 0; l < L; ++l) {
    p_t.push_back(d.put(as_floats(probs[l]), {N, E}));
    const Tensor st = d.alloc({2, E});
    be.moe_balance_stats(p_t[l], d.put(IVec(experts[l].begin(), experts[l].end()), {N, k}), m, st);
    stats.push_back(d.get(st));
  }
  const MoeBalanceLoss got = moe_balance_loss(stats, E, 8, coef);
  EXPECT_NEAR(got.loss, ref_balance(probs, experts, mask, E, k), 1e-6);
  const Tensor scale = d.put(got.scale, {E});
  for (int64_t l = 0; l < L; ++l) {
    const Tensor dp = d.put(FVec(N * E, std::nanf("")), {N, E});
    be.moe_balance_backward(m, scale, dp);
    Vec want = fd_grad(probs[l], [&](const Vec& v) {
      std::vector<Vec> q = probs;
      q[l] = v;
      return ref_balance(q, experts, mask, E, k);
    });
    for (double& v : want) v *= coef;
    EXPECT_TRUE(rel_near(d.get(dp), as_floats(want), 1e-6, 1e-6)) << "layer " << l;
  }
}

TEST_P(MoeOn, BalanceLossAndGradientAreTransformers) {
  check_balance(*be_);
}

// fp64: ST-MoE's router z-loss sum over the kept tokens of logsumexp(logits)^2.
double ref_z_sum(const Vec& logits, const Vec& mask, int64_t E) {
  double total = 0;
  for (size_t n = 0; n < mask.size(); ++n) {
    double sum = 0;
    for (int64_t e = 0; e < E; ++e) sum += std::exp(logits[n * E + e]);
    total += mask[n] * std::log(sum) * std::log(sum);
  }
  return total;
}

// The router z-loss's statistics (each token's logsumexp, 0 where masked out, and the sum of
// their squares) against fp64, and its gradient added to the logits' against finite differences
// of that sum, scaled.
TEST_P(MoeOn, RouterZLossAndGradientMatchTheReference) {
  Backend& be = *be_;
  const int64_t N = 9, E = 5;
  const float scale = 0.3f;
  std::mt19937 rng(12);
  std::normal_distribution<double> normal(0.0, 2.0);
  Vec logits(N * E), probs(N * E), start(N * E);
  for (double& v : logits) v = normal(rng);
  for (double& v : start) v = normal(rng);
  const Vec mask{1, 0, 1, 1, 1, 0, 1, 1, 1};
  Vec lse(N);
  for (int64_t n = 0; n < N; ++n) {
    double sum = 0;
    for (int64_t e = 0; e < E; ++e) sum += std::exp(logits[n * E + e]);
    for (int64_t e = 0; e < E; ++e) probs[n * E + e] = std::exp(logits[n * E + e]) / sum;
    lse[n] = mask[n] * std::log(sum);
  }
  DeviceBuffers d(be);
  const Tensor m = d.put(IVec(mask.begin(), mask.end()), {N});
  const Tensor z = d.put(FVec(N, std::nanf("")), {N}), sum = d.put(FVec{std::nanf("")}, {1});
  be.moe_z_stats(d.put(as_floats(logits), {N, E}), m, z, sum);
  EXPECT_TRUE(rel_near(d.get(z), as_floats(lse), 1e-6, 1e-6));
  EXPECT_NEAR(d.get(sum)[0], ref_z_sum(logits, mask, E), 1e-5 * ref_z_sum(logits, mask, E));
  const Tensor dlogits = d.put(as_floats(start), {N, E});
  be.moe_z_backward(d.put(as_floats(probs), {N, E}), z, scale, dlogits);
  Vec want = fd_grad(logits, [&](const Vec& v) { return ref_z_sum(v, mask, E); });
  for (int64_t i = 0; i < N * E; ++i) want[i] = start[i] + scale * want[i];
  EXPECT_TRUE(rel_near(d.get(dlogits), as_floats(want), 1e-4, 1e-5));
}

INSTANTIATE_TEST_SUITE_P(Every, MoeOn, ::testing::Values(Device::cpu, Device::cuda),
                         [](const ::testing::TestParamInfo<Device>& p) {
                           return std::string(p.param == Device::cuda ? "cuda" : "cpu");
                         });

TEST(MoeLayer, BadShapesAreRefused) {
  auto be = make_cpu_backend();
  DeviceBuffers d(*be);
  const MoeShape s{3, 4, 2, 2, 3, true};
  const Tensor x = d.alloc({3, 4});
  const MoeWeights w{d.alloc({2, 4}), d.alloc({2, 4, 4}), d.alloc({2, 4, 2})};
  std::vector<int32_t> counts;
  expect_error([&] { moe_forward(*be, s, w, x, MoeSaved{}, MoeScratch{}, x, counts); },
               "top 3 of 2 experts");
  MoeShape wide = s;
  wide.top_k = 1;
  wide.inner = 3;
  expect_error([&] { moe_forward(*be, wide, w, x, MoeSaved{}, MoeScratch{}, x, counts); },
               "do not fit 2 experts");
}

}  // namespace
}  // namespace brisk::testing
