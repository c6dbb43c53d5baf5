// The MLP activations on the CPU (formulas in backend/activation.h), plain and gated (SwiGLU).
// This file is compiled with
// -ffast-math so that erf, exp and tanh vectorize through glibc's vector math library; NaN and
// inf still propagate through the arithmetic, which is all the overflow checks downstream rely on.
#include <algorithm>

#include "backend/activation.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_store.h"
#include "backend/cpu/cpu_tiles.h"

namespace brisk {

namespace {

// Work goes in blocks of kBlock elements, each by one float32 kernel (not inlined: one machine
// code) whatever the input's type, a bf16 input widened into a buffer first: a value's result
// then has the same bits from a bf16 input as from the float32 holding it (the vector math of
// -ffast-math differs between loops the compiler shapes differently, and between vector lanes
// and scalar tails).
constexpr int64_t kBlock = 256;

// x's values as a typed pointer for f: float32, or bf16 (checked by the caller: bf16 mode's saved
// MLP inputs).
template <typename F>
void with_input(const Tensor& x, F f) {
  with_bf16_or_f32(x.data(), x.dtype() == DType::bf16, f);
}

// in[0, n) (n <= kBlock) as float32: itself, or widened into buf.
const float* widened(const float* in, int64_t /*n*/, float* /*buf*/) {
  return in;
}
const float* widened(const uint16_t* in, int64_t n, float* buf) {
  bf16_widen_row(in, buf, n);
  return buf;
}

// g[0, n) (n <= kBlock) rounded to `dtype` into buf (round_to's bits, through cpu_tiles' rows,
// which are not built with -ffast-math and so keep NaN a NaN); f32: g itself.
const float* rounded(const float* g, int64_t n, DType dtype, float* buf) {
  if (dtype == DType::f32) return g;
  if (dtype == DType::f16) {
    fp16_rounded_row(g, buf, n);
    return buf;
  }
  BRISK_CHECK(dtype == DType::bf16, "a gradient rounded to ", dtype_name(dtype));
  uint16_t half[kBlock];
  bf16_round_row(g, half, n);
  bf16_widen_row(half, buf, n);
  return buf;
}

template <Activation A>
[[gnu::noinline]] void forward_block(const float* in, float* out, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) out[i] = activation_value<A>(in[i]);
}

// out may alias g: element i is read before it is written.
template <Activation A>
[[gnu::noinline]] void backward_block(const float* in, const float* g, float* out, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) out[i] = activation_grad<A>(in[i], g[i]);
}

// out: float32, or bf16 (the float32 results rounded).
template <Activation A, typename T>
void forward_loop(const T* in, void* out, DType out_type, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t m = std::min(kBlock, n - b);
    float buf[kBlock];
    const float* x = widened(in + b, m, buf);
    store_row(static_cast<char*>(out) + b * dtype_size(out_type), out_type == DType::bf16, m,
              [&](float* y, int64_t c0, int64_t count) { forward_block<A>(x + c0, y, count); });
  }
}

template <Activation A, typename T>
void backward_loop(const T* in, const float* g, DType round_g, float* out, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t m = std::min(kBlock, n - b);
    float buf[kBlock], g_buf[kBlock];
    backward_block<A>(widened(in + b, m, buf), rounded(g + b, m, round_g, g_buf), out + b, m);
  }
}

[[gnu::noinline]] void swiglu_forward_block(const float* gate, const float* up, float* y,
                                            int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] = activation_value<Activation::silu>(gate[i]) * up[i];
}

// Both inputs of pair i are read before either gradient is written, so dgate and dup may alias
// gate and up.
[[gnu::noinline]] void swiglu_backward_block(const float* gate, const float* up, const float* g,
                                             float* dgate, float* dup, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const float v = gate[i], u = up[i];
    dgate[i] = activation_grad<Activation::silu>(v, g[i] * u);
    dup[i] = g[i] * activation_value<Activation::silu>(v);
  }
}

}  // namespace

