// Mixture of experts: the router (moe_route.h): softmax, top-k, normalization, and the logits'
// gradient from the weights' and from a term on the probabilities.
//
// Tolerances: a row's softmax in float32 (exponentials of differences from the maximum, one sum of
// at most 64 terms): 1e-6 element by element against fp64 and between backends (whose
// exponentials may differ in the last bit); the chosen experts exact. The logits' gradient: 1e-4
// against finite differences (normwise), 1e-5 between backends. Rows with tied probabilities are
// checked forward only (finite differences across a tie pick other experts).
#include <algorithm>
#include <cmath>
#include <string>

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

}  // namespace

std::vector<OpCase> moe_cases() {
  return {route_case(7, 5, 2, true, false, false, true),
          route_case(7, 5, 2, false, true, false, true),
          route_case(9, 8, 1, true, true, false, true),
          route_case(6, 8, 4, false, true, false, true),
          route_case(5, 3, 3, true, false, false, true),
          route_case(4, 6, 2, true, false, true, true),
          route_case(1000, 64, 8, true, true, false, false)};
}

}  // namespace brisk::testing
