// Mixture of experts: the router (moe_route.h): softmax, top-k, normalization, and the logits'
// gradient from the weights' and from a term on the probabilities. The dispatch of the routed
// pairs into rows grouped by expert (exact), the gather into those rows (exact), the weighted
// combine out of them and its backward.
//
// Tolerances: a row's softmax in float32 (exponentials of differences from the maximum, one sum of
// at most 64 terms): 1e-6 element by element against fp64 and between backends (whose
// exponentials may differ in the last bit); the chosen experts exact. The logits' gradient: 1e-4
// against finite differences (normwise), 1e-5 between backends. Rows with tied probabilities are
// checked forward only (finite differences across a tie pick other experts). The combine: sums of
// k float32 products, 1e-6 against fp64; its gradients 1e-5 normwise against finite differences
// (the rows' dot products in float32 over C terms).
#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "backend_support.h"
#include "conformance/op_case.h"

namespace brisk::testing {
namespace {

struct Routed {
  Vec probs, weights, experts;
};

// In double: each row's softmax, its k most probable experts (the lower of two alike first) and
// their probabilities, divided by their sum where `normalize`.
Routed ref_route(const Vec& z, int64_t E, int64_t k, bool normalize) {
  const int64_t N = static_cast<int64_t>(z.size()) / E;
  Routed r{Vec(z.size()), Vec(N * k), Vec(N * k)};
  for (int64_t n = 0; n < N; ++n) {
    const double top = *std::max_element(z.begin() + n * E, z.begin() + (n + 1) * E);
    double sum = 0;
    for (int64_t e = 0; e < E; ++e) sum += std::exp(z[n * E + e] - top);
    std::vector<int64_t> order(E);
    for (int64_t e = 0; e < E; ++e) {
      r.probs[n * E + e] = std::exp(z[n * E + e] - top) / sum;
      order[e] = e;
    }
    const double* p = &r.probs[n * E];
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return p[a] > p[b]; });
    double chosen = 0;
    for (int64_t j = 0; j < k; ++j) chosen += p[order[j]];
    for (int64_t j = 0; j < k; ++j) {
      r.experts[n * k + j] = static_cast<double>(order[j]);
      r.weights[n * k + j] = normalize ? p[order[j]] / chosen : p[order[j]];
    }
  }
  return r;
}

// N tokens over E experts, k each. `dprobs`: a term on the probabilities' gradient too; `ties`:
// rows 0 and 1 of equal logits throughout and of two equal maxima (forward checks only).
OpCase route_case(int64_t N, int64_t E, int64_t k, bool normalize, bool dprobs, bool ties,
                  bool reference) {
  OpCase c;
  c.name = "moe_route_N" + std::to_string(N) + "_E" + std::to_string(E) + "_k" + std::to_string(k) +
           (normalize ? "_normalized" : "") + (dprobs ? "_dprobs" : "") + (ties ? "_ties" : "");
  c.inputs = [=](std::mt19937& rng) {
    Vec z = randn_d(N * E, rng, 2.0);
    if (ties) {
      std::fill(z.begin(), z.begin() + E, 0.5);
      z[E + 1] = z[E + E - 1] = 9.0;
    }
    return Values{
        {"logits", z}, {"dweights", randn_d(N * k, rng)}, {"dprobs", randn_d(N * E, rng)}};
  };
  c.run = [=](Backend& be, const Values& in) {
    DeviceBuffers d(be);
    const Tensor z = d.put_as(in.at("logits"), {N, E});
    const Tensor probs = d.put(FVec(N * E, -7.f), {N, E});
    const Tensor weights = d.put(FVec(N * k, -7.f), {N, k});
    const Tensor experts = d.put(IVec(N * k, -1), {N, k});
    const Tensor dw = d.put_as(in.at("dweights"), {N, k});
    const Tensor dp = dprobs ? d.put_as(in.at("dprobs"), {N, E}) : Tensor();
    const Tensor dz = d.put(FVec(N * E, -7.f), {N, E});
    be.moe_route_forward(z, normalize, probs, weights, experts);
    be.moe_route_backward(probs, weights, experts, dw, dp, normalize, dz);
    return Values{{"probs", d.values(probs)},
                  {"weights", d.values(weights)},
                  {"experts", d.values(experts)},
                  {"dlogits", d.values(dz)}};
  };
  if (reference)
    c.reference = [=](const Values& in) {
      const Vec& z = in.at("logits");
      const Routed r = ref_route(z, E, k, normalize);
      Values want{{"probs", r.probs}, {"weights", r.weights}, {"experts", r.experts}};
      if (ties) return want;
      Vec dz = fd_vjp(
          z, [&](const Vec& v) { return ref_route(v, E, k, normalize).weights; },
          in.at("dweights"));
      if (dprobs) {
        const Vec more = fd_vjp(
            z, [&](const Vec& v) { return ref_route(v, E, k, normalize).probs; }, in.at("dprobs"));
        for (size_t i = 0; i < dz.size(); ++i) dz[i] += more[i];
      }
      want["dlogits"] = dz;
      return want;
    };
  c.checks = {{"probs", Metric::elementwise, 1e-6, 1e-6},
              {"weights", Metric::elementwise, 1e-6, 1e-6},
              {"experts", Metric::exact}};
  if (!ties) c.checks.push_back({"dlogits", Metric::normwise, 1e-4, 1e-5});
  return c;
}

