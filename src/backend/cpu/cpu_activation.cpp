// The MLP activations on the CPU (formulas in backend/activation.h), plain and gated (SwiGLU).
// This file is compiled with
// -ffast-math so that erf, exp and tanh vectorize through glibc's vector math library; NaN and
// inf still propagate through the arithmetic, which is all the overflow checks downstream rely on.
#include "backend/activation.h"
#include "backend/cpu/cpu_backend.h"

namespace brisk {

namespace {

template <Activation A>
void forward_loop(const float* in, float* out, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) out[i] = activation_value<A>(in[i]);
}

// out may alias g: element i is read before it is written.
template <Activation A>
void backward_loop(const float* in, const float* g, float* out, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) out[i] = activation_grad<A>(in[i], g[i]);
}

}  // namespace

void CpuBackend::activation_forward(Activation kind, const Tensor& x, const Tensor& y) {
  check_same_numel(x, y, "activation_forward");
  visit_activation(kind,
                   [&](auto a) { forward_loop<decltype(a)::value>(x.f32(), y.f32(), x.numel()); });
}

void CpuBackend::activation_backward(Activation kind, const Tensor& x, const Tensor& dy,
                                     const Tensor& dx) {
  check_same_numel(x, dy, "activation_backward");
  check_same_numel(x, dx, "activation_backward");
  visit_activation(kind, [&](auto a) {
    backward_loop<decltype(a)::value>(x.f32(), dy.f32(), dx.f32(), x.numel());
  });
}

void CpuBackend::swiglu_forward(const Tensor& gate_up, const Tensor& out) {
  const int64_t F = check_swiglu(gate_up, out, "swiglu_forward");
  const int64_t R = rows_of(out);
  const float* in = gate_up.f32();
  float* y = out.f32();
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < R; ++r) {
    const float *gate = in + r * 2 * F, *up = gate + F;
    float* yr = y + r * F;
#pragma omp simd
    for (int64_t i = 0; i < F; ++i) yr[i] = activation_value<Activation::silu>(gate[i]) * up[i];
  }
}

void CpuBackend::swiglu_backward(const Tensor& gate_up, const Tensor& dout,
                                 const Tensor& dgate_up) {
  const int64_t F = check_swiglu(gate_up, dout, "swiglu_backward");
  BRISK_CHECK(dgate_up.dtype() == DType::f32 && dgate_up.numel() == gate_up.numel(),
              "swiglu_backward: dgate_up ", dgate_up.shape().str(), " is not shaped as gate_up ",
              gate_up.shape().str());
  const int64_t R = rows_of(dout);
  const float *in = gate_up.f32(), *g = dout.f32();
  float* d = dgate_up.f32();
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < R; ++r) {
    const float *gate = in + r * 2 * F, *up = gate + F, *gr = g + r * F;
    float *dgate = d + r * 2 * F, *dup = dgate + F;
    // Both inputs of pair i are read before either gradient is written, so d may alias in.
#pragma omp simd
    for (int64_t i = 0; i < F; ++i) {
      const float v = gate[i], u = up[i];
      dgate[i] = activation_grad<Activation::silu>(v, gr[i] * u);
      dup[i] = gr[i] * activation_value<Activation::silu>(v);
    }
  }
}

}  // namespace brisk
