// 4-bit dequantization (QLoRA's frozen base, core/quant4.h): dequantize_4bit of a tensor the
// host codec quantized (NF4 and FP4, blocks of 64 and 128, a partial last block, nested absmaxes)
// into float32, bf16 and f16, and written transposed (a Conv1D's weight quantized as nn.Linear's,
// [out, in]). The host codec equals bitsandbytes bit for bit (test_quant4.cpp),
// so every backend must give its bits exactly: the reference is the host's dequantization,
// rounded to nearest even for the 16-bit outputs (their bit patterns compared).
#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

#include "backend_support.h"
#include "conformance/op_case.h"
#include "core/dtype.h"
#include "core/quant4.h"
#include "core/quantization.h"

namespace brisk::testing {
namespace {

struct Quant4Case {
  int64_t numel, blocksize;
  Quant4Type type;
  bool nested;
  DType out;
  int64_t transposed_cols = 0;
};

std::string case_name(const Quant4Case& c) {
  return std::string("dequantize_4bit_") + (c.type == Quant4Type::nf4 ? "nf4" : "fp4") + "_n" +
         std::to_string(c.numel) + "_block" + std::to_string(c.blocksize) +
         (c.nested ? "_nested" : "") + "_" + dtype_name(c.out) +
         (c.transposed_cols ? "_transposed" + std::to_string(c.transposed_cols) : "");
}

Quant4Host quantized(const Quant4Case& c, const Vec& x) {
  const std::vector<float> v(x.begin(), x.end());
  return quantize_4bit(v.data(), {c.numel, c.blocksize, c.type, c.nested}, "x");
}

// q's state in the backend's memory.
Backend::Quant4Tensor uploaded(DeviceBuffers& d, const Quant4Host& q) {
  Backend::Quant4Tensor t;
  t.layout = q.layout;
  t.packed = d.put(q.packed, {q.layout.numel > 0 ? q.layout.packed_bytes() : 0}, DType::u8);
  if (q.layout.nested) {
    const std::array<float, 256> map = dynamic_quant_map(true);
    t.qabsmax = d.put(q.qabsmax, {q.layout.blocks()}, DType::u8);
    t.absmax2 = d.put(q.absmax2, {q.layout.nested_blocks()});
    t.code2 = d.put(std::vector<float>(map.begin(), map.end()), {256});
    t.offset = q.offset;
  } else {
    t.absmax = d.put(q.absmax, {q.layout.blocks()});
  }
  return t;
}

OpCase quant4_case(const Quant4Case& c) {
  OpCase op;
  op.name = case_name(c);
  op.inputs = [=](std::mt19937& rng) { return Values{{"x", randn_d(c.numel, rng, 0.05)}}; };
  op.run = [=](Backend& be, const Values& in) {
    const Quant4Host q = quantized(c, in.at("x"));
    DeviceBuffers d(be);
    Backend::Quant4Tensor t = uploaded(d, q);
    t.transposed_cols = c.transposed_cols;
    const Tensor out = d.alloc({c.numel}, c.out);
    be.dequantize_4bit(t, out);
    return Values{{"out", d.values(out)}};
  };
  op.reference = [=](const Values& in) {
    const Quant4Host q = quantized(c, in.at("x"));
    std::vector<float> f(static_cast<size_t>(c.numel));
    dequantize_4bit(q, f.data());
    Vec want(f.size());
    const int64_t cols = c.transposed_cols, rows = cols ? c.numel / cols : 0;
    for (int64_t i = 0; i < c.numel; ++i) {
      const float v = f[static_cast<size_t>(i)];
      want[static_cast<size_t>(cols ? (i % cols) * rows + i / cols : i)] = c.out == DType::f32 ? v
                                                                           : c.out == DType::bf16
                                                                               ? float_to_bf16(v)
                                                                               : float_to_fp16(v);
    }
    return Values{{"out", want}};
  };
  op.checks = {{"out", Metric::exact}};
  return op;
}

// A linear's 4-bit weight [N, K] in parts of `rows` rows, each quantized apart, multiplied by
// quantized_linear_forward (y = x W^T + b) and quantized_linear_backward (dx = or += dy W).
struct Quant4LinearCase {
  int64_t M, K;
  std::vector<int64_t> rows;  // each part's
  Quant4Type type;
  bool nested;
  DType products;                 // f32, or bf16 (operands rounded to it)
  DType part_dtype = DType::f32;  // every part's values rounded to it (its quant_state dtype)
  bool fp16 = false;              // then to fp16 (an fp16 run)
  bool accumulate = false;
  bool finite_differences = false;  // dx against the forward's finite differences, else dy W
  int64_t N() const { return std::accumulate(rows.begin(), rows.end(), int64_t{0}); }
};

std::string linear_case_name(const Quant4LinearCase& c) {
  std::string parts;
  for (const int64_t r : c.rows) parts += "_" + std::to_string(r);
  return std::string("quantized_linear_") + dtype_name(c.products) + "_" +
         (c.type == Quant4Type::nf4 ? "nf4" : "fp4") + (c.nested ? "_nested" : "") + "_M" +
         std::to_string(c.M) + "_K" + std::to_string(c.K) + "_rows" + parts +
         (c.part_dtype != DType::f32 ? std::string("_as_") + dtype_name(c.part_dtype) : "") +
         (c.fp16 ? "_fp16" : "") + (c.accumulate ? "_dxadd" : "_dxset");
}

// Each part quantized from its rows of w ([N, K]).
std::vector<Quant4Host> quantized_parts(const Quant4LinearCase& c, const Vec& w) {
  std::vector<Quant4Host> parts;
  int64_t at = 0;
  for (const int64_t r : c.rows) {
    const std::vector<float> v(w.begin() + at, w.begin() + at + r * c.K);
    parts.push_back(quantize_4bit(v.data(), {r * c.K, 64, c.type, c.nested}, "w"));
    at += r * c.K;
  }
  return parts;
}

// The weight the product multiplies by: each part dequantized and rounded as the case says, then
// to the products' type.
Vec product_weight(const Quant4LinearCase& c, const Vec& w) {
  std::vector<float> all;
  for (const Quant4Host& q : quantized_parts(c, w)) {
    std::vector<float> v(static_cast<size_t>(q.layout.numel));
    dequantize_4bit(q, v.data());
    v = rounded(v, c.part_dtype);
    if (c.fp16) v = rounded(v, DType::f16);
    all.insert(all.end(), v.begin(), v.end());
  }
  all = rounded(all, c.products);
  return Vec(all.begin(), all.end());
}

Vec ref_quantized_forward(const Vec& x, const Vec& w, const Vec& b, int64_t M, int64_t K,
                          int64_t N) {
  Vec y(static_cast<size_t>(M * N));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double s = b[static_cast<size_t>(n)];
      for (int64_t k = 0; k < K; ++k) s += x[m * K + k] * w[n * K + k];
      y[m * N + n] = s;
    }
  return y;
}

OpCase quant4_linear_case(const Quant4LinearCase& c) {
  const int64_t M = c.M, K = c.K, N = c.N();
  OpCase op;
  op.name = linear_case_name(c);
  op.inputs = [=](std::mt19937& rng) {
    auto operand = [&](int64_t n) {
      const FVec v = rounded(randn(n, rng), c.products);
      return Vec(v.begin(), v.end());
    };
    return Values{{"x", operand(M * K)},
                  {"dy", operand(M * N)},
                  {"w", randn_d(N * K, rng, 0.05)},
                  {"b", randn_d(N, rng)},
                  {"dx0", randn_d(M * K, rng)}};
  };
  op.run = [=](Backend& be, const Values& in) {
    be.set_matmul_dtype(c.products);
    DeviceBuffers d(be);
    MatmulOperands operands(std::max({M * K, N * K, M * N}));
    operands.quantized = N * K;
    operands.quantized_blocked = cpu_blocked_elements(N, K);
    d.workspace(operands);
    Backend::Quant4Matrix w;
    w.cols = K;
    w.fp16 = c.fp16;
    for (const Quant4Host& q : quantized_parts(c, in.at("w")))
      w.parts.push_back({uploaded(d, q), c.part_dtype});
    const Tensor x = d.put_as(in.at("x"), {M, K}), dy = d.put_as(in.at("dy"), {M, N});
    const Tensor b = d.put_as(in.at("b"), {N}), dx = d.put_as(in.at("dx0"), {M, K});
    const Tensor y = d.put(FVec(static_cast<size_t>(M * N), -7.f), {M, N});
    be.quantized_linear_forward(x, w, b, y);
    be.quantized_linear_backward(dy, w, dx, c.accumulate);
    return Values{{"y", d.values(y)}, {"dx", d.values(dx)}};
  };
  op.reference = [=](const Values& in) {
    const Vec w = product_weight(c, in.at("w")), &b = in.at("b"), &dy = in.at("dy");
    Values want{{"y", ref_quantized_forward(in.at("x"), w, b, M, K, N)}};
    Vec dx(static_cast<size_t>(M * K), 0.0);
    if (c.finite_differences) {
      dx = fd_vjp(
          in.at("x"), [&](const Vec& v) { return ref_quantized_forward(v, w, b, M, K, N); }, dy);
    } else {
      for (int64_t m = 0; m < M; ++m)
        for (int64_t n = 0; n < N; ++n)
          for (int64_t k = 0; k < K; ++k) dx[m * K + k] += dy[m * N + n] * w[n * K + k];
    }
    want["dx"] = dx;
    return want;
  };
  op.checks = {{"y", Metric::elementwise, 1e-5, 1e-4},
               {"dx", Metric::normwise, 1e-5, 1e-4, c.accumulate ? "dx0" : ""}};
  return op;
}

}  // namespace

