// Linear layers: linear_forward and linear_backward in both weight layouts, with and without a
// bias, dx skipped, overwritten or accumulated, dw and db overwritten or accumulated, in float32,
// TF32 and on bf16 and fp16 operands.
//
// Tolerances, per operand type:
// - float32: 1e-5 forward (element by element), 1e-4 for gradients against finite differences,
//   1e-5 against the CPU (only the summation order differs).
// - TF32 keeps 10 of float32's 23 mantissa bits: 5e-3 everywhere (the CPU has no TF32 and
//   multiplies in float32, which is within that of the fp64 reference as well).
// - bf16 and fp16: the operands are rounded to the type beforehand, so every product is exact in
//   float32 and the fp64 reference sees the same values; only float32 summation differs: 1e-4
//   against the CPU, float32's tolerances against the reference.
#include <algorithm>
#include <string>

#include "backend_support.h"
#include "conformance/op_case.h"

namespace brisk::testing {
namespace {

enum class DxMode { skipped, overwritten, accumulated };

Vec ref_linear(const Vec& x, const Vec& w, const Vec& b, WeightLayout layout, int64_t M, int64_t K,
               int64_t N) {
  Vec y(static_cast<size_t>(M * N));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double s = b.empty() ? 0.0 : b[n];
      for (int64_t k = 0; k < K; ++k)
        s += x[m * K + k] * (layout == WeightLayout::out_in ? w[n * K + k] : w[k * N + n]);
      y[m * N + n] = s;
    }
  return y;
}

struct Precision {
  const char* name;
  DType operands;
  bool tf32;
  double fwd, grad, vs_cpu;
};

const Precision kF32{"f32", DType::f32, false, 1e-5, 1e-4, 1e-5};
// Float32 over a long sum (K = 1000): partial sums up to ~10 round at ~1e-6 each step, in each
// backend's own order.
const Precision kF32LongSums{"f32", DType::f32, false, 1e-4, 1e-4, 1e-4};
// Each tf32 run is held to 5e-3 of the fp64 reference, so the GPU's and the CPU's runs (each
// rounding its operands to tf32, summing in its own order) to twice that of each other.
const Precision kTf32{"tf32", DType::f32, true, 5e-3, 5e-3, 1e-2};
const Precision kBf16{"bf16", DType::bf16, false, 1e-5, 1e-4, 1e-4};
const Precision kF16{"f16", DType::f16, false, 1e-5, 1e-4, 1e-4};

// The gradients of sum(y * dy), y = x W' + b, directly: dx = dy W (W' = W^T for out_in),
// dW = dy^T x (or its transpose for in_out), db = the column sums of dy.
Values ref_linear_grads(const Vec& x, const Vec& w, const Vec& dy, WeightLayout layout, int64_t M,
                        int64_t K, int64_t N) {
  Vec dx(static_cast<size_t>(M * K), 0.0), dw(static_cast<size_t>(N * K), 0.0);
  Vec db(static_cast<size_t>(N), 0.0);
  const bool out_in = layout == WeightLayout::out_in;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      const double g = dy[m * N + n];
      db[n] += g;
      for (int64_t k = 0; k < K; ++k) {
        const int64_t wi = out_in ? n * K + k : k * N + n;
        dx[m * K + k] += g * w[wi];
        dw[wi] += g * x[m * K + k];
      }
    }
  return {{"dx", dx}, {"dw", dw}, {"db", db}};
}

// How a case's fp64 expected values are had: none (the CPU is the GPU's reference), by finite
// differences of the forward, or analytically (large cases, where finite differences would take
// minutes).
enum class Reference { none, finite_differences, analytic };

