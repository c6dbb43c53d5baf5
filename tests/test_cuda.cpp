// The CUDA backend against the CPU backend, which is the reference (itself checked against fp64
// and finite differences in test_ops.cpp and against PyTorch in test_models.cpp): every op on
// random inputs of odd sizes, whole models, the trainer's equivalences (gradient accumulation,
// checkpointing, the fp16 overflow skip, resume) and the device memory anatomy.
//
// Every test starts with REQUIRE_GPU(): where no usable GPU is present (or brisk was built
// without CUDA) it is skipped and says why.
//
// Tolerances, and why:
// - float32 ops: 1e-5, elementwise relative to max(1, |want|) for outputs of O(1) and norm-wise
//   for sums over many terms. Both backends compute in float32 and differ only in summation order
//   and in the last ulps of exp/erf/tanh, which is 1e-7 to 1e-6 at these sizes.
// - Bit-exact where both backends do the same float32 operations in the same order: casts and
//   rounding, copies, fills, adds, embedding forward, position-gradient sums, first-token pooling.
// - TF32 products: 5e-3, TF32 keeps 10 of float32's 23 mantissa bits.
// - bf16/fp16 products: operands are rounded to the 16-bit type beforehand, so every product is
//   exact in float32 on both sides and only float32 summation order differs: 1e-4.
// - Whole models: 1e-4 in float32 (as against PyTorch); a few percent in bf16, where both sides
//   round activations and matmul operands to 8 mantissa bits at different places.
// - Optimizers: float32 per element in the same order on both sides, 1e-6 (AdamW, SGD; 1e-5 for
//   8-bit AdamW's weights); Adafactor 1e-5, its means and RMS being double sums in another order;
//   8-bit codes equal in 99.9% of positions (a moment on the midpoint between two codes may
//   round either way); stochastic rounding bit-exact (the same random words, integer arithmetic).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#if defined(BRISK_HAVE_CUDA)
#include <cuda_runtime.h>
#endif

#include "backend/activation.h"
#include "backend/backend.h"
#include "backend/rope.h"
#include "core/rng.h"
#include "data/dataset.h"
#include "optim/optimizer.h"
#include "optim/quantization.h"
#include "optim/step_control.h"
#include "test_support.h"
#include "train/assembly.h"
#include "train/trainer.h"
#include "trainer_support.h"

namespace brisk::testing {
namespace {

// =============================================================================================
// Helpers
// =============================================================================================

// The first statement of every test here: skips the test, saying why, where no GPU can run it
// (none present, no driver, or a brisk built without CUDA).
#define REQUIRE_GPU()                                                                  \
  do {                                                                                 \
    std::string why_no_gpu;                                                            \
    if (!cuda_available(&why_no_gpu)) GTEST_SKIP() << "no usable GPU: " << why_no_gpu; \
  } while (false)

// The backend under test, as the model and trainer tests name it.
std::unique_ptr<Backend> gpu_backend() {
  return make_cuda_backend();
}
constexpr Device kGpu = Device::cuda;
const char* const kGpuOption = "cuda";  // TrainOptions::device

using FVec = std::vector<float>;
using IVec = std::vector<int32_t>;

FVec randn(int64_t n, std::mt19937& rng, float scale = 1.f, float shift = 0.f) {
  std::normal_distribution<float> dist(0.f, 1.f);
  FVec v(static_cast<size_t>(n));
  for (float& x : v) x = shift + scale * dist(rng);
  return v;
}

// n ints uniform in [lo, hi).
IVec randint(int64_t n, int32_t lo, int32_t hi, std::mt19937& rng) {
  std::uniform_int_distribution<int32_t> dist(lo, hi - 1);
  IVec v(static_cast<size_t>(n));
  for (int32_t& x : v) x = dist(rng);
  return v;
}

// v rounded to `dtype` by the CPU backend's round_to: values both backends hold exactly in any
// of the 16-bit operand types.
FVec rounded(FVec v, DType dtype) {
  if (dtype != DType::f32)
    make_cpu_backend()->round_to(
        dtype, Tensor(v.data(), Shape{static_cast<int64_t>(v.size())}, DType::f32));
  return v;
}

// Element by element: |got - want| <= tol * max(1, |want|); names the worst element.
::testing::AssertionResult near(const FVec& got, const FVec& want, double tol) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << "size " << got.size() << " vs " << want.size();
  double worst = 0;  // in units of the allowance
  size_t at = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(got[i]) || std::isnan(want[i])) {
      if (std::isnan(got[i]) && std::isnan(want[i])) continue;
      return ::testing::AssertionFailure()
             << "element " << i << ": got " << got[i] << ", want " << want[i];
    }
    if (got[i] == want[i]) continue;  // equal infinities included
    const double d =
        std::abs(double(got[i]) - want[i]) / (tol * std::max(1.0, std::abs(double(want[i]))));
    if (!(d <= worst)) worst = d, at = i;
  }
  if (worst <= 1.0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "element " << at << " of " << got.size() << ": got " << got[at] << ", want " << want[at]
         << ", error " << worst * tol << " relative to max(1, |want|) > " << tol;
}

// Norm-wise: ||got - want|| / max(||want||, floor) <= tol; names the worst element.
::testing::AssertionResult rel_near(const FVec& got, const FVec& want, double tol,
                                    double floor = 1e-30) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << "size " << got.size() << " vs " << want.size();
  for (size_t i = 0; i < got.size(); ++i)
    if (!std::isfinite(got[i]) || !std::isfinite(want[i]))
      return ::testing::AssertionFailure()
             << "element " << i << ": got " << got[i] << ", want " << want[i];
  const double e = rel_error(got.data(), want.data(), static_cast<int64_t>(got.size()), floor);
  if (e <= tol) return ::testing::AssertionSuccess();
  size_t at = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (std::abs(got[i] - want[i]) > std::abs(got[at] - want[at])) at = i;
  return ::testing::AssertionFailure()
         << "relative error " << e << " > " << tol << "; worst element " << at << " of "
         << got.size() << ": got " << got[at] << ", want " << want[at];
}

// Bit for bit.
template <typename T>
::testing::AssertionResult identical(const std::vector<T>& got, const std::vector<T>& want) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << "size " << got.size() << " vs " << want.size();
  size_t differ = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0 && differ++ == 0) first = i;
  if (differ == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << differ << " of " << got.size() << " elements differ; first at " << first << ": got "
         << +got[first] << ", want " << +want[first];
}

template <typename T>
constexpr DType dtype_of() {
  if constexpr (std::is_same_v<T, float>) return DType::f32;
  if constexpr (std::is_same_v<T, double>) return DType::f64;
  if constexpr (std::is_same_v<T, int32_t>) return DType::i32;
  if constexpr (std::is_same_v<T, int64_t>) return DType::i64;
  return DType::u16;  // bf16 and f16 bit patterns: the caller names the type
}

// Buffers in a backend's memory (GPU memory for the CUDA backend, host memory for the CPU), each
// in its own small arena so that a test makes them as it goes, with host data in and out in one
// call each. The same test code thus runs on both backends. Must not outlive the backend, whose
// memory resources free the arenas, nor be outlived by the backend's use of its workspace.
class DeviceBuffers {
 public:
  explicit DeviceBuffers(Backend& be) : be_(be) {}

  // A buffer for an op to write; inputs, zeros included, go in with put().
  Tensor alloc(Shape shape, DType dtype = DType::f32) {
    Block& b = blocks_.emplace_back();  // a deque: arenas keep referring to their plans
    b.plan.add("buffer", Category::temporaries, dtype, shape);
    b.plan.finalize();
    b.arena = std::make_unique<Arena>(b.plan, be_.device_memory(), be_.staging_memory());
    settle();
    return b.arena->tensor(0);
  }
  template <typename T>
  Tensor put(const std::vector<T>& values, Shape shape, DType dtype = dtype_of<T>()) {
    const Tensor t = alloc(shape, dtype);
    set(t, values);
    return t;
  }
  // t = values (t in this backend's memory).
  template <typename T>
  void set(const Tensor& t, const std::vector<T>& values) {
    BRISK_CHECK(values.size() * sizeof(T) == t.bytes(), "DeviceBuffers::set: ", values.size(),
                " values for ", t.bytes(), " bytes");
    be_.upload(Tensor(const_cast<T*>(values.data()), t.shape(), t.dtype(), Device::cpu), t);
  }
  // A host copy of t (waits for the device).
  template <typename T = float>
  std::vector<T> get(const Tensor& t) {
    std::vector<T> v(t.bytes() / sizeof(T));
    be_.download(t, Tensor(v.data(), t.shape(), t.dtype(), Device::cpu));
    return v;
  }
  // The backend's own matmul buffers for operands of up to max_operand elements (after
  // set_matmul_dtype, as the trainer does).
  void workspace(int64_t max_operand) {
    Block& b = blocks_.emplace_back();
    BufferBinder binder;
    be_.plan_workspace(b.plan, binder, max_operand);
    b.plan.finalize();
    b.arena = std::make_unique<Arena>(b.plan, be_.device_memory(), be_.staging_memory());
    settle();
    binder.bind(*b.arena);
  }

 private:
  // The CUDA backend's memory resource zeroes a new block with cudaMemset, on the legacy default
  // stream, which the backend's non-blocking stream does not wait for: an upload right after
  // could land before the zeros. Waiting here keeps the op tests about the ops; the model and
  // trainer tests allocate as brisk does.
  void settle() {
#if defined(BRISK_HAVE_CUDA)
    if (be_.device() == Device::cuda) cudaDeviceSynchronize();
#endif
  }

  struct Block {
    MemoryPlan plan;
    std::unique_ptr<Arena> arena;
  };
  Backend& be_;
  std::deque<Block> blocks_;
};

// =============================================================================================
// Ops: the CUDA backend against the CPU backend on the same inputs
// =============================================================================================

// ---- linear layers ----

enum class DxMode { skipped, overwritten, accumulated };

struct LinearInputs {
  Shape xs, ws, ys;
  FVec x, w, b, dy, dx0, dw0, db0;  // *0: what dx, dw and db hold before the backward pass
};

// x [..., K] and N outputs; x, w and dy rounded to `operands`.
LinearInputs linear_inputs(Shape xs, int64_t N, WeightLayout layout, DType operands,
                           std::mt19937& rng) {
  const int64_t K = xs[xs.rank() - 1], M = xs.numel() / K;
  LinearInputs in;
  in.xs = xs;
  in.ws = layout == WeightLayout::out_in ? Shape{N, K} : Shape{K, N};
  for (int i = 0; i + 1 < xs.rank(); ++i) in.ys.push_back(xs[i]);
  in.ys.push_back(N);
  in.x = rounded(randn(M * K, rng), operands);
  in.w = rounded(randn(N * K, rng, 0.3f), operands);
  in.b = randn(N, rng);
  in.dy = rounded(randn(M * N, rng), operands);
  in.dx0 = randn(M * K, rng);
  in.dw0 = randn(N * K, rng);
  in.db0 = randn(N, rng);
  return in;
}

struct LinearOutputs {
  FVec y, dx, dw, db;
};

LinearOutputs run_linear(Backend& be, DType matmul, bool tf32, const LinearInputs& in,
                         WeightLayout layout, bool bias, DxMode dx_mode) {
  be.set_matmul_dtype(matmul);
  be.set_tf32(tf32);
  DeviceBuffers d(be);
  d.workspace(std::max({in.x.size(), in.w.size(), in.dy.size()}));
  const int64_t N = in.ys[in.ys.rank() - 1];
  const Tensor x = d.put(in.x, in.xs), w = d.put(in.w, in.ws), b = d.put(in.b, {N});
  const Tensor dy = d.put(in.dy, in.ys), dx = d.put(in.dx0, in.xs), dw = d.put(in.dw0, in.ws);
  const Tensor db = d.put(in.db0, {N});
  const Tensor y = d.put(FVec(in.dy.size(), -7.f), in.ys);  // overwritten
  be.linear_forward(x, w, bias ? b : Tensor(), layout, y);
  be.linear_backward(x, w, dy, layout, dx_mode == DxMode::skipped ? Tensor() : dx,
                     dx_mode == DxMode::accumulated, dw, bias ? db : Tensor());
  return {d.get(y), d.get(dx), d.get(dw), d.get(db)};
}

// Every combination of layout, bias and dx handling on three odd shapes: a rank-3 input, and a
// long K that cuBLASLt may split.
void check_linear(DType operands, bool tf32, double tol) {
  auto cpu = make_cpu_backend();
  auto gpu = gpu_backend();
  // The CPU multiplies fp16 values in float32, which is exact for them (products of 11-bit
  // significands fit in 24 bits); bf16 goes to oneDNN where the CPU has it, exact as well.
  const DType cpu_matmul = operands == DType::bf16 ? DType::bf16 : DType::f32;
  std::mt19937 rng(100 + static_cast<int>(operands) + (tf32 ? 10 : 0));
  const std::pair<Shape, int64_t> shapes[] = {
      {Shape{37, 75}, 129}, {Shape{3, 13, 129}, 75}, {Shape{37, 1031}, 67}};
  for (const auto& [xs, N] : shapes)
    for (WeightLayout layout : {WeightLayout::out_in, WeightLayout::in_out})
      for (bool bias : {false, true})
        for (DxMode dx_mode : {DxMode::skipped, DxMode::overwritten, DxMode::accumulated}) {
          SCOPED_TRACE(::testing::Message() << "x " << xs.str() << " N=" << N << " out_in="
                                            << (layout == WeightLayout::out_in) << " bias=" << bias
                                            << " dx=" << static_cast<int>(dx_mode));
          const LinearInputs in = linear_inputs(xs, N, layout, operands, rng);
          const LinearOutputs want = run_linear(*cpu, cpu_matmul, false, in, layout, bias, dx_mode);
          const LinearOutputs got = run_linear(*gpu, operands, tf32, in, layout, bias, dx_mode);
          EXPECT_TRUE(rel_near(got.y, want.y, tol)) << "y";
          if (dx_mode == DxMode::skipped)
            EXPECT_TRUE(identical(got.dx, in.dx0)) << "an empty dx must leave the buffer alone";
          else
            EXPECT_TRUE(rel_near(got.dx, want.dx, tol)) << "dx";
          // dw and db start nonzero: accumulating instead of overwriting is part of the check.
          EXPECT_TRUE(rel_near(got.dw, want.dw, tol)) << "dw";
          if (bias)
            EXPECT_TRUE(rel_near(got.db, want.db, tol)) << "db";
          else
            EXPECT_TRUE(identical(got.db, in.db0)) << "no bias: db untouched";
        }
}

