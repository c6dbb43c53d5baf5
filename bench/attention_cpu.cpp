// Micro-benchmark: the CPU backend's attention, forward and backward, at the shapes of the CPU
// speed benchmark's causal rows (bench/cpu_speed.py: GPT-2 124M and SmolLM2-135M, batch 4 x 256).
// Prints milliseconds per pass and the GFLOP/s of the products attention runs (causal: about half
// of the full [T, T] score matrix), so its share of a training step can be read off.
// Build: cmake --build build --target bench_attention; run: build/bench_attention
#include <chrono>
#include <cstdio>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "core/rng.h"

namespace {
double seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Row {
  const char* name;
  int64_t batch, seq, heads, kv_heads, head_dim;
};
}  // namespace

int main() {
  using namespace brisk;
  const Row rows[] = {{"gpt2", 4, 256, 12, 12, 64}, {"smollm2", 4, 256, 9, 3, 64}};
  std::printf("%-8s %-5s %10s %10s %12s %12s\n", "model", "type", "fwd ms", "bwd ms", "fwd GFLOP/s",
              "bwd GFLOP/s");
  for (const Row& r : rows)
    for (DType products : {DType::f32, DType::bf16}) {
      auto be = make_cpu_backend();
      be->set_matmul_dtype(products);
      const int64_t B = r.batch, T = r.seq, H = r.heads, K = r.kv_heads, D = r.head_dim;
      const AttentionBuffers ab = attention_buffers(Device::cpu, B, H, T, D);
      std::mt19937 gen(1);
      std::normal_distribution<float> normal(0.0f, 1.0f);
      std::vector<float> qkv(B * T * (H + 2 * K) * D), out(B * T * H * D), dout(out.size()),
          dqkv(qkv.size()), stats(ab.stats.numel()), scratch(ab.scratch.numel());
      for (float& x : qkv) x = normal(gen);
      for (float& x : dout) x = normal(gen);
      const Tensor tq(qkv.data(), {B, T, (H + 2 * K) * D}, DType::f32);
      const Tensor to(out.data(), {B, T, H * D}, DType::f32);
      const Tensor tg(dout.data(), {B, T, H * D}, DType::f32);
      const Tensor tdq(dqkv.data(), tq.shape(), DType::f32);
      const Tensor ts(stats.data(), ab.stats, DType::f32),
          tsc(scratch.data(), ab.scratch, DType::f32);
      const float scale = 0.125f;
      const RngKey key{};
      auto fwd = [&] {
        be->attention_forward(tq, Tensor(), true, H, K, scale, 0.0f, key, ts, tsc, to);
      };
      auto bwd = [&] {
        be->attention_backward(tg, tq, to, ts, Tensor(), true, H, K, scale, 0.0f, key, tsc, tdq,
                               DType::f32, DType::f32);
      };
      fwd();
      bwd();
      const int reps = 20;
      double t = seconds();
      for (int i = 0; i < reps; ++i) fwd();
      const double f = (seconds() - t) / reps;
      t = seconds();
      for (int i = 0; i < reps; ++i) bwd();
      const double b = (seconds() - t) / reps;
      // Causal products: T (T + 1) / 2 scores per head, 2 D flops each, 2 products forward
      // (scores, weighted values), 4 backward.
      const double per_product = 2.0 * B * H * D * T * (T + 1) / 2.0;
      std::printf("%-8s %-5s %10.3f %10.3f %12.0f %12.0f\n", r.name, dtype_name(products), f * 1e3,
                  b * 1e3, 2 * per_product / f * 1e-9, 4 * per_product / b * 1e-9);
    }
  return 0;
}