OpCase linear_case(Shape xs, int64_t N, WeightLayout layout, bool bias, DxMode dx_mode,
                   bool dw_written, const Precision& pr, Reference reference) {
  const int64_t K = xs[xs.rank() - 1], M = xs.numel() / K;
  const Shape ws = layout == WeightLayout::out_in ? Shape{N, K} : Shape{K, N};
  Shape ys;
  for (int i = 0; i + 1 < xs.rank(); ++i) ys.push_back(xs[i]);
  ys.push_back(N);
  const char* dx_names[] = {"dxskip", "dxset", "dxadd"};
  OpCase c;
  c.name = std::string("linear_") + pr.name + "_" + shape_name(xs) + "_N" + std::to_string(N) +
           (layout == WeightLayout::out_in ? "_outin" : "_inout") + (bias ? "_bias" : "") + "_" +
           dx_names[static_cast<int>(dx_mode)] + (dw_written ? "_dwset" : "");
  c.inputs = [=](std::mt19937& rng) {
    auto operand = [&](int64_t n, float scale) {
      const FVec v = rounded(randn(n, rng, scale), pr.operands);
      return Vec(v.begin(), v.end());
    };
    Values v;
    v["x"] = operand(M * K, 1.f);
    v["w"] = operand(N * K, 0.3f);
    v["dy"] = operand(M * N, 1.f);
    v["b"] = randn_d(N, rng);
    v["dx0"] = randn_d(M * K, rng);  // what dx, dw and db hold before the backward pass
    v["dw0"] = randn_d(N * K, rng);
    v["db0"] = randn_d(N, rng);
    return v;
  };
  c.run = [=](Backend& be, const Values& in) {
    // The CPU has no fp16 products; it multiplies fp16 values in float32, exactly.
    be.set_matmul_dtype(be.device() == Device::cpu && pr.operands == DType::f16 ? DType::f32
                                                                                : pr.operands);
    be.set_tf32(pr.tf32);
    DeviceBuffers d(be);
    d.workspace(std::max({M * K, N * K, M * N}));
    const Tensor x = d.put_as(in.at("x"), xs), w = d.put_as(in.at("w"), ws);
    const Tensor b = d.put_as(in.at("b"), {N}), dy = d.put_as(in.at("dy"), ys);
    const Tensor dx = d.put_as(in.at("dx0"), xs), dw = d.put_as(in.at("dw0"), ws);
    const Tensor db = d.put_as(in.at("db0"), {N}), y = d.put(FVec(M * N, -7.f), ys);
    be.linear_forward(x, w, bias ? b : Tensor(), layout, y);
    be.linear_backward(x, w, dy, layout, dx_mode == DxMode::skipped ? Tensor() : dx,
                       dx_mode == DxMode::accumulated, dw, bias ? db : Tensor(), !dw_written);
    return Values{
        {"y", d.values(y)}, {"dx", d.values(dx)}, {"dw", d.values(dw)}, {"db", d.values(db)}};
  };
  if (reference == Reference::analytic)
    c.reference = [=](const Values& in) {
      const Vec &x = in.at("x"), &w = in.at("w"), &dy = in.at("dy");
      Values want = ref_linear_grads(x, w, dy, layout, M, K, N);
      want["y"] = ref_linear(x, w, bias ? in.at("b") : Vec(), layout, M, K, N);
      if (dx_mode == DxMode::skipped) want["dx"] = in.at("dx0");
      if (!bias) want["db"] = Vec(static_cast<size_t>(N), 0.0);
      return want;
    };
  if (reference == Reference::finite_differences)
    c.reference = [=](const Values& in) {
      const Vec &x = in.at("x"), &w = in.at("w"), &dy = in.at("dy");
      const Vec b = bias ? in.at("b") : Vec();
      Values want;
      want["y"] = ref_linear(x, w, b, layout, M, K, N);
      want["dx"] =
          dx_mode == DxMode::skipped
              ? in.at("dx0")
              : fd_vjp(
                    x, [&](const Vec& v) { return ref_linear(v, w, b, layout, M, K, N); }, dy);
      want["dw"] = fd_vjp(
          w, [&](const Vec& v) { return ref_linear(x, v, b, layout, M, K, N); }, dy);
      want["db"] =
          bias ? fd_vjp(
                     b, [&](const Vec& v) { return ref_linear(x, w, v, layout, M, K, N); }, dy)
               : Vec(static_cast<size_t>(N), 0.0);
      return want;
    };
  c.checks.push_back({"y", Metric::elementwise, pr.fwd, pr.vs_cpu});
  if (dx_mode == DxMode::skipped)
    c.checks.push_back({"dx", Metric::exact, 0, 0});  // an empty dx leaves the buffer alone
  else
    c.checks.push_back(
        {"dx", Metric::normwise, pr.grad, pr.vs_cpu, dx_mode == DxMode::accumulated ? "dx0" : ""});
  // Written gradients are compared as they are: what dw0 and db0 held must be gone.
  const char* dw0 = dw_written ? "" : "dw0";
  c.checks.push_back({"dw", Metric::normwise, pr.grad, pr.vs_cpu, dw0});
  // Without a bias db is untouched: what it gained is exactly zero.
  if (bias)
    c.checks.push_back({"db", Metric::normwise, pr.grad, pr.vs_cpu, dw_written ? "" : "db0"});
  else
    c.checks.push_back({"db", Metric::exact, 0, 0, "db0"});
  return c;
}

}  // namespace