TEST(CudaOps, LinearFp32MatchesTheCpu) {
  REQUIRE_GPU();
  check_linear(DType::f32, false, 1e-5);
}

TEST(CudaOps, LinearTf32StaysCloseToTheCpu) {
  REQUIRE_GPU();
  check_linear(DType::f32, true, 5e-3);
}

TEST(CudaOps, LinearBf16MatchesTheCpuOnRoundedOperands) {
  REQUIRE_GPU();
  check_linear(DType::bf16, false, 1e-4);
}

TEST(CudaOps, LinearFp16MatchesTheCpuOnRoundedOperands) {
  REQUIRE_GPU();
  check_linear(DType::f16, false, 1e-4);
}

// A 16-bit product without the planned operand buffers is refused, not run on garbage.
TEST(CudaOps, Bf16ProductsNeedThePlannedWorkspace) {
  REQUIRE_GPU();
  auto gpu = gpu_backend();
  DeviceBuffers d(*gpu);
  d.workspace(64);  // planned in float32: no operand buffers
  gpu->set_matmul_dtype(DType::bf16);
  const Tensor x = d.alloc({4, 8}), w = d.alloc({8, 8}), y = d.alloc({4, 8});
  expect_error([&] { gpu->linear_forward(x, w, Tensor(), WeightLayout::out_in, y); },
               "operand buffers");
}

// ---- normalization and elementwise ops ----

TEST(CudaOps, LayerNormMatchesTheCpu) {
  REQUIRE_GPU();
  auto cpu = make_cpu_backend();
  auto gpu = gpu_backend();
  std::mt19937 rng(21);
  const std::pair<Shape, float> cases[] = {
      {Shape{37, 75}, 1e-5f}, {Shape{37, 129}, 1e-5f}, {Shape{2, 19, 1031}, 1e-12f}};
  for (const auto& [xs, eps] : cases)
    for (bool accumulate : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "x " << xs.str() << " accumulate_dx=" << accumulate);
      const int64_t C = xs[xs.rank() - 1], R = xs.numel() / C;
      // Offset from zero, so that the variance is taken about a mean that matters.
      const FVec x = randn(R * C, rng, 2.f, 3.f), gamma = randn(C, rng, 0.1f, 1.f);
      const FVec beta = randn(C, rng, 0.1f), dy = randn(R * C, rng);
      const FVec dx0 = randn(R * C, rng), dg0 = randn(C, rng), db0 = randn(C, rng);
      auto run = [&](Backend& be) {
        DeviceBuffers d(be);
        const Tensor xt = d.put(x, xs), g = d.put(gamma, {C}), b = d.put(beta, {C});
        const Tensor y = d.put(FVec(x.size(), -7.f), xs), mean = d.put(FVec(R, -7.f), {R});
        const Tensor rstd = d.put(FVec(R, -7.f), {R}), dyt = d.put(dy, xs), dx = d.put(dx0, xs);
        const Tensor dg = d.put(dg0, {C}), db = d.put(db0, {C});
        be.layernorm_forward(xt, g, b, eps, y, mean, rstd);
        be.layernorm_backward(dyt, xt, g, mean, rstd, dx, accumulate, dg, db);
        return std::array<FVec, 6>{d.get(y),  d.get(mean), d.get(rstd),
                                   d.get(dx), d.get(dg),   d.get(db)};
      };
      const auto want = run(*cpu), got = run(*gpu);
      EXPECT_TRUE(near(got[0], want[0], 1e-5)) << "y";
      EXPECT_TRUE(near(got[1], want[1], 1e-5)) << "mean";
      EXPECT_TRUE(near(got[2], want[2], 1e-5)) << "rstd";
      EXPECT_TRUE(rel_near(got[3], want[3], 1e-5)) << "dx";
      EXPECT_TRUE(rel_near(got[4], want[4], 1e-5)) << "dgamma (accumulated)";
      EXPECT_TRUE(rel_near(got[5], want[5], 1e-5)) << "dbeta (accumulated)";
    }
}

// Llama's and Qwen2's eps; C = 1031 takes several 32-column chunks per lane and row.
TEST(CudaOps, RmsNormMatchesTheCpu) {
  REQUIRE_GPU();
  auto cpu = make_cpu_backend();
  auto gpu = gpu_backend();
  std::mt19937 rng(27);
  const std::pair<Shape, float> cases[] = {
      {Shape{37, 75}, 1e-6f}, {Shape{37, 129}, 1e-5f}, {Shape{2, 19, 1031}, 1e-6f}};
  for (const auto& [xs, eps] : cases)
    for (bool accumulate : {false, true})
      for (bool with_dgamma : {false, true}) {
        SCOPED_TRACE(::testing::Message() << "x " << xs.str() << " accumulate_dx=" << accumulate
                                          << " dgamma=" << with_dgamma);
        const int64_t C = xs[xs.rank() - 1], R = xs.numel() / C;
        const FVec x = randn(R * C, rng, 2.f, 0.5f), gamma = randn(C, rng, 0.1f, 1.f);
        const FVec dy = randn(R * C, rng), dx0 = randn(R * C, rng), dg0 = randn(C, rng);
        auto run = [&](Backend& be) {
          DeviceBuffers d(be);
          const Tensor xt = d.put(x, xs), g = d.put(gamma, {C});
          const Tensor y = d.put(FVec(x.size(), -7.f), xs), rstd = d.put(FVec(R, -7.f), {R});
          const Tensor dyt = d.put(dy, xs), dx = d.put(dx0, xs), dg = d.put(dg0, {C});
          const Tensor dy_inplace = d.put(dy, xs);
          be.rmsnorm_forward(xt, g, eps, y, rstd);
          be.rmsnorm_backward(dyt, xt, g, rstd, dx, accumulate, with_dgamma ? dg : Tensor());
          // dx over dy, after the gamma gradient has read dy.
          be.rmsnorm_backward(dy_inplace, xt, g, rstd, dy_inplace, false, Tensor());
          return std::array<FVec, 5>{d.get(y), d.get(rstd), d.get(dx), d.get(dg),
                                     d.get(dy_inplace)};
        };
        const auto want = run(*cpu), got = run(*gpu);
        EXPECT_TRUE(near(got[0], want[0], 1e-5)) << "y";
        EXPECT_TRUE(near(got[1], want[1], 1e-5)) << "rstd";
        EXPECT_TRUE(rel_near(got[2], want[2], 1e-5)) << "dx";
        if (with_dgamma)
          EXPECT_TRUE(rel_near(got[3], want[3], 1e-5)) << "dgamma (accumulated)";
        else
          EXPECT_TRUE(identical(got[3], dg0)) << "an empty dgamma leaves the buffer alone";
        EXPECT_TRUE(rel_near(got[4], want[4], 1e-5)) << "dx in place of dy";
      }
}

// MHA, GQA and MQA layouts; D = 128 (Llama's) and 6; from position 0 and from a later one.
// Products of the same float32 values, possibly fused differently: 1e-6.
TEST(CudaOps, RotaryMatchesTheCpu) {
  REQUIRE_GPU();
  auto cpu = make_cpu_backend();
  auto gpu = gpu_backend();
  std::mt19937 rng(28);
  struct Case {
    int64_t B, T, H, K, D, first;
  };
  for (const Case& k :
       {Case{2, 37, 4, 4, 128, 0}, Case{3, 19, 8, 2, 6, 11}, Case{1, 5, 6, 1, 64, 300}}) {
    SCOPED_TRACE(::testing::Message() << "T=" << k.T << " H=" << k.H << " K=" << k.K << " D=" << k.D
                                      << " first=" << k.first);
    const int64_t W = (k.H + 2 * k.K) * k.D, P = k.first + k.T;
    const RopeTables t = rope_tables(k.D, 500000.0, P);
    const FVec x = randn(k.B * k.T * W, rng), g = randn(k.B * k.T * W, rng);
    auto run = [&](Backend& be) {
      DeviceBuffers d(be);
      const Tensor c = d.put(t.cos, {P, k.D / 2}), s = d.put(t.sin, {P, k.D / 2});
      const Tensor xt = d.put(x, {k.B, k.T, W}), gt = d.put(g, {k.B, k.T, W});
      be.rotary_forward(xt, static_cast<int>(k.H), static_cast<int>(k.K), c, s, k.first);
      be.rotary_backward(gt, static_cast<int>(k.H), static_cast<int>(k.K), c, s, k.first);
      return std::array<FVec, 2>{d.get(xt), d.get(gt)};
    };
    const auto want = run(*cpu), got = run(*gpu);
    EXPECT_TRUE(near(got[0], want[0], 1e-6)) << "forward";
    EXPECT_TRUE(near(got[1], want[1], 1e-6)) << "backward";
  }
}

// The same activation.h expressions on both sides: 1e-5 as the plain activations.
TEST(CudaOps, SwiGluMatchesTheCpu) {
  REQUIRE_GPU();
  auto cpu = make_cpu_backend();
  auto gpu = gpu_backend();
  std::mt19937 rng(26);
  const int64_t R = 37, F = 129;
  const FVec gu = randn(R * 2 * F, rng, 2.5f), dout = randn(R * F, rng);
  auto run = [&](Backend& be) {
    DeviceBuffers d(be);
    const Tensor g = d.put(gu, {R, 2 * F}), y = d.put(FVec(R * F, -7.f), {R, F});
    const Tensor go = d.put(dout, {R, F}), dg = d.put(FVec(R * 2 * F, -7.f), {R, 2 * F});
    const Tensor inplace = d.put(gu, {R, 2 * F});
    be.swiglu_forward(g, y);
    be.swiglu_backward(g, go, dg);
    be.swiglu_backward(inplace, go, inplace);
    return std::array<FVec, 3>{d.get(y), d.get(dg), d.get(inplace)};
  };
  const auto want = run(*cpu), got = run(*gpu);
  EXPECT_TRUE(near(got[0], want[0], 1e-5)) << "out";
  EXPECT_TRUE(rel_near(got[1], want[1], 1e-5)) << "dgate_up";
  EXPECT_TRUE(rel_near(got[2], want[2], 1e-5)) << "dgate_up in place of gate_up";
}

TEST(CudaOps, ActivationsAndTanhMatchTheCpu) {
  REQUIRE_GPU();
  auto cpu = make_cpu_backend();
  auto gpu = gpu_backend();
  std::mt19937 rng(22);
  const int64_t M = 37, C = 129;
  const FVec x = randn(M * C, rng, 2.5f), dy = randn(M * C, rng);
  const FVec garbage(x.size(), -7.f);
  // y, dx, and dx computed in place over dy.
  auto run =
      [&](Backend& be, const std::function<void(const Tensor&, const Tensor&)>& forward,
          const std::function<void(const Tensor&, const Tensor&, const Tensor&, const Tensor&)>&
              backward) {
        DeviceBuffers d(be);
        const Tensor xt = d.put(x, {M, C}), y = d.put(garbage, {M, C}), g = d.put(dy, {M, C});
        const Tensor dx = d.put(garbage, {M, C}), g_inplace = d.put(dy, {M, C});
        forward(xt, y);
        backward(xt, y, g, dx);
        backward(xt, y, g_inplace, g_inplace);
        return std::array<FVec, 3>{d.get(y), d.get(dx), d.get(g_inplace)};
      };
  for (Activation kind : kAllActivations) {
    SCOPED_TRACE(activation_name(kind));
    auto on = [&](Backend& be) {
      return run(
          be, [&](const Tensor& a, const Tensor& y) { be.activation_forward(kind, a, y); },
          [&](const Tensor& a, const Tensor&, const Tensor& g, const Tensor& dx) {
            be.activation_backward(kind, a, g, dx);
          });
    };
    const auto want = on(*cpu), got = on(*gpu);
    EXPECT_TRUE(near(got[0], want[0], 1e-5)) << "y";
    EXPECT_TRUE(rel_near(got[1], want[1], 1e-5)) << "dx";
    EXPECT_TRUE(rel_near(got[2], want[2], 1e-5)) << "dx in place of dy";
  }
  SCOPED_TRACE("tanh");
  auto on = [&](Backend& be) {
    return run(
        be, [&](const Tensor& a, const Tensor& y) { be.tanh_forward(a, y); },
        [&](const Tensor&, const Tensor& y, const Tensor& g, const Tensor& dx) {
          be.tanh_backward(y, g, dx);
        });
  };
  const auto want = on(*cpu), got = on(*gpu);
  EXPECT_TRUE(near(got[0], want[0], 1e-5)) << "y";
  EXPECT_TRUE(rel_near(got[1], want[1], 1e-5)) << "dx";
  EXPECT_TRUE(rel_near(got[2], want[2], 1e-5)) << "dx in place of dy";
}

// Elements that are zero in one vector and not in the other.
int64_t zero_pattern_mismatches(const FVec& got, const FVec& want) {
  int64_t n = 0;
  for (size_t i = 0; i < got.size() && i < want.size(); ++i) n += (got[i] == 0) != (want[i] == 0);
  return n;
}

