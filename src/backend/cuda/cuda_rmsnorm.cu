// RMSNorm forward and backward on CUDA (Llama's normalization): one warp per row for rstd and the
// input gradient, as LayerNorm's kernels; the gamma gradient reduces over rows per column in a
// fixed order (deterministic).
#include "backend/cuda/cuda_column_sums.cuh"
#include "backend/cuda/cuda_dropout_rows.cuh"
#include "backend/cuda/cuda_elements.cuh"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_launch.h"
#include "backend/cuda/cuda_norm_rows.cuh"

namespace brisk::cuda {

namespace {

constexpr int kRowsPerBlock = 8;  // warps per block, one row each

// A warp per row (cuda_norm_rows.cuh).
template <typename Y>
__global__ void __launch_bounds__(kRowsPerBlock * 32)
    rmsnorm_forward_kernel(const float* x, const float* gamma, float eps, Y* y, float* rstd,
                           int64_t rows, int64_t C) {
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
       row < rows; row += static_cast<int64_t>(gridDim.x) * kRowsPerBlock)
    rmsnorm_row(x + row * C, gamma, eps, y + row * C, C, rstd + row);
}

// dx = rstd * (dy*gamma - xhat * mean(dy*gamma*xhat)), the CPU's formula, dy rounded to round_dy
// as read. Lanes own fixed columns across both passes, so dx may alias dy (the gamma gradient is
// taken first). A branch's gradient as LayerNorm's.
__global__ void __launch_bounds__(kRowsPerBlock * 32)
    rmsnorm_backward_dx_kernel(const float* dy, DType round_dy, const float* x, const float* gamma,
                               const float* rstd, float* dx, bool accumulate_dx, float* branch,
                               RowDropout drop, int64_t rows, int64_t C) {
  const int lane = threadIdx.x & 31;
  const float cf = static_cast<float>(C);
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
       row < rows; row += static_cast<int64_t>(gridDim.x) * kRowsPerBlock) {
    const float *xr = x + row * C, *gr = dy + row * C;
    const float s = rstd[row];
    float sum_dx = 0.0f;
    for (int64_t c = lane; c < C; c += 32)
      sum_dx += rounded(gr[c], round_dy) * gamma[c] * (xr[c] * s);
    const float mean_dx = warp_reduce(sum_dx, SumOp{}) / cf;
    float* dr = dx + row * C;
    for (int64_t c = lane; c < C; c += 32) {
      const float v = s * (rounded(gr[c], round_dy) * gamma[c] - xr[c] * s * mean_dx);
      dr[c] = accumulate_dx ? dr[c] + v : v;
    }
    if (branch == nullptr) continue;
    __syncwarp();  // the dropout's lanes read columns other lanes wrote
    dropout_row(static_cast<const float*>(nullptr), static_cast<const float*>(dr), drop,
                drop.key.first_element + static_cast<uint64_t>(row * C), branch + row * C, C);
  }
}

// dgamma[c] += sum_r dy[r,c] * x[r,c] * rstd[r], over the block's chunk of rows
// (cuda_column_sums.cuh). A block takes 32 adjacent columns; its 32 warps split the chunk's rows
// by a fixed stride and their partial sums meet in a fixed tree, so the result does not depend on
// scheduling.
__global__ void __launch_bounds__(kSumThreads)
    rmsnorm_gamma_grad_kernel(const float* dy, DType round_dy, const float* x, const float* rstd,
                              float* dgamma, float* scratch, int64_t rows, int64_t chunk_rows,
                              int64_t C) {
  __shared__ float part[kSumLanes][kSumCols];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t first = chunk_first_row(chunk_rows), end = chunk_end_row(chunk_rows, rows);
  for (int64_t c0 = static_cast<int64_t>(blockIdx.x) * kSumCols; c0 < C;
       c0 += static_cast<int64_t>(gridDim.x) * kSumCols) {
    const int64_t c = c0 + tx;
    float acc = 0.0f;
    if (c < C) {
#pragma unroll 4
      for (int64_t r = first + ty; r < end; r += kSumLanes)
        acc += rounded(dy[r * C + c], round_dy) * (x[r * C + c] * rstd[r]);
    }
    part[ty][tx] = acc;
    __syncthreads();
    for (int half = kSumLanes / 2; half > 0; half >>= 1) {
      if (ty < half) part[ty][tx] += part[ty + half][tx];
      __syncthreads();
    }
    if (ty == 0 && c < C) put_column_sum(part[0][tx], dgamma, scratch, 0, C, c);
    // The next chunk overwrites the partials that row 0 just read.
    __syncthreads();
  }
}

}  // namespace

void rmsnorm_forward(cudaStream_t s, const float* x, const float* gamma, float eps, Out y,
                     float* rstd, int64_t rows, int64_t C) {
  if (rows <= 0 || C <= 0) return;
  with_elements(y.bf16, [&](auto yt) {
    rmsnorm_forward_kernel<<<grid_for(rows, kRowsPerBlock), kRowsPerBlock * 32, 0, s>>>(
        x, gamma, eps, static_cast<decltype(yt)*>(y.data), rstd, rows, C);
  });
  check_launch("rmsnorm_forward");
}

void rmsnorm_backward(cudaStream_t s, const float* dy, const float* x, const float* gamma,
                      const float* rstd, float* dx, bool accumulate_dx, float* dgamma, int64_t rows,
                      int64_t C, const ColumnScratch& scratch, DType round_dy,
                      const BranchGrad& branch) {
  if (rows <= 0 || C <= 0) return;
  // The gamma gradient first: it reads dy, which dx is allowed to overwrite.
  if (dgamma) {
    const ColumnSplit split = column_split(rows, C, 1, scratch);
    rmsnorm_gamma_grad_kernel<<<split.grid, dim3(kSumCols, kSumLanes), 0, s>>>(
        dy, round_dy, x, rstd, dgamma, scratch.data, rows, split.chunk_rows, C);
    check_launch("rmsnorm_backward (dgamma)");
    add_chunk_sums<1>(s, split, scratch.data, C, dgamma);
  }
  rmsnorm_backward_dx_kernel<<<grid_for(rows, kRowsPerBlock), kRowsPerBlock * 32, 0, s>>>(
      dy, round_dy, x, gamma, rstd, dx, accumulate_dx, branch.grad,
      row_dropout(branch.p, branch.key), rows, C);
  check_launch("rmsnorm_backward (dx)");
}

}  // namespace brisk::cuda
