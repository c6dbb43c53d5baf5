// Mixture of experts on CUDA: the routing of each token (moe_route.h, the CPU's arithmetic), one
// thread per token; the dispatch, one thread per expert walking the pairs in order (the CPU's
// rows; work E x N k, simple before fast); the gather and the combine, a thread per element; the
// combine's weight gradients, a warp per routed row.
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

// Each expert's count of pairs (one thread per expert).
__global__ void moe_count_kernel(const int32_t* experts, int64_t pairs, int E, int32_t* counts) {
  const int e = static_cast<int>(global_thread());
  if (e >= E) return;
  int32_t c = 0;
  for (int64_t i = 0; i < pairs; ++i) c += experts[i] == e;
  counts[e] = c;
}

// Each pair's row: its expert's offset plus the pairs of that expert before it.
__global__ void moe_position_kernel(const int32_t* experts, int64_t pairs, int E,
                                    const int32_t* counts, int32_t* positions) {
  const int e = static_cast<int>(global_thread());
  if (e >= E) return;
  int32_t next = 0;
  for (int f = 0; f < e; ++f) next += counts[f];
  for (int64_t i = 0; i < pairs; ++i)
    if (experts[i] == e) positions[i] = next++;
}

__global__ void moe_gather_kernel(const float* x, const int32_t* positions, int64_t pairs, int k,
                                  int64_t C, float* rows) {
  for (int64_t t = global_thread(); t < pairs * C; t += grid_threads()) {
    const int64_t i = t / C, c = t % C;
    const int32_t p = positions[i];
    if (p >= 0 && p < pairs) rows[p * C + c] = x[(i / k) * C + c];
  }
}

__global__ void moe_combine_kernel(const float* rows, const int32_t* positions,
                                   const float* weights, int64_t N, int k, int64_t C,
                                   bool accumulate, float* y) {
  const int64_t pairs = N * k;
  for (int64_t t = global_thread(); t < N * C; t += grid_threads()) {
    const int64_t n = t / C, c = t % C;
    float sum = accumulate ? y[t] : 0.0f;
    for (int j = 0; j < k; ++j) {
      const int64_t p = positions ? positions[n * k + j] : n * k + j;
      if (p >= 0 && p < pairs) sum += (weights ? weights[n * k + j] : 1.0f) * rows[p * C + c];
    }
    y[t] = sum;
  }
}

// One warp per routed row: its gradient, and its weight's as a dot product summed lane by lane
// then across the warp (a fixed order).
__global__ void moe_combine_backward_kernel(const float* dy, const float* rows,
                                            const int32_t* positions, const float* weights,
                                            int64_t pairs, int k, int64_t C, float* drows,
                                            float* dweights) {
  const int lane = threadIdx.x % 32;
  const int64_t warps = grid_threads() / 32;
  for (int64_t i = global_thread() / 32; i < pairs; i += warps) {
    const int64_t p = positions ? positions[i] : i;
    const bool valid = p >= 0 && p < pairs;
    const float* g = dy + (i / k) * C;
    float dot = 0.0f;
    for (int64_t c = lane; c < C && valid; c += 32) {
      drows[p * C + c] = weights[i] * g[c];
      dot += g[c] * rows[p * C + c];
    }
    for (int offset = 16; offset > 0; offset /= 2)
      dot += __shfl_down_sync(0xffffffffu, dot, offset);
    if (lane == 0) dweights[i] = dot;
  }
}

// One thread per expert: its routed pairs and its probabilities' sum over the unmasked tokens, in
// token order (the CPU's sums).
__global__ void moe_balance_stats_kernel(const float* probs, const int32_t* experts,
                                         const int32_t* mask, int64_t N, int E, int k,
                                         float* stats) {
  const int e = static_cast<int>(global_thread());
  if (e >= E) return;
  float count = 0.0f, sum = 0.0f;
  for (int64_t n = 0; n < N; ++n) {
    if (mask && mask[n] == 0) continue;
    for (int j = 0; j < k; ++j) count += experts[n * k + j] == e ? 1.0f : 0.0f;
    sum += probs[n * E + e];
  }
  stats[e] = count;
  stats[E + e] = sum;
}

__global__ void moe_balance_backward_kernel(const int32_t* mask, const float* scale, int64_t N,
                                            int E, float* dprobs) {
  for (int64_t t = global_thread(); t < N * E; t += grid_threads()) {
    const int64_t n = t / E;
    dprobs[t] = mask && mask[n] == 0 ? 0.0f : scale[t % E];
  }
}

