// Ops on a bf16 run's saved activations, stored in bf16 only (Backend::reads_product_input): norms
// and activations writing them, activations, SwiGLU, products and attention reading them as they
// lie. Inputs are bf16 values, so the fp64 references see what the backends see.
//
// Tolerances: an output rounded to bf16 is off from the rounded fp64 value by at most one bf16 ulp
// (2^-8 of the value) where the float32 result sits next to a rounding boundary: 8e-3. Float32
// results read from bf16 inputs: as in the float32 cases. Attention against the CPU: the CPU's
// bf16 attention rounds its probabilities to bf16, the GPU's does not: 2e-2 norm-wise.
#include <cmath>
#include <string>

#include "backend/activation.h"
#include "backend_support.h"
#include "conformance/op_case.h"
#include "core/dtype.h"

namespace brisk::testing {
namespace {

constexpr double kRounded = 8e-3;

double round_bf16(double v) {
  return bf16_to_float(float_to_bf16(static_cast<float>(v)));
}
Vec rounded(Vec v) {
  for (double& x : v) x = round_bf16(x);
  return v;
}
Vec randn_bf16(int64_t n, std::mt19937& rng, double scale = 1.0) {
  return rounded(randn_d(n, rng, scale));
}

// bf16 tensors in and out of a backend, as values.
Tensor put_bf16(DeviceBuffers& d, const Vec& v, Shape s) {
  std::vector<uint16_t> bits(v.size());
  for (size_t i = 0; i < v.size(); ++i) bits[i] = float_to_bf16(static_cast<float>(v[i]));
  return d.put(bits, s, DType::bf16);
}
Vec bf16_values(DeviceBuffers& d, const Tensor& t) {
  const std::vector<uint16_t> bits = d.get<uint16_t>(t);
  Vec v(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) v[i] = bf16_to_float(bits[i]);
  return v;
}
// A backend in bf16 mode, where its saved activations are bf16.
void bf16_mode(Backend& be) {
  be.set_matmul_dtype(DType::bf16);
  BRISK_CHECK(be.reads_product_input(DType::bf16), be.name(), " reads no bf16 activations");
}

Vec ref_norm(const Vec& x, const Vec& g, const Vec& b, bool rms, int64_t C) {
  Vec y(x.size());
  for (size_t r = 0; r < x.size() / C; ++r) {
    const double* xr = &x[r * C];
    double mean = 0, var = 0;
    for (int64_t c = 0; c < C; ++c) mean += rms ? 0.0 : xr[c] / C;
    for (int64_t c = 0; c < C; ++c) var += (xr[c] - mean) * (xr[c] - mean) / C;
    for (int64_t c = 0; c < C; ++c)
      y[r * C + c] = round_bf16((xr[c] - mean) / std::sqrt(var + 1e-5) * g[c] + (rms ? 0 : b[c]));
  }
  return y;
}

// LayerNorm and RMSNorm writing a bf16 output from float32 input.
OpCase norm_case(bool rms) {
  const int64_t M = 37, C = 75;
  OpCase c;
  c.name = std::string("stored_") + (rms ? "rmsnorm" : "layernorm") + "_bf16_output";
  c.inputs = [=](std::mt19937& rng) {
    return Values{{"x", randn_d(M * C, rng, 2.0, 0.5)},
                  {"g", randn_d(C, rng, 0.5, 1.0)},
                  {"b", randn_d(C, rng)}};
  };
  c.run = [=](Backend& be, const Values& in) {
    bf16_mode(be);
    DeviceBuffers d(be);
    const Tensor x = d.put_as(in.at("x"), {M, C}), g = d.put_as(in.at("g"), {C});
    const Tensor b = d.put_as(in.at("b"), {C}), y = d.alloc({M, C}, DType::bf16);
    const Tensor mean = d.alloc({M}), rstd = d.alloc({M});
    if (rms)
      be.rmsnorm_forward(x, g, 1e-5f, y, rstd);
    else
      be.layernorm_forward(x, g, b, 1e-5f, y, mean, rstd);
    return Values{{"y", bf16_values(d, y)}};
  };
  c.reference = [=](const Values& in) {
    return Values{{"y", ref_norm(in.at("x"), in.at("g"), in.at("b"), rms, C)}};
  };
  c.checks = {{"y", Metric::elementwise, kRounded, kRounded}};
  return c;
}

// GELU from a bf16 input into bf16 and float32 outputs, and its gradient read from the bf16 input.
OpCase activation_case() {
  const int64_t n = 1000;
  OpCase c;
  c.name = "stored_gelu_bf16";
  c.inputs = [=](std::mt19937& rng) {
    return Values{{"x", randn_bf16(n, rng, 2.5)}, {"dy", randn_d(n, rng)}};
  };
  c.run = [=](Backend& be, const Values& in) {
    bf16_mode(be);
    DeviceBuffers d(be);
    const Tensor x = put_bf16(d, in.at("x"), {n}), y16 = d.alloc({n}, DType::bf16);
    const Tensor y = d.alloc({n}), dy = d.put_as(in.at("dy"), {n}), dx = d.alloc({n});
    be.activation_forward(Activation::gelu, x, y16);
    be.activation_forward(Activation::gelu, x, y);
    be.activation_backward(Activation::gelu, x, dy, dx, DType::f32);
    return Values{{"y16", bf16_values(d, y16)}, {"y", d.values(y)}, {"dx", d.values(dx)}};
  };
  c.reference = [=](const Values& in) {
    const Vec &x = in.at("x"), &dy = in.at("dy");
    Values want{{"y16", Vec(n)}, {"y", Vec(n)}, {"dx", Vec(n)}};
    auto f = [](double v) { return 0.5 * v * (1.0 + std::erf(v / std::sqrt(2.0))); };
    for (int64_t i = 0; i < n; ++i) {
      want["y"][i] = f(x[i]);
      want["y16"][i] = round_bf16(f(x[i]));
      want["dx"][i] = dy[i] * (f(x[i] + 1e-4) - f(x[i] - 1e-4)) / 2e-4;
    }
    return want;
  };
  c.checks = {{"y16", Metric::elementwise, kRounded, kRounded},
              {"y", Metric::elementwise, 2e-6, 1e-5},
              {"dx", Metric::normwise, 1e-5, 1e-5}};
  return c;
}

// SwiGLU over a bf16 [gate | up] into a bf16 output, and its gradient into bf16 and float32.
OpCase swiglu_case() {
  const int64_t R = 9, F = 70;
  OpCase c;
  c.name = "stored_swiglu_bf16";
  c.inputs = [=](std::mt19937& rng) {
    return Values{{"gate_up", randn_bf16(R * 2 * F, rng, 2.0)}, {"dout", randn_d(R * F, rng)}};
  };
  c.run = [=](Backend& be, const Values& in) {
    bf16_mode(be);
    DeviceBuffers d(be);
    const Tensor gu = put_bf16(d, in.at("gate_up"), {R, 2 * F});
    const Tensor y = d.alloc({R, F}, DType::bf16), dout = d.put_as(in.at("dout"), {R, F});
    const Tensor d16 = d.alloc({R, 2 * F}, DType::bf16), d32 = d.alloc({R, 2 * F});
    be.swiglu_forward(gu, y);
    be.swiglu_backward(gu, dout, d16, DType::f32);
    be.swiglu_backward(gu, dout, d32, DType::f32);
    return Values{
        {"y", bf16_values(d, y)}, {"dgate_up16", bf16_values(d, d16)}, {"dgate_up", d.values(d32)}};
  };
  c.reference = [=](const Values& in) {
    const Vec &gu = in.at("gate_up"), &dout = in.at("dout");
    Values want{{"y", Vec(R * F)}, {"dgate_up16", Vec(R * 2 * F)}, {"dgate_up", Vec(R * 2 * F)}};
    for (int64_t r = 0; r < R; ++r)
      for (int64_t j = 0; j < F; ++j) {
        const double g = gu[r * 2 * F + j], u = gu[r * 2 * F + F + j], o = dout[r * F + j];
        const double sig = 1.0 / (1.0 + std::exp(-g)), silu = g * sig;
        want["y"][r * F + j] = round_bf16(silu * u);
        const double dg = o * u * (sig + g * sig * (1.0 - sig)), du = o * silu;
        want["dgate_up"][r * 2 * F + j] = dg;
        want["dgate_up"][r * 2 * F + F + j] = du;
        want["dgate_up16"][r * 2 * F + j] = round_bf16(dg);
        want["dgate_up16"][r * 2 * F + F + j] = round_bf16(du);
      }
    return want;
  };
  c.checks = {{"y", Metric::elementwise, kRounded, kRounded},
              {"dgate_up16", Metric::elementwise, kRounded, kRounded},
              {"dgate_up", Metric::normwise, 1e-5, 1e-5}};
  return c;
}

// A product reading a bf16 input x (and where dy16, a bf16 gradient dy, its bias gradient too);
// weights and bias float32 holding bf16 values (a 16-bit run's compute copy), so every product is
// exact up to float32 accumulation. Its output also stored in bf16 where the backend's products
// store it (Backend::stores_product_output; elsewhere rounded after), and dropout_add reading that
// as the float32 copy of its values.
OpCase linear_case(bool bias, bool dy16) {
  const int64_t M = 33, K = 48, N = 40;
  OpCase c;
  c.name =
      std::string("stored_linear_bf16_input") + (bias ? "_bias" : "") + (dy16 ? "_dy_bf16" : "");
  c.inputs = [=](std::mt19937& rng) {
    return Values{{"x", randn_bf16(M * K, rng)},
                  {"w", randn_bf16(N * K, rng, 0.3)},
                  {"b", randn_bf16(N, rng)},
                  {"dy", randn_bf16(M * N, rng)},
                  {"res", randn_d(M * N, rng)}};
  };
  c.run = [=](Backend& be, const Values& in) {
    bf16_mode(be);
    DeviceBuffers d(be);
    d.workspace(std::max({M * K, N * K, M * N}));
    const Tensor x = put_bf16(d, in.at("x"), {M, K}), w = d.put_as(in.at("w"), {N, K});
    const Tensor b = d.put_as(in.at("b"), {N}), y = d.alloc({M, N});
    const Tensor dy = dy16 ? put_bf16(d, in.at("dy"), {M, N}) : d.put_as(in.at("dy"), {M, N});
    const Tensor dx = d.alloc({M, K}), dw = d.alloc({N, K}), db = d.alloc({N});
    be.linear_forward(x, w, bias ? b : Tensor(), WeightLayout::out_in, y);
    be.linear_backward(x, w, dy, WeightLayout::out_in, dx, false, dw, bias ? db : Tensor(), false);
    Values out{{"y", d.values(y)}, {"dx", d.values(dx)}, {"dw", d.values(dw)}};
    if (bias) out["db"] = d.values(db);
    const Tensor y16 = d.alloc({M, N}, DType::bf16);
    out["dropout_add_diff"] = Vec(M * N, 0.0);  // where products store no bf16: nothing to compare
    if (!be.stores_product_output(DType::bf16)) {
      be.cast(y, y16);
      out["y16"] = bf16_values(d, y16);
      return out;
    }
    be.linear_forward(x, w, bias ? b : Tensor(), WeightLayout::out_in, y16);
    out["y16"] = bf16_values(d, y16);
    const Tensor res = d.put_as(in.at("res"), {M, N}), y16_32 = d.alloc({M, N});
    const Tensor z = d.alloc({M, N}), z32 = d.alloc({M, N});
    be.cast(y16, y16_32);
    const RngKey key{7, 2, 1};
    be.dropout_add(res, y16, 0.25f, key, z);
    be.dropout_add(res, y16_32, 0.25f, key, z32);
    const Vec zv = d.values(z), z32v = d.values(z32);
    for (int64_t i = 0; i < M * N; ++i) out["dropout_add_diff"][i] = zv[i] - z32v[i];
    return out;
  };
  c.reference = [=](const Values& in) {
    const Vec &x = in.at("x"), &w = in.at("w"), &b = in.at("b"), &dy = in.at("dy");
    Values want{{"y", Vec(M * N)},
                {"dx", Vec(M * K)},
                {"dw", Vec(N * K)},
                {"y16", Vec(M * N)},
                {"dropout_add_diff", Vec(M * N, 0.0)}};
    if (bias) want["db"] = Vec(N);
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) {
        double s = bias ? b[j] : 0.0;
        for (int64_t k = 0; k < K; ++k) s += x[i * K + k] * w[j * K + k];
        want["y"][i * N + j] = s;
        want["y16"][i * N + j] = round_bf16(s);
        for (int64_t k = 0; k < K; ++k) {
          want["dx"][i * K + k] += dy[i * N + j] * w[j * K + k];
          want["dw"][j * K + k] += dy[i * N + j] * x[i * K + k];
        }
        if (bias) want["db"][j] += dy[i * N + j];
      }
    return want;
  };
  c.checks = {{"y", Metric::elementwise, 1e-5, 1e-5},
              {"y16", Metric::elementwise, kRounded, kRounded},
              {"dropout_add_diff", Metric::elementwise, 0, 0},
              {"dx", Metric::normwise, 1e-5, 1e-5},
              {"dw", Metric::normwise, 1e-5, 1e-5}};
  if (bias) c.checks.push_back({"db", Metric::normwise, 1e-5, 1e-5});
  return c;
}

double ref_activation(Activation kind, double v) {
  if (kind == Activation::gelu) return 0.5 * v * (1.0 + std::erf(v / std::sqrt(2.0)));
  const double u = std::sqrt(2.0 / M_PI) * (v + activation_constants::kGeluCubic * v * v * v);
  return 0.5 * v * (1.0 + std::tanh(u));  // gelu_tanh
}

// linear_backward through the activation before the product (an MLP's second product over its
// saved, bf16 pre-activation and activation), then the first product's bias gradient from the
// gradient it returns (float32, or bf16 where the backend fuses the activation's gradient into
// the product). dy W is rounded to bf16 before act' on one side, the product after on the other:
// each within 2^-9 of the fp64 value, 5e-3 norm-wise (GELU's erf and tanh forms' slopes differ by
// 8.7e-4 at most: below what bf16 resolves, so this checks the product and the slope, not which
// form). K not a multiple of 8: no GPU epilogue.
OpCase linear_activation_case(Activation kind, int64_t K) {
  const int64_t M = 33, N = 40, K1 = 24;
  OpCase c;
  c.name = std::string("stored_linear_activation_backward_") + activation_name(kind) + "_K" +
           std::to_string(K);
  c.inputs = [=](std::mt19937& rng) {
    Values v{{"pre", randn_bf16(M * K, rng, 2.0)},
             {"w", randn_bf16(N * K, rng, 0.3)},
             {"dy", randn_bf16(M * N, rng)},
             {"x1", randn_bf16(M * K1, rng)},
             {"w1", randn_bf16(K * K1, rng, 0.3)}};
    v["x"] = Vec(M * K);
    for (int64_t i = 0; i < M * K; ++i) v["x"][i] = round_bf16(ref_activation(kind, v["pre"][i]));
    return v;
  };
  c.run = [=](Backend& be, const Values& in) {
    bf16_mode(be);
    DeviceBuffers d(be);
    d.workspace(std::max({M * K, N * K, M * N, M * K1}));
    const Tensor pre = put_bf16(d, in.at("pre"), {M, K}), x = put_bf16(d, in.at("x"), {M, K});
    const Tensor w = d.put_as(in.at("w"), {N, K}), dy = d.put_as(in.at("dy"), {M, N});
    const Tensor dx = d.put(FVec(M * K, -7.f), {M, K}), dw = d.put(FVec(N * K, -7.f), {N, K});
    const Tensor db = d.put(FVec(N, -7.f), {N}), db1 = d.put(FVec(K, -7.f), {K});
    const Tensor x1 = put_bf16(d, in.at("x1"), {M, K1}), w1 = d.put_as(in.at("w1"), {K, K1});
    const Tensor d_pre = be.linear_activation_backward(x, w, dy, WeightLayout::out_in, kind, pre,
                                                       DType::bf16, dx, dw, db, false);
    BRISK_CHECK(d_pre.data() == dx.data(), "the gradient is not in dx's memory");
    be.linear_backward(x1, w1, d_pre, WeightLayout::out_in, Tensor(), false, Tensor(), db1, false);
    const Vec dxv = d_pre.dtype() == DType::bf16 ? bf16_values(d, d_pre) : d.values(d_pre);
    return Values{{"dx", dxv}, {"dw", d.values(dw)}, {"db", d.values(db)}, {"db1", d.values(db1)}};
  };
  c.reference = [=](const Values& in) {
    const Vec &pre = in.at("pre"), &x = in.at("x"), &w = in.at("w"), &dy = in.at("dy");
    Values want{{"dx", Vec(M * K)}, {"dw", Vec(N * K)}, {"db", Vec(N)}, {"db1", Vec(K)}};
    for (int64_t i = 0; i < M; ++i)
      for (int64_t k = 0; k < K; ++k) {
        double s = 0;
        for (int64_t j = 0; j < N; ++j) s += dy[i * N + j] * w[j * K + k];
        const double v = pre[i * K + k];
        const double slope =
            (ref_activation(kind, v + 1e-4) - ref_activation(kind, v - 1e-4)) / 2e-4;
        want["dx"][i * K + k] = s * slope;
        want["db1"][k] += s * slope;
      }
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) {
        want["db"][j] += dy[i * N + j];
        for (int64_t k = 0; k < K; ++k) want["dw"][j * K + k] += dy[i * N + j] * x[i * K + k];
      }
    return want;
  };
  c.checks = {{"dx", Metric::normwise, 5e-3, 5e-3},
              {"dw", Metric::normwise, 1e-5, 1e-5},
              {"db", Metric::normwise, 1e-5, 1e-5},
              {"db1", Metric::normwise, 5e-3, 5e-3}};
  return c;
}

