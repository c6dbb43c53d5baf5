// Micro-benchmark: the residual add before a norm (Backend::dropout_add_norm, one pass over the
// rows) against dropout_add then the norm (two passes), on the CPU or a GPU, at the block shapes
// of the benchmarks' runs (tokens x hidden), LayerNorm and RMSNorm, dropout 0 and 0.1, float32
// stream and norm output. Prints milliseconds per call, the ratio, and the fused pass's bytes
// over its time (x and r read, sum and y written).
// Build: cmake --build build --target bench_residual_norm; run: build/bench_residual_norm [cuda]
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/memory_plan.h"

namespace {
using namespace brisk;

double seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Buffers {
  MemoryPlan plan;
  BufferBinder binder;
  std::unique_ptr<Arena> arena;
  Tensor x, r, sum, y, gamma, beta, mean, rstd;
};

void plan(Backend& be, Buffers& b, int64_t rows, int64_t C) {
  const auto add = [&](Tensor* t, const char* name, Shape shape) {
    b.binder.declare(b.plan, t, name, Category::temporaries, DType::f32, shape);
  };
  for (auto [t, name] : {std::pair{&b.x, "x"}, {&b.r, "r"}, {&b.sum, "sum"}, {&b.y, "y"}})
    add(t, name, {rows, C});
  add(&b.gamma, "gamma", {C});
  add(&b.beta, "beta", {C});
  add(&b.mean, "mean", {rows});
  add(&b.rstd, "rstd", {rows});
  b.plan.finalize();
  b.arena = std::make_unique<Arena>(b.plan, be.device_memory(), be.staging_memory());
  b.binder.bind(*b.arena);
  std::mt19937 gen(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (const Tensor* t : {&b.x, &b.r, &b.gamma, &b.beta}) {
    std::vector<float> v(static_cast<size_t>(t->numel()));
    for (float& e : v) e = normal(gen);
    be.upload(Tensor(v.data(), t->shape(), DType::f32, Device::cpu), *t);
  }
  be.synchronize();
}

// Milliseconds per call of `pass`, over enough calls for ~0.1 s after two warm-ups.
double timed_ms(Backend& be, const std::function<void()>& pass) {
  pass();
  pass();
  be.synchronize();
  int reps = 0;
  const double t = seconds();
  do {
    pass();
    ++reps;
    if (reps % 8 == 0) be.synchronize();
  } while (reps % 8 != 0 || seconds() - t < 0.1);
  be.synchronize();
  return (seconds() - t) * 1e3 / reps;
}
}  // namespace

int main(int argc, char** argv) {
  const bool gpu = argc > 1 && std::strcmp(argv[1], "cuda") == 0;
  std::unique_ptr<Backend> be = make_backend(gpu ? Device::cuda : Device::cpu, read_switches());
  struct Shape2 {
    const char* what;
    int64_t rows, C;
  };
  // BERT-base MLM b8 x 128, GPT-2 b4 x 1024 (CPU); bert-large b32 x 512, GPT-2 b32 x 1024 (GPU).
  const std::vector<Shape2> shapes =
      gpu ? std::vector<Shape2>{{"bert-large b32x512", 32 * 512, 1024},
                                {"gpt2 b32x1024", 32 * 1024, 768}}
          : std::vector<Shape2>{{"bert-base b8x128", 8 * 128, 768},
                                {"gpt2 b4x1024", 4 * 1024, 768}};
  std::printf("%s backend\n", be->name().c_str());
  std::printf("%-20s %-9s %5s %13s %10s %8s %10s\n", "shape", "norm", "p", "separate ms",
              "fused ms", "ratio", "fused GB/s");
  for (const Shape2& s : shapes) {
    Buffers b;
    plan(*be, b, s.rows, s.C);
    for (bool rms : {false, true})
      for (float p : {0.0f, 0.1f}) {
        const Backend::Norm n{b.gamma, rms ? Tensor() : b.beta, 1e-5f,
                              rms,     rms ? Tensor() : b.mean, b.rstd};
        const RngKey key{7, 1, 2};
        // Taking turns, three times each: the machine's speed drifts.
        double separate = 0, fused = 0;
        for (int turn = 0; turn < 3; ++turn) {
          separate += timed_ms(*be,
                               [&] {
                                 be->dropout_add(b.x, b.r, p, key, b.sum);
                                 be->norm_forward(b.sum, n, b.y);
                               }) /
                      3;
          fused +=
              timed_ms(*be, [&] { be->dropout_add_norm(b.x, b.r, p, key, b.sum, n, b.y); }) / 3;
        }
        const double bytes = 4.0 * 4.0 * static_cast<double>(s.rows * s.C);
        std::printf("%-20s %-9s %5.2f %13.3f %10.3f %7.2fx %10.1f\n", s.what,
                    rms ? "rmsnorm" : "layernorm", p, separate, fused, separate / fused,
                    bytes / (fused * 1e-3) / 1e9);
      }
  }
  return 0;
}