TEST(CudaOps, DropoutMasksAreTheCpus) {
  REQUIRE_GPU();
  auto cpu = make_cpu_backend();
  auto gpu = gpu_backend();
  std::mt19937 rng(23);
  const int64_t n = 37 * 129;  // 4773: not a multiple of 4, so the last group of words is partial
  const FVec x = randn(n, rng), r = randn(n, rng);
  const RngKey key{0x1234'5678'9abcULL, (1ULL << 32) + 7, 3};  // a step beyond 32 bits
  // y, y in place of x, dx, dx in place of dy, x + dropout(r), the same in place of x. Views
  // `offset` floats into their buffers: offset 1 breaks the 16-byte alignment that the GPU's
  // vectorized path needs, so both of its paths run.
  auto run = [&](Backend& be, float p, int64_t offset) {
    DeviceBuffers d(be);
    auto view = [&](const FVec& v) {
      FVec padded(static_cast<size_t>(offset), 0.f);
      padded.insert(padded.end(), v.begin(), v.end());
      const Tensor t = d.put(padded, {offset + n});
      return Tensor(t.f32() + offset, Shape{n}, DType::f32, t.device());
    };
    const FVec garbage(x.size(), -7.f);
    const Tensor xt = view(x), rt = view(r), y = view(garbage), x_inplace = view(x);
    const Tensor dx = view(garbage), dy_inplace = view(x), sum = view(garbage), x2 = view(x);
    be.dropout_forward(xt, p, key, y);
    be.dropout_forward(x_inplace, p, key, x_inplace);
    be.dropout_backward(xt, p, key, dx);
    be.dropout_backward(dy_inplace, p, key, dy_inplace);
    be.dropout_add(xt, rt, p, key, sum);
    be.dropout_add(x2, rt, p, key, x2);
    return std::array<FVec, 6>{d.get(y),          d.get(x_inplace), d.get(dx),
                               d.get(dy_inplace), d.get(sum),       d.get(x2)};
  };
  const char* names[] = {"forward",           "forward in place", "backward",
                         "backward in place", "dropout_add",      "dropout_add in place"};
  for (int64_t offset : {0, 1})
    for (float p : {0.1f, 0.5f}) {
      SCOPED_TRACE(::testing::Message() << "p=" << p << " offset=" << offset);
      const auto want = run(*cpu, p, offset), got = run(*gpu, p, offset);
      const int64_t dropped = std::count(want[0].begin(), want[0].end(), 0.f);
      ASSERT_GT(dropped, 0);  // a mask that does something
      ASSERT_LT(dropped, n);
      for (int i = 0; i < 6; ++i) {
        if (i < 4) {
          EXPECT_EQ(zero_pattern_mismatches(got[i], want[i]), 0) << names[i];
        }
        EXPECT_TRUE(near(got[i], want[i], 1e-6)) << names[i];
      }
    }
  // p = 0: the identity, and a plain sum.
  const auto want = run(*cpu, 0.f, 0), got = run(*gpu, 0.f, 0);
  for (int i = 0; i < 6; ++i) EXPECT_TRUE(identical(got[i], want[i])) << names[i] << ", p = 0";
  EXPECT_TRUE(identical(got[0], x));
}

TEST(CudaOps, AddFillAndCopyAreExact) {
  REQUIRE_GPU();
  auto cpu = make_cpu_backend();
  auto gpu = gpu_backend();
  std::mt19937 rng(24);
  const int64_t n = 4773;
  const FVec a = randn(n, rng), b = randn(n, rng), garbage(n, -7.f);
  const IVec ints = randint(n, -1000, 1000, rng);
  std::vector<int64_t> longs(n);
  for (int64_t i = 0; i < n; ++i) longs[i] = (i << 33) - 5 * i;
  auto run = [&](Backend& be) {
    DeviceBuffers d(be);
    const Tensor y = d.put(a, {n}), x = d.put(b, {n});
    be.add_inplace(y, x);
    const Tensor f1 = d.put(garbage, {n}), f2 = d.put(garbage, {n});
    be.fill(f1, 2.5f);
    be.fill(f2, 0.f);
    const Tensor c = d.put(garbage, {n});
    be.copy(x, c);
    const Tensor is = d.put(ints, {n}), id = d.alloc({n}, DType::i32);
    be.copy(is, id);
    const Tensor ls = d.put(longs, {n}), ld = d.alloc({n}, DType::i64);
    be.copy(ls, ld);
    return std::make_tuple(std::array<FVec, 5>{d.get(y), d.get(x), d.get(f1), d.get(f2), d.get(c)},
                           d.get<int32_t>(id), d.get<int64_t>(ld));
  };
  const auto [want, want_i, want_l] = run(*cpu);
  const auto [got, got_i, got_l] = run(*gpu);
  const char* names[] = {"add_inplace target", "add_inplace source", "fill 2.5", "fill 0", "copy"};
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(identical(got[i], want[i])) << names[i];
  EXPECT_TRUE(identical(got[2], FVec(n, 2.5f)));
  EXPECT_TRUE(identical(got_i, ints)) << "int32 copy";
  EXPECT_TRUE(identical(got_l, longs)) << "int64 copy";
  EXPECT_TRUE(identical(want_i, ints));
  EXPECT_TRUE(identical(want_l, longs));
}

// ---- casts ----

// Float32 inputs for the 16-bit conversions: special values, the formats' range limits and
// subnormals, round-to-nearest-even ties for both formats, and random bit patterns (every
// exponent, float32 subnormals and NaNs included).
FVec cast_inputs(std::mt19937& rng) {
  const float inf = std::numeric_limits<float>::infinity();
  const float big = std::numeric_limits<float>::max();
  FVec v = {0.f, -0.f, 1.f, -1.f, inf, -inf, std::nanf(""), -std::nanf("")};
  // NaNs with payloads: signaling, quiet.
  v.insert(v.end(), {bits_float(0x7f800001u), bits_float(0x7fc12345u)});
  // float32's smallest normal and subnormal; its largest, which rounds to inf in bf16; bf16's
  // largest.
  v.insert(v.end(), {std::numeric_limits<float>::min(), std::numeric_limits<float>::denorm_min(),
                     big, -big, 3.3895313892515355e38f});
  // fp16's largest, a value that rounds down to it, the tie above it (rounds to inf).
  v.insert(v.end(), {65504.f, 65519.f, 65520.f, -65520.f});
  // fp16's smallest normal and subnormal, ties at its bottom (to 0, to 2^-23), and below it.
  v.insert(v.end(), {6.103515625e-05f, 5.9604644775390625e-08f, 2.98023223876953125e-08f,
                     8.940696716308594e-08f, 1e-9f});
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 20000; ++i) v.push_back(bits_float(bits(rng)));
  std::uniform_int_distribution<int> exponent(-14, 15);
  for (int i = 0; i < 4000; ++i) {
    const float sign = i % 2 ? 1.f : -1.f;
    // bf16 ties: the 16 dropped bits are exactly half an ulp (both parities of the kept bits).
    v.push_back(bits_float((bits(rng) & 0xffff0000u) | 0x8000u));
    // fp16 ties: half an fp16 ulp above a value on fp16's grid, in its normal range (exponent e,
    // ulp 2^(e-10)) and its subnormal range (ulp 2^-24). Exact in float32 (12 bits).
    const int e = exponent(rng);
    const float m = static_cast<float>(bits(rng) % 1024);
    v.push_back(sign * (std::ldexp(1.f + m / 1024.f, e) + std::ldexp(1.f, e - 11)));
    v.push_back(sign * (std::ldexp(m, -24) + std::ldexp(1.f, -25)));
  }
  return v;
}

bool is_nan16(uint16_t h, DType t) {
  return t == DType::bf16 ? (h & 0x7fffu) > 0x7f80u : (h & 0x7fffu) > 0x7c00u;
}

// got and want agree bit for bit, except that where `nan_at` says so both only need to be NaN
// (the GPU writes the canonical NaN, the CPU keeps payloads).
template <typename T, typename IsNan, typename NanAt>
::testing::AssertionResult same_bits_but_nan(const std::vector<T>& got, const std::vector<T>& want,
                                             IsNan is_nan, NanAt nan_at) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << "size " << got.size() << " vs " << want.size();
  for (size_t i = 0; i < got.size(); ++i) {
    const bool ok = nan_at(i) ? is_nan(got[i]) && is_nan(want[i])
                              : std::memcmp(&got[i], &want[i], sizeof(T)) == 0;
    if (!ok) {
      uint32_t g = 0, w = 0;
      std::memcpy(&g, &got[i], sizeof(T));
      std::memcpy(&w, &want[i], sizeof(T));
      return ::testing::AssertionFailure()
             << "element " << i << ": got bits 0x" << std::hex << g << ", want 0x" << w;
    }
  }
  return ::testing::AssertionSuccess();
}

TEST(CudaOps, CastsAndRoundingAreBitExact) {
  REQUIRE_GPU();
  auto cpu = make_cpu_backend();
  auto gpu = gpu_backend();
  std::mt19937 rng(25);
  const FVec x = cast_inputs(rng);
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<uint16_t> all16(65536);
  std::iota(all16.begin(), all16.end(), uint16_t{0});
  auto is_nan_f = [](float f) { return std::isnan(f); };
  auto x_is_nan = [&](size_t i) { return std::isnan(x[i]); };
  for (DType t : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(t));
    // f32 -> 16 bits; every 16-bit pattern -> f32; round_to into another buffer and in place.
    auto run = [&](Backend& be) {
      DeviceBuffers d(be);
      const Tensor src = d.put(x, {n}), narrow = d.alloc({n}, t);
      be.cast(src, narrow);
      const Tensor patterns = d.put(all16, {65536}, t), wide = d.alloc({65536});
      be.cast(patterns, wide);
      const Tensor r = d.alloc({n}), r_inplace = d.put(x, {n});
      be.round_to(t, src, r);
      be.round_to(t, r_inplace);
      return std::make_tuple(d.get<uint16_t>(narrow), d.get(wide), d.get(r), d.get(r_inplace));
    };
    const auto [want_n, want_w, want_r, want_ri] = run(*cpu);
    const auto [got_n, got_w, got_r, got_ri] = run(*gpu);
    EXPECT_TRUE(same_bits_but_nan(
        got_n, want_n, [&](uint16_t h) { return is_nan16(h, t); }, x_is_nan))
        << "cast from float32";
    EXPECT_TRUE(same_bits_but_nan(got_w, want_w, is_nan_f, [&](size_t i) {
      return is_nan16(all16[i], t);
    })) << "cast to float32";
    EXPECT_TRUE(same_bits_but_nan(got_r, want_r, is_nan_f, x_is_nan)) << "round_to";
    EXPECT_TRUE(same_bits_but_nan(got_ri, want_ri, is_nan_f, x_is_nan)) << "round_to in place";
  }
  // Same types: plain copies, NaN payloads included.
  DeviceBuffers d(*gpu);
  const Tensor src = d.put(x, {n}), copy = d.alloc({n}), rounded32 = d.alloc({n});
  gpu->cast(src, copy);
  gpu->round_to(DType::f32, src, rounded32);
  EXPECT_TRUE(identical(d.get(copy), x)) << "cast float32 to float32";
  EXPECT_TRUE(identical(d.get(rounded32), x)) << "round_to float32";
}

// ---- embeddings, pooling, loss ----

TEST(CudaOps, EmbeddingMatchesTheCpu) {
  REQUIRE_GPU();
  auto cpu = make_cpu_backend();
  auto gpu = gpu_backend();
  std::mt19937 rng(26);
  const int64_t B = 3, T = 45, V = 50, C = 75, P = 64, NT = 2;  // position table longer than T
  const IVec ids = randint(B * T, 0, V, rng), types = randint(B * T, 0, NT, rng);  // repeats
  // The same ids with each sequence's last 7 tokens padding (id 1, which also occurs elsewhere).
  const int32_t pad_id = 1;
  IVec padded = ids;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = T - 7; t < T; ++t) padded[b * T + t] = pad_id;
  const FVec word = randn(V * C, rng), pos = randn(P * C, rng), tt = randn(NT * C, rng);
  const FVec dout = randn(B * T * C, rng);
  const FVec dw0 = randn(V * C, rng), dp0 = randn(P * C, rng), dt0 = randn(NT * C, rng);
  enum Tables { word_pos_type, word_pos, word_only };
  auto run = [&](Backend& be, Tables tables, const IVec& token_ids, int64_t padding_idx) {
    DeviceBuffers d(be);
    const bool with_pos = tables != word_only, with_type = tables == word_pos_type;
    const Tensor id = d.put(token_ids, {B, T}), ty = d.put(types, {B, T});
    const Tensor w = d.put(word, {V, C}), p = d.put(pos, {P, C}), t = d.put(tt, {NT, C});
    const Tensor out = d.put(FVec(dout.size(), -7.f), {B, T, C}), g = d.put(dout, {B, T, C});
    const Tensor dw = d.put(dw0, {V, C}), dp = d.put(dp0, {P, C}), dt = d.put(dt0, {NT, C});
    be.embedding_forward(id, w, with_pos ? p : Tensor(), with_type ? ty : Tensor(),
                         with_type ? t : Tensor(), out);
    be.embedding_backward(g, id, padding_idx, with_type ? ty : Tensor(), dw,
                          with_pos ? dp : Tensor(), with_type ? dt : Tensor());
    return std::array<FVec, 4>{d.get(out), d.get(dw), d.get(dp), d.get(dt)};
  };
  for (Tables tables : {word_pos_type, word_pos, word_only})
    for (int64_t padding_idx : {int64_t{-1}, int64_t{pad_id}}) {
      SCOPED_TRACE(::testing::Message() << (tables == word_pos_type ? "word+pos+type"
                                            : tables == word_pos    ? "word+pos"
                                                                    : "word only")
                                        << " padding_idx=" << padding_idx);
      const IVec& token_ids = padding_idx < 0 ? ids : padded;
      const auto want = run(*cpu, tables, token_ids, padding_idx);
      const auto got = run(*gpu, tables, token_ids, padding_idx);
      // The same additions in the same order, (word + pos) + type.
      EXPECT_TRUE(identical(got[0], want[0])) << "forward";
      // Word and type rows are scatter-added with atomics on the GPU: any order.
      EXPECT_TRUE(near(got[1], want[1], 1e-6)) << "dword";
      // Each type row sums ~B*T/NT = 67 rows of |x| ~ 0.8 in any order: reordering a float32 sum
      // moves it by up to n*u*sum|x| ~ 2e-4, typically sqrt(n)*u*sum|x| ~ 3e-5 (measured 2e-6 on
      // an H100); a missed or doubled row would be off by ~1.
      EXPECT_TRUE(near(got[3], want[3], 1e-4)) << "dtype_table";
      // Each position row is summed over the batch in the CPU's order (no atomics).
      EXPECT_TRUE(identical(got[2], want[2])) << "dpos";
      if (padding_idx >= 0) {
        const auto row = [&](const FVec& v) {
          return FVec(v.begin() + padding_idx * C, v.begin() + (padding_idx + 1) * C);
        };
        EXPECT_TRUE(identical(row(got[1]), row(dw0))) << "the padding row's gradient";
      }
      if (tables != word_pos_type) {
        EXPECT_TRUE(identical(got[3], dt0)) << "no type table";
      }
      if (tables == word_only) {
        EXPECT_TRUE(identical(got[2], dp0)) << "no position table";
      }
    }
}

