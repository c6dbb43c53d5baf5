// What the backend tests share: skipping without a GPU, random inputs, buffers in any backend's
// memory with host data in and out, and comparisons that name the worst element.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#if defined(BRISK_HAVE_CUDA)
#include <cuda_runtime.h>
#endif

#include "backend/backend.h"
#include "core/dtype.h"
#include "core/error.h"
#include "test_support.h"

namespace brisk::testing {
// The first statement of every test that needs a GPU: skips the test, saying why, where no GPU can
// run it (none present, no driver, or a brisk built without CUDA).
#define REQUIRE_GPU()                                                                  \
  do {                                                                                 \
    std::string why_no_gpu;                                                            \
    if (!cuda_available(&why_no_gpu)) GTEST_SKIP() << "no usable GPU: " << why_no_gpu; \
  } while (false)

using FVec = std::vector<float>;
using IVec = std::vector<int32_t>;

inline FVec randn(int64_t n, std::mt19937& rng, float scale = 1.f, float shift = 0.f) {
  std::normal_distribution<float> dist(0.f, 1.f);
  FVec v(static_cast<size_t>(n));
  for (float& x : v) x = shift + scale * dist(rng);
  return v;
}

// n ints uniform in [lo, hi).
inline IVec randint(int64_t n, int32_t lo, int32_t hi, std::mt19937& rng) {
  std::uniform_int_distribution<int32_t> dist(lo, hi - 1);
  IVec v(static_cast<size_t>(n));
  for (int32_t& x : v) x = dist(rng);
  return v;
}

// v rounded to `dtype` by the CPU backend's round_to: values both backends hold exactly in any
// of the 16-bit operand types.
inline FVec rounded(FVec v, DType dtype) {
  if (dtype != DType::f32)
    make_cpu_backend()->round_to(
        dtype, Tensor(v.data(), Shape{static_cast<int64_t>(v.size())}, DType::f32));
  return v;
}

// Element by element: |got - want| <= tol * max(1, |want|); names the worst element.
inline ::testing::AssertionResult near(const FVec& got, const FVec& want, double tol) {
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
inline ::testing::AssertionResult rel_near(const FVec& got, const FVec& want, double tol,
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
  // Values held as doubles (an op case's inputs) stored as `dtype`: f32, f64, i32, i64 or u8.
  Tensor put_as(const std::vector<double>& values, Shape shape, DType dtype = DType::f32) {
    switch (dtype) {
      case DType::f32:
        return put(std::vector<float>(values.begin(), values.end()), shape);
      case DType::f64:
        return put(values, shape);
      case DType::i32:
        return put(std::vector<int32_t>(values.begin(), values.end()), shape);
      case DType::i64:
        return put(std::vector<int64_t>(values.begin(), values.end()), shape);
      case DType::u8:
        return put(std::vector<uint8_t>(values.begin(), values.end()), shape, DType::u8);
      default:
        BRISK_CHECK(false, "DeviceBuffers::put_as: no ", dtype_name(dtype));
    }
    return Tensor();
  }
  // t's elements as doubles: f32, f64, i32, i64 and u8 exactly; 16-bit types as bit patterns.
  std::vector<double> values(const Tensor& t) {
    switch (t.dtype()) {
      case DType::f32:
        return widen(get<float>(t));
      case DType::f64:
        return get<double>(t);
      case DType::i32:
        return widen(get<int32_t>(t));
      case DType::i64:
        return widen(get<int64_t>(t));
      case DType::u8:
        return widen(get<uint8_t>(t));
      default:
        return widen(get<uint16_t>(t));
    }
  }
  // `key` drawing the same numbers with `held` of its step in this backend's memory, as a
  // recorded step's keys hold it (RngKey::step_offset).
  RngKey hold_step(RngKey key, uint64_t held) {
    BRISK_CHECK(held <= key.step, "DeviceBuffers::hold_step: more than the key's step");
    const Tensor word = put(std::vector<int64_t>{static_cast<int64_t>(held)}, {1});
    key.step -= held;
    key.step_offset = static_cast<const uint64_t*>(word.data());
    return key;
  }
  // A float32 or 16-bit floating-point tensor's values, as floats.
  FVec floats(const Tensor& t) {
    if (t.dtype() == DType::f32) return get<float>(t);
    BRISK_CHECK(t.dtype() == DType::bf16 || t.dtype() == DType::f16,
                "DeviceBuffers::floats: ", dtype_name(t.dtype()));
    const std::vector<uint16_t> bits = get<uint16_t>(t);
    FVec v(bits.size());
    for (size_t i = 0; i < bits.size(); ++i)
      v[i] = t.dtype() == DType::bf16 ? bf16_to_float(bits[i]) : fp16_to_float(bits[i]);
    return v;
  }
  // The backend's own matmul buffers for operands of up to max_operand elements (after
  // set_matmul_dtype, as the trainer does).
  void workspace(int64_t max_operand) { workspace(MatmulOperands(max_operand)); }
  void workspace(const MatmulOperands& operands) {
    Block& b = blocks_.emplace_back();
    BufferBinder binder;
    be_.plan_workspace(b.plan, binder, operands);
    b.plan.finalize();
    b.arena = std::make_unique<Arena>(b.plan, be_.device_memory(), be_.staging_memory());
    settle();
    binder.bind(*b.arena);
  }

 private:
  template <typename T>
  static std::vector<double> widen(const std::vector<T>& v) {
    return std::vector<double>(v.begin(), v.end());
  }
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

}  // namespace brisk::testing
