// Mixture of experts on CUDA: the routing of each token (moe_route.h, the CPU's arithmetic), one
// thread per token.
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_launch.h"
#include "backend/moe_route.h"

namespace brisk::cuda {

namespace {

__global__ void moe_route_kernel(const float* logits, int64_t N, int E, int k, bool normalize,
                                 float* probs, float* weights, int32_t* experts) {
  for (int64_t n = global_thread(); n < N; n += grid_threads())
    moe_route_row(logits + n * E, E, k, normalize, probs + n * E, weights + n * k, experts + n * k);
}

__global__ void moe_route_backward_kernel(const float* probs, const float* weights,
                                          const int32_t* experts, const float* dweights,
                                          const float* dprobs, int64_t N, int E, int k,
                                          bool normalize, float* dlogits) {
  for (int64_t n = global_thread(); n < N; n += grid_threads())
    moe_route_row_backward(probs + n * E, weights + n * k, experts + n * k, dweights + n * k,
                           dprobs ? dprobs + n * E : nullptr, E, k, normalize, dlogits + n * E);
}

}  // namespace

void moe_route(cudaStream_t s, const float* logits, int64_t N, int64_t E, int64_t k, bool normalize,
               float* probs, float* weights, int32_t* experts) {
  if (N <= 0) return;
  moe_route_kernel<<<grid_for(N), kThreads, 0, s>>>(
      logits, N, static_cast<int>(E), static_cast<int>(k), normalize, probs, weights, experts);
  check_launch("moe_route");
}

void moe_route_backward(cudaStream_t s, const float* probs, const float* weights,
                        const int32_t* experts, const float* dweights, const float* dprobs,
                        int64_t N, int64_t E, int64_t k, bool normalize, float* dlogits) {
  if (N <= 0) return;
  moe_route_backward_kernel<<<grid_for(N), kThreads, 0, s>>>(
      probs, weights, experts, dweights, dprobs, N, static_cast<int>(E), static_cast<int>(k),
      normalize, dlogits);
  check_launch("moe_route_backward");
}

}  // namespace brisk::cuda