TEST(CudaOps, FirstTokenIsExact) {
  REQUIRE_GPU();
  auto cpu = make_cpu_backend();
  auto gpu = gpu_backend();
  std::mt19937 rng(27);
  const int64_t B = 3, T = 45, C = 75;
  const FVec x = randn(B * T * C, rng), dout = randn(B * C, rng), dx0 = randn(B * T * C, rng);
  auto run = [&](Backend& be) {
    DeviceBuffers d(be);
    const Tensor xt = d.put(x, {B, T, C}), out = d.put(FVec(dout.size(), -7.f), {B, C});
    const Tensor g = d.put(dout, {B, C}), dx = d.put(dx0, {B, T, C});
    be.first_token(xt, out);
    be.first_token_backward(g, dx);  // adds into position 0 only
    return std::array<FVec, 2>{d.get(out), d.get(dx)};
  };
  const auto want = run(*cpu), got = run(*gpu);
  EXPECT_TRUE(identical(got[0], want[0])) << "first_token";
  EXPECT_TRUE(identical(got[1], want[1])) << "first_token_backward";
}

TEST(CudaOps, SoftmaxCrossEntropyMatchesTheCpu) {
  REQUIRE_GPU();
  auto cpu = make_cpu_backend();
  auto gpu = gpu_backend();
  std::mt19937 rng(28);
  const int64_t N = 37;
  const double start = 1.5;        // the accumulator's value before: the op adds to it
  for (int64_t V : {129, 8193}) {  // 8193: the wide-block path for vocabulary-sized rows
    SCOPED_TRACE(::testing::Message() << "V=" << V);
    FVec logits = randn(N * V, rng, 3.f);
    IVec labels = randint(N, 0, static_cast<int32_t>(V), rng);
    labels[0] = 0;
    labels[1] = static_cast<int32_t>(V - 1);
    for (int r : {2, 9, 30}) labels[r] = kIgnoreIndex;
    const int count = static_cast<int>(N) - 3;
    // Row 5 has hidden vocabulary entries (-inf logits), as a masked vocabulary would.
    for (int64_t j = 0; j < V; j += 7)
      if (j != labels[5]) logits[5 * V + j] = -std::numeric_limits<float>::infinity();
    // Loss and logits after a pass without gradients, loss and gradient after one with.
    auto run = [&](Backend& be, const IVec& y) {
      DeviceBuffers d(be);
      const Tensor z = d.put(logits, {N, V}), yt = d.put(y, {N});
      const Tensor loss = d.put(std::vector<double>{start}, {1});
      be.softmax_cross_entropy(z, yt, false, 1.f, loss);
      const double l1 = d.get<double>(loss)[0] - start;
      const FVec z1 = d.get(z);
      be.softmax_cross_entropy(z, yt, true, 1.f / count, loss);
      const double l2 = d.get<double>(loss)[0] - start - l1;
      return std::make_tuple(l1, z1, l2, d.get(z));
    };
    const auto [want_l1, want_z1, want_l2, want_g] = run(*cpu, labels);
    const auto [got_l1, got_z1, got_l2, got_g] = run(*gpu, labels);
    EXPECT_NEAR(got_l1, want_l1, 1e-5 * std::abs(want_l1));
    EXPECT_NEAR(got_l2, want_l2, 1e-5 * std::abs(want_l2));
    EXPECT_TRUE(identical(got_z1, logits)) << "without write_grad the logits stay";
    EXPECT_TRUE(rel_near(got_g, want_g, 1e-5)) << "gradient";
    for (int r : {2, 9, 30})
      EXPECT_TRUE(identical(FVec(got_g.begin() + r * V, got_g.begin() + (r + 1) * V), FVec(V, 0.f)))
          << "ignored row " << r;

    // Every row ignored: nothing added, zero gradient.
    const auto [l1, z1, l2, g] = run(*gpu, IVec(N, kIgnoreIndex));
    EXPECT_EQ(l1, 0.0);
    EXPECT_EQ(l2, 0.0);
    EXPECT_TRUE(identical(g, FVec(g.size(), 0.f)));
  }
}

TEST(CudaOps, MseLossMatchesTheCpu) {
  REQUIRE_GPU();
  auto cpu = make_cpu_backend();
  auto gpu = gpu_backend();
  std::mt19937 rng(30);
  const double start = 0.5;
  for (int64_t N : {5, 300}) {  // 300: more rows than the kernel's threads
    SCOPED_TRACE(::testing::Message() << "N=" << N);
    const FVec pred = randn(N, rng, 2.f);
    FVec targets = randn(N, rng, 1.f);
    targets[1] = std::numeric_limits<float>::quiet_NaN();  // an unlabelled row
    auto run = [&](Backend& be) {
      DeviceBuffers d(be);
      const Tensor p = d.put(pred, {N, 1}), y = d.put(targets, {N});
      const Tensor loss = d.put(std::vector<double>{start}, {1});
      be.mse_loss(p, y, false, 1.f, loss);
      const double l1 = d.get<double>(loss)[0] - start;
      const FVec p1 = d.get(p);
      be.mse_loss(p, y, true, 1.f / static_cast<float>(N - 1), loss);
      return std::make_tuple(l1, p1, d.get(p));
    };
    const auto [want_l, want_p1, want_g] = run(*cpu);
    const auto [got_l, got_p1, got_g] = run(*gpu);
    EXPECT_NEAR(got_l, want_l, 1e-6 * std::abs(want_l));
    EXPECT_TRUE(identical(got_p1, pred)) << "without write_grad the predictions stay";
    EXPECT_TRUE(rel_near(got_g, want_g, 1e-6)) << "gradient";
    EXPECT_EQ(got_g[1], 0.f) << "unlabelled row";
  }
}

// ---- attention ----

// Decoding over a cache: a prompt and then single tokens, with more keys than the kernel's block
// (so the chunked value pass takes several chunks) and a head width above its block (several
// columns per thread).
TEST(CudaOps, AttentionDecodeMatchesTheCpu) {
  REQUIRE_GPU();
  auto cpu = make_cpu_backend();
  auto gpu = gpu_backend();
  std::mt19937 rng(31);
  const int64_t B = 2, H = 2, D = 160, C = H * D, S = 300;
  for (int64_t prompt : {int64_t{5}, int64_t{250}}) {
    // The long prompt at half the usual scale (scale_attn_by_inverse_layer_idx's second layer).
    const float scale = (prompt == 5 ? 1.f : 0.5f) / std::sqrt(static_cast<float>(D));
    SCOPED_TRACE(::testing::Message() << "prompt=" << prompt << " scale=" << scale);
    std::vector<FVec> chunks;
    for (int64_t n : {prompt, int64_t{1}, int64_t{1}, int64_t{1}})
      chunks.push_back(randn(B * n * 3 * C, rng));
    auto run = [&](Backend& be) {
      DeviceBuffers d(be);
      const Tensor kc = d.put(FVec(B * S * C, 0.f), {B, S, C});
      const Tensor vc = d.put(FVec(B * S * C, 0.f), {B, S, C});
      std::vector<FVec> outs;
      int64_t past = 0;
      for (const FVec& q : chunks) {
        const int64_t n = static_cast<int64_t>(q.size()) / (B * 3 * C);
        const Tensor out = d.put(FVec(B * n * C, 0.f), {B, n, C});
        be.attention_decode(d.put(q, {B, n, 3 * C}), kc, vc, past, static_cast<int>(H),
                            static_cast<int>(H), scale, out);
        outs.push_back(d.get(out));
        past += n;
      }
      outs.push_back(d.get(kc));
      outs.push_back(d.get(vc));
      return outs;
    };
    const auto want = run(*cpu), got = run(*gpu);
    for (size_t i = 0; i < want.size(); ++i) EXPECT_TRUE(rel_near(got[i], want[i], 1e-5)) << i;
  }
}

TEST(CudaOps, AttentionMatchesTheCpu) {
  REQUIRE_GPU();
  auto cpu = make_cpu_backend();
  auto gpu = gpu_backend();
  std::mt19937 rng(29);
  const int64_t B = 3, H = 2;
  const RngKey key{42, 3, 5};
  // T = 45 leaves partial tiles (64 queries forward, 32 backward); 130 takes several. D = 80
  // uses the wide-head path with idle feature slots and more than 48 KiB of shared memory.
  for (int64_t T : {45, 130})
    for (int64_t D : {16, 64, 80})
      for (bool masked : {false, true})
        for (bool causal : {false, true})
          for (float p : {0.f, 0.1f}) {
            // T = 130 at half the usual scale (scale_attn_by_inverse_layer_idx's second layer).
            const float scale = (T == 45 ? 1.f : 0.5f) / std::sqrt(static_cast<float>(D));
            SCOPED_TRACE(::testing::Message()
                         << "T=" << T << " D=" << D << " mask=" << masked << " causal=" << causal
                         << " dropout=" << p << " scale=" << scale);
            const int64_t C = H * D;
            // Sequence 0: padding at the end. Sequence 1: key 0 and two others hidden, so that
            // with causality query 0 sees no key at all. Sequence 2: every key hidden.
            IVec mask(static_cast<size_t>(B * T), 1);
            for (int64_t t = T - 6; t < T; ++t) mask[t] = 0;
            for (int64_t t : {0, 7, 20}) mask[T + t] = 0;
            for (int64_t t = 0; t < T; ++t) mask[2 * T + t] = 0;
            const FVec qkv = randn(B * T * 3 * C, rng), dout = randn(B * T * C, rng);
            const FVec dqkv0 = randn(B * T * 3 * C, rng);  // overwritten
            auto run = [&](Backend& be) {
              const AttentionBuffers ab = attention_buffers(be.device(), B, H, T);
              DeviceBuffers d(be);
              const Tensor q = d.put(qkv, {B, T, 3 * C});
              const Tensor m = masked ? d.put(mask, {B, T}) : Tensor();
              const Tensor stats = d.alloc(ab.stats), scratch = d.alloc(ab.scratch);
              const Tensor out = d.put(FVec(dout.size(), -7.f), {B, T, C});
              const Tensor g = d.put(dout, {B, T, C}), dq = d.put(dqkv0, {B, T, 3 * C});
              be.attention_forward(q, m, causal, static_cast<int>(H), static_cast<int>(H), scale, p,
                                   key, stats, scratch, out);
              be.attention_backward(g, q, out, stats, m, causal, static_cast<int>(H),
                                    static_cast<int>(H), scale, p, key, scratch, dq);
              return std::array<FVec, 2>{d.get(out), d.get(dq)};
            };
            const auto want = run(*cpu), got = run(*gpu);
            EXPECT_TRUE(near(got[0], want[0], 1e-5)) << "out";
            EXPECT_TRUE(rel_near(got[1], want[1], 1e-5)) << "dqkv";
            if (!masked) continue;
            // A query that sees no key gets a zero output; keys no query sees get no gradient.
            auto all_zero = [](const FVec& v, int64_t begin, int64_t end) {
              return std::all_of(v.begin() + begin, v.begin() + end,
                                 [](float f) { return f == 0; });
            };
            EXPECT_TRUE(all_zero(got[0], 2 * T * C, 3 * T * C)) << "out of a fully masked row";
            EXPECT_TRUE(all_zero(got[1], 2 * T * 3 * C, 3 * T * 3 * C)) << "dqkv, sequence 2";
            if (causal) {
              EXPECT_TRUE(all_zero(got[0], T * C, T * C + C)) << "sequence 1, query 0";
              EXPECT_TRUE(all_zero(got[1], T * 3 * C, T * 3 * C + C)) << "dq, sequence 1, query 0";
            }
          }
}

