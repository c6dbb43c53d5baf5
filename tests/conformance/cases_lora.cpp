// LoRA's low-rank products (adapters/): lora_forward adds scale * (x a^T) b^T to the adapted
// columns [at, at + out) of a wider output, keeping u = scale * x a^T; lora_backward gives b's
// and a's gradients (written or accumulated) and adds x's to dx (or skips it).
//
// Tolerances: float32 sums of at most in (or N, or out) products, 1e-5 against the fp64
// reference forward (element by element) and 1e-4 normwise for the gradients, which are checked
// against finite differences of the fp64 forward; 1e-5 against the CPU.
#include <string>

#include "backend_support.h"
#include "conformance/op_case.h"

namespace brisk::testing {
namespace {

struct LoraShape {
  int64_t N, in, r, out, width, at;
};

// y = y0 with scale * (x a^T) b^T added to its columns [at, at + out).
Vec ref_lora(const Vec& x, const Vec& a, const Vec& b, const Vec& y0, double scale,
             const LoraShape& s) {
  Vec y = y0;
  for (int64_t n = 0; n < s.N; ++n)
    for (int64_t j = 0; j < s.r; ++j) {
      double u = 0;
      for (int64_t k = 0; k < s.in; ++k) u += x[n * s.in + k] * a[j * s.in + k];
      for (int64_t o = 0; o < s.out; ++o) y[n * s.width + s.at + o] += scale * u * b[o * s.r + j];
    }
  return y;
}

std::string case_name(const LoraShape& s, bool accumulate, bool dx) {
  return "lora_N" + std::to_string(s.N) + "_in" + std::to_string(s.in) + "_r" +
         std::to_string(s.r) + "_out" + std::to_string(s.out) + "_of" + std::to_string(s.width) +
         "_at" + std::to_string(s.at) + (accumulate ? "_accumulate" : "") + (dx ? "" : "_no_dx");
}

OpCase lora_case(const LoraShape& s, bool accumulate, bool with_dx, bool reference) {
  const double scale = 1.75;
  OpCase c;
  c.name = case_name(s, accumulate, with_dx);
  c.inputs = [=](std::mt19937& rng) {
    return Values{{"x", randn_d(s.N * s.in, rng)},       {"a", randn_d(s.r * s.in, rng, 0.3)},
                  {"b", randn_d(s.out * s.r, rng, 0.3)}, {"y0", randn_d(s.N * s.width, rng)},
                  {"dy", randn_d(s.N * s.width, rng)},   {"da0", randn_d(s.r * s.in, rng)},
                  {"db0", randn_d(s.out * s.r, rng)},    {"dx0", randn_d(s.N * s.in, rng)}};
  };
  c.run = [=](Backend& be, const Values& in) {
    DeviceBuffers d(be);
    d.workspace(std::max({s.N * s.width, s.N * s.in, s.out * s.r}));
    const Tensor x = d.put_as(in.at("x"), {s.N, s.in}), a = d.put_as(in.at("a"), {s.r, s.in});
    const Tensor b = d.put_as(in.at("b"), {s.out, s.r}), y = d.put_as(in.at("y0"), {s.N, s.width});
    const Tensor dy = d.put_as(in.at("dy"), {s.N, s.width});
    const Tensor u = d.put(FVec(s.N * s.r, -7.f), {s.N, s.r});
    const Tensor v = d.put(FVec(s.N * s.r, -7.f), {s.N, s.r});
    const Tensor da = accumulate ? d.put_as(in.at("da0"), {s.r, s.in})
                                 : d.put(FVec(s.r * s.in, -7.f), {s.r, s.in});
    const Tensor db = accumulate ? d.put_as(in.at("db0"), {s.out, s.r})
                                 : d.put(FVec(s.out * s.r, -7.f), {s.out, s.r});
    const Tensor dx = d.put_as(in.at("dx0"), {s.N, s.in});
    be.lora_forward(x, a, b, static_cast<float>(scale), u, y, s.at);
    be.lora_backward(x, a, b, static_cast<float>(scale), u, dy, s.at, v, da, db,
                     with_dx ? dx : Tensor(), accumulate);
    return Values{
        {"y", d.values(y)}, {"da", d.values(da)}, {"db", d.values(db)}, {"dx", d.values(dx)}};
  };
  if (reference)
    c.reference = [=](const Values& in) {
      const Vec &x = in.at("x"), &a = in.at("a"), &b = in.at("b"), &y0 = in.at("y0");
      const Vec& dy = in.at("dy");
      Vec y = ref_lora(x, a, b, y0, scale, s);
      auto term = [&](const Vec& xv, const Vec& av, const Vec& bv) {
        return minus(ref_lora(xv, av, bv, y0, scale, s), y0);
      };
      Values want{{"y", y}};
      want["da"] = fd_vjp(
          a, [&](const Vec& v) { return term(x, v, b); }, dy);
      want["db"] = fd_vjp(
          b, [&](const Vec& v) { return term(x, a, v); }, dy);
      want["dx"] = with_dx ? fd_vjp(
                                 x, [&](const Vec& v) { return term(v, a, b); }, dy)
                           : Vec(static_cast<size_t>(s.N * s.in), 0.0);
      return want;
    };
  c.checks = {{"y", Metric::elementwise, 1e-5, 1e-5},
              {"da", Metric::normwise, 1e-4, 1e-5, accumulate ? "da0" : ""},
              {"db", Metric::normwise, 1e-4, 1e-5, accumulate ? "db0" : ""},
              {"dx", Metric::normwise, 1e-4, 1e-5, "dx0"}};
  return c;
}

}  // namespace

std::vector<OpCase> lora_cases() {
  std::vector<OpCase> cases;
  // A query's columns inside a packed query/key/value output, the value's at the end, a whole
  // output; accumulated and skipped gradients; then sizes past a GPU's tiles (the CPU their
  // reference).
  cases.push_back(lora_case({7, 12, 3, 10, 26, 0}, false, true, true));
  cases.push_back(lora_case({7, 12, 3, 10, 26, 16}, true, true, true));
  cases.push_back(lora_case({5, 9, 2, 11, 11, 0}, false, false, true));
  cases.push_back(lora_case({9, 6, 1, 4, 13, 5}, true, true, true));
  cases.push_back(lora_case({300, 384, 16, 384, 1152, 768}, false, true, false));
  cases.push_back(lora_case({257, 129, 8, 100, 300, 7}, true, true, false));
  return cases;
}

}  // namespace brisk::testing
