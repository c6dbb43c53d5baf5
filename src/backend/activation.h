// The MLP activations' formulas, shared by the CPU loops (cpu_activation.cpp) and the CUDA kernels
// (cuda_elementwise.cu) so that both backends evaluate the same float32 expressions.
#pragma once

#include <cmath>
#include <type_traits>

#include "backend/backend.h"
#include "core/error.h"
#include "core/rng.h"  // BRISK_HD

namespace brisk {

// Every kind, for code that handles each in turn (tests, dispatch tables).
inline constexpr Activation kAllActivations[] = {Activation::gelu,       Activation::gelu_tanh,
                                                 Activation::relu,       Activation::silu,
                                                 Activation::quick_gelu, Activation::sigmoid};

constexpr const char* activation_name(Activation a) {
  switch (a) {
    case Activation::gelu:
      return "gelu";
    case Activation::gelu_tanh:
      return "gelu_tanh";
    case Activation::relu:
      return "relu";
    case Activation::silu:
      return "silu";
    case Activation::quick_gelu:
      return "quick_gelu";
    case Activation::sigmoid:
      return "sigmoid";
  }
  return "unknown";
}

namespace activation_constants {
inline constexpr float kSqrt2OverPi = 0.7978845608028654f;
inline constexpr float kInvSqrt2 = 0.7071067811865476f;
inline constexpr float kInvSqrt2Pi = 0.3989422804014327f;
inline constexpr float kGeluCubic = 0.044715f;
inline constexpr float kQuickGeluSlope = 1.702f;  // transformers' QuickGELUActivation
}  // namespace activation_constants

// y = f(x).
template <Activation A>
BRISK_HD float activation_value(float v) {
  using namespace activation_constants;
  if constexpr (A == Activation::gelu) {
    return 0.5f * v * (1.0f + std::erf(v * kInvSqrt2));
  } else if constexpr (A == Activation::gelu_tanh) {
    return 0.5f * v * (1.0f + std::tanh(kSqrt2OverPi * (v + kGeluCubic * v * v * v)));
  } else if constexpr (A == Activation::relu) {
    // v < 0 rather than v > 0, so that a NaN input compares false and passes through as in
    // torch.relu (IEEE semantics; the CPU's -ffast-math loops keep it too, though unpromised).
    return v < 0.0f ? 0.0f : v;
  } else if constexpr (A == Activation::silu) {
    // x / (1 + e^-x) rather than x * sigmoid(x): one division, and as PyTorch's kernels write it.
    return v / (1.0f + std::exp(-v));
  } else if constexpr (A == Activation::sigmoid) {
    return 1.0f / (1.0f + std::exp(-v));
  } else {
    static_assert(A == Activation::quick_gelu);
    return v / (1.0f + std::exp(-kQuickGeluSlope * v));
  }
}

// dL/dx = g * f'(x) for the upstream gradient g.
template <Activation A>
BRISK_HD float activation_grad(float v, float g) {
  using namespace activation_constants;
  if constexpr (A == Activation::gelu) {
    const float cdf = 0.5f * (1.0f + std::erf(v * kInvSqrt2));
    return g * (cdf + v * kInvSqrt2Pi * std::exp(-0.5f * v * v));
  } else if constexpr (A == Activation::gelu_tanh) {
    const float t = std::tanh(kSqrt2OverPi * (v + kGeluCubic * v * v * v));
    const float du = kSqrt2OverPi * (1.0f + 3.0f * kGeluCubic * v * v);
    return g * (0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * du);
  } else if constexpr (A == Activation::relu) {
    // A select, not g * step(x), as PyTorch's threshold_backward: the gradient at exactly 0 is 0,
    // and an inf gradient where x <= 0 gives 0 rather than inf * 0 = NaN.
    return v <= 0.0f ? 0.0f : g;
  } else if constexpr (A == Activation::silu) {
    const float s = 1.0f / (1.0f + std::exp(-v));
    return g * s * (1.0f + v * (1.0f - s));
  } else if constexpr (A == Activation::sigmoid) {
    const float s = 1.0f / (1.0f + std::exp(-v));
    return g * s * (1.0f - s);
  } else {
    static_assert(A == Activation::quick_gelu);
    const float s = 1.0f / (1.0f + std::exp(-kQuickGeluSlope * v));
    return g * s * (1.0f + kQuickGeluSlope * v * (1.0f - s));
  }
}

// fn(std::integral_constant<Activation, kind>{}): turns the run-time kind into a template
// argument, so each kind gets its own loop or kernel without a branch per element.
template <typename Fn>
void visit_activation(Activation kind, Fn&& fn) {
  switch (kind) {
    case Activation::gelu:
      return fn(std::integral_constant<Activation, Activation::gelu>{});
    case Activation::gelu_tanh:
      return fn(std::integral_constant<Activation, Activation::gelu_tanh>{});
    case Activation::relu:
      return fn(std::integral_constant<Activation, Activation::relu>{});
    case Activation::silu:
      return fn(std::integral_constant<Activation, Activation::silu>{});
    case Activation::quick_gelu:
      return fn(std::integral_constant<Activation, Activation::quick_gelu>{});
    case Activation::sigmoid:
      return fn(std::integral_constant<Activation, Activation::sigmoid>{});
  }
  BRISK_FAIL("unknown activation kind ", static_cast<int>(kind));
}

}  // namespace brisk