// Causal attention reading a bf16 qkv (and, backward, a bf16 output) against the same op reading
// float32 copies of the same values: the differences are checked against zero, the results
// against the CPU; its output written into a bf16 stored copy, exactly against the cast.
OpCase attention_case() {
  const int64_t B = 2, T = 37, H = 2, D = 16, C = H * D;
  OpCase c;
  c.name = "stored_attention_bf16_qkv";
  c.inputs = [=](std::mt19937& rng) {
    return Values{{"qkv", randn_bf16(B * T * 3 * C, rng)}, {"dout", randn_d(B * T * C, rng)}};
  };
  c.run = [=](Backend& be, const Values& in) {
    bf16_mode(be);
    DeviceBuffers d(be);
    const AttentionBuffers a = attention_buffers(be.device(), B, H, T, D);
    const Shape qs{B, T, 3 * C}, os{B, T, C};
    const Tensor q16 = put_bf16(d, in.at("qkv"), qs), q32 = d.put_as(in.at("qkv"), qs);
    const Tensor dout = d.put_as(in.at("dout"), os), stats = d.alloc(a.stats);
    const Tensor scratch = d.alloc(a.scratch), out = d.alloc(os), out32 = d.alloc(os);
    const Tensor out16 = d.alloc(os, DType::bf16), dq16 = d.alloc(qs), dq32 = d.alloc(qs);
    const float scale = 1.0f / 4.0f;
    be.attention_forward(q32, Tensor(), true, H, H, scale, 0.0f, RngKey{}, stats, scratch, out32);
    be.attention_forward(q16, Tensor(), true, H, H, scale, 0.0f, RngKey{}, stats, scratch, out);
    be.cast(out, out16);
    // Straight into a stored copy: the same bits as the cast (a GPU's fused attention writes them).
    const Tensor stored = d.alloc(os, DType::bf16), spare = d.alloc(os);
    be.attention_forward_stored(q16, Tensor(), true, H, H, scale, 0.0f, RngKey{}, stats, scratch,
                                spare, stored);
    const Vec stored_less_cast = minus(bf16_values(d, stored), bf16_values(d, out16));
    be.attention_backward(dout, q16, out16, stats, Tensor(), true, H, H, scale, 0.0f, RngKey{},
                          scratch, dq16, DType::f32, DType::f32);
    const Tensor out16_32 = d.alloc(os);
    be.cast(out16, out16_32);
    be.attention_backward(dout, q32, out16_32, stats, Tensor(), true, H, H, scale, 0.0f, RngKey{},
                          scratch, dq32, DType::f32, DType::f32);
    const Vec o = d.values(out), o32 = d.values(out32), g = d.values(dq16), g32 = d.values(dq32);
    Vec out_diff(o.size()), grad_diff(g.size());
    for (size_t i = 0; i < o.size(); ++i) out_diff[i] = o[i] - o32[i];
    for (size_t i = 0; i < g.size(); ++i) grad_diff[i] = g[i] - g32[i];
    return Values{{"out", o},
                  {"dqkv", g},
                  {"out_diff", out_diff},
                  {"dqkv_diff", grad_diff},
                  {"stored_less_cast", stored_less_cast}};
  };
  c.reference = [=](const Values&) {
    return Values{{"out_diff", Vec(B * T * C, 0.0)},
                  {"dqkv_diff", Vec(B * T * 3 * C, 0.0)},
                  {"stored_less_cast", Vec(B * T * C, 0.0)}};
  };
  c.checks = {{"out", Metric::normwise, 0, 2e-2},
              {"dqkv", Metric::normwise, 0, 2e-2},
              {"out_diff", Metric::elementwise, 1e-6, 1e-6},
              {"dqkv_diff", Metric::elementwise, 1e-6, 1e-6},
              {"stored_less_cast", Metric::exact, 0, 0}};
  return c;
}

}  // namespace

std::vector<OpCase> stored_cases() {
  return {norm_case(false),
          norm_case(true),
          activation_case(),
          swiglu_case(),
          linear_case(true, false),
          linear_case(false, true),
          linear_case(true, true),
          attention_case(),
          linear_activation_case(Activation::gelu_tanh, 48),
          linear_activation_case(Activation::gelu, 48),
          linear_activation_case(Activation::gelu_tanh, 44)};
}

}  // namespace brisk::testing