std::vector<OpCase> linear_cases() {
  std::vector<OpCase> cases;
  // Small: every combination, against finite differences.
  for (const Shape& xs : {Shape{7, 13}, Shape{2, 3, 13}})
    for (WeightLayout layout : {WeightLayout::out_in, WeightLayout::in_out})
      for (bool bias : {false, true})
        for (DxMode dx : {DxMode::skipped, DxMode::overwritten, DxMode::accumulated})
          for (bool dw_written : {false, true})
            cases.push_back(linear_case(xs, 5, layout, bias, dx, dw_written, kF32,
                                        Reference::finite_differences));
  // No rows (an empty micro-batch): written gradients are zeros, added ones unchanged.
  for (const bool dw_written : {false, true})
    cases.push_back(linear_case({0, 13}, 5, WeightLayout::out_in, true, DxMode::overwritten,
                                dw_written, kF32, Reference::finite_differences));
  for (const Precision& pr : {kTf32, kBf16, kF16}) {
    cases.push_back(linear_case({2, 3, 13}, 5, WeightLayout::out_in, true, DxMode::accumulated,
                                false, pr, Reference::finite_differences));
    cases.push_back(linear_case({7, 13}, 5, WeightLayout::in_out, true, DxMode::overwritten, true,
                                pr, Reference::finite_differences));
  }
  // A GPU's tiles: odd shapes, a rank-3 input, a long K that cuBLASLt may split.
  struct Variant {
    WeightLayout layout;
    bool bias;
    DxMode dx;
    bool dw_written;
  };
  const Variant variants[] = {{WeightLayout::out_in, true, DxMode::accumulated, false},
                              {WeightLayout::in_out, false, DxMode::skipped, false},
                              {WeightLayout::in_out, true, DxMode::overwritten, true},
                              {WeightLayout::out_in, false, DxMode::overwritten, true}};
  const std::pair<Shape, int64_t> shapes[] = {
      {Shape{37, 75}, 129}, {Shape{3, 13, 129}, 75}, {Shape{37, 1031}, 67}};
  for (const Precision& pr : {kF32, kTf32, kBf16, kF16})
    for (const auto& [xs, N] : shapes)
      for (const Variant& v : variants)
        cases.push_back(
            linear_case(xs, N, v.layout, v.bias, v.dx, v.dw_written, pr, Reference::none));
  // A B over 4 MiB read as it lies runs on oneDNN's gemm kernel, not brgemm, in float32
  // (cpu_matmul_dnnl.cpp's prefers_gemm_kernel): the input gradient through a large weight, dx
  // written and added to; the weight gradient over a large input (A transposed), dW written and
  // added to.
  for (const DxMode dx : {DxMode::overwritten, DxMode::accumulated})
    cases.push_back(linear_case({9, 1000}, 1100, WeightLayout::out_in, false, dx, true,
                                kF32LongSums, Reference::analytic));
  for (const bool dw_written : {false, true})
    cases.push_back(linear_case({1100, 1000}, 9, WeightLayout::out_in, true, DxMode::overwritten,
                                dw_written, kF32LongSums, Reference::analytic));
  return cases;
}

}  // namespace brisk::testing
