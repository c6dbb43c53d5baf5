// Elementwise ops: the activations, tanh, SwiGLU, dropout (forward, backward, dropout_add, each
// also in place), add_inplace, fill and copy.
//
// Tolerances: an activation output is a few float32 operations around at most one erf, exp or
// tanh, which the CPU's vector versions (cpu_activation.cpp builds with -ffast-math) and CUDA's
// compute within a few ulp: 2e-6 of max(1, |y|) against fp64 (where 1 + erf cancels for
// negative x the error stays an absolute |x| * 1e-7, under the max(1, ...) floor), 1e-5 between
// backends. Gradients: the central difference of the fp64 reference with h = 1e-4 is off by
// h^2 |f'''| / 6 ~ 1e-9, the float32 derivative by ~1e-6: 1e-5 norm-wise. Dropout multiplies by
// one float32 scale: 1e-6. Adds, fills and copies are exact.
#include <algorithm>
#include <cmath>
#include <string>

#include "backend/activation.h"
#include "backend_support.h"
#include "conformance/op_case.h"
#include "core/rng.h"

namespace brisk::testing {
namespace {

constexpr double kFwd = 2e-6, kGrad = 1e-5;

// transformers' definitions, in double.
double ref_activation(Activation kind, double x) {
  switch (kind) {
    case Activation::gelu:
      return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0)));
    case Activation::gelu_tanh:
      return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
    case Activation::relu:
      return std::max(x, 0.0);
    case Activation::silu:
      return x / (1.0 + std::exp(-x));
    case Activation::quick_gelu:
      return x / (1.0 + std::exp(-1.702 * x));
    case Activation::sigmoid:
      return 1.0 / (1.0 + std::exp(-x));
  }
  return NAN;
}

// Exact zeros (relu's kink), and tails where the exponentials saturate.
void put_edges(Vec& x) {
  const double edges[] = {0.0, -0.0, 12.0, -12.0, 30.0, -30.0, 1e-3f, -1e-3f};
  std::copy(std::begin(edges), std::end(edges), x.begin());
}

// out = (the op run on dy rounded to `dtype` as it reads it) - (the op run on dy rounded by
// round_to first): zeros, for the 16-bit dtypes. run(dy, round_dy, out) runs the op.
template <typename Run>
Vec rounded_less_separate(Backend& be, DeviceBuffers& d, const Vec& dy, Shape dy_shape,
                          Shape out_shape, DType dtype, Run run) {
  const Tensor g = d.put_as(dy, dy_shape), g_rounded = d.put_as(dy, dy_shape);
  const Tensor a = d.put(FVec(out_shape.numel(), -7.f), out_shape);
  const Tensor b = d.put(FVec(out_shape.numel(), -7.f), out_shape);
  run(g, dtype, a);
  be.round_to(dtype, g_rounded);
  run(g_rounded, DType::f32, b);
  return minus(d.values(a), d.values(b));
}