void CpuBackend::activation_forward(Activation kind, const Tensor& x, const Tensor& y) {
  check_operand(x, "activation_forward");
  check_output(y, x, "activation_forward");
  with_input(x, [&](auto in) {
    visit_activation(kind, [&](auto a) {
      forward_loop<decltype(a)::value>(in, y.data(), y.dtype(), x.numel());
    });
  });
}

void CpuBackend::activation_backward(Activation kind, const Tensor& x, const Tensor& dy,
                                     const Tensor& dx, DType round_dy) {
  check_operand(x, "activation_backward");
  check_same_numel(x, dy, "activation_backward");
  check_same_numel(x, dx, "activation_backward");
  const float* g = dy.f32();
  float* out = dx.f32();
  with_input(x, [&](auto in) {
    visit_activation(
        kind, [&](auto a) { backward_loop<decltype(a)::value>(in, g, round_dy, out, x.numel()); });
  });
}

// SwiGLU: each row's columns in blocks, its gate and up halves side by side.
void CpuBackend::swiglu_forward(const Tensor& gate_up, const Tensor& out) {
  const int64_t F = check_swiglu(gate_up, out, "swiglu_forward", bf16_operands_);
  const int64_t R = rows_of(out);
  const bool bf16 = out.dtype() == DType::bf16;
  const size_t elem = dtype_size(out.dtype());
  char* y = static_cast<char*>(out.data());
  with_input(gate_up, [&](auto in) {
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < R; ++r)
      for (int64_t c = 0; c < F; c += kBlock) {
        const int64_t m = std::min(kBlock, F - c);
        const auto* gate = in + r * 2 * F + c;
        float gate_buf[kBlock], up_buf[kBlock];
        const float *g = widened(gate, m, gate_buf), *u = widened(gate + F, m, up_buf);
        store_row(y + static_cast<size_t>(r * F + c) * elem, bf16, m,
                  [&](float* dst, int64_t c0, int64_t count) {
                    swiglu_forward_block(g + c0, u + c0, dst, count);
                  });
      }
  });
}

void CpuBackend::swiglu_backward(const Tensor& gate_up, const Tensor& dout, const Tensor& dgate_up,
                                 DType round_dout) {
  const int64_t F = check_swiglu(gate_up, dout, "swiglu_backward", bf16_operands_);
  const bool bf16 = dgate_up.dtype() == DType::bf16;
  BRISK_CHECK((dgate_up.dtype() == DType::f32 || (bf16 && bf16_operands_)) &&
                  dgate_up.numel() == gate_up.numel(),
              "swiglu_backward: dgate_up ", dgate_up.shape().str(), " ",
              dtype_name(dgate_up.dtype()), " is not shaped as gate_up ", gate_up.shape().str());
  const int64_t R = rows_of(dout);
  const float* g = dout.f32();
  float* d = bf16 ? nullptr : dgate_up.f32();
  uint16_t* d16 = bf16 ? dgate_up.as<uint16_t>() : nullptr;
  with_input(gate_up, [&](auto in) {
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < R; ++r)
      for (int64_t c = 0; c < F; c += kBlock) {
        const int64_t m = std::min(kBlock, F - c);
        const auto* gate = in + r * 2 * F + c;
        float gate_buf[kBlock], up_buf[kBlock];
        const float *v = widened(gate, m, gate_buf), *u = widened(gate + F, m, up_buf);
        float g_buf[kBlock];
        const float* gr = rounded(g + r * F + c, m, round_dout, g_buf);
        if (!bf16) {
          float* dgate = d + r * 2 * F + c;
          swiglu_backward_block(v, u, gr, dgate, dgate + F, m);
          continue;
        }
        // The float32 results rounded as they are stored: the bits a bf16 product's packing
        // would give them.
        float dgate[kBlock], dup[kBlock];
        swiglu_backward_block(v, u, gr, dgate, dup, m);
        bf16_round_row(dgate, d16 + r * 2 * F + c, m);
        bf16_round_row(dup, d16 + r * 2 * F + F + c, m);
      }
  });
}

}  // namespace brisk
