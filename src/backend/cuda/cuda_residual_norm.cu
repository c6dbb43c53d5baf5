// The residual add before a norm on CUDA: one warp per row sums x + dropout(r) into the row of
// `sum` (cuda_dropout_rows.cuh), then normalizes that row (cuda_norm_rows.cuh) while it is in
// cache - the bits of the dropout kernel's sum and the norm kernels' row, in one kernel and one
// read of the stream.
#include "backend/cuda/cuda_dropout_rows.cuh"
#include "backend/cuda/cuda_elements.cuh"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_launch.h"
#include "backend/cuda/cuda_norm_rows.cuh"

namespace brisk::cuda {

namespace {

constexpr int kRowsPerBlock = 8;  // warps per block, one row each

// beta null: RMSNorm (mean unused).
template <typename R, typename Y>
__global__ void __launch_bounds__(kRowsPerBlock * 32)
    dropout_add_norm_kernel(const float* x, const R* r, RowDropout d, float* sum,
                            const float* gamma, const float* beta, float eps, Y* y, float* mean,
                            float* rstd, int64_t rows, int64_t C) {
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
       row < rows; row += static_cast<int64_t>(gridDim.x) * kRowsPerBlock) {
    const int64_t at = row * C;
    dropout_row(x + at, r + at, d, d.key.first_element + static_cast<uint64_t>(at), sum + at, C);
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
  const RowDropout d = row_dropout(p, key);
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