// y = f(x), dx = dy * f'(x), and dx computed over dy; dy rounded to bf16 and fp16 as read against
// rounded first. `kind` empty: tanh, whose backward reads y.
OpCase activation_case(const Activation* kind, int64_t M, int64_t C, bool reference) {
  const Activation k = kind ? *kind : Activation::gelu;
  const Shape s{M, C};
  OpCase c;
  c.name = std::string(kind ? activation_name(k) : "tanh") + "_" + shape_name(s);
  c.inputs = [=](std::mt19937& rng) {
    Values v{{"x", randn_d(M * C, rng, kind ? 2.5 : 1.5)}, {"dy", randn_d(M * C, rng)}};
    put_edges(v["x"]);
    return v;
  };
  c.run = [=](Backend& be, const Values& in) {
    DeviceBuffers d(be);
    const Tensor x = d.put_as(in.at("x"), s), y = d.put(FVec(M * C, -7.f), s);
    const Tensor dy = d.put_as(in.at("dy"), s), dx = d.put(FVec(M * C, -7.f), s);
    const Tensor dx_in_dy = d.put_as(in.at("dy"), s);
    Values out;
    if (kind) {
      be.activation_forward(k, x, y);
      be.activation_backward(k, x, dy, dx, DType::f32);
      be.activation_backward(k, x, dx_in_dy, dx_in_dy, DType::f32);
      for (const auto& [t, name] :
           {std::pair{DType::bf16, "dx_rounded_bf16"}, std::pair{DType::f16, "dx_rounded_f16"}})
        out[name] = rounded_less_separate(be, d, in.at("dy"), s, s, t,
                                          [&](const Tensor& g, DType r, const Tensor& o) {
                                            be.activation_backward(k, x, g, o, r);
                                          });
      // Over dy itself.
      out["dx_over_dy_rounded"] = rounded_less_separate(
          be, d, in.at("dy"), s, s, DType::bf16, [&](const Tensor& g, DType r, const Tensor& o) {
            be.activation_backward(k, x, g, g, r);
            be.copy(g, o);
          });
    } else {
      be.tanh_forward(x, y);
      be.tanh_backward(y, dy, dx);
      be.tanh_backward(y, dx_in_dy, dx_in_dy);
    }
    out["y"] = d.values(y);
    out["dx"] = d.values(dx);
    out["dx_over_dy"] = d.values(dx_in_dy);
    return out;
  };
  if (reference)
    c.reference = [=](const Values& in) {
      auto f = [&](double x) { return kind ? ref_activation(k, x) : std::tanh(x); };
      const Vec &x = in.at("x"), &dy = in.at("dy");
      Vec y(x.size()), dx(x.size());
      for (size_t i = 0; i < x.size(); ++i) {
        y[i] = f(x[i]);
        const double slope = (f(x[i] + 1e-4) - f(x[i] - 1e-4)) / 2e-4;
        // At relu's kink the difference gives 1/2; PyTorch's derivative there is 0.
        dx[i] = dy[i] * (kind && k == Activation::relu && x[i] == 0.0 ? 0.0 : slope);
      }
      Values want{{"y", y}, {"dx", dx}, {"dx_over_dy", dx}};
      if (kind)
        for (const char* z : {"dx_rounded_bf16", "dx_rounded_f16", "dx_over_dy_rounded"})
          want[z] = Vec(x.size(), 0.0);
      return want;
    };
  c.checks = {{"y", Metric::elementwise, kFwd, 1e-5},
              {"dx", Metric::normwise, kGrad, 1e-5},
              {"dx_over_dy", Metric::normwise, kGrad, 1e-5}};
  if (kind)
    for (const char* z : {"dx_rounded_bf16", "dx_rounded_f16", "dx_over_dy_rounded"})
      c.checks.push_back({z, Metric::exact});
  return c;
}

