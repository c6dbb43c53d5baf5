// Normalization and positions: layernorm, rmsnorm (Llama's), rotary embeddings.
//
// Tolerances: float32 sums over a row, 1e-5 element by element forward; gradients 1e-4
// against finite differences, 1e-5 against the CPU (summation order only). Rotary is a few
// products of the same float32 values: 1e-6 against the CPU.
#include <cmath>
#include <string>

#include "backend/rope.h"
#include "backend_support.h"
#include "conformance/op_case.h"
#include "core/dtype.h"

namespace brisk::testing {
namespace {

std::string eps_name(float eps) {
  return "eps" + std::to_string(static_cast<int>(std::lround(-std::log10(eps))));
}

// ---- layernorm ----

Vec ref_layernorm(const Vec& x, const Vec& gamma, const Vec& beta, double eps, int64_t C,
                  Vec* mean = nullptr, Vec* rstd = nullptr) {
  const int64_t M = static_cast<int64_t>(x.size()) / C;
  Vec y(x.size());
  if (mean) mean->assign(M, 0.0);
  if (rstd) rstd->assign(M, 0.0);
  for (int64_t m = 0; m < M; ++m) {
    const double* r = &x[m * C];
    double mu = 0, var = 0;
    for (int64_t c = 0; c < C; ++c) mu += r[c];
    mu /= C;
    for (int64_t c = 0; c < C; ++c) var += (r[c] - mu) * (r[c] - mu);
    var /= C;
    const double rs = 1.0 / std::sqrt(var + eps);
    for (int64_t c = 0; c < C; ++c) y[m * C + c] = (r[c] - mu) * rs * gamma[c] + beta[c];
    if (mean) (*mean)[m] = mu;
    if (rstd) (*rstd)[m] = rs;
  }
  return y;
}

OpCase layernorm_case(Shape xs, float eps, bool accumulate, bool reference) {
  const int64_t C = xs[xs.rank() - 1], R = xs.numel() / C;
  OpCase c;
  c.name = "layernorm_" + shape_name(xs) + "_" + eps_name(eps) + (accumulate ? "_dxadd" : "");
  c.inputs = [=](std::mt19937& rng) {
    // Offset from zero, so that the variance is taken about a mean that matters.
    return Values{{"x", randn_d(R * C, rng, 2.0, 3.0)}, {"gamma", randn_d(C, rng, 0.1, 1.0)},
                  {"beta", randn_d(C, rng, 0.1)},       {"dy", randn_d(R * C, rng)},
                  {"dx0", randn_d(R * C, rng)},         {"dgamma0", randn_d(C, rng)},
                  {"dbeta0", randn_d(C, rng)}};
  };
  c.run = [=](Backend& be, const Values& in) {
    DeviceBuffers d(be);
    const Tensor x = d.put_as(in.at("x"), xs), g = d.put_as(in.at("gamma"), {C});
    const Tensor b = d.put_as(in.at("beta"), {C}), dy = d.put_as(in.at("dy"), xs);
    const Tensor y = d.put(FVec(R * C, -7.f), xs), mean = d.put(FVec(R, -7.f), {R});
    const Tensor rstd = d.put(FVec(R, -7.f), {R}), dx = d.put_as(in.at("dx0"), xs);
    const Tensor dg = d.put_as(in.at("dgamma0"), {C}), db = d.put_as(in.at("dbeta0"), {C});
    be.layernorm_forward(x, g, b, eps, y, mean, rstd);
    be.layernorm_backward(dy, x, g, mean, rstd, dx, accumulate, dg, db);
    return Values{{"y", d.values(y)},   {"mean", d.values(mean)}, {"rstd", d.values(rstd)},
                  {"dx", d.values(dx)}, {"dgamma", d.values(dg)}, {"dbeta", d.values(db)}};
  };
  if (reference)
    c.reference = [=](const Values& in) {
      const Vec &x = in.at("x"), &g = in.at("gamma"), &b = in.at("beta"), &dy = in.at("dy");
      Values want;
      want["y"] = ref_layernorm(x, g, b, eps, C, &want["mean"], &want["rstd"]);
      want["dx"] = fd_vjp(
          x, [&](const Vec& v) { return ref_layernorm(v, g, b, eps, C); }, dy);
      want["dgamma"] = fd_vjp(
          g, [&](const Vec& v) { return ref_layernorm(x, v, b, eps, C); }, dy);
      want["dbeta"] = fd_vjp(
          b, [&](const Vec& v) { return ref_layernorm(x, g, v, eps, C); }, dy);
      return want;
    };
  c.checks = {{"y"},
              {"mean"},
              {"rstd"},
              {"dx", Metric::normwise, 1e-4, 1e-5, accumulate ? "dx0" : ""},
              {"dgamma", Metric::normwise, 1e-4, 1e-5, "dgamma0"},
              {"dbeta", Metric::normwise, 1e-4, 1e-5, "dbeta0"}};
  return c;
}

// ---- rmsnorm ----

// LlamaRMSNorm: y = x / sqrt(mean(x^2) + eps) * gamma.
Vec ref_rmsnorm(const Vec& x, const Vec& gamma, double eps, int64_t C, Vec* rstd = nullptr) {
  const int64_t M = static_cast<int64_t>(x.size()) / C;
  Vec y(x.size());
  if (rstd) rstd->assign(M, 0.0);
  for (int64_t m = 0; m < M; ++m) {
    const double* r = &x[m * C];
    double ss = 0;
    for (int64_t c = 0; c < C; ++c) ss += r[c] * r[c];
    const double rs = 1.0 / std::sqrt(ss / C + eps);
    for (int64_t c = 0; c < C; ++c) y[m * C + c] = r[c] * rs * gamma[c];
    if (rstd) (*rstd)[m] = rs;
  }
  return y;
}

// Besides y and dx: y computed over x, dx computed over dy without a gamma gradient, and dx over
// dy with one (the gamma gradient reads dy before dx overwrites it). Small cases scale row 2 down
// to mean(x^2) ~ 1e-6, where eps matters as much as the data, and make row 4 zeros (y = 0, rstd
// = 1/sqrt(eps)).
OpCase rmsnorm_case(Shape xs, float eps, bool accumulate, bool with_dgamma, bool reference) {
  const int64_t C = xs[xs.rank() - 1], R = xs.numel() / C;
  OpCase c;
  c.name = "rmsnorm_" + shape_name(xs) + "_" + eps_name(eps) + (accumulate ? "_dxadd" : "") +
           (with_dgamma ? "_dgamma" : "");
  c.inputs = [=](std::mt19937& rng) {
    Values v{{"x", randn_d(R * C, rng, 2.0, 0.5)},
             {"gamma", randn_d(C, rng, 0.1, 1.0)},
             {"dy", randn_d(R * C, rng)},
             {"dx0", randn_d(R * C, rng)},
             {"dgamma0", randn_d(C, rng)}};
    if (R > 4)
      for (int64_t j = 0; j < C; ++j) {
        v["x"][2 * C + j] = static_cast<float>(v["x"][2 * C + j] * 1e-3);
        v["x"][4 * C + j] = 0.0;
      }
    return v;
  };
  c.run = [=](Backend& be, const Values& in) {
    DeviceBuffers d(be);
    const Tensor x = d.put_as(in.at("x"), xs), g = d.put_as(in.at("gamma"), {C});
    const Tensor y = d.put(FVec(R * C, -7.f), xs), rstd = d.put(FVec(R, -7.f), {R});
    const Tensor dy = d.put_as(in.at("dy"), xs), dx = d.put_as(in.at("dx0"), xs);
    const Tensor dg = d.put_as(in.at("dgamma0"), {C});
    be.rmsnorm_forward(x, g, eps, y, rstd);
    be.rmsnorm_backward(dy, x, g, rstd, dx, accumulate, with_dgamma ? dg : Tensor());
    const Tensor y_in_x = d.put_as(in.at("x"), xs), rstd2 = d.put(FVec(R, -7.f), {R});
    be.rmsnorm_forward(y_in_x, g, eps, y_in_x, rstd2);
    const Tensor dx_in_dy = d.put_as(in.at("dy"), xs), dx_in_dy2 = d.put_as(in.at("dy"), xs);
    const Tensor dg2 = d.put(FVec(C, 0.f), {C});
    be.rmsnorm_backward(dx_in_dy, x, g, rstd, dx_in_dy, false, Tensor());
    be.rmsnorm_backward(dx_in_dy2, x, g, rstd, dx_in_dy2, false, dg2);
    return Values{{"y", d.values(y)},
                  {"rstd", d.values(rstd)},
                  {"dx", d.values(dx)},
                  {"dgamma", d.values(dg)},
                  {"y_over_x", d.values(y_in_x)},
                  {"dx_over_dy", d.values(dx_in_dy)},
                  {"dx_over_dy_with_dgamma", d.values(dx_in_dy2)},
                  {"dgamma_from_zero", d.values(dg2)}};
  };
  if (reference)
    c.reference = [=](const Values& in) {
      const Vec &x = in.at("x"), &g = in.at("gamma"), &dy = in.at("dy");
      Values want;
      want["y"] = ref_rmsnorm(x, g, eps, C, &want["rstd"]);
      // A smaller step for the rows near eps, whose curvature is 1e3 times larger.
      want["dx"] = fd_vjp(
          x, [&](const Vec& v) { return ref_rmsnorm(v, g, eps, C); }, dy, 1e-6);
      want["dgamma"] = with_dgamma
                           ? fd_vjp(
                                 g, [&](const Vec& v) { return ref_rmsnorm(x, v, eps, C); }, dy)
                           : Vec(static_cast<size_t>(C), 0.0);
      want["y_over_x"] = want["y"];
      want["dx_over_dy"] = want["dx_over_dy_with_dgamma"] = want["dx"];
      want["dgamma_from_zero"] = fd_vjp(
          g, [&](const Vec& v) { return ref_rmsnorm(x, v, eps, C); }, dy);
      return want;
    };
  c.checks = {{"y"},
              {"rstd"},  // large where the row is small: relative to itself there
              {"dx", Metric::normwise, 1e-4, 1e-5, accumulate ? "dx0" : ""},
              // Without a gamma gradient the buffer is left alone: it gained exactly zero.
              {"dgamma", with_dgamma ? Metric::normwise : Metric::exact, 1e-4, 1e-5, "dgamma0"},
              {"y_over_x"},
              {"dx_over_dy", Metric::normwise, 1e-4, 1e-5},
              {"dx_over_dy_with_dgamma", Metric::normwise, 1e-4, 1e-5},
              {"dgamma_from_zero", Metric::normwise, 1e-4, 1e-5}};
  return c;
}

// ---- the residual add before a norm ----

// sum = x + dropout(r) from the keyed generator, then its LayerNorm (beta given) or RMSNorm.
Vec ref_residual_norm(const Vec& x, const Vec& r, const Vec& gamma, const Vec& beta, float p,
                      const RngKey& key, double eps, int64_t C, bool rms, Vec* sum, Vec* mean,
                      Vec* rstd) {
  const uint32_t threshold = dropout_threshold(p);
  sum->resize(x.size());
  for (size_t e = 0; e < x.size(); ++e) {
    const bool keep = p == 0.f || dropout_keep(key, key.first_element + e, threshold);
    (*sum)[e] = x[e] + (keep ? r[e] / (1.0 - double(p)) : 0.0);
  }
  return rms ? ref_rmsnorm(*sum, gamma, eps, C, rstd)
             : ref_layernorm(*sum, gamma, beta, eps, C, mean, rstd);
}

// dropout_add_norm against the fp64 reference, and against dropout_add then the norm on the same
// backend: the same bits (the differences checked against zero). `first`: the key's
// first_element; with C odd or `first` off a multiple of 4 rows start off the generator's groups
// of four words. The reference is the forward alone: cheap at every size.
// `held`: that much of the key's step given in the backend's memory (RngKey::step_offset).
OpCase dropout_add_norm_case(Shape xs, float p, bool rms, uint64_t first, uint64_t held = 0) {
  const int64_t C = xs[xs.rank() - 1], R = xs.numel() / C;
  RngKey key{0x5eed'0001ULL, (1ULL << 32) + 3, 5};
  key.first_element = first;
  OpCase c;
  c.name = std::string("dropout_add_") + (rms ? "rmsnorm_" : "layernorm_") + shape_name(xs) + "_p" +
           std::to_string(static_cast<int>(p * 100)) +
           (first > 0 ? "_first" + std::to_string(first) : "") + (held > 0 ? "_step_held" : "");
  c.inputs = [=](std::mt19937& rng) {
    return Values{{"x", randn_d(R * C, rng, 2.0, 1.0)},
                  {"r", randn_d(R * C, rng)},
                  {"gamma", randn_d(C, rng, 0.1, 1.0)},
                  {"beta", randn_d(C, rng, 0.1)}};
  };
  c.run = [=, c_key = key](Backend& be, const Values& in) {
    DeviceBuffers d(be);
    const RngKey key = held > 0 ? d.hold_step(c_key, held) : c_key;
    const Tensor x = d.put_as(in.at("x"), xs), r = d.put_as(in.at("r"), xs);
    auto norm = [&] {
      return Backend::Norm{d.put_as(in.at("gamma"), {C}),
                           rms ? Tensor() : d.put_as(in.at("beta"), {C}),
                           1e-5f,
                           rms,
                           rms ? Tensor() : d.put(FVec(R, -7.f), {R}),
                           d.put(FVec(R, -7.f), {R})};
    };
    const Backend::Norm fused = norm(), separate = norm();
    const FVec garbage(static_cast<size_t>(R * C), -7.f);
    const Tensor sum = d.put(garbage, xs), y = d.put(garbage, xs);
    const Tensor sum2 = d.put(garbage, xs), y2 = d.put(garbage, xs);
    const Tensor sum_in_x = d.put_as(in.at("x"), xs), y3 = d.put(garbage, xs);
    be.dropout_add_norm(x, r, p, key, sum, fused, y);
    be.dropout_add(x, r, p, key, sum2);
    be.norm_forward(sum2, separate, y2);
    be.dropout_add_norm(sum_in_x, r, p, key, sum_in_x, norm(), y3);
    auto diff = [&](const Tensor& a, const Tensor& b) { return minus(d.values(a), d.values(b)); };
    Values out{{"sum", d.values(sum)},
               {"y", d.values(y)},
               {"rstd", d.values(fused.rstd)},
               {"sum_less_separate", diff(sum, sum2)},
               {"y_less_separate", diff(y, y2)},
               {"rstd_less_separate", diff(fused.rstd, separate.rstd)},
               {"sum_over_x_less_sum", diff(sum_in_x, sum)},
               {"y_over_x_less_y", diff(y3, y)}};
    if (!rms) {
      out["mean"] = d.values(fused.mean);
      out["mean_less_separate"] = diff(fused.mean, separate.mean);
    }
    return out;
  };
  const std::vector<std::string> zeros = {"sum_less_separate", "y_less_separate",
                                          "rstd_less_separate", "sum_over_x_less_sum",
                                          "y_over_x_less_y"};
  c.reference = [=](const Values& in) {
    Values want;
    Vec mean;
    want["y"] = ref_residual_norm(in.at("x"), in.at("r"), in.at("gamma"), in.at("beta"), p, key,
                                  1e-5, C, rms, &want["sum"], &mean, &want["rstd"]);
    for (const std::string& z : zeros) want[z] = Vec(static_cast<size_t>(R * C), 0.0);
    want["rstd_less_separate"] = Vec(static_cast<size_t>(R), 0.0);
    if (!rms) {
      want["mean"] = mean;
      want["mean_less_separate"] = Vec(static_cast<size_t>(R), 0.0);
    }
    return want;
  };
  c.checks = {{"sum"}, {"y"}, {"rstd"}};
  if (!rms) c.checks.push_back({"mean"});
  for (const std::string& z : zeros) c.checks.push_back({z, Metric::exact});
  if (!rms) c.checks.push_back({"mean_less_separate", Metric::exact});
  return c;
}

// Backend::norm_backward: dy rounded to bf16 as read (or not), the branch's gradient through its
// dropout written over dy (or none), dx written or added to. Against the fp64 reference (finite
// differences of the forward at the rounded dy; the branch the reference mask over the whole dx)
// and, exactly, against round_to, the norm's own backward and dropout_backward on the same
// backend (which the CPU, running Backend's default, is by construction: there the fp64 checks
// are the test; on a GPU the fused kernels are). Without `reference` (a GPU's sizes, where finite
// differences would take minutes) only the latter.
OpCase norm_backward_case(Shape xs, bool rms, bool round, float p, bool accumulate,
                          bool reference = true) {
  const int64_t C = xs[xs.rank() - 1], R = xs.numel() / C;
  RngKey key{0x5eed'0002ULL, 9, 4};
  key.first_element = 8;
  const DType round_dy = round ? DType::bf16 : DType::f32;
  OpCase c;
  c.name = std::string("norm_backward_") + (rms ? "rmsnorm_" : "layernorm_") + shape_name(xs) +
           (round ? "_bf16dy" : "") + (p > 0 ? "_branch" : "") + (accumulate ? "_dxadd" : "");
  c.inputs = [=](std::mt19937& rng) {
    return Values{{"x", randn_d(R * C, rng, 2.0, 1.0)}, {"gamma", randn_d(C, rng, 0.1, 1.0)},
                  {"dy", randn_d(R * C, rng)},          {"dx0", randn_d(R * C, rng)},
                  {"dgamma0", randn_d(C, rng)},         {"dbeta0", randn_d(C, rng)}};
  };
  c.run = [=](Backend& be, const Values& in) {
    DeviceBuffers d(be);
    const Tensor x = d.put_as(in.at("x"), xs), g = d.put_as(in.at("gamma"), {C});
    const Tensor beta = d.put(FVec(C, 0.f), {C}), mean = d.put(FVec(R, 0.f), {R});
    const Tensor rstd = d.put(FVec(R, 0.f), {R}), y = d.put(FVec(R * C, 0.f), xs);
    const Backend::Norm n{g, rms ? Tensor() : beta, 1e-5f, rms, rms ? Tensor() : mean, rstd};
    be.norm_forward(x, n, y);  // the statistics
    // Fused: the branch over dy. Separate: the three calls.
    Values out;
    for (const bool fused : {true, false}) {
      const Tensor dy = d.put_as(in.at("dy"), xs), dx = d.put_as(in.at("dx0"), xs);
      const Tensor dg = d.put_as(in.at("dgamma0"), {C}), db = d.put_as(in.at("dbeta0"), {C});
      const Tensor dbeta = rms ? Tensor() : db, branch = p > 0 ? dy : Tensor();
      if (fused) {
        be.norm_backward(dy, x, n, dx, accumulate, dg, dbeta, round_dy, {branch, p, key});
      } else {
        if (round) be.round_to(round_dy, dy);
        if (rms)
          be.rmsnorm_backward(dy, x, g, rstd, dx, accumulate, dg);
        else
          be.layernorm_backward(dy, x, g, mean, rstd, dx, accumulate, dg, db);
        if (p > 0) be.dropout_backward(dx, p, key, branch);
      }
      Values v{{"dx", d.values(dx)}, {"dgamma", d.values(dg)}, {"dbeta", d.values(db)}};
      if (p > 0) v["branch"] = d.values(branch);
      for (auto& [name, values] : v) {
        if (fused) {
          out[name] = values;
          continue;
        }
        out[name + "_less_separate"] = minus(out.at(name), values);
      }
    }
    return out;
  };
  c.reference = [=](const Values& in) {
    Values zeros;
    for (const char* z : {"dx", "branch"})
      zeros[std::string(z) + "_less_separate"] = Vec(static_cast<size_t>(R * C), 0.0);
    zeros["dgamma_less_separate"] = zeros["dbeta_less_separate"] = Vec(static_cast<size_t>(C), 0.0);
    if (!reference) return zeros;
    const Vec &x = in.at("x"), &g = in.at("gamma");
    Vec dy = in.at("dy");
    if (round)
      for (double& v : dy) v = bf16_to_float(float_to_bf16(static_cast<float>(v)));
    const Vec beta(static_cast<size_t>(C), 0.0);
    auto f = [&](const Vec& xv, const Vec& gv) {
      return rms ? ref_rmsnorm(xv, gv, 1e-5, C) : ref_layernorm(xv, gv, beta, 1e-5, C);
    };
    Values want;
    want["dx"] = fd_vjp(
        x, [&](const Vec& v) { return f(v, g); }, dy);
    want["dgamma"] = fd_vjp(
        g, [&](const Vec& v) { return f(x, v); }, dy);
    want["dbeta"] = Vec(static_cast<size_t>(C), 0.0);  // RMSNorm's: left as it was
    if (!rms)
      for (int64_t i = 0; i < R * C; ++i) want["dbeta"][i % C] += dy[i];
    if (p > 0) {
      const uint32_t threshold = dropout_threshold(p);
      Vec& b = want["branch"];
      b.resize(static_cast<size_t>(R * C));
      for (int64_t i = 0; i < R * C; ++i) {
        const double total = want["dx"][i] + (accumulate ? in.at("dx0")[i] : 0.0);
        b[i] = dropout_keep(key, key.first_element + i, threshold) ? total / (1.0 - p) : 0.0;
      }
    }
    want.merge(zeros);
    return want;
  };
  c.checks = {{"dx", Metric::normwise, 1e-4, 1e-5, accumulate ? "dx0" : ""},
              {"dgamma", Metric::normwise, 1e-4, 1e-5, "dgamma0"},
              {"dbeta", Metric::normwise, 1e-4, 1e-5, "dbeta0"}};
  if (p > 0) c.checks.push_back({"branch", Metric::normwise, 1e-4, 1e-5});
  for (const char* z : {"dx", "dgamma", "dbeta"})
    c.checks.push_back({std::string(z) + "_less_separate", Metric::exact});
  if (p > 0) c.checks.push_back({"branch_less_separate", Metric::exact});
  return c;
}

// ---- rotary ----

// transformers' apply_rotary_pos_emb on packed qkv [B,T,(H+2K)*D], literally: per query and key
// head, x * cat(cos, cos) + rotate_half(x) * cat(sin, sin) with rotate_half(x) = cat(-x2, x1),
// at position first + t, or where `positions` is given the token's own; values copied.
Vec ref_rotary(const Vec& qkv, const FVec& cos, const FVec& sin, int64_t first, int64_t T,
               int64_t H, int64_t K, int64_t D, const Vec* positions) {
  const int64_t half = D / 2, width = (H + 2 * K) * D,
                B = static_cast<int64_t>(qkv.size()) / (T * width);
  Vec out = qkv;
  Vec c(D), s(D), rh(D);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      const auto p = positions ? static_cast<int64_t>((*positions)[b * T + t]) : first + t;
      for (int64_t i = 0; i < D; ++i) {
        c[i] = cos[p * half + i % half];
        s[i] = sin[p * half + i % half];
      }
      for (int64_t h = 0; h < H + K; ++h) {
        const int64_t at = (b * T + t) * width + h * D;
        for (int64_t i = 0; i < half; ++i) {
          rh[i] = -qkv[at + half + i];
          rh[half + i] = qkv[at + i];
        }
        for (int64_t i = 0; i < D; ++i) out[at + i] = qkv[at + i] * c[i] + rh[i] * s[i];
      }
    }
  return out;
}

// Forward rotates x in place; backward rotates the gradient g back in place (the transposed
// rotation), and backward after forward gives x again. `packed`: each token at its position in a
// packed batch's sample (packed_positions, read from memory), from 0.
OpCase rotary_case(int64_t B, int64_t T, int64_t H, int64_t K, int64_t D, int64_t first,
                   double theta, bool reference, bool packed = false) {
  const int64_t W = (H + 2 * K) * D, P = first + T + 12;
  const Shape qs{B, T, W};
  const Vec positions = packed_positions(B * T);
  OpCase c;
  c.name = "rotary_B" + std::to_string(B) + "_T" + std::to_string(T) + "_H" + std::to_string(H) +
           "_K" + std::to_string(K) + "_D" + std::to_string(D) +
           (packed ? "_packed" : "_from" + std::to_string(first));
  c.inputs = [=](std::mt19937& rng) {
    return Values{{"x", randn_d(B * T * W, rng)}, {"g", randn_d(B * T * W, rng)}};
  };
  c.run = [=](Backend& be, const Values& in) {
    const RopeTables t = rope_tables(D, theta, P);
    DeviceBuffers d(be);
    const Tensor cos = d.put(t.cos, {P, D / 2}), sin = d.put(t.sin, {P, D / 2});
    const Tensor x = d.put_as(in.at("x"), qs), g = d.put_as(in.at("g"), qs);
    const Tensor pos = packed ? d.put_as(positions, {B * T}, DType::i32) : Tensor();
    const int h = static_cast<int>(H), k = static_cast<int>(K);
    be.rotary_forward(x, h, k, cos, sin, first, pos);
    be.rotary_backward(g, h, k, cos, sin, first, pos);
    const Vec rotated = d.values(x);
    be.rotary_backward(x, h, k, cos, sin, first, pos);
    return Values{{"forward", rotated}, {"backward", d.values(g)}, {"round_trip", d.values(x)}};
  };
  if (reference)
    c.reference = [=](const Values& in) {
      const RopeTables t = rope_tables(D, theta, P);
      const Vec* at = packed ? &positions : nullptr;
      auto f = [&](const Vec& v) { return ref_rotary(v, t.cos, t.sin, first, T, H, K, D, at); };
      return Values{{"forward", f(in.at("x"))},
                    {"backward", fd_vjp(in.at("x"), f, in.at("g"))},
                    {"round_trip", in.at("x")}};
    };
  c.checks = {{"forward", Metric::elementwise, 1e-5, 1e-6},
              {"backward", Metric::normwise, 1e-4, 1e-6},
              {"round_trip", Metric::elementwise, 1e-5, 1e-6}};
  return c;
}

}  // namespace

std::vector<OpCase> norm_cases() {
  std::vector<OpCase> cases;
  for (bool acc : {false, true}) {
    cases.push_back(layernorm_case({7, 13}, 1e-5f, acc, true));
    cases.push_back(layernorm_case({2, 3, 13}, 1e-12f, acc, true));
    // A GPU's tiles; C = 1031 takes several chunks per lane and row.
    for (const auto& [xs, eps] : {std::pair<Shape, float>{Shape{37, 75}, 1e-5f},
                                  {Shape{37, 129}, 1e-5f},
                                  {Shape{2, 19, 1031}, 1e-12f}})
      cases.push_back(layernorm_case(xs, eps, acc, false));
  }
  // Llama's and Qwen2's eps values.
  for (bool acc : {false, true})
    for (bool dgamma : {false, true}) {
      cases.push_back(rmsnorm_case({7, 13}, 1e-6f, acc, dgamma, true));
      cases.push_back(rmsnorm_case({7, 13}, 1e-5f, acc, dgamma, true));
      for (const auto& [xs, eps] : {std::pair<Shape, float>{Shape{37, 75}, 1e-6f},
                                    {Shape{37, 129}, 1e-5f},
                                    {Shape{2, 19, 1031}, 1e-6f}})
        cases.push_back(rmsnorm_case(xs, eps, acc, dgamma, false));
    }
  for (bool rms : {false, true}) {
    cases.push_back(dropout_add_norm_case({7, 13}, 0.25f, rms, 0));
    cases.push_back(dropout_add_norm_case({3, 2, 16}, 0.0f, rms, 0));
    cases.push_back(dropout_add_norm_case({5, 12}, 0.5f, rms, 6));
    // A GPU's rows: several groups of four per lane, C a multiple of 4 or not.
    cases.push_back(dropout_add_norm_case({37, 768}, 0.1f, rms, 0));
    cases.push_back(dropout_add_norm_case({2, 19, 1031}, 0.1f, rms, 4));
    cases.push_back(dropout_add_norm_case({5, 12}, 0.5f, rms, 6, 4));
  }
  for (bool rms : {false, true})
    for (bool round : {false, true}) {
      cases.push_back(norm_backward_case({7, 13}, rms, round, 0.25f, true));
      cases.push_back(norm_backward_case({5, 12}, rms, round, 0.0f, false));
      cases.push_back(norm_backward_case({3, 2, 16}, rms, round, 0.5f, false));
      cases.push_back(norm_backward_case({37, 768}, rms, round, 0.1f, true, false));
    }
  // MHA, GQA and MQA layouts, from position 0 and later ones; D = 2 the narrowest.
  cases.push_back(rotary_case(2, 5, 3, 3, 8, 0, 10000.0, true));
  cases.push_back(rotary_case(2, 3, 4, 2, 6, 7, 10000.0, true));
  cases.push_back(rotary_case(1, 4, 6, 1, 4, 2, 10000.0, true));
  cases.push_back(rotary_case(2, 2, 2, 2, 2, 1, 10000.0, true));
  // D = 128 (Llama's) and long positions.
  cases.push_back(rotary_case(2, 37, 4, 4, 128, 0, 500000.0, false));
  cases.push_back(rotary_case(3, 19, 8, 2, 6, 11, 500000.0, false));
  cases.push_back(rotary_case(1, 5, 6, 1, 64, 300, 500000.0, false));
  // A packed batch's positions, restarting at each sample.
  cases.push_back(rotary_case(2, 9, 4, 2, 6, 0, 10000.0, true, true));
  cases.push_back(rotary_case(3, 19, 8, 2, 128, 0, 500000.0, false, true));
  return cases;
}

}  // namespace brisk::testing
