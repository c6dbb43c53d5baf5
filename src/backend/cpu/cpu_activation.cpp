// The MLP activations on the CPU (formulas in backend/activation.h). This file is compiled with
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

}  // namespace brisk
