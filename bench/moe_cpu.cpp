// Micro-benchmark: one mixture-of-experts layer of the CPU speed benchmark's `mixtral` row
// (bench/cpu_speed.py: 512 wide, 8 experts of 1024, top 2, batch 4 x 256 tokens), forward and
// backward, split into its phases (models/moe_layer.h's set_moe_phase_hook: router, dispatch,
// experts, combine), beside the dense SwiGLU MLP of the same active size (2048: the
// `mixtral_dense` row's) run by the same products. float32, as brisk trains mixtures of experts.
// Build: cmake --build build --target bench_moe; run: build/bench_moe
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/memory_plan.h"
#include "models/moe_layer.h"

namespace {
using namespace brisk;

double seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

constexpr int64_t kTokens = 4 * 256, kHidden = 512, kInner = 1024, kExperts = 8, kTopK = 2;
constexpr int64_t kDenseInner = kTopK * kInner;
constexpr int kReps = 10;

struct Buffers {
  MemoryPlan plan;
  BufferBinder binder;
  std::unique_ptr<Arena> arena;
  MoeSaved saved;
  MoeScratch scratch;
  MoeWeights w, g;
  Tensor x, y, dy, dx;
  Tensor fc_w, out_w, d_fc_w, d_out_w, fc, act, d_act, d_fc;  // the dense MLP's
};

void declare(Buffers& b, Tensor* t, const std::string& name, Shape shape,
             DType dtype = DType::f32) {
  b.binder.declare(b.plan, t, name, Category::temporaries, dtype, shape);
}

void plan(Backend& be, Buffers& b, const MoeShape& s) {
  const int64_t N = s.tokens, C = s.hidden, F = s.inner, E = s.experts, D = kDenseInner;
  const auto add = [&](Tensor* t, const std::string& name, DType dtype, Shape shape) {
    declare(b, t, name, shape, dtype);
  };
  declare_moe_saved(s, b.saved, add);
  declare_moe_scratch(s, b.scratch, add);
  for (MoeWeights* w : {&b.w, &b.g}) {
    const std::string p = w == &b.w ? "w." : "g.";
    declare(b, &w->router, p + "router", {E, C});
    declare(b, &w->gate_up, p + "gate_up", {E, 2 * F, C});
    declare(b, &w->down, p + "down", {E, C, F});
  }
  for (Tensor* t : {&b.x, &b.y, &b.dy, &b.dx})
    declare(b, t, "io" + std::to_string(t - &b.x), {N, C});
  declare(b, &b.fc_w, "dense.fc_w", {2 * D, C});
  declare(b, &b.d_fc_w, "dense.d_fc_w", {2 * D, C});
  declare(b, &b.out_w, "dense.out_w", {C, D});
  declare(b, &b.d_out_w, "dense.d_out_w", {C, D});
  declare(b, &b.fc, "dense.fc", {N, 2 * D});
  declare(b, &b.d_fc, "dense.d_fc", {N, 2 * D});
  declare(b, &b.act, "dense.act", {N, D});
  declare(b, &b.d_act, "dense.d_act", {N, D});
  be.plan_workspace(b.plan, b.binder, MatmulOperands(std::max(N * 2 * D, E * 2 * F * C)));
  b.plan.finalize();
  b.arena = std::make_unique<Arena>(b.plan, be.device_memory(), be.staging_memory());
  b.binder.bind(*b.arena);
}

void fill(const Tensor& t, std::mt19937& gen, float scale) {
  std::normal_distribution<float> normal(0.0f, scale);
  for (int64_t i = 0; i < t.numel(); ++i) t.f32()[i] = normal(gen);
}

// Milliseconds per call of each phase of `pass`, over kReps calls after one warm-up.
std::map<std::string, double> timed(const std::function<void()>& pass) {
  std::map<std::string, double> ms;
  double last = 0;
  set_moe_phase_hook([&](const char* phase) {
    const double now = seconds();
    ms[phase] += (now - last) * 1e3 / kReps;
    last = now;
  });
  pass();
  ms.clear();
  for (int i = 0; i < kReps; ++i) {
    last = seconds();
    pass();
  }
  set_moe_phase_hook(nullptr);
  return ms;
}

double timed_ms(const std::function<void()>& pass) {
  pass();
  const double t = seconds();
  for (int i = 0; i < kReps; ++i) pass();
  return (seconds() - t) * 1e3 / kReps;
}
}  // namespace

int main() {
  auto be = make_cpu_backend(read_switches());
  const MoeShape s{kTokens, kHidden, kInner, kExperts, kTopK, true};
  Buffers b;
  plan(*be, b, s);
  std::mt19937 gen(1);
  for (const Tensor& t : {b.x, b.dy}) fill(t, gen, 1.0f);
  for (const Tensor& t : {b.w.router, b.w.gate_up, b.w.down, b.fc_w, b.out_w}) fill(t, gen, 0.03f);
  std::vector<int32_t> counts;
  const auto fwd = timed([&] { moe_forward(*be, s, b.w, b.x, b.saved, b.scratch, b.y, counts); });
  const auto bwd = timed([&] {
    moe_backward(*be, s, b.w, b.g, b.x, b.saved, b.scratch, counts, b.dy, Tensor(), b.dx, false);
  });
  const WeightLayout out_in = WeightLayout::out_in;
  const double dense_fwd = timed_ms([&] {
    be->linear_forward(b.x, b.fc_w, Tensor(), out_in, b.fc);
    be->swiglu_forward(b.fc, b.act);
    be->linear_forward(b.act, b.out_w, Tensor(), out_in, b.y);
  });
  const double dense_bwd = timed_ms([&] {
    be->linear_backward(b.act, b.out_w, b.dy, out_in, b.d_act, false, b.d_out_w, Tensor(), false);
    be->swiglu_backward(b.fc, b.d_act, b.d_fc, DType::f32);
    be->linear_backward(b.x, b.fc_w, b.d_fc, out_in, b.dx, false, b.d_fc_w, Tensor(), false);
  });
  double moe_fwd = 0, moe_bwd = 0;
  for (const auto& [phase, ms] : fwd) moe_fwd += ms;
  for (const auto& [phase, ms] : bwd) moe_bwd += ms;
  const double moe = moe_fwd + moe_bwd;
  std::printf("one MoE layer: %lld tokens, %lld wide, %lld experts of %lld, top %lld (float32)\n",
              static_cast<long long>(kTokens), static_cast<long long>(kHidden),
              static_cast<long long>(kExperts), static_cast<long long>(kInner),
              static_cast<long long>(kTopK));
  std::printf("%-22s %10s %10s %10s\n", "phase", "fwd ms", "bwd ms", "share");
  for (const char* phase : {"router", "dispatch", "experts", "combine"})
    std::printf("%-22s %10.2f %10.2f %9.1f%%\n", phase, fwd.at(phase), bwd.at(phase),
                100.0 * (fwd.at(phase) + bwd.at(phase)) / moe);
  std::printf("%-22s %10.2f %10.2f %9.1f%%\n", "MoE layer", moe_fwd, moe_bwd, 100.0);
  std::printf("%-22s %10.2f %10.2f %9.1f%%\n", "dense MLP of 2048", dense_fwd, dense_bwd,
              100.0 * (dense_fwd + dense_bwd) / moe);
  std::printf("MoE layer / dense MLP of its active size: %.2fx\n", moe / (dense_fwd + dense_bwd));
  return 0;
}