// silu(gate) * up over [R, 2F] = [gate | up]; the gradient into a new buffer and over gate_up.
OpCase swiglu_case(int64_t R, int64_t F, bool reference) {
  OpCase c;
  c.name = "swiglu_R" + std::to_string(R) + "_F" + std::to_string(F);
  c.inputs = [=](std::mt19937& rng) {
    Values v{{"gate_up", randn_d(R * 2 * F, rng, 2.5)}, {"dout", randn_d(R * F, rng)}};
    put_edges(v["gate_up"]);  // saturated gates and exact zeros in both halves
    v["gate_up"][F] = 0.0;
    return v;
  };
  c.run = [=](Backend& be, const Values& in) {
    DeviceBuffers d(be);
    const Tensor gu = d.put_as(in.at("gate_up"), {R, 2 * F}), y = d.put(FVec(R * F, -7.f), {R, F});
    const Tensor dout = d.put_as(in.at("dout"), {R, F});
    const Tensor dgu = d.put(FVec(R * 2 * F, -7.f), {R, 2 * F});
    const Tensor over = d.put_as(in.at("gate_up"), {R, 2 * F});
    be.swiglu_forward(gu, y);
    be.swiglu_backward(gu, dout, dgu, DType::f32);
    be.swiglu_backward(over, dout, over, DType::f32);
    Values out{{"y", d.values(y)},
               {"dgate_up", d.values(dgu)},
               {"dgate_up_over_gate_up", d.values(over)},
               {"dout_after", d.values(dout)}};
    for (const auto& [t, name] : {std::pair{DType::bf16, "dgate_up_rounded_bf16"},
                                  std::pair{DType::f16, "dgate_up_rounded_f16"}})
      out[name] = rounded_less_separate(
          be, d, in.at("dout"), {R, F}, {R, 2 * F}, t,
          [&](const Tensor& g, DType r, const Tensor& o) { be.swiglu_backward(gu, g, o, r); });
    return out;
  };
  if (reference)
    c.reference = [=](const Values& in) {
      auto f = [&](const Vec& v) {
        Vec y(static_cast<size_t>(R * F));
        for (int64_t r = 0; r < R; ++r)
          for (int64_t i = 0; i < F; ++i) {
            const double g = v[r * 2 * F + i], u = v[r * 2 * F + F + i];
            y[r * F + i] = g / (1.0 + std::exp(-g)) * u;
          }
        return y;
      };
      const Vec dgu = fd_vjp(in.at("gate_up"), f, in.at("dout"));
      return Values{{"y", f(in.at("gate_up"))},
                    {"dgate_up", dgu},
                    {"dgate_up_over_gate_up", dgu},
                    {"dout_after", in.at("dout")},
                    {"dgate_up_rounded_bf16", Vec(dgu.size(), 0.0)},
                    {"dgate_up_rounded_f16", Vec(dgu.size(), 0.0)}};
    };
  c.checks = {{"y", Metric::elementwise, kFwd, 1e-5},
              {"dgate_up", Metric::normwise, kGrad, 1e-5},
              {"dgate_up_over_gate_up", Metric::normwise, kGrad, 1e-5},
              {"dout_after", Metric::exact},
              {"dgate_up_rounded_bf16", Metric::exact},
              {"dgate_up_rounded_f16", Metric::exact}};
  return c;
}

