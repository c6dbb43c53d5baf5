// Micro-benchmark: the products of a linear's 4-bit weight (QLoRA's frozen base) on the CPU in a
// bf16 run, forward (x W^T) and the input gradient (dy W), at SmolLM2-135M's and Llama-2-7B's
// linear shapes, three ways side by side:
// - resident: the weight float32 in memory (LoRA without --load_in_4bit), the products as any;
// - staged: the 4-bit weight dequantized into a float32 slot before each product (a QLoRA run's
//   weight slots bring a block back for its forward pass and again for its backward pass);
// - fused: quantized_linear_forward/backward, the weight dequantized into the blocked layout the
//   kernel reads (on bf16 units), one weight at a time;
// - plain: the same with BRISK_BLOCKED_4BIT_WEIGHTS=0, the weight dequantized into plain bf16 rows
//   (the path where oneDNN's kernel wants a layout brisk's packer does not write).
// The milliseconds are the median of 7 repetitions of forward + input gradient; "buffer" is what
// each way keeps beside the 4-bit state: the float32 weight (resident, or one slot's share), or
// the one buffer every 4-bit weight is dequantized into in turn.
// Build: cmake --build build --target bench_quant4; run: build/bench_quant4
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "core/memory_plan.h"
#include "core/quant4.h"
#include "core/switches.h"

namespace {
using namespace brisk;

double seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

template <typename F>
double median_ms(F f) {
  f();  // the shapes' first call prepares oneDNN's kernels
  std::vector<double> t;
  for (int r = 0; r < 7; ++r) {
    const double t0 = seconds();
    f();
    t.push_back((seconds() - t0) * 1e3);
  }
  std::sort(t.begin(), t.end());
  return t[3];
}

struct Shape3 {
  const char* name;
  int64_t m, n, k;  // tokens, out, in
};

void plan(Backend& be, int64_t M, int64_t N, int64_t K, MemoryPlan& plan, BufferBinder& binder) {
  MatmulOperands operands(std::max({M * K, N * K, M * N}));
  operands.quantized = N * K;
  operands.quantized_blocked = cpu_blocked_elements(N, K);
  be.plan_workspace(plan, binder, operands);
  plan.finalize();
}

void run(Backend& be, Backend& plain_be, const Shape3& s) {
  const int64_t M = s.m, N = s.n, K = s.k;
  std::mt19937 gen(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> w(static_cast<size_t>(N * K)), x(static_cast<size_t>(M * K)),
      dy(static_cast<size_t>(M * N)), y(static_cast<size_t>(M * N)), dx(static_cast<size_t>(M * K));
  for (float& v : w) v = 0.02f * normal(gen);
  for (float& v : x) v = normal(gen);
  for (float& v : dy) v = normal(gen);
  const Quant4Host q = quantize_4bit(w.data(), {N * K, 64, Quant4Type::nf4, false}, "w");
  MemoryPlan plan_a, plan_b;
  BufferBinder binder_a, binder_b;
  plan(be, M, N, K, plan_a, binder_a);
  plan(plain_be, M, N, K, plan_b, binder_b);
  Arena arena_a(plan_a, be.device_memory(), be.staging_memory()),
      arena_b(plan_b, plain_be.device_memory(), plain_be.staging_memory());
  binder_a.bind(arena_a);
  binder_b.bind(arena_b);
  auto t = [](auto& v, Shape shape, DType dtype = DType::f32) {
    return Tensor(const_cast<void*>(static_cast<const void*>(v.data())), shape, dtype);
  };
  Backend::Quant4Matrix matrix;
  matrix.cols = K;
  Backend::Quant4Tensor part;
  part.layout = q.layout;
  part.packed = t(q.packed, Shape{q.layout.packed_bytes()}, DType::u8);
  part.absmax = t(q.absmax, Shape{q.layout.blocks()});
  matrix.parts.push_back({part, DType::f32});
  const Tensor tw = t(w, {N, K}), tx = t(x, {M, K}), tdy = t(dy, {M, N}), ty = t(y, {M, N}),
               tdx = t(dx, {M, K});
  const double resident = median_ms([&] {
    be.linear_forward(tx, tw, Tensor(), WeightLayout::out_in, ty);
    be.linear_backward(tx, tw, tdy, WeightLayout::out_in, tdx, false, Tensor(), Tensor(), false);
  });
  const double staged = median_ms([&] {
    // Each pass brings its block's weights back into the slot: forward's, then backward's.
    be.dequantize_4bit(part, Tensor(w.data(), Shape{N * K}, DType::f32));
    be.linear_forward(tx, tw, Tensor(), WeightLayout::out_in, ty);
    be.dequantize_4bit(part, Tensor(w.data(), Shape{N * K}, DType::f32));
    be.linear_backward(tx, tw, tdy, WeightLayout::out_in, tdx, false, Tensor(), Tensor(), false);
  });
  const double fused = median_ms([&] {
    be.quantized_linear_forward(tx, matrix, Tensor(), ty);
    be.quantized_linear_backward(tdy, matrix, tdx, false);
  });
  const double plain = median_ms([&] {
    plain_be.quantized_linear_forward(tx, matrix, Tensor(), ty);
    plain_be.quantized_linear_backward(tdy, matrix, tdx, false);
  });
  const double gflop = 4.0 * M * N * K * 1e-9;
  const double f32_mib = N * K * 4.0 / (1 << 20);
  const double buffer_mib = static_cast<double>(be.dequantized_buffer().bytes()) / (1 << 20);
  std::printf(
      "| %-22s | %5lld x %5lld x %5lld | %8.2f | %8.2f | %8.2f | %8.2f | %5.2fx | %7.1f | %7.1f "
      "| %7.1f |\n",
      s.name, static_cast<long long>(M), static_cast<long long>(N), static_cast<long long>(K),
      resident, staged, fused, plain, staged / fused, gflop / fused * 1e3, f32_mib, buffer_mib);
}
}  // namespace

int main() {
  auto be = make_cpu_backend();
  Switches plain_rows;
  plain_rows.blocked_4bit_weights = false;
  auto plain_be = make_cpu_backend(plain_rows);
  for (Backend* b : {be.get(), plain_be.get()}) b->set_matmul_dtype(DType::bf16);
  std::printf(
      "| linear | tokens x out x in | resident ms | staged ms | fused ms | plain ms | staged/fused "
      "| fused GFLOP/s | float32 weight MiB | dequantization buffer MiB "
      "|\n|---|---|---|---|---|---|---|---|---|---|\n");
  const Shape3 shapes[] = {
      {"SmolLM2-135M q_proj", 2048, 576, 576},     {"SmolLM2-135M gate_proj", 2048, 1536, 576},
      {"SmolLM2-135M down_proj", 2048, 576, 1536}, {"Llama-2-7B q_proj", 512, 4096, 4096},
      {"Llama-2-7B gate_proj", 512, 11008, 4096},  {"Llama-2-7B down_proj", 512, 4096, 11008}};
  for (const Shape3& s : shapes) run(*be, *plain_be, s);
  return 0;
}