// Grouped-query attention: ratios 1, 2 and 3 and multi-query, head widths 16, 33 (odd) and 128,
// with a mask, causality and dropout; T = 45 leaves partial tiles, 130 takes several.
TEST(CudaOps, GroupedQueryAttentionMatchesTheCpu) {
  REQUIRE_GPU();
  auto cpu = make_cpu_backend();
  auto gpu = gpu_backend();
  std::mt19937 rng(32);
  const int64_t B = 2;
  const RngKey key{11, 2, 6};
  struct Heads {
    int64_t H, K;
  };
  for (int64_t T : {45, 130})
    for (int64_t D : {16, 33, 128})
      for (const Heads& hk : {Heads{4, 4}, Heads{4, 2}, Heads{6, 2}, Heads{3, 1}})
        for (bool causal : {false, true})
          for (float p : {0.f, 0.1f}) {
            const int64_t H = hk.H, K = hk.K, C = H * D, W = (H + 2 * K) * D;
            const float scale = 1.f / std::sqrt(static_cast<float>(D));
            SCOPED_TRACE(::testing::Message() << "T=" << T << " D=" << D << " H=" << H << " K=" << K
                                              << " causal=" << causal << " dropout=" << p);
            IVec mask(static_cast<size_t>(B * T), 1);
            for (int64_t t = T - 5; t < T; ++t) mask[t] = 0;  // padding at the end of sequence 0
            const FVec qkv = randn(B * T * W, rng), dout = randn(B * T * C, rng);
            const FVec dqkv0 = randn(B * T * W, rng);  // overwritten
            auto run = [&](Backend& be) {
              const AttentionBuffers ab = attention_buffers(be.device(), B, H, T);
              DeviceBuffers d(be);
              const Tensor q = d.put(qkv, {B, T, W}), m = d.put(mask, {B, T});
              const Tensor stats = d.alloc(ab.stats), scratch = d.alloc(ab.scratch);
              const Tensor out = d.put(FVec(dout.size(), -7.f), {B, T, C});
              const Tensor g = d.put(dout, {B, T, C}), dq = d.put(dqkv0, {B, T, W});
              be.attention_forward(q, m, causal, static_cast<int>(H), static_cast<int>(K), scale, p,
                                   key, stats, scratch, out);
              be.attention_backward(g, q, out, stats, m, causal, static_cast<int>(H),
                                    static_cast<int>(K), scale, p, key, scratch, dq);
              return std::array<FVec, 2>{d.get(out), d.get(dq)};
            };
            const auto want = run(*cpu), got = run(*gpu);
            EXPECT_TRUE(near(got[0], want[0], 1e-5)) << "out";
            EXPECT_TRUE(rel_near(got[1], want[1], 1e-5)) << "dqkv";
          }
}

// Decoding over caches of the K key/value heads, GQA and MQA, against the CPU.
TEST(CudaOps, GroupedQueryDecodeMatchesTheCpu) {
  REQUIRE_GPU();
  auto cpu = make_cpu_backend();
  auto gpu = gpu_backend();
  std::mt19937 rng(33);
  const int64_t B = 2, D = 72, S = 200;
  struct Heads {
    int64_t H, K;
  };
  for (const Heads& hk : {Heads{4, 2}, Heads{6, 1}}) {
    const int64_t H = hk.H, K = hk.K, C = H * D, KD = K * D, W = C + 2 * KD;
    const float scale = 1.f / std::sqrt(static_cast<float>(D));
    SCOPED_TRACE(::testing::Message() << "H=" << H << " K=" << K);
    std::vector<FVec> chunks;
    for (int64_t n : {int64_t{150}, int64_t{1}, int64_t{1}, int64_t{3}})
      chunks.push_back(randn(B * n * W, rng));
    auto run = [&](Backend& be) {
      DeviceBuffers d(be);
      const Tensor kc = d.put(FVec(B * S * KD, 0.f), {B, S, KD});
      const Tensor vc = d.put(FVec(B * S * KD, 0.f), {B, S, KD});
      std::vector<FVec> outs;
      int64_t past = 0;
      for (const FVec& q : chunks) {
        const int64_t n = static_cast<int64_t>(q.size()) / (B * W);
        const Tensor out = d.put(FVec(B * n * C, 0.f), {B, n, C});
        be.attention_decode(d.put(q, {B, n, W}), kc, vc, past, static_cast<int>(H),
                            static_cast<int>(K), scale, out);
        outs.push_back(d.get(out));
        past += n;
      }
      outs.push_back(d.get(kc));
      outs.push_back(d.get(vc));
      return outs;
    };
    const auto want = run(*cpu), got = run(*gpu);
    for (size_t i = 0; i < want.size(); ++i) EXPECT_TRUE(rel_near(got[i], want[i], 1e-5)) << i;
  }
}

// ---- the optimizer step ----

TEST(CudaOps, SumOfSquaresAndStepDecisionMatchTheCpu) {
  REQUIRE_GPU();
  auto cpu = make_cpu_backend();
  auto gpu = gpu_backend();
  std::mt19937 rng(30);
  const double start = 7.25;  // the accumulator's value before: the op adds to it
  auto sum_squares = [&](Backend& be, const FVec& x) {
    DeviceBuffers d(be);
    const Tensor xt = d.put(x, {static_cast<int64_t>(x.size())});
    const Tensor acc = d.put(std::vector<double>{start}, {1});
    be.sum_squares(xt, acc);
    return d.get<double>(acc)[0];
  };
  for (int64_t n : {37, 1'000'003}) {
    const FVec x = randn(n, rng);
    const double want = sum_squares(*cpu, x), got = sum_squares(*gpu, x);
    // Squares of floats are exact in double; only the order of the double sums differs.
    EXPECT_NEAR(got, want, 1e-11 * want) << "n=" << n;
  }
  FVec x = randn(100'003, rng);
  x[12345] = std::numeric_limits<float>::infinity();
  const double with_inf = sum_squares(*gpu, x);
  EXPECT_TRUE(std::isinf(with_inf) && with_inf > 0) << with_inf;
  x[12345] = std::nanf("");
  EXPECT_TRUE(std::isnan(sum_squares(*gpu, x)));

  // decide_step: the same shared function on the host and the device.
  struct Case {
    double loss, sumsq, loss_scale, max_norm;
  };
  const double inf = std::numeric_limits<double>::infinity(), nan = std::nan("");
  const Case cases[] = {
      {2.5, 0.25, 1, 1},                       // norm 0.5: no clipping
      {2.5, 400, 1, 1},                        // norm 20: clipped
      {2.5, 400.0 * 65536 * 65536, 65536, 1},  // scaled fp16 gradients, clipped after unscaling
      {2.5, 400, 1, 0},                        // no clipping asked for
      {2.5, inf, 65536, 1},                    // overflow: skip
      {2.5, nan, 1, 1},                        // skip
      {nan, 1, 1, 1},                          // a NaN loss: skip
      {inf, 1, 1, 1},                          // skip
  };
  auto decide = [&](Backend& be, const Case& c) {
    DeviceBuffers d(be);
    const Tensor stats = d.put(std::vector<double>{c.loss, c.sumsq}, {kStatsSize});
    const Tensor control = d.put(FVec{-7.f, -7.f}, {kControlSize});
    be.decide_step(stats, c.loss_scale, c.max_norm, control);
    return d.get(control);
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << "loss " << c.loss << " sumsq " << c.sumsq << " scale "
                                      << c.loss_scale << " max_norm " << c.max_norm);
    const FVec want = decide(*cpu, c), got = decide(*gpu, c);
    EXPECT_EQ(got[kControlSkip], want[kControlSkip]);
    EXPECT_FLOAT_EQ(got[kControlMultiplier], want[kControlMultiplier]);
  }

  // As the trainer chains them on the device (it plants an fp16 overflow the same way): an inf
  // gradient sets the skip flag.
  DeviceBuffers d(*gpu);
  const Tensor grads = d.put(randn(100'003, rng), {100'003});
  gpu->fill(Tensor(grads.f32() + 777, Shape{1}, DType::f32, grads.device()),
            std::numeric_limits<float>::infinity());
  const Tensor stats = d.put(std::vector<double>{3.0, 0.0}, {kStatsSize});
  const Tensor control = d.put(FVec{-7.f, -7.f}, {kControlSize});
  gpu->sum_squares(
      grads, Tensor(stats.as<double>() + kStatGradSumSq, Shape{1}, DType::f64, stats.device()));
  gpu->decide_step(stats, 65536.0, 1.0, control);
  const FVec c = d.get(control);
  EXPECT_EQ(c[kControlSkip], 1.f);
  EXPECT_EQ(c[kControlMultiplier], 0.f);
}

// Flat buffers for the AdamW and SGD tests: more than one pass of the GPU's grid-stride loop
// (4096 blocks x 256 threads), with decay ranges at the start, of one element, across the first
// pass's end, adjacent, and at the end.
constexpr int64_t kFlatParams = 1'100'003;
const std::vector<int64_t> kDecayRanges = {0,       1000,    5000,    5001,    10007,
                                           300000,  600000,  1048570, 1048580, 1048600,
                                           1048600, 1049000, 1099990, 1100003};

TEST(CudaOps, AdamWMatchesTheCpuAndASkippedStepChangesNothing) {
  REQUIRE_GPU();
  auto cpu = make_cpu_backend();
  auto gpu = gpu_backend();
  std::mt19937 rng(31);
  const int64_t n = kFlatParams;
  const std::vector<int64_t>& ranges = kDecayRanges;
  const int64_t R = static_cast<int64_t>(ranges.size()) / 2;
  const FVec w0 = randn(n, rng);
  std::vector<FVec> grads;
  for (int s = 0; s < 5; ++s) grads.push_back(randn(n, rng, 0.01f, 0.001f * s));
  FVec bad = grads[0];
  bad[777] = std::numeric_limits<float>::infinity();
  // The state after five steps, the control of the sixth (an inf gradient) and the state after.
  auto run = [&](Backend& be) {
    DeviceBuffers d(be);
    const Tensor w = d.put(w0, {n}), m = d.put(FVec(n, 0.f), {n}), v = d.put(FVec(n, 0.f), {n});
    const Tensor g = d.alloc({n});
    const Tensor decay = d.put(ranges, {R, 2});
    const Tensor stats = d.alloc({kStatsSize}, DType::f64), control = d.alloc({kControlSize});
    const Tensor sumsq =
        Tensor(stats.as<double>() + kStatGradSumSq, Shape{1}, DType::f64, stats.device());
    auto step = [&](const FVec& gv, int64_t t) {
      d.set(g, gv);
      d.set(stats, std::vector<double>{0.5, 0.0});
      // As the trainer does it: loss scale 4 and clipping folded into the multiplier.
      be.sum_squares(g, sumsq);
      be.decide_step(stats, 4.0, 1.0, control);
      AdamWUpdate u{w, g, m, v, decay, control};
      u.lr = 1e-2f / static_cast<float>(t);
      u.beta1 = 0.9f;
      u.beta2 = 0.98f;
      u.eps = 1e-6f;
      u.weight_decay = 0.1f;
      u.step = t;
      be.adamw_update(u);
    };
    for (int64_t t = 1; t <= 5; ++t) step(grads[t - 1], t);
    std::array<FVec, 3> after5{d.get(w), d.get(m), d.get(v)};
    step(bad, 6);
    return std::make_tuple(after5, d.get(control),
                           std::array<FVec, 3>{d.get(w), d.get(m), d.get(v)});
  };
  const auto [want, want_control, want_after] = run(*cpu);
  const auto [got, got_control, got_after] = run(*gpu);
  // Float32 per element on both; fused multiply-adds may differ in the last bit.
  EXPECT_TRUE(near(got[0], want[0], 1e-6)) << "weights";
  EXPECT_TRUE(rel_near(got[1], want[1], 1e-6)) << "exp_avg";
  EXPECT_TRUE(rel_near(got[2], want[2], 1e-6)) << "exp_avg_sq";
  // Decay on the wrong elements would show at lr * weight_decay = 1e-3 relative per step, far
  // above the bound; and the steps did move the weights (by about 2e-2).
  EXPECT_GT(rel_error(want[0].data(), w0.data(), n), 1e-3);
  EXPECT_EQ(got_control[kControlSkip], 1.f);
  EXPECT_EQ(want_control[kControlSkip], 1.f);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(identical(got_after[i], got[i])) << "skipped step, " << i;
}

// Element by element, relative to the element itself: |got - want| <= tol * |want|; for state
// whose scale is far from 1 (second moments, absolute maxima), where near() would be absolute.
::testing::AssertionResult each_rel_near(const FVec& got, const FVec& want, double tol) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << "size " << got.size() << " vs " << want.size();
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = std::abs(double(got[i]) - want[i]);
    if (!(d <= tol * std::abs(double(want[i]))) && got[i] != want[i])
      return ::testing::AssertionFailure()
             << "element " << i << " of " << got.size() << ": got " << got[i] << ", want "
             << want[i] << ", relative error " << d / std::abs(double(want[i])) << " > " << tol;
  }
  return ::testing::AssertionSuccess();
}

// The step control as decide_step writes it: a gradient multiplier, or a skipped step.
const FVec kApplyControl = {0.75f, 0.f};  // {kControlMultiplier, kControlSkip}
const FVec kSkipControl = {0.f, 1.f};