// Every dropout op, each into another buffer and in place, on views `offset` floats into their
// buffers: offset 1 breaks the 16-byte alignment a GPU's vectorized path needs. The key's step
// is beyond 32 bits. The reference draws the mask from the same keyed generator. `first`: the
// key's first_element (a part of a larger tensor: element i draws element first + i's mask; off
// a multiple of 4, a GPU's groups of four words do not line up). `held`: that much of the key's
// step given in the backend's memory (RngKey::step_offset), the same numbers drawn.
OpCase dropout_case(int64_t n, float p, int64_t offset, uint64_t first = 0, uint64_t held = 0) {
  RngKey key{0x1234'5678'9abcULL, (1ULL << 32) + 7, 3};
  key.first_element = first;
  OpCase c;
  c.name = "dropout_n" + std::to_string(n) + "_p" + std::to_string(static_cast<int>(p * 100)) +
           "_offset" + std::to_string(offset) +
           (first > 0 ? "_first" + std::to_string(first) : "") + (held > 0 ? "_step_held" : "");
  c.inputs = [=](std::mt19937& rng) {
    return Values{{"x", randn_d(n, rng)}, {"r", randn_d(n, rng)}};
  };
  c.run = [=, c_key = key](Backend& be, const Values& in) {
    DeviceBuffers d(be);
    auto view = [&](const Vec& v) {
      Vec padded(static_cast<size_t>(offset), 0.0);
      padded.insert(padded.end(), v.begin(), v.end());
      const Tensor t = d.put_as(padded, {offset + n});
      return Tensor(t.f32() + offset, Shape{n}, DType::f32, t.device());
    };
    const Vec garbage(static_cast<size_t>(n), -7.0);
    const Tensor x = view(in.at("x")), r = view(in.at("r")), y = view(garbage);
    const Tensor y_in_x = view(in.at("x")), dx = view(garbage), dx_in_dy = view(in.at("x"));
    const Tensor sum = view(garbage), sum_in_x = view(in.at("x"));
    const RngKey key = held > 0 ? d.hold_step(c_key, held) : c_key;
    be.dropout_forward(x, p, key, y);
    be.dropout_forward(y_in_x, p, key, y_in_x);
    be.dropout_backward(x, p, key, dx);  // x as the upstream gradient
    be.dropout_backward(dx_in_dy, p, key, dx_in_dy);
    be.dropout_add(x, r, p, key, sum);
    be.dropout_add(sum_in_x, r, p, key, sum_in_x);
    return Values{{"forward", d.values(y)},       {"forward_in_place", d.values(y_in_x)},
                  {"backward", d.values(dx)},     {"backward_in_place", d.values(dx_in_dy)},
                  {"dropout_add", d.values(sum)}, {"dropout_add_in_place", d.values(sum_in_x)}};
  };
  c.reference = [=](const Values& in) {
    const Vec &x = in.at("x"), &r = in.at("r");
    const uint32_t threshold = dropout_threshold(p);
    Vec y(x.size()), add(x.size());
    int64_t dropped = 0;
    for (size_t e = 0; e < x.size(); ++e) {
      const bool keep = p == 0.f || dropout_keep(key, first + e, threshold);
      dropped += !keep;
      const double m = keep ? 1.0 / (1.0 - double(p)) : 0.0;
      y[e] = m * x[e];
      // At p = 0 a plain float32 sum, which the backends must give exactly.
      add[e] = p == 0.f ? static_cast<float>(static_cast<float>(x[e]) + static_cast<float>(r[e]))
                        : x[e] + m * r[e];
    }
    // A mask that does something (or, at p = 0, nothing).
    BRISK_CHECK(p == 0.f ? dropped == 0 : dropped > 0 && dropped < n, "a degenerate mask");
    return Values{{"forward", y},           {"forward_in_place", y}, {"backward", y},
                  {"backward_in_place", y}, {"dropout_add", add},    {"dropout_add_in_place", add}};
  };
  // p = 0 is the identity and a plain float32 sum: exact.
  const Metric m = p == 0.f ? Metric::exact : Metric::elementwise;
  for (const char* out : {"forward", "forward_in_place", "backward", "backward_in_place",
                          "dropout_add", "dropout_add_in_place"})
    c.checks.push_back({out, m, 1e-6, 1e-6});
  return c;
}

// add_inplace, fill with a value and with zero, and copies of float32, int32 and int64 (the
// latter beyond 32 bits): exact.
OpCase add_fill_copy_case(int64_t n) {
  OpCase c;
  c.name = "add_fill_copy_n" + std::to_string(n);
  c.inputs = [=](std::mt19937& rng) {
    const IVec ints = randint(n, -1000, 1000, rng);
    Vec longs(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) longs[i] = static_cast<double>((i << 33) - 5 * i);
    return Values{{"a", randn_d(n, rng)},
                  {"b", randn_d(n, rng)},
                  {"ints", Vec(ints.begin(), ints.end())},
                  {"longs", longs}};
  };
  c.run = [=](Backend& be, const Values& in) {
    DeviceBuffers d(be);
    const FVec garbage(static_cast<size_t>(n), -7.f);
    const Tensor y = d.put_as(in.at("a"), {n}), x = d.put_as(in.at("b"), {n});
    be.add_inplace(y, x);
    const Tensor f1 = d.put(garbage, {n}), f2 = d.put(garbage, {n}), copy = d.put(garbage, {n});
    be.fill(f1, 2.5f);
    be.fill(f2, 0.f);
    be.copy(x, copy);
    const Tensor is = d.put_as(in.at("ints"), {n}, DType::i32), id = d.alloc({n}, DType::i32);
    const Tensor ls = d.put_as(in.at("longs"), {n}, DType::i64), ld = d.alloc({n}, DType::i64);
    be.copy(is, id);
    be.copy(ls, ld);
    return Values{{"sum", d.values(y)},      {"addend_after", d.values(x)},
                  {"fill", d.values(f1)},    {"fill0", d.values(f2)},
                  {"copy", d.values(copy)},  {"copy_i32", d.values(id)},
                  {"copy_i64", d.values(ld)}};
  };
  c.reference = [=](const Values& in) {
    Vec sum(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i)  // float32 addition, as the op does
      sum[i] =
          static_cast<float>(static_cast<float>(in.at("a")[i]) + static_cast<float>(in.at("b")[i]));
    return Values{{"sum", sum},
                  {"addend_after", in.at("b")},
                  {"fill", Vec(static_cast<size_t>(n), 2.5)},
                  {"fill0", Vec(static_cast<size_t>(n), 0.0)},
                  {"copy", in.at("b")},
                  {"copy_i32", in.at("ints")},
                  {"copy_i64", in.at("longs")}};
  };
  for (const char* out : {"sum", "addend_after", "fill", "fill0", "copy", "copy_i32", "copy_i64"})
    c.checks.push_back({out, Metric::exact});
  return c;
}

