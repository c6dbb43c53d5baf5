// Rotary position embedding on CUDA: the query and key heads of packed qkv rotated in place, one
// thread per pair (i, i + D/2) of a head, with the CPU's float32 expressions; a packed batch's
// positions read from memory.
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_launch.h"

namespace brisk::cuda {

namespace {

// Pairs are numbered ((b*T + t) * (H + K) + head) * half + i: consecutive threads take
// consecutive i of one head, so reads and writes of both halves are coalesced. Each pair is read
// and written by one thread, so rotating in place is safe.
template <bool kInverse>
__global__ void rotary_kernel(float* qkv, const float* cos, const float* sin, int64_t T,
                              int64_t rotated_heads, int64_t width, int64_t D,
                              int64_t first_position, const int32_t* positions, int64_t pairs) {
  const int64_t half = D / 2;
  for (int64_t n = global_thread(); n < pairs; n += grid_threads()) {
    const int64_t i = n % half, head_row = n / half;
    const int64_t head = head_row % rotated_heads, bt = head_row / rotated_heads;
    const int64_t at = (positions ? positions[bt] : first_position + bt % T) * half + i;
    const float c = cos[at], s = sin[at];
    float* x = qkv + bt * width + head * D;
    const float x1 = x[i], x2 = x[i + half];
    if constexpr (kInverse) {
      x[i] = x1 * c + x2 * s;
      x[i + half] = x2 * c - x1 * s;
    } else {
      x[i] = x1 * c - x2 * s;
      x[i + half] = x2 * c + x1 * s;
    }
  }
}

}  // namespace

void rotary(cudaStream_t s, float* qkv, const float* cos, const float* sin, int64_t B, int64_t T,
            int64_t H, int64_t K, int64_t D, int64_t first_position, const int32_t* positions,
            bool inverse) {
  const int64_t pairs = B * T * (H + K) * (D / 2);
  if (pairs <= 0) return;
  const int64_t width = (H + 2 * K) * D;
  if (inverse) {
    rotary_kernel<true><<<grid_for(pairs), kThreads, 0, s>>>(qkv, cos, sin, T, H + K, width, D,
                                                             first_position, positions, pairs);
  } else {
    rotary_kernel<false><<<grid_for(pairs), kThreads, 0, s>>>(qkv, cos, sin, T, H + K, width, D,
                                                              first_position, positions, pairs);
  }
  check_launch(inverse ? "rotary_backward" : "rotary_forward");
}

}  // namespace brisk::cuda