TEST(CudaOps, StochasticRoundingIsTheCpus) {
  REQUIRE_GPU();
  auto cpu = make_cpu_backend();
  auto gpu = gpu_backend();
  std::mt19937 rng(32);
  // More than one pass of the grid-stride loop (4096 blocks x 256 threads x 4 elements), not a
  // multiple of 4 (a partial last group), and values of every kind: exact bf16 values, zeros,
  // subnormals, the largest floats (which may round up to inf), inf and NaN.
  const int64_t n = 4 * 4096 * 256 + 13;
  FVec x = randn(n, rng);
  for (int64_t i = 0; i < n; i += 97) x[i] *= 1e-39f;  // subnormal
  for (int64_t i = 5; i < n; i += 101) {               // exact bf16 values: the low 16 bits cleared
    uint32_t u;
    std::memcpy(&u, &x[i], 4);
    u &= 0xffff0000u;
    std::memcpy(&x[i], &u, 4);
  }
  x[1] = 0.f;
  x[2] = -0.f;
  x[3] = std::numeric_limits<float>::max();
  x[4] = -std::numeric_limits<float>::max();
  x[6] = std::numeric_limits<float>::infinity();
  x[7] = -std::numeric_limits<float>::infinity();
  x[8] = std::nanf("");
  // Three steps' keys (one beyond 32 bits); views at offset 0 and 1: offset 1 breaks the
  // 16-byte alignment of the GPU's vectorized path (element ids are the view's indices).
  const RngKey keys[] = {{17, 1, 0}, {17, 2, 0}, {0x1234'5678'9abcULL, (1ULL << 32) + 7, 5}};
  auto run = [&](Backend& be, const RngKey& key, int64_t offset) {
    DeviceBuffers d(be);
    const Tensor t = d.put(x, {n});
    be.stochastic_round(DType::bf16,
                        Tensor(t.f32() + offset, Shape{n - offset}, DType::f32, t.device()), key);
    return d.get(t);
  };
  for (const RngKey& key : keys)
    for (int64_t offset : {0, 1}) {
      SCOPED_TRACE(::testing::Message() << "step " << key.step << " offset " << offset);
      const FVec want = run(*cpu, key, offset), got = run(*gpu, key, offset);
      EXPECT_TRUE(identical(got, want));
      int64_t up = 0;  // rounded away from zero, which a fair coin does about half the time
      for (int64_t i = 0; i < n; ++i) up += std::abs(want[i]) > std::abs(x[i]);
      EXPECT_GT(up, n / 4);
      EXPECT_LT(up, 3 * n / 4);
    }
  DeviceBuffers d(*gpu);
  const Tensor t = d.put(x, {n});
  expect_error([&] { gpu->stochastic_round(DType::f16, t, keys[0]); }, "only bf16");
}

TEST(CudaOps, SgdMatchesTheCpuAndASkippedStepChangesNothing) {
  REQUIRE_GPU();
  auto cpu = make_cpu_backend();
  auto gpu = gpu_backend();
  std::mt19937 rng(33);
  const int64_t n = kFlatParams;
  const std::vector<int64_t>& ranges = kDecayRanges;
  const int64_t R = static_cast<int64_t>(ranges.size()) / 2;
  const FVec w0 = randn(n, rng);
  std::vector<FVec> grads;
  for (int s = 0; s < 3; ++s) grads.push_back(randn(n, rng, 0.1f, 0.01f * s));
  FVec bad = grads[0];
  bad[777] = std::numeric_limits<float>::infinity();
  struct Config {
    float momentum, dampening;
    bool nesterov;
  };
  // Every branch: no momentum; heavy ball with dampening; Nesterov.
  for (const Config c : {Config{0, 0, false}, Config{0.9f, 0.1f, false}, Config{0.9f, 0, true}}) {
    SCOPED_TRACE(::testing::Message() << "momentum " << c.momentum << " dampening " << c.dampening
                                      << " nesterov " << c.nesterov);
    const bool momentum = c.momentum > 0;
    // The weights and momentum after three steps, and after a fourth, skipped one.
    auto run = [&](Backend& be) {
      DeviceBuffers d(be);
      const Tensor w = d.put(w0, {n}), g = d.alloc({n});
      const Tensor buf = momentum ? d.put(FVec(n, -7.f), {n}) : Tensor();  // first step sets it
      const Tensor decay = d.put(ranges, {R, 2}), control = d.alloc({kControlSize});
      auto step = [&](const FVec& gv, const FVec& cv, int t) {
        d.set(g, gv);
        d.set(control, cv);
        SgdUpdate u{w, g, buf, decay, control};
        u.lr = 0.05f / static_cast<float>(t);
        u.momentum = c.momentum;
        u.dampening = c.dampening;
        u.weight_decay = 0.1f;
        u.nesterov = c.nesterov;
        u.first_step = t == 1;
        be.sgd_update(u);
      };
      for (int t = 1; t <= 3; ++t) step(grads[t - 1], kApplyControl, t);
      std::array<FVec, 2> after3{d.get(w), momentum ? d.get(buf) : FVec{}};
      step(bad, kSkipControl, 4);
      return std::make_pair(after3, std::array<FVec, 2>{d.get(w), momentum ? d.get(buf) : FVec{}});
    };
    const auto [want, want_after] = run(*cpu);
    const auto [got, got_after] = run(*gpu);
    // Float32 per element on both, in the same order; fused multiply-adds may differ in the last
    // bit.
    EXPECT_TRUE(near(got[0], want[0], 1e-6)) << "weights";
    EXPECT_TRUE(rel_near(got[1], want[1], 1e-6)) << "momentum buffer";
    // Decay on the wrong elements would show at lr * weight_decay = 5e-3 relative, far above
    // the bound; and the steps did move the weights.
    EXPECT_GT(rel_error(want[0].data(), w0.data(), n), 1e-3);
    EXPECT_TRUE(identical(want_after[0], want[0]));
    for (int i = 0; i < 2; ++i)
      EXPECT_TRUE(identical(got_after[i], got[i])) << "skipped step, " << i;
  }
}

// Parameter tensors within flat buffers, three untouched elements after each (an optimizer must
// not write outside its slots). `matrix`: two or more dimensions, as param_slots sets factored.
struct SlotShape {
  int64_t rows, cols;
  bool matrix, decay;
};
// Vectors, matrices whose sides are not multiples of 32 (wide, tall, more rows than the GPU's
// row kernels' grid, more elements than one pass of a grid-stride loop), and matrices of one row
// and of one column.
const std::initializer_list<SlotShape> kSlotShapes = {
    {1, 37, false, false},  {45, 77, true, true},    {129, 33, true, true},
    {1, 1000, false, true}, {5000, 40, true, false}, {1100, 1037, true, true},
    {2, 256, true, true},   {3, 1, true, false},     {1, 100, true, true},
    {1, 300, false, false}};
constexpr int64_t kSlotGap = 3;

std::vector<ParamSlot> slots_of(std::initializer_list<SlotShape> shapes, int64_t* n) {
  std::vector<ParamSlot> slots;
  *n = 0;
  for (const SlotShape& sh : shapes) {
    ParamSlot s;
    s.offset = *n;
    s.rows = sh.rows;
    s.cols = sh.cols;
    s.numel = sh.rows * sh.cols;
    s.factored = sh.matrix;
    s.decay = sh.decay;
    slots.push_back(s);
    *n += s.numel + kSlotGap;
  }
  return slots;
}

// Gradients for three steps with per-row and per-column scales, so that the factored statistics
// are far from uniform.
std::vector<FVec> slot_grads(const std::vector<ParamSlot>& slots, int64_t n, std::mt19937& rng) {
  std::vector<FVec> grads;
  for (int t = 0; t < 3; ++t) {
    FVec g = randn(n, rng, 0.01f);
    for (const ParamSlot& s : slots) {
      const FVec rs = randn(s.rows, rng), cs = randn(s.cols, rng);
      for (int64_t r = 0; r < s.rows; ++r)
        for (int64_t c = 0; c < s.cols; ++c)
          g[s.offset + r * s.cols + c] *= (1.f + std::abs(rs[r])) * (0.2f + std::abs(cs[c]));
    }
    grads.push_back(std::move(g));
  }
  return grads;
}

TEST(CudaOps, AdafactorMatchesTheCpuAndASkippedStepChangesNothing) {
  REQUIRE_GPU();
  auto cpu = make_cpu_backend();
  auto gpu = gpu_backend();
  std::mt19937 rng(34);
  int64_t n = 0;
  std::vector<ParamSlot> slots = slots_of(kSlotShapes, &n);
  int64_t state = 0;
  for (ParamSlot& s : slots) {
    s.state = state;
    state += s.factored ? s.rows + s.cols : s.numel;
  }
  const FVec w0 = randn(n, rng);
  const std::vector<FVec> grads = slot_grads(slots, n, rng);
  FVec bad = grads[0];
  bad[slots[1].offset + 5] = std::numeric_limits<float>::infinity();
  struct Config {
    bool scale_parameter;
    float beta1;  // < 0: no first moment
    float clip_threshold, weight_decay;
  };
  // transformers' Trainer default (no first moment, no scaling), and every option on with a
  // clip threshold that clips.
  for (const Config c : {Config{false, -1, 1.0f, 0}, Config{true, 0.9f, 0.5f, 0.01f}}) {
    SCOPED_TRACE(::testing::Message()
                 << "scale_parameter " << c.scale_parameter << " beta1 " << c.beta1);
    const bool first_moment = c.beta1 >= 0;
    auto run = [&](Backend& be) {
      DeviceBuffers d(be);
      if (be.device() == kGpu) d.workspace(1);  // the backend's reduction scratch
      const Tensor w = d.put(w0, {n}), g = d.alloc({n});
      const Tensor v = d.put(FVec(state, 0.f), {state});
      const Tensor m = first_moment ? d.put(FVec(n, 0.f), {n}) : Tensor();
      const Tensor control = d.alloc({kControlSize});
      auto step = [&](const FVec& gv, const FVec& cv, int t) {
        d.set(g, gv);
        d.set(control, cv);
        AdafactorUpdate u;
        u.weights = w;
        u.grads = g;
        u.second_moment = v;
        u.exp_avg = m;
        u.control = control;
        u.slots = &slots;
        u.step_size = 1e-2f;
        u.beta2t = static_cast<float>(1.0 - std::pow(double(t), -0.8));  // 0 on the first step
        u.clip_threshold = c.clip_threshold;
        u.beta1 = std::max(c.beta1, 0.f);
        u.weight_decay = c.weight_decay;
        u.scale_parameter = c.scale_parameter;
        be.adafactor_update(u);
      };
      for (int t = 1; t <= 3; ++t) step(grads[t - 1], kApplyControl, t);
      std::array<FVec, 3> after3{d.get(w), d.get(v), first_moment ? d.get(m) : FVec{}};
      step(bad, kSkipControl, 4);
      return std::make_pair(
          after3, std::array<FVec, 3>{d.get(w), d.get(v), first_moment ? d.get(m) : FVec{}});
    };
    const auto [want, want_after] = run(*cpu);
    const auto [got, got_after] = run(*gpu);
    // Float32 per element, but the sums (the statistics' means, the row mean, the update's and
    // the weights' RMS) are double reductions in another order (blocks, atomics), which moves
    // the float results they feed by an ulp or so: 1e-5 leaves a wide margin.
    EXPECT_TRUE(near(got[0], want[0], 1e-5)) << "weights";
    EXPECT_TRUE(each_rel_near(got[1], want[1], 1e-5)) << "second-moment statistics";
    EXPECT_TRUE(rel_near(got[2], want[2], 1e-5)) << "exp_avg";
    EXPECT_GT(rel_error(want[0].data(), w0.data(), n), 1e-4);  // the steps did something
    // The gaps between slots are not parameters: untouched.
    for (const ParamSlot& s : slots)
      for (int64_t i = s.offset + s.numel; i < s.offset + s.numel + kSlotGap; ++i)
        EXPECT_EQ(got[0][i], w0[i]) << "element " << i << " after a slot";
    for (int i = 0; i < 3; ++i)
      EXPECT_TRUE(identical(got_after[i], got[i])) << "skipped step, " << i;
  }
  // The reductions need the backend's planned scratch.
  DeviceBuffers d(*gpu);
  AdafactorUpdate u;
  u.weights = d.put(w0, {n});
  u.grads = d.put(grads[0], {n});
  u.second_moment = d.alloc({state});
  u.control = d.put(kApplyControl, {kControlSize});
  u.slots = &slots;
  auto fresh = gpu_backend();  // no plan_workspace yet
  expect_error([&] { fresh->adafactor_update(u); }, "plan_workspace");
}