// copy_rows: strided runs from a source into a destination that starts with garbage (which the
// runs must leave where they do not write), float32 and int32 exact. Runs of 5 elements, 7
// apart in the source and 9 in the destination, as the sequence exchange's packing strides.
OpCase copy_rows_case(DType dtype) {
  const RowCopy rc{3, 7, 2, 9, 5, 11};
  const int64_t src_n = rc.src_at + (rc.rows - 1) * rc.src_pitch + rc.count + 4;
  const int64_t dst_n = rc.dst_at + (rc.rows - 1) * rc.dst_pitch + rc.count + 3;
  OpCase c;
  c.name = std::string("copy_rows_") + dtype_name(dtype);
  c.inputs = [=](std::mt19937& rng) {
    const IVec ints = randint(src_n, -1000, 1000, rng);
    return Values{
        {"src", dtype == DType::i32 ? Vec(ints.begin(), ints.end()) : randn_d(src_n, rng)},
        {"garbage", Vec(static_cast<size_t>(dst_n), -7.0)}};
  };
  c.run = [=](Backend& be, const Values& in) {
    DeviceBuffers d(be);
    const Tensor src = d.put_as(in.at("src"), {src_n}, dtype);
    const Tensor dst = d.put_as(in.at("garbage"), {dst_n}, dtype);
    be.copy_rows(src, dst, rc);
    return Values{{"dst", d.values(dst)}};
  };
  c.reference = [=](const Values& in) {
    Vec dst = in.at("garbage");
    for (int64_t i = 0; i < rc.rows; ++i)
      for (int64_t j = 0; j < rc.count; ++j)
        dst[rc.dst_at + i * rc.dst_pitch + j] = in.at("src")[rc.src_at + i * rc.src_pitch + j];
    return Values{{"dst", dst}};
  };
  c.checks.push_back({"dst", Metric::exact});
  return c;
}

}  // namespace

std::vector<OpCase> elementwise_cases() {
  std::vector<OpCase> cases;
  for (const Activation& kind : kAllActivations) {
    cases.push_back(activation_case(&kind, 7, 13, true));
    cases.push_back(activation_case(&kind, 37, 129, false));
  }
  cases.push_back(activation_case(nullptr, 7, 13, true));
  cases.push_back(activation_case(nullptr, 37, 129, false));
  cases.push_back(swiglu_case(6, 11, true));
  cases.push_back(swiglu_case(37, 129, false));
  // 4773 is not a multiple of 4: a GPU's last group of words is partial.
  for (int64_t n : {91, 4773})
    for (int64_t offset : {0, 1})
      for (float p : {0.f, 0.1f, 0.5f}) cases.push_back(dropout_case(n, p, offset));
  for (uint64_t first : {uint64_t{4096}, uint64_t{4098}, uint64_t{1} << 33})
    cases.push_back(dropout_case(4773, 0.1f, 1, first));
  cases.push_back(dropout_case(4773, 0.1f, 1, 4098, (1ULL << 32) - 1));
  cases.push_back(copy_rows_case(DType::f32));
  cases.push_back(copy_rows_case(DType::i32));
  cases.push_back(add_fill_copy_case(37));
  cases.push_back(add_fill_copy_case(4773));
  return cases;
}

}  // namespace brisk::testing
