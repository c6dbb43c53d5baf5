// Mixture of experts on the CPU: the routing of each token (moe_route.h), rows in parallel.
#include "backend/cpu/cpu_backend.h"
#include "backend/moe_route.h"

namespace brisk {

namespace {
// Throws unless t is float32 [N, E] (`what` names it).
void check_rows(const Tensor& t, int64_t N, int64_t E, const char* op, const char* what) {
  BRISK_CHECK(t.dtype() == DType::f32 && t.numel() == N * E, op, ": ", what, " ", t.shape().str(),
              " ", dtype_name(t.dtype()), " is not float32 [", N, ", ", E, "]");
}
}  // namespace

void CpuBackend::moe_route_forward(const Tensor& logits, bool normalize, const Tensor& probs,
                                   const Tensor& weights, const Tensor& experts) {
  const auto [E, k] = check_moe_route(probs, weights, experts, "moe_route_forward");
  const int64_t N = probs.dim(0);
  check_rows(logits, N, E, "moe_route_forward", "logits");
  const float* z = logits.f32();
  float *p = probs.f32(), *w = weights.f32();
  int32_t* x = experts.i32();
#pragma omp parallel for schedule(static) if (N * E > 16384)
  for (int64_t n = 0; n < N; ++n)
    moe_route_row(z + n * E, static_cast<int>(E), static_cast<int>(k), normalize, p + n * E,
                  w + n * k, x + n * k);
}

void CpuBackend::moe_route_backward(const Tensor& probs, const Tensor& weights,
                                    const Tensor& experts, const Tensor& dweights,
                                    const Tensor& dprobs, bool normalize, const Tensor& dlogits) {
  const auto [E, k] = check_moe_route(probs, weights, experts, "moe_route_backward");
  const int64_t N = probs.dim(0);
  check_rows(dweights, N, k, "moe_route_backward", "dweights");
  check_rows(dlogits, N, E, "moe_route_backward", "dlogits");
  if (!dprobs.empty()) check_rows(dprobs, N, E, "moe_route_backward", "dprobs");
  const int32_t* x = experts.i32();
  for (int64_t i = 0; i < N * k; ++i)
    BRISK_CHECK(x[i] >= 0 && x[i] < E, "moe_route_backward: expert ", x[i], " of ", E);
  const float *p = probs.f32(), *w = weights.f32(), *dw = dweights.f32();
  const float* dp = dprobs.empty() ? nullptr : dprobs.f32();
  float* dz = dlogits.f32();
#pragma omp parallel for schedule(static) if (N * E > 16384)
  for (int64_t n = 0; n < N; ++n)
    moe_route_row_backward(p + n * E, w + n * k, x + n * k, dw + n * k, dp ? dp + n * E : nullptr,
                           static_cast<int>(E), static_cast<int>(k), normalize, dz + n * E);
}

}  // namespace brisk
