// Helpers shared by brisk's CUDA kernel files: grid sizing for grid-stride loops, launch-error
// checks that throw brisk::Error, and warp/block reductions with a fixed (deterministic) order.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "core/error.h"

namespace brisk::cuda {

constexpr int kThreads = 256;  // default block size of elementwise kernels
// Grid-stride loops cover any size, so grids are capped: a few waves fill every current GPU and
// each thread then handles several elements.
constexpr int64_t kMaxBlocks = 4096;

// Blocks for a grid-stride loop over n work items (n > 0), `per_block` items per block per pass:
// one per thread for elementwise kernels, one per warp for row kernels.
inline unsigned grid_for(int64_t n, int per_block = kThreads, int64_t max_blocks = kMaxBlocks) {
  const int64_t blocks = (n + per_block - 1) / per_block;
  return static_cast<unsigned>(std::clamp<int64_t>(blocks, 1, max_blocks));
}

// Threads for a block that walks one row of `cols` elements: a multiple of the warp size, at most
// `max_threads`, so short rows do not leave most of a large block idle.
inline int threads_for_row(int64_t cols, int max_threads = kThreads) {
  const int64_t rounded = (cols + 31) / 32 * 32;
  return static_cast<int>(std::clamp<int64_t>(rounded, 32, max_threads));
}

// Launches are asynchronous; a bad configuration is only visible through cudaGetLastError. An
// earlier kernel's fault (sticky) surfaces here too, so the message names where it was noticed.
inline void check_launch(const char* kernel) {
  const cudaError_t err = cudaGetLastError();
  BRISK_CHECK(err == cudaSuccess, "CUDA error at kernel ", kernel, ": ", cudaGetErrorString(err));
}

inline void check_cuda(cudaError_t err, const char* what) {
  BRISK_CHECK(err == cudaSuccess, "CUDA ", what, " failed: ", cudaGetErrorString(err));
}

#if defined(__CUDACC__)

__device__ __forceinline__ int64_t global_thread() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t grid_threads() {
  return static_cast<int64_t>(gridDim.x) * blockDim.x;
}

struct SumOp {
  template <typename T>
  __device__ __forceinline__ T operator()(T a, T b) const {
    return a + b;
  }
};
struct MaxOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

// Butterfly reduction: every lane ends with the same value (a + b == b + a in IEEE arithmetic),
// so lanes can branch on it uniformly. All 32 lanes must take part.
template <typename T, typename Op>
__device__ __forceinline__ T warp_reduce(T v, Op op) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1)
    v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// Reduces over the whole block (blockDim.x a multiple of 32, at most 1024) and returns the result
// to every thread. The warp partials are combined in warp order by every thread, which keeps the
// result deterministic and identical across threads. `shared` holds 32 elements; the leading
// barrier makes back-to-back calls on the same buffer safe.
template <typename T, typename Op>
__device__ __forceinline__ T block_reduce(T v, T* shared, Op op) {
  v = warp_reduce(v, op);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int warps = static_cast<int>(blockDim.x >> 5);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  T r = shared[0];
  for (int w = 1; w < warps; ++w) r = op(r, shared[w]);
  return r;
}

#endif  // __CUDACC__

}  // namespace brisk::cuda
