// Attention over a key/value cache for incremental decoding on CUDA: the new tokens' keys and
// values are appended to the caches, then each new query attends to every cached position up to
// its own. Grouped-query attention: the caches hold the K key/value heads, query head h reads
// head h / (H / K). One block per (batch, query head, query): scores in three passes over the keys
// (maximum,
// sum of exponentials, weighted values in chunks staged through shared memory), so the key count
// is not limited by shared memory.
#include <cmath>

#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_launch.h"

namespace brisk::cuda {

namespace {

constexpr int kDecodeThreads = 128;

// Rows of qkv hold C = H*D query columns, then KD = K*D key and KD value columns.
__global__ void append_cache_kernel(const float* qkv, float* k_cache, float* v_cache, int64_t B,
                                    int64_t T, int64_t S, int64_t C, int64_t KD, int64_t past) {
  const int64_t n = B * T * KD;
  for (int64_t i = global_thread(); i < n; i += grid_threads()) {
    const int64_t c = i % KD, t = (i / KD) % T, b = i / (KD * T);
    const float* row = qkv + (b * T + t) * (C + 2 * KD);
    const int64_t at = (b * S + past + t) * KD + c;
    k_cache[at] = row[C + c];
    v_cache[at] = row[C + KD + c];
  }
}

// A query's dot product with key j of key/value head kh, scaled.
__device__ __forceinline__ float score(const float* q, const float* k_cache, int64_t b, int64_t j,
                                       int64_t S, int64_t KD, int64_t kh, int64_t D, float scale) {
  const float* k = k_cache + (b * S + j) * KD + kh * D;
  float s = 0.0f;
  for (int64_t i = 0; i < D; ++i) s += q[i] * k[i];
  return s * scale;
}

__global__ void attention_decode_kernel(const float* qkv, const float* k_cache,
                                        const float* v_cache, float* out, int64_t T, int64_t S,
                                        int64_t H, int64_t K, int64_t D, int64_t past,
                                        float scale) {
  extern __shared__ float shared[];  // q [D], then chunk probabilities [kDecodeThreads]
  __shared__ float reduce_max[32];
  __shared__ float reduce_sum[32];
  float* q = shared;
  float* p = shared + D;
  const int64_t t = blockIdx.y, bh = blockIdx.x, b = bh / H, h = bh % H, kh = h / (H / K);
  const int64_t C = H * D, KD = K * D;
  const float* q_src = qkv + (b * T + t) * (C + 2 * KD) + h * D;
  for (int64_t i = threadIdx.x; i < D; i += blockDim.x) q[i] = q_src[i];
  __syncthreads();
  const int64_t keys = past + t + 1;
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < keys; j += blockDim.x)
    m = fmaxf(m, score(q, k_cache, b, j, S, KD, kh, D, scale));
  m = block_reduce(m, reduce_max, MaxOp{});
  float l = 0.0f;
  for (int64_t j = threadIdx.x; j < keys; j += blockDim.x)
    l += expf(score(q, k_cache, b, j, S, KD, kh, D, scale) - m);
  l = block_reduce(l, reduce_sum, SumOp{});
  float* y = out + (b * T + t) * C + h * D;
  // Each thread owns output columns i = threadIdx.x + k * blockDim.x (D <= 4 * blockDim.x: the
  // host checks kMaxDecodeHeadWidth).
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int64_t first = 0; first < keys; first += blockDim.x) {
    const int64_t j = first + threadIdx.x;
    __syncthreads();
    p[threadIdx.x] = j < keys ? expf(score(q, k_cache, b, j, S, KD, kh, D, scale) - m) / l : 0.0f;
    __syncthreads();
    const int64_t chunk = min(static_cast<int64_t>(blockDim.x), keys - first);
    for (int k = 0; k < 4; ++k) {
      const int64_t i = threadIdx.x + k * blockDim.x;
      if (i >= D) break;
      for (int64_t jj = 0; jj < chunk; ++jj)
        acc[k] += p[jj] * v_cache[(b * S + first + jj) * KD + kh * D + i];
    }
  }
  for (int k = 0; k < 4; ++k) {
    const int64_t i = threadIdx.x + k * blockDim.x;
    if (i < D) y[i] = acc[k];
  }
}

}  // namespace

void attention_decode(cudaStream_t s, const float* qkv, float* k_cache, float* v_cache, float* out,
                      int64_t B, int64_t T, int64_t S, int64_t H, int64_t K, int64_t D,
                      int64_t past, float scale) {
  if (B <= 0 || T <= 0) return;
  const int64_t C = H * D, KD = K * D;
  append_cache_kernel<<<grid_for(B * T * KD), kThreads, 0, s>>>(qkv, k_cache, v_cache, B, T, S, C,
                                                                KD, past);
  check_launch("append_cache");
  const dim3 grid(static_cast<unsigned>(B * H), static_cast<unsigned>(T));
  const size_t shared = sizeof(float) * static_cast<size_t>(D + kDecodeThreads);
  attention_decode_kernel<<<grid, kDecodeThreads, shared, s>>>(qkv, k_cache, v_cache, out, T, S, H,
                                                               K, D, past, scale);
  check_launch("attention_decode");
}

}  // namespace brisk::cuda