TEST(CudaOps, AdamW8bitMatchesTheCpuAndASkippedStepChangesNothing) {
  REQUIRE_GPU();
  auto cpu = make_cpu_backend();
  auto gpu = gpu_backend();
  std::mt19937 rng(35);
  int64_t n = 0;
  std::vector<ParamSlot> slots = slots_of(kSlotShapes, &n);
  // 8-bit state for the matrices (45x77: 13 full blocks and 137 values; 2x256: exactly two
  // blocks; 1x100: less than one; 3x1) and the 1000-element vector; 32-bit for the rest.
  const std::vector<bool> eight_bit = {false, true, true, true, true,
                                       true,  true, true, true, false};
  ASSERT_EQ(slots.size(), eight_bit.size());
  const QuantizedStateSizes sizes = place_8bit_state(slots, eight_bit);
  const int64_t n8 = sizes.values8, n32 = sizes.values32, blocks = sizes.blocks;
  const auto qs = dynamic_quant_map(true), qu = dynamic_quant_map(false);
  const FVec qmaps = [&] {
    FVec q(qs.begin(), qs.end());
    q.insert(q.end(), qu.begin(), qu.end());
    return q;
  }();
  const std::vector<FVec> grads = slot_grads(slots, n, rng);
  FVec bad = grads[0];
  bad[slots[1].offset + 5] = std::numeric_limits<float>::infinity();
  struct State {
    FVec w, m32, v32, absmax1, absmax2;
    std::vector<uint8_t> codes1, codes2;
  };
  // One step on `be` from `s`, as the optimizer calls it.
  auto step = [&](Backend& be, const State& s, const FVec& gv, const FVec& cv, int64_t t) {
    DeviceBuffers d(be);
    const Tensor q = d.put(qmaps, {2, 256});
    AdamW8bitUpdate u;
    u.weights = d.put(s.w, {n});
    u.grads = d.put(gv, {n});
    u.control = d.put(cv, {kControlSize});
    u.exp_avg32 = d.put(s.m32, {n32});
    u.exp_avg_sq32 = d.put(s.v32, {n32});
    u.exp_avg8 = d.put(s.codes1, {n8}, DType::u8);
    u.exp_avg_sq8 = d.put(s.codes2, {n8}, DType::u8);
    u.absmax1 = d.put(s.absmax1, {blocks});
    u.absmax2 = d.put(s.absmax2, {blocks});
    u.qmap_signed = Tensor(q.f32(), Shape{256}, DType::f32, q.device());
    u.qmap_unsigned = Tensor(q.f32() + 256, Shape{256}, DType::f32, q.device());
    u.slots = &slots;
    u.lr = 1e-3f;
    u.beta1 = 0.9f;
    u.beta2 = 0.95f;
    u.eps = 1e-8f;
    u.weight_decay = 0.1f;
    u.step = t;
    be.adamw_8bit_update(u);
    return State{d.get(u.weights),
                 d.get(u.exp_avg32),
                 d.get(u.exp_avg_sq32),
                 d.get(u.absmax1),
                 d.get(u.absmax2),
                 d.get<uint8_t>(u.exp_avg8),
                 d.get<uint8_t>(u.exp_avg_sq8)};
  };
  // Positions where two code vectors agree, at least 99.9%: a moment that falls (almost) exactly
  // between two map values may round either way, since the GPU may fuse a multiply-add the CPU
  // rounds twice (or the reverse).
  auto mostly_equal = [](const std::vector<uint8_t>& got, const std::vector<uint8_t>& want) {
    size_t differ = 0;
    for (size_t i = 0; i < got.size(); ++i) differ += got[i] != want[i];
    if (got.size() == want.size() && differ * 1000 <= got.size())
      return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << differ << " of " << got.size() << " codes differ";
  };
  // The reset state (zero maxima dequantize every code to zero), then three steps. Each step
  // starts both backends from the CPU's state, so that a code rounded the other way (above)
  // is not carried into later steps, where its dequantized moment would differ by a whole
  // quantization step.
  State s{randn(n, rng),
          FVec(n32, 0.f),
          FVec(n32, 0.f),
          FVec(blocks, 0.f),
          FVec(blocks, 0.f),
          std::vector<uint8_t>(n8, 0),
          std::vector<uint8_t>(n8, 0)};
  const FVec w0 = s.w;
  for (int64_t t = 1; t <= 3; ++t) {
    SCOPED_TRACE(::testing::Message() << "step " << t);
    const State want = step(*cpu, s, grads[t - 1], kApplyControl, t);
    const State got = step(*gpu, s, grads[t - 1], kApplyControl, t);
    EXPECT_TRUE(near(got.w, want.w, 1e-5)) << "weights";
    EXPECT_TRUE(rel_near(got.m32, want.m32, 1e-6)) << "exp_avg (32-bit)";
    EXPECT_TRUE(rel_near(got.v32, want.v32, 1e-6)) << "exp_avg_sq (32-bit)";
    EXPECT_TRUE(each_rel_near(got.absmax1, want.absmax1, 1e-6)) << "exp_avg absmax";
    EXPECT_TRUE(each_rel_near(got.absmax2, want.absmax2, 1e-6)) << "exp_avg_sq absmax";
    EXPECT_TRUE(mostly_equal(got.codes1, want.codes1)) << "exp_avg codes";
    EXPECT_TRUE(mostly_equal(got.codes2, want.codes2)) << "exp_avg_sq codes";
    for (const ParamSlot& sl : slots)
      for (int64_t i = sl.offset + sl.numel; i < sl.offset + sl.numel + kSlotGap; ++i)
        EXPECT_EQ(got.w[i], s.w[i]) << "element " << i << " after a slot";
    s = want;
  }
  EXPECT_GT(rel_error(s.w.data(), w0.data(), n), 1e-4);  // the steps did something
  const State after = step(*gpu, s, bad, kSkipControl, 4);
  EXPECT_TRUE(identical(after.w, s.w));
  EXPECT_TRUE(identical(after.m32, s.m32));
  EXPECT_TRUE(identical(after.v32, s.v32));
  EXPECT_TRUE(identical(after.absmax1, s.absmax1));
  EXPECT_TRUE(identical(after.absmax2, s.absmax2));
  EXPECT_TRUE(identical(after.codes1, s.codes1));
  EXPECT_TRUE(identical(after.codes2, s.codes2));
}

// =============================================================================================
// Whole models: the fixtures on the GPU against the CPU backend
// =============================================================================================

struct ModelRun {
  FVec logits;  // of an evaluation pass (a training pass overwrites them with their gradient)
  double eval_loss = 0, loss = 0;
  FVec grads;
  std::vector<ParamInfo> params;
};

ModelRun run_model(const std::string& name, Device device, DType act, bool dropout) {
  // The matmul type follows the activations, as the trainer sets it for bf16.
  LoadedModel m(fixture(name), {false, act, device}, dropout, act);
  // The compute weights of mixed precision are rounded (MixedPrecision does it in training), so
  // both backends multiply the same values.
  if (act != DType::f32) m.be->round_to(act, m.model->params().flat_weights());
  ModelRun r;
  StepOptions eval;
  eval.training = false;
  eval.compute_grad = false;
  const int64_t targets = m.model->count_targets();
  r.eval_loss = m.model->forward(*m.be, eval) / targets;
  r.logits = to_host(*m.be, m.model->logits());
  r.loss = m.step(dropout);  // with dropout on: the masks are the same on both backends
  r.grads = m.grads();
  r.params = m.model->params().list();
  return r;
}

// Per parameter, gradients are compared relative to their own norm but never to less than
// `floor_fraction` of the whole gradient's norm: the key biases' exact gradient is zero (softmax
// ignores a constant added to a row of scores), so theirs is rounding noise of either backend.
void compare_models(const std::string& name, DType act, bool dropout, double tol_loss,
                    double tol_logits, double tol_grads, double tol_param, double floor_fraction) {
  SCOPED_TRACE(::testing::Message() << name << " " << dtype_name(act) << " dropout=" << dropout);
  const ModelRun want = run_model(name, Device::cpu, act, dropout);
  const ModelRun got = run_model(name, kGpu, act, dropout);
  EXPECT_NEAR(got.eval_loss, want.eval_loss, tol_loss * std::abs(want.eval_loss));
  EXPECT_NEAR(got.loss, want.loss, tol_loss * std::abs(want.loss));
  EXPECT_TRUE(rel_near(got.logits, want.logits, tol_logits)) << "logits";
  EXPECT_TRUE(rel_near(got.grads, want.grads, tol_grads)) << "all gradients";
  const double floor =
      floor_fraction *
      std::sqrt(std::inner_product(want.grads.begin(), want.grads.end(), want.grads.begin(), 0.0));
  ASSERT_EQ(got.params.size(), want.params.size());
  for (const ParamInfo& p : want.params) {
    const int64_t n = p.shape.numel();
    const FVec g(got.grads.begin() + p.offset, got.grads.begin() + p.offset + n);
    const FVec w(want.grads.begin() + p.offset, want.grads.begin() + p.offset + n);
    EXPECT_TRUE(rel_near(g, w, tol_param, floor)) << "gradient of " << p.name;
  }
}

// Float32: as close as the CPU is to PyTorch (test_models.cpp), with dropout off and on (the
// masks come from the same counter-based generator on both backends).
TEST(CudaModels, BertMatchesTheCpuBackendInFp32) {
  REQUIRE_GPU();
  for (bool dropout : {false, true})
    compare_models("bert_tiny", DType::f32, dropout, 1e-4, 1e-4, 1e-5, 1e-4, 1e-3);
}

TEST(CudaModels, Gpt2MatchesTheCpuBackendInFp32) {
  REQUIRE_GPU();
  for (bool dropout : {false, true})
    compare_models("gpt2_tiny", DType::f32, dropout, 1e-4, 1e-4, 1e-5, 1e-4, 1e-3);
}

// bf16 activations and products: both sides round to 8 mantissa bits, but at different places
// (the CPU keeps attention probabilities in bf16, the GPU a float32 log-sum-exp), so results
// differ as two bf16 implementations do. On these fixtures the CPU's bf16 runs differ from its
// float32 runs by at most: loss 2.4e-3, logits 8e-3, all gradients 1.9e-2, one parameter 2.8e-2
// (floor 2% of the whole gradient's norm); the bounds here leave a factor of about 3 over that.
TEST(CudaModels, Bf16StaysCloseToTheCpuBackend) {
  REQUIRE_GPU();
  for (const char* name : {"bert_tiny", "gpt2_tiny"})
    for (bool dropout : {false, true})
      compare_models(name, DType::bf16, dropout, 1e-2, 3e-2, 5e-2, 8e-2, 2e-2);
}

// =============================================================================================
// The trainer on the GPU: the equivalences test_trainer.cpp and test_precision.cpp check on the
// CPU. Bit-identity becomes closeness: the GPU's embedding gradients, loss sum and gradient norm
// are summed with atomics, in an order that changes from run to run.
// =============================================================================================

namespace fs = std::filesystem;

TrainOptions gpu_options(const std::string& model, const std::string& out) {
  return tiny_options(model, out, kGpuOption);
}

struct Result {
  TrainSummary summary;
  std::vector<nlohmann::json> logs;
  std::vector<double> losses;
};

Result run(const TrainOptions& o, const Dataset* data = nullptr, FaultHooks faults = {}) {
  Result r;
  r.summary = train(
      o,
      [&](const nlohmann::json& j) {
        if (!j.contains("loss")) return;  // records other than step logs
        r.logs.push_back(j);
        r.losses.push_back(j["loss"]);
      },
      data, faults);
  if (o.device == kGpuOption)  // a GPU run ran on the GPU (reference runs ask for the CPU)
    EXPECT_EQ(r.summary.device.rfind("cuda", 0), 0u) << "the run was on " << r.summary.device;
  return r;
}

void expect_losses_near(const std::vector<double>& got, const std::vector<double>& want, double tol,
                        const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i], want[i], tol * std::abs(want[i])) << what << ", step " << i + 1;
}

// Every weight of a checkpoint but the key biases. Their exact gradient is zero (softmax ignores
// a constant added to a row of scores), so they only receive rounding noise, which differs with
// every summation order and which Adam turns into steps near the learning rate however small it
// is; they change no output.
FVec weights_of(const std::string& checkpoint) {
  SafetensorsFile f(checkpoint + "/model.safetensors");
  FVec all;
  for (const auto& name : f.names()) {
    const Tensor& t = f.get(name);
    const float* p = t.f32();
    const int64_t n = t.numel();
    if (name.ends_with("attention.self.key.bias")) continue;  // BERT
    if (name.ends_with("attn.c_attn.bias")) {                 // GPT-2: query | key | value
      all.insert(all.end(), p, p + n / 3);
      all.insert(all.end(), p + 2 * n / 3, p + n);
      continue;
    }
    all.insert(all.end(), p, p + n);
  }
  return all;
}

double rel(const FVec& a, const FVec& b) {
  EXPECT_EQ(a.size(), b.size());
  return rel_error(a.data(), b.data(), static_cast<int64_t>(std::min(a.size(), b.size())));
}

// A float32 tensor of a safetensors file, as a vector.
FVec tensor_of(const std::string& file, const std::string& name) {
  SafetensorsFile f(file);
  const Tensor& t = f.get(name);
  return FVec(t.f32(), t.f32() + t.numel());
}

TEST(CudaTrainer, AccumulationEqualsTheLargeBatch) {
  REQUIRE_GPU();
  TempDir dir("accum");
  for (const std::string type : {"bert", "gpt2"}) {
    const std::string model = write_config(dir, type, 0.0);
    UnequalLengths lm_data;
    const Dataset* data = type == "gpt2" ? &lm_data : nullptr;
    TrainOptions big = gpu_options(model, dir / (type + "_big"));
    TrainOptions small = big;
    small.output_dir = dir / (type + "_small");
    small.per_device_train_batch_size = 1;
    small.gradient_accumulation_steps = 4;
    const Result a = run(big, data), b = run(small, data);
    // Summation order differs (other product shapes), as on the CPU: within rounding.
    expect_losses_near(b.losses, a.losses, 1e-5, type);
    EXPECT_LE(rel(weights_of(b.summary.last_checkpoint), weights_of(a.summary.last_checkpoint)),
              1e-5)
        << type;
    // The weights did move: the comparison is not between two untouched initializations.
    TrainOptions none = big;
    none.max_steps = 1;
    none.learning_rate = 0;
    none.output_dir = dir / (type + "_none");
    EXPECT_GT(rel(weights_of(a.summary.last_checkpoint),
                  weights_of(run(none, data).summary.last_checkpoint)),
              1e-3)
        << type;
  }
}

TEST(CudaTrainer, GradientCheckpointingChangesMemoryNotResults) {
  REQUIRE_GPU();
  TempDir dir("ckpt");
  for (const std::string type : {"bert", "gpt2"})
    for (bool bf16 : {false, true}) {
      const std::string tag = type + (bf16 ? "_bf16" : "_fp32");
      TrainOptions plain = gpu_options(write_config(dir, type, 0.1), dir / (tag + "_plain"));
      plain.bf16 = bf16;
      TrainOptions ckpt = plain;
      ckpt.output_dir = dir / (tag + "_ckpt");
      ckpt.gradient_checkpointing = true;
      const Result a = run(plain), b = run(ckpt);
      // The recomputation is exact; only the atomics' order differs. In bf16 a weight whose
      // float32 master lies at a rounding midpoint may round the other way, moving by one bf16
      // step (4e-3 of itself), hence the looser bound there.
      const double tol = bf16 ? 1e-4 : 1e-5;
      expect_losses_near(b.losses, a.losses, tol, tag);
      EXPECT_LE(rel(weights_of(b.summary.last_checkpoint), weights_of(a.summary.last_checkpoint)),
                tol)
          << tag;
      const int act = static_cast<int>(Category::activations);
      EXPECT_LT(b.summary.memory.planned[act], a.summary.memory.planned[act]) << tag;
    }
}

