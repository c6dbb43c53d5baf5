// Micro-benchmark: the CPU backend's attention, forward and backward, at the shapes of the CPU
// speed benchmark's causal rows (bench/cpu_speed.py: GPT-2 124M and SmolLM2-135M, batch 4 x 256).
// Prints milliseconds per pass and the GFLOP/s of the products attention runs (causal: about half
// of the full [T, T] score matrix), so its share of a training step can be read off. Then a
// right-padded BERT-base batch (16 x 128, rows keeping 16 to 128 keys, a fine-tuning set's
// sentences): its mask alone against the mask with its rows' key counts (KeyMask::lengths), which
// let the CPU skip the padded keys.
// Build: cmake --build build --target bench_attention; run: build/bench_attention
#include <chrono>
#include <cstdio>
#include <functional>
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

// Seconds per call of f, over 20 calls after one.
double timed(const std::function<void()>& f) {
  f();
  const int reps = 20;
  const double t = seconds();
  for (int i = 0; i < reps; ++i) f();
  return (seconds() - t) / reps;
}

// One attention problem's buffers on the CPU, random q, k, v and output gradient.
struct Problem {
  std::vector<float> qkv, out, dout, dqkv, stats, scratch;
  brisk::Tensor tq, to, tg, tdq, ts, tsc;

  explicit Problem(const Row& r) {
    using namespace brisk;
    const int64_t B = r.batch, T = r.seq, H = r.heads, K = r.kv_heads, D = r.head_dim;
    const AttentionBuffers ab = attention_buffers(Device::cpu, B, H, T, D);
    std::mt19937 gen(1);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    qkv.resize(B * T * (H + 2 * K) * D), out.resize(B * T * H * D), dout.resize(out.size());
    dqkv.resize(qkv.size()), stats.resize(ab.stats.numel()), scratch.resize(ab.scratch.numel());
    for (float& x : qkv) x = normal(gen);
    for (float& x : dout) x = normal(gen);
    tq = Tensor(qkv.data(), {B, T, (H + 2 * K) * D}, DType::f32);
    to = Tensor(out.data(), {B, T, H * D}, DType::f32);
    tg = Tensor(dout.data(), {B, T, H * D}, DType::f32);
    tdq = Tensor(dqkv.data(), tq.shape(), DType::f32);
    ts = Tensor(stats.data(), ab.stats, DType::f32);
    tsc = Tensor(scratch.data(), ab.scratch, DType::f32);
  }
  // Forward and backward seconds per pass.
  std::pair<double, double> time(brisk::Backend& be, const Row& r, const brisk::KeyMask& mask,
                                 bool causal) {
    const int H = static_cast<int>(r.heads), K = static_cast<int>(r.kv_heads);
    const brisk::RngKey key{};
    const double f = timed(
        [&] { be.attention_forward(tq, mask, causal, H, K, 0.125f, 0.0f, key, ts, tsc, to); });
    const double b = timed([&] {
      be.attention_backward(tg, tq, to, ts, mask, causal, H, K, 0.125f, 0.0f, key, tsc, tdq,
                            brisk::DType::f32, brisk::DType::f32);
    });
    return {f, b};
  }
};

void causal_rows() {
  using namespace brisk;
  const Row rows[] = {{"gpt2", 4, 256, 12, 12, 64}, {"smollm2", 4, 256, 9, 3, 64}};
  std::printf("%-8s %-5s %10s %10s %12s %12s\n", "model", "type", "fwd ms", "bwd ms", "fwd GFLOP/s",
              "bwd GFLOP/s");
  for (const Row& r : rows)
    for (DType products : {DType::f32, DType::bf16}) {
      auto be = make_cpu_backend(read_switches());
      be->set_matmul_dtype(products);
      Problem p(r);
      const auto [f, b] = p.time(*be, r, KeyMask(), true);
      // Causal products: T (T + 1) / 2 scores per head, 2 D flops each, 2 products forward
      // (scores, weighted values), 4 backward.
      const double per_product = 2.0 * r.batch * r.heads * r.head_dim * r.seq * (r.seq + 1) / 2.0;
      std::printf("%-8s %-5s %10.3f %10.3f %12.0f %12.0f\n", r.name, dtype_name(products), f * 1e3,
                  b * 1e3, 2 * per_product / f * 1e-9, 4 * per_product / b * 1e-9);
    }
}

void padded_rows() {
  using namespace brisk;
  const Row r{"bert", 16, 128, 12, 12, 64};
  std::vector<int32_t> mask(r.batch * r.seq, 0), lengths(r.batch);
  int64_t kept = 0;
  for (int64_t b = 0; b < r.batch; ++b) {
    lengths[b] = static_cast<int32_t>(16 + b * (r.seq - 16) / (r.batch - 1));
    std::fill_n(mask.begin() + b * r.seq, lengths[b], 1);
    kept += lengths[b];
  }
  const Tensor keep(mask.data(), {r.batch, r.seq}, DType::i32);
  const Tensor counts(lengths.data(), {r.batch}, DType::i32);
  std::printf("\nbert-base %ld x %ld, right-padded (%.0f%% of the keys kept)\n", r.batch, r.seq,
              100.0 * kept / (r.batch * r.seq));
  std::printf("%-8s %-16s %10s %10s\n", "type", "mask", "fwd ms", "bwd ms");
  for (DType products : {DType::f32, DType::bf16}) {
    auto be = make_cpu_backend(read_switches());
    be->set_matmul_dtype(products);
    Problem p(r);
    for (const bool with_counts : {false, true}) {
      const KeyMask m = with_counts ? KeyMask(keep, counts) : KeyMask(keep);
      const auto [f, b] = p.time(*be, r, m, false);
      std::printf("%-8s %-16s %10.3f %10.3f\n", dtype_name(products),
                  with_counts ? "with key counts" : "alone", f * 1e3, b * 1e3);
    }
  }
}
}  // namespace

int main() {
  causal_rows();
  padded_rows();
  return 0;
}