// In double: counts per expert and each pair's row, expert by expert, pairs in order.
Values ref_dispatch(const Vec& experts, int64_t E) {
  Vec counts(E, 0.0), positions(experts.size());
  for (double e : experts) counts[static_cast<size_t>(e)] += 1;
  Vec next(E, 0.0);
  for (int64_t e = 1; e < E; ++e) next[e] = next[e - 1] + counts[e - 1];
  for (size_t i = 0; i < experts.size(); ++i)
    positions[i] = next[static_cast<size_t>(experts[i])]++;
  return Values{{"counts", counts}, {"positions", positions}};
}

// N tokens' k distinct experts of E, drawn at random; with `idle`, expert E - 1 is never drawn.
Vec random_experts(int64_t N, int64_t E, int64_t k, bool idle, std::mt19937& rng) {
  Vec out;
  std::vector<int> pool(idle ? E - 1 : E);
  for (int64_t n = 0; n < N; ++n) {
    std::iota(pool.begin(), pool.end(), 0);
    std::shuffle(pool.begin(), pool.end(), rng);
    for (int64_t j = 0; j < k; ++j) out.push_back(pool[j]);
  }
  return out;
}

IVec as_ints(const Vec& v) {
  return IVec(v.begin(), v.end());
}

OpCase dispatch_case(int64_t N, int64_t E, int64_t k, bool idle) {
  OpCase c;
  c.name = "moe_dispatch_N" + std::to_string(N) + "_E" + std::to_string(E) + "_k" +
           std::to_string(k) + (idle ? "_idle_expert" : "");
  c.inputs = [=](std::mt19937& rng) {
    return Values{{"experts", random_experts(N, E, k, idle, rng)}};
  };
  c.run = [=](Backend& be, const Values& in) {
    DeviceBuffers d(be);
    const Tensor experts = d.put(as_ints(in.at("experts")), {N, k});
    const Tensor counts = d.put(IVec(E, -1), {E}), positions = d.put(IVec(N * k, -1), {N, k});
    be.moe_dispatch(experts, E, counts, positions);
    return Values{{"counts", d.values(counts)}, {"positions", d.values(positions)}};
  };
  c.reference = [=](const Values& in) { return ref_dispatch(in.at("experts"), E); };
  c.checks = {{"counts", Metric::exact}, {"positions", Metric::exact}};
  return c;
}

// y[n] = (y0[n] +) sum_j w[n,j] rows[pos[n,j]] (plain sum without weights).
Vec ref_combine(const Vec& rows, const Vec& pos, const Vec* w, const Vec* y0, int64_t N, int64_t k,
                int64_t C) {
  Vec y = y0 ? *y0 : Vec(N * C, 0.0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t j = 0; j < k; ++j)
      for (int64_t c = 0; c < C; ++c)
        y[n * C + c] += (w ? (*w)[n * k + j] : 1.0) * rows[pos[n * k + j] * C + c];
  return y;
}