TEST(CudaTrainer, Fp16OverflowSkipsExactlyThatStepAndChangesNothing) {
  REQUIRE_GPU();
  TempDir dir("overflow");
  TrainOptions o = gpu_options(write_config(dir, "gpt2", 0.0), dir / "out");
  o.synthetic_task = "learnable";
  o.seq_len = 16;
  o.dataset_size = 128;
  o.per_device_train_batch_size = 8;
  o.max_steps = 6;
  o.fp16 = true;  // fp16 products on the GPU
  o.save_steps = 1;
  FaultHooks faults;
  faults.overflow_at_step = 3;  // the fourth step
  const Result r = run(o, nullptr, faults);
  ASSERT_EQ(r.logs.size(), 6u);
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(r.logs[i]["skipped"].get<bool>(), i == 3) << "step " << i + 1;
    EXPECT_EQ(r.logs[i]["loss_scale"].get<double>(), i <= 3 ? 65536.0 : 32768.0) << i + 1;
  }
  // Five updates were made; the skipped step left the learning-rate schedule where it was.
  SafetensorsFile opt(r.summary.last_checkpoint + "/optimizer.safetensors");
  EXPECT_EQ(opt.get("step").as<int64_t>()[0], 5);
  EXPECT_EQ(r.logs[3]["learning_rate"], r.logs[4]["learning_rate"]);
  // The skipped step changed nothing: checkpoint 4 holds checkpoint 3's master weights and
  // moments bit for bit, and the next step did move them.
  const std::string c3 = o.output_dir + "/checkpoint-3", c4 = o.output_dir + "/checkpoint-4",
                    c5 = o.output_dir + "/checkpoint-5";
  {
    SafetensorsFile a(c3 + "/model.safetensors"), b(c4 + "/model.safetensors");
    ASSERT_EQ(a.names(), b.names());
    for (const auto& name : a.names()) {
      const Tensor &x = a.get(name), &y = b.get(name);
      EXPECT_TRUE(identical(FVec(y.f32(), y.f32() + y.numel()), FVec(x.f32(), x.f32() + x.numel())))
          << name;
    }
  }
  for (const char* moment : {"exp_avg", "exp_avg_sq"})
    EXPECT_TRUE(identical(tensor_of(c4 + "/optimizer.safetensors", moment),
                          tensor_of(c3 + "/optimizer.safetensors", moment)))
        << moment;
  EXPECT_GT(rel(weights_of(c5), weights_of(c4)), 1e-5);
}

TEST(CudaTrainer, ResumeEqualsTheUninterruptedRun) {
  REQUIRE_GPU();
  TempDir dir("resume");
  for (const std::string type : {"bert", "gpt2", "gpt2_fp16"}) {
    const std::string arch = type.substr(0, 4);
    TrainOptions straight = gpu_options(write_config(dir, arch, 0.1), dir / (type + "_straight"));
    straight.fp16 = type == "gpt2_fp16";
    straight.max_steps = 6;
    straight.save_steps = 3;
    straight.gradient_accumulation_steps = 2;
    straight.dataloader_num_workers = 1;
    const Result a = run(straight);
    TrainOptions resumed = straight;
    resumed.output_dir = dir / (type + "_resumed");
    resumed.resume_from_checkpoint = straight.output_dir + "/checkpoint-3";
    resumed.seed = 1234;  // the checkpoint's seed wins
    const Result b = run(resumed);
    ASSERT_EQ(a.losses.size(), 6u);
    ASSERT_EQ(b.losses.size(), 3u);
    // As in GradientCheckpointingChangesMemoryNotResults: fp16 compute weights may round the
    // other way at a midpoint.
    const double tol = straight.fp16 ? 1e-4 : 1e-5;
    expect_losses_near(b.losses, std::vector<double>(a.losses.begin() + 3, a.losses.end()), tol,
                       type);
    EXPECT_LE(rel(weights_of(b.summary.last_checkpoint), weights_of(a.summary.last_checkpoint)),
              tol)
        << type;
  }
}

// Each optimizer (and bf16 weights without a master copy) trains on the GPU as on the CPU, and
// a GPU run resumed from a checkpoint continues as the uninterrupted one. Tolerances: the first
// steps agree to summation order (1e-5, as above); Adam-type updates of weights with near-zero
// gradients then differ by up to the learning rate (see weights_of), and an 8-bit moment near a
// midpoint between two codes may pick the other one, so four steps on: 1e-3 of the loss.
// Adafactor's GPU sums use double atomics (not bit-reproducible), hence 1e-4 for resume.
TEST(CudaTrainer, EveryOptimizerFollowsTheCpuAndResumes) {
  REQUIRE_GPU();
  TempDir dir("optim");
  const std::string model = write_config(dir, "gpt2", 0.1);
  struct Case {
    std::string optim, args;
    double lr;
    bool bf16_direct;
  };
  for (const Case& c : {Case{"adafactor", "beta1=0.9", 1e-2, false},
                        Case{"adamw_8bit", "min_8bit_size=256", 3e-3, false},
                        Case{"sgd", "momentum=0.9,nesterov=true", 0.1, false},
                        Case{"adamw_torch", "", 3e-3, true}}) {
    const std::string tag = c.optim + (c.bf16_direct ? "_bf16_direct" : "");
    TrainOptions gpu = gpu_options(model, dir / (tag + "_gpu"));
    gpu.optim = c.optim;
    gpu.optim_args = c.args;
    gpu.learning_rate = c.lr;
    gpu.weight_decay = 0.01;
    gpu.bf16 = c.bf16_direct;
    gpu.bf16_master_weights = !c.bf16_direct;
    gpu.max_steps = 6;
    gpu.save_steps = 3;
    TrainOptions cpu = gpu;
    cpu.device = "cpu";
    cpu.output_dir = dir / (tag + "_cpu");
    const Result g = run(gpu), h = run(cpu);
    // bf16 without master weights rounds stochastically with the same random words on both
    // devices, but a weight within float32 noise of a rounding threshold may land apart by one
    // bf16 step: a looser bound there.
    const double tol = c.bf16_direct ? 1e-2 : 1e-3;
    expect_losses_near(g.losses, h.losses, tol, tag);
    TrainOptions resumed = gpu;
    resumed.output_dir = dir / (tag + "_resumed");
    resumed.resume_from_checkpoint = gpu.output_dir + "/checkpoint-3";
    const Result r = run(resumed);
    expect_losses_near(r.losses, std::vector<double>(g.losses.begin() + 3, g.losses.end()), 1e-4,
                       tag + " resumed");
    EXPECT_LE(rel(weights_of(r.summary.last_checkpoint), weights_of(g.summary.last_checkpoint)),
              1e-4)
        << tag;
  }
}

// =============================================================================================
// Memory: the plan accounts for the GPU's memory
// =============================================================================================

// Every planned buffer is handed out, in each block exactly up to its last buffer's end, with
// and without checkpointing, in float32 and bf16.
TEST(CudaMemory, TheArenaHandsOutExactlyThePlannedBuffers) {
  REQUIRE_GPU();
  for (const char* name : {"bert_tiny", "gpt2_tiny"})
    for (DType act : {DType::f32, DType::bf16})
      for (bool checkpointing : {false, true}) {
        SCOPED_TRACE(::testing::Message()
                     << name << " " << dtype_name(act) << " checkpointing=" << checkpointing);
        LoadedModel m(fixture(name), {checkpointing, act, kGpu}, /*dropout=*/true, act);
        m.step(true);
        std::array<size_t, kNumPlacements> end{};
        for (const auto& b : m.plan.buffers())
          end[static_cast<int>(b.placement)] = b.offset + b.bytes;
        EXPECT_EQ(m.arena->high_water(Placement::device), end[0]);
        EXPECT_EQ(m.arena->high_water(Placement::host), end[1]);
        // On a GPU run the host block holds only what the host writes: the batch, the step
        // statistics' host copy.
        for (const auto& b : m.plan.buffers()) {
          if (b.placement == Placement::host) {
            EXPECT_TRUE(b.category == Category::data || b.name == "step_stats.host") << b.name;
          }
        }
      }
}

// Selective recomputation on the GPU (the log-sum-exp rows rebuilt per block) trains as keeping
// everything does, within the GPU's run-to-run rounding.
TEST(CudaTrainer, SelectiveRecomputationChangesMemoryNotResults) {
  REQUIRE_GPU();
  TempDir dir("selective");
  for (bool bf16 : {false, true}) {
    TrainOptions o = gpu_options(write_config(dir, "bert", 0.1), dir / "plain");
    o.bf16 = bf16;
    const Result plain = run(o);
    o.output_dir = dir / "selective";
    o.selective_recompute = true;
    const Result selective = run(o);
    expect_losses_near(selective.losses, plain.losses, 1e-5, bf16 ? "bf16" : "fp32");
    const int act = static_cast<int>(Category::activations);
    EXPECT_LT(selective.summary.memory.planned[act], plain.summary.memory.planned[act]);
  }
}

// dataloader_pin_memory picks the staging block: page-locked, or ordinary host memory; a run
// trains the same either way.
TEST(CudaMemory, PinMemoryChoosesTheStagingMemory) {
  REQUIRE_GPU();
  auto gpu = gpu_backend();
  MemoryPlan plan;
  [[maybe_unused]] const BufferId id =
      plan.add("staged", Category::data, DType::i32, Shape{1024}, Placement::host);
  plan.finalize();
#if defined(BRISK_HAVE_CUDA)  // the CUDA runtime's view of the staging block
  for (bool pinned : {true, false}) {
    Arena arena(plan, gpu->device_memory(), gpu->staging_memory(pinned));
    cudaPointerAttributes attr{};
    ASSERT_EQ(cudaPointerGetAttributes(&attr, arena.tensor(id).data()), cudaSuccess);
    EXPECT_EQ(attr.type == cudaMemoryTypeHost, pinned) << "pinned " << pinned;
    cudaGetLastError();
  }
#endif
  TempDir dir("pin");
  TrainOptions o = gpu_options("gpt2-tiny", dir / "pinned");
  const Result pinned = run(o);
  o.output_dir = dir / "pageable";
  o.dataloader_pin_memory = false;
  const Result pageable = run(o);
  // Two GPU runs differ in the last bits (the embedding gradients' atomics), not more.
  expect_losses_near(pageable.losses, pinned.losses, 1e-5, "pageable vs pinned staging");
}

// What `brisk estimate --device cuda` plans without a GPU is what the GPU run allocates.
TEST(CudaMemory, PlanningWithoutTheBackendEqualsTheGpuRunsPlan) {
  REQUIRE_GPU();
  TempDir dir("estimate");
  for (const char* model : {"bert-tiny", "gpt2-tiny"})
    for (int variant = 0; variant < 3; ++variant) {
      SCOPED_TRACE(std::string(model) + " variant " + std::to_string(variant));
      TrainOptions o = gpu_options(model, dir / "out");
      o.max_steps = 1;
      o.bf16 = variant == 1;
      o.fp16 = variant == 2;
      o.gradient_checkpointing = variant == 2;
      if (variant == 2) o.optim = "adafactor";
      Result r;
      try {
        r = run(o);
      } catch (const Error& e) {
        ADD_FAILURE() << e.what();
        continue;
      }
      const auto planned = assemble_run(o, Device::cuda, nullptr)->plan.bytes_by_category();
      EXPECT_EQ(planned, r.summary.memory.planned);
    }
}

// The GPU memory the driver reports grows by the arena and little else.
TEST(CudaMemory, DeviceMemoryGrowsByTheArena) {
  REQUIRE_GPU();
  TempDir dir("memory");
  for (bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "bf16" : "fp32");
    TrainOptions o = gpu_options("bert-tiny", dir / (bf16 ? "bf16" : "fp32"));
    o.seq_len = 128;
    o.per_device_train_batch_size = 8;
    o.dataset_size = 16;
    o.max_steps = 2;
    o.bf16 = bf16;
    const Result r = run(o);
    const MemoryReport& m = r.summary.memory;
    if (m.device_memory_before_arena < 0 || m.device_memory_used < 0)
      GTEST_SKIP() << "the driver reports no memory figure (NVML could not be loaded)";
    size_t planned = 0;
    for (size_t b : m.planned) planned += b;
    EXPECT_GE(m.arena_bytes, planned);
    EXPECT_LE(m.arena_bytes - planned, 64 * 1024u);
    // arena_bytes also counts the pinned host block, which holds only the batch (category data)
    // and 16 bytes of statistics: the device block lies between these two bounds.
    const size_t data = m.planned[static_cast<int>(Category::data)];
    const int64_t device_hi = static_cast<int64_t>(m.arena_bytes);
    const int64_t device_lo = static_cast<int64_t>(m.arena_bytes - data) - 64 * 1024;
    // The figure is the whole GPU's: run this test alone on its GPU (ctest runs tests one at a
    // time unless -j is given).
    const int64_t growth = m.device_memory_used - m.device_memory_before_arena;
    // Stated margin: 64 MiB + 5% of the plan, for what the first steps add besides the arena:
    // CUDA's lazy loading of the kernels brisk and cuBLASLt launch (module code and constants),
    // cuBLASLt's own state on its first products, the driver's 2 MiB allocation granularity,
    // and a growth of the per-thread local memory reservation should a kernel need more than
    // the default. The arena holds the cuBLASLt workspace, so no product allocates.
    const int64_t margin = (64 << 20) + static_cast<int64_t>(planned / 20);
    // At least the device block, less a 2 MiB chunk the driver may have committed already.
    EXPECT_GE(growth, device_lo - (2 << 20)) << "device block at least " << device_lo;
    EXPECT_LE(growth, device_hi + margin) << "device block at most " << device_hi;
  }
}

}  // namespace
}  // namespace brisk::testing