__global__ void moe_z_kernel(const float* logits, const int32_t* mask, int64_t N, int E, float* z) {
  for (int64_t n = global_thread(); n < N; n += grid_threads())
    z[n] = mask && mask[n] == 0 ? 0.0f : moe_logsumexp(logits + n * E, E);
}

__global__ void moe_z_sum_kernel(const float* z, int64_t N, float* sum) {
  if (global_thread() != 0) return;
  float total = 0.0f;
  for (int64_t n = 0; n < N; ++n) total += z[n] * z[n];
  sum[0] = total;
}

__global__ void moe_z_backward_kernel(const float* probs, const float* z, float scale, int64_t N,
                                      int E, float* dlogits) {
  for (int64_t t = global_thread(); t < N * E; t += grid_threads())
    dlogits[t] += 2.0f * scale * z[t / E] * probs[t];
}

}  // namespace

void moe_z_stats(cudaStream_t s, const float* logits, const int32_t* mask, int64_t N, int64_t E,
                 float* z, float* sum) {
  if (N > 0) moe_z_kernel<<<grid_for(N), kThreads, 0, s>>>(logits, mask, N, static_cast<int>(E), z);
  moe_z_sum_kernel<<<1, 1, 0, s>>>(z, N, sum);
  check_launch("moe_z_stats");
}

void moe_z_backward(cudaStream_t s, const float* probs, const float* z, float scale, int64_t N,
                    int64_t E, float* dlogits) {
  if (N * E <= 0) return;
  moe_z_backward_kernel<<<grid_for(N * E), kThreads, 0, s>>>(probs, z, scale, N,
                                                             static_cast<int>(E), dlogits);
  check_launch("moe_z_backward");
}

void moe_balance_stats(cudaStream_t s, const float* probs, const int32_t* experts,
                       const int32_t* mask, int64_t N, int64_t E, int64_t k, float* stats) {
  moe_balance_stats_kernel<<<grid_for(E), kThreads, 0, s>>>(
      probs, experts, mask, N, static_cast<int>(E), static_cast<int>(k), stats);
  check_launch("moe_balance_stats");
}

void moe_balance_backward(cudaStream_t s, const int32_t* mask, const float* scale, int64_t N,
                          int64_t E, float* dprobs) {
  if (N * E <= 0) return;
  moe_balance_backward_kernel<<<grid_for(N * E), kThreads, 0, s>>>(mask, scale, N,
                                                                   static_cast<int>(E), dprobs);
  check_launch("moe_balance_backward");
}

void moe_dispatch(cudaStream_t s, const int32_t* experts, int64_t pairs, int64_t E, int32_t* counts,
                  int32_t* positions) {
  const unsigned grid = grid_for(E);
  moe_count_kernel<<<grid, kThreads, 0, s>>>(experts, pairs, static_cast<int>(E), counts);
  if (pairs > 0)
    moe_position_kernel<<<grid, kThreads, 0, s>>>(experts, pairs, static_cast<int>(E), counts,
                                                  positions);
  check_launch("moe_dispatch");
}

void moe_gather(cudaStream_t s, const float* x, const int32_t* positions, int64_t N, int64_t k,
                int64_t C, float* rows) {
  if (N * k * C <= 0) return;
  moe_gather_kernel<<<grid_for(N * k * C), kThreads, 0, s>>>(x, positions, N * k,
                                                             static_cast<int>(k), C, rows);
  check_launch("moe_gather");
}

void moe_combine(cudaStream_t s, const float* rows, const int32_t* positions, const float* weights,
                 int64_t N, int64_t k, int64_t C, bool accumulate, float* y) {
  if (N * C <= 0) return;
  moe_combine_kernel<<<grid_for(N * C), kThreads, 0, s>>>(rows, positions, weights, N,
                                                          static_cast<int>(k), C, accumulate, y);
  check_launch("moe_combine");
}

void moe_combine_backward(cudaStream_t s, const float* dy, const float* rows,
                          const int32_t* positions, const float* weights, int64_t N, int64_t k,
                          int64_t C, float* drows, float* dweights) {
  if (N * k <= 0) return;
  moe_combine_backward_kernel<<<grid_for(N * k * 32), kThreads, 0, s>>>(
      dy, rows, positions, weights, N * k, static_cast<int>(k), C, drows, dweights);
  check_launch("moe_combine_backward");
}

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