// The gather of x into the routed rows, the combine of other rows (weighted, or the plain sum;
// written or added to y0), and the weighted combine's backward, on the rows of a random routing;
// with `own_rows` (k = 1, one expert) the combines are given no positions: each token's own row.
OpCase combine_case(int64_t N, int64_t E, int64_t k, int64_t C, bool weighted, bool accumulate,
                    bool reference, bool own_rows = false) {
  OpCase c;
  c.name = "moe_gather_combine_N" + std::to_string(N) + "_k" + std::to_string(k) + "_C" +
           std::to_string(C) + (weighted ? "_weighted" : "") + (accumulate ? "_accumulate" : "") +
           (own_rows ? "_own_rows" : "");
  c.inputs = [=](std::mt19937& rng) {
    const Vec experts = random_experts(N, E, k, false, rng);
    return Values{{"positions", ref_dispatch(experts, E).at("positions")},
                  {"x", randn_d(N * C, rng)},
                  {"rows", randn_d(N * k * C, rng)},
                  {"weights", randn_d(N * k, rng, 0.5, 0.5)},
                  {"y0", randn_d(N * C, rng)},
                  {"dy", randn_d(N * C, rng)}};
  };
  c.run = [=](Backend& be, const Values& in) {
    DeviceBuffers d(be);
    const Tensor pos = d.put(as_ints(in.at("positions")), {N, k});
    const Tensor x = d.put_as(in.at("x"), {N, C}), rows = d.put_as(in.at("rows"), {N * k, C});
    const Tensor w = d.put_as(in.at("weights"), {N, k}), dy = d.put_as(in.at("dy"), {N, C});
    const Tensor gathered = d.put(FVec(N * k * C, -7.f), {N * k, C});
    const Tensor y = d.put_as(in.at("y0"), {N, C});
    const Tensor drows = d.put(FVec(N * k * C, -7.f), {N * k, C});
    const Tensor dw = d.put(FVec(N * k, -7.f), {N, k});
    be.moe_gather(x, pos, gathered);
    const Tensor combined = own_rows ? Tensor() : pos;
    be.moe_combine(rows, combined, weighted ? w : Tensor(), y, accumulate);
    be.moe_combine_backward(dy, rows, combined, w, drows, dw);
    return Values{{"gathered", d.values(gathered)},
                  {"y", d.values(y)},
                  {"drows", d.values(drows)},
                  {"dweights", d.values(dw)}};
  };
  if (reference)
    c.reference = [=](const Values& in) {
      const Vec &pos = in.at("positions"), &x = in.at("x"), &rows = in.at("rows");
      const Vec &w = in.at("weights"), &dy = in.at("dy"), &y0 = in.at("y0");
      Vec gathered(N * k * C);
      for (int64_t i = 0; i < N * k; ++i)
        for (int64_t ch = 0; ch < C; ++ch) gathered[pos[i] * C + ch] = x[(i / k) * C + ch];
      return Values{
          {"gathered", gathered},
          {"y",
           ref_combine(rows, pos, weighted ? &w : nullptr, accumulate ? &y0 : nullptr, N, k, C)},
          {"drows",
           fd_vjp(
               rows, [&](const Vec& v) { return ref_combine(v, pos, &w, nullptr, N, k, C); }, dy)},
          {"dweights",
           fd_vjp(
               w, [&](const Vec& v) { return ref_combine(rows, pos, &v, nullptr, N, k, C); }, dy)}};
    };
  c.checks = {{"gathered", Metric::exact},
              {"y", Metric::elementwise, 1e-6, 1e-6},
              {"drows", Metric::normwise, 1e-5, 1e-5},
              {"dweights", Metric::normwise, 1e-5, 1e-5}};
  return c;
}

}  // namespace

std::vector<OpCase> moe_cases() {
  return {route_case(7, 5, 2, true, false, false, true),
          route_case(7, 5, 2, false, true, false, true),
          route_case(9, 8, 1, true, true, false, true),
          route_case(6, 8, 4, false, true, false, true),
          route_case(5, 3, 3, true, false, false, true),
          route_case(4, 6, 2, true, false, true, true),
          route_case(1000, 64, 8, true, true, false, false),
          dispatch_case(9, 5, 2, false),
          dispatch_case(11, 6, 3, true),
          dispatch_case(13, 4, 1, false),
          dispatch_case(2000, 64, 8, true),
          combine_case(7, 5, 2, 5, true, false, true),
          combine_case(6, 4, 1, 9, false, true, true),
          combine_case(5, 8, 4, 3, true, true, true),
          combine_case(300, 16, 2, 257, true, false, false),
          combine_case(8, 1, 1, 6, true, true, true, true),
          combine_case(300, 1, 1, 129, true, false, false, true)};
}

}  // namespace brisk::testing
