// The residual add before a norm on CUDA: one warp per row sums x + dropout(r) into the row of
// `sum`, then normalizes that row (cuda_norm_rows.cuh) while it is in cache - the bits of the
// dropout kernel's sum and the norm kernels' row, in one kernel and one read of the stream.
#include "backend/cuda/cuda_elements.cuh"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_launch.h"
#include "backend/cuda/cuda_norm_rows.cuh"

namespace brisk::cuda {

namespace {

constexpr int kRowsPerBlock = 8;  // warps per block, one row each

// The dropout: keep elements whose word is >= threshold, scaled; `drop` false: every element
// kept unscaled (p = 0, no words drawn).
struct Dropout {
  RngKey key;
  uint32_t threshold;
  float scale;
  bool drop;
};

// sr[c] = xr[c] + dropout(rr)[c] for the C elements of a row whose first element is element e0
// of the whole (its words rng_block(key, e / 4).v[e % 4], the dropout kernel's). A lane takes four
// adjacent columns at a time: one Philox block per group where the row's groups line up with the
// generator's. Each element is read and written by one thread, so sr may alias xr.
template <typename R>
__device__ __forceinline__ void residual_row(const float* xr, const R* rr, const Dropout& d,
                                             uint64_t e0, float* sr, int64_t C) {
  const int lane = threadIdx.x & 31;
  const bool lined_up = e0 % 4 == 0;
  for (int64_t c0 = 4 * static_cast<int64_t>(lane); c0 < C; c0 += 128) {
    Philox4 words{};
    if (d.drop && lined_up) words = rng_block(d.key, (e0 + static_cast<uint64_t>(c0)) / 4);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t c = c0 + j;
      if (c >= C) break;
      const float v = widen(rr[c]);
      if (!d.drop) {
        sr[c] = xr[c] + v;
        continue;
      }
      const uint64_t e = e0 + static_cast<uint64_t>(c);
      const uint32_t w = lined_up ? words.v[j] : rng_block(d.key, e / 4).v[e % 4];
      sr[c] = xr[c] + (w >= d.threshold ? __fmul_rn(v, d.scale) : 0.0f);
    }
  }
}

// beta null: RMSNorm (mean unused).
template <typename R, typename Y>
__global__ void __launch_bounds__(kRowsPerBlock * 32)
    dropout_add_norm_kernel(const float* x, const R* r, Dropout d, float* sum, const float* gamma,
                            const float* beta, float eps, Y* y, float* mean, float* rstd,
                            int64_t rows, int64_t C) {
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
       row < rows; row += static_cast<int64_t>(gridDim.x) * kRowsPerBlock) {
    const int64_t at = row * C;
    residual_row(x + at, r + at, d, d.key.first_element + static_cast<uint64_t>(at), sum + at, C);
    __syncwarp();  // the norm's lanes read columns other lanes summed
    if (beta != nullptr)
      layernorm_row(sum + at, gamma, beta, eps, y + at, C, mean + row, rstd + row);
    else
      rmsnorm_row(sum + at, gamma, eps, y + at, C, rstd + row);
  }
}

}  // namespace

void dropout_add_norm(cudaStream_t s, const float* x, In r, float p, RngKey key, float* sum,
                      const float* gamma, const float* beta, float eps, Out y, float* mean,
                      float* rstd, int64_t rows, int64_t C) {
  BRISK_CHECK(p >= 0.0f && p < 1.0f, "dropout probability ", p, " is outside [0, 1)");
  if (rows <= 0 || C <= 0) return;
  const Dropout d{key, dropout_threshold(p), 1.0f / (1.0f - p), p != 0.0f};
  with_elements(r.bf16, [&](auto rt) {
    with_elements(y.bf16, [&](auto yt) {
      using R = decltype(rt);
      using Y = decltype(yt);
      dropout_add_norm_kernel<<<grid_for(rows, kRowsPerBlock), kRowsPerBlock * 32, 0, s>>>(
          x, static_cast<const R*>(r.data), d, sum, gamma, beta, eps, static_cast<Y*>(y.data), mean,
          rstd, rows, C);
    });
  });
  check_launch("dropout_add_norm");
}

}  // namespace brisk::cuda