std::vector<OpCase> quant4_cases() {
  std::vector<OpCase> cases;
  for (const DType out : {DType::f32, DType::bf16, DType::f16}) {
    cases.push_back(quant4_case({4096, 64, Quant4Type::nf4, false, out}));
    cases.push_back(quant4_case({64 * 300 + 22, 64, Quant4Type::nf4, true, out}));
    cases.push_back(quant4_case({1000, 128, Quant4Type::fp4, false, out}));
  }
  cases.push_back(quant4_case({64 * 257 + 1, 64, Quant4Type::fp4, true, DType::f32}));
  // A [90, 30] weight (GPT-2's c_attn, [out, in]) into its [30, 90] place; rows across blocks.
  cases.push_back(quant4_case({90 * 30, 64, Quant4Type::nf4, false, DType::f32, 30}));
  cases.push_back(quant4_case({37 * 300, 64, Quant4Type::fp4, true, DType::bf16, 300}));
  // The products of a 4-bit weight: whole and in parts (query, key and value as one matrix),
  // rows starting mid-block, edges of the blocked layout (N and K not multiples of 64 and 32), an
  // odd K (values starting mid-byte), values rounded to a checkpoint's bf16 and to an fp16 run's.
  using Q = Quant4LinearCase;
  const auto nf4 = Quant4Type::nf4, fp4 = Quant4Type::fp4;
  const DType f32 = DType::f32, bf16 = DType::bf16;
  cases.push_back(quant4_linear_case({5, 12, {3, 2}, nf4, false, f32, f32, false, false, true}));
  cases.push_back(quant4_linear_case({9, 96, {48, 16, 16}, nf4, true, f32, f32, false, true}));
  cases.push_back(quant4_linear_case({7, 33, {10}, fp4, false, f32, DType::f16, true}));
  for (const DType products : {f32, bf16}) {
    cases.push_back(quant4_linear_case(Q{33, 128, {64, 64, 64}, nf4, true, products}));
    cases.push_back(quant4_linear_case({17, 80, {70}, fp4, false, products, bf16, false, true}));
    cases.push_back(quant4_linear_case({3, 256, {130, 62}, nf4, false, products}));
  }
  cases.push_back(quant4_linear_case({21, 33, {9, 4}, nf4, true, bf16, f32, true}));
  return cases;
}

}  // namespace brisk::testing
