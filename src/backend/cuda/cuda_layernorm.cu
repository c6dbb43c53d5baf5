// LayerNorm forward and backward on CUDA: one warp per row for the row statistics and the input
// gradient; the parameter gradients reduce over rows per column in a fixed order (deterministic).
#include "backend/cuda/cuda_column_sums.cuh"
#include "backend/cuda/cuda_dropout_rows.cuh"
#include "backend/cuda/cuda_elements.cuh"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_launch.h"
#include "backend/cuda/cuda_norm_rows.cuh"

namespace brisk::cuda {

namespace {

constexpr int kRowsPerBlock = 8;  // warps per block, one row each

// A warp per row (cuda_norm_rows.cuh). mean and rstd may be null (nothing saved).
template <typename Y>
__global__ void __launch_bounds__(kRowsPerBlock * 32)
    layernorm_forward_kernel(const float* x, const float* gamma, const float* beta, float eps, Y* y,
                             float* mean, float* rstd, int64_t rows, int64_t C) {
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
       row < rows; row += static_cast<int64_t>(gridDim.x) * kRowsPerBlock)
    layernorm_row(x + row * C, gamma, beta, eps, y + row * C, C, mean ? mean + row : nullptr,
                  rstd ? rstd + row : nullptr);
}

// dx = rstd * (dy*gamma - mean(dy*gamma) - xhat * mean(dy*gamma*xhat)), the CPU's formula, dy
// rounded to round_dy as read. Lanes own fixed columns across both passes, so dx may alias dy
// (parameter gradients are taken first). With a branch, the row's dx then goes through the
// branch's dropout into its gradient (after the warp's last read of dy, which it may overwrite).
__global__ void __launch_bounds__(kRowsPerBlock * 32)
    layernorm_backward_dx_kernel(const float* dy, DType round_dy, const float* x,
                                 const float* gamma, const float* mean, const float* rstd,
                                 float* dx, bool accumulate_dx, float* branch, RowDropout drop,
                                 int64_t rows, int64_t C) {
  const int lane = threadIdx.x & 31;
  const float cf = static_cast<float>(C);
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
       row < rows; row += static_cast<int64_t>(gridDim.x) * kRowsPerBlock) {
    const float *xr = x + row * C, *gr = dy + row * C;
    const float m = mean[row], s = rstd[row];
    float sum_d = 0.0f, sum_dx = 0.0f;
    for (int64_t c = lane; c < C; c += 32) {
      const float xhat = (xr[c] - m) * s;
      const float d = rounded(gr[c], round_dy) * gamma[c];
      sum_d += d;
      sum_dx += d * xhat;
    }
    const float mean_d = warp_reduce(sum_d, SumOp{}) / cf;
    const float mean_dx = warp_reduce(sum_dx, SumOp{}) / cf;
    float* dr = dx + row * C;
    for (int64_t c = lane; c < C; c += 32) {
      const float xhat = (xr[c] - m) * s;
      const float v = s * (rounded(gr[c], round_dy) * gamma[c] - mean_d - xhat * mean_dx);
      dr[c] = accumulate_dx ? dr[c] + v : v;
    }
    if (branch == nullptr) continue;
    __syncwarp();  // the dropout's lanes read columns other lanes wrote
    dropout_row(static_cast<const float*>(nullptr), static_cast<const float*>(dr), drop,
                drop.key.first_element + static_cast<uint64_t>(row * C), branch + row * C, C);
  }
}

// dgamma[c] += sum_r dy[r,c] * xhat[r,c]; dbeta[c] += sum_r dy[r,c], over the block's chunk of
// rows (cuda_column_sums.cuh). A block takes 32 adjacent columns (coalesced rows of 128 bytes);
// its 32 warps split the chunk's rows by a fixed stride and their partial sums meet in a fixed
// tree, so the result does not depend on scheduling. Either output may be null.
__global__ void __launch_bounds__(kSumThreads)
    layernorm_param_grad_kernel(const float* dy, DType round_dy, const float* x, const float* mean,
                                const float* rstd, float* dgamma, float* dbeta, float* scratch,
                                int64_t rows, int64_t chunk_rows, int64_t C) {
  __shared__ float part_g[kSumLanes][kSumCols];
  __shared__ float part_b[kSumLanes][kSumCols];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t first = chunk_first_row(chunk_rows), end = chunk_end_row(chunk_rows, rows);
  for (int64_t c0 = static_cast<int64_t>(blockIdx.x) * kSumCols; c0 < C;
       c0 += static_cast<int64_t>(gridDim.x) * kSumCols) {
    const int64_t c = c0 + tx;
    float acc_g = 0.0f, acc_b = 0.0f;
    if (c < C) {
#pragma unroll 4
      for (int64_t r = first + ty; r < end; r += kSumLanes) {
        const float g = rounded(dy[r * C + c], round_dy);
        acc_g += g * (x[r * C + c] - mean[r]) * rstd[r];
        acc_b += g;
      }
    }
    part_g[ty][tx] = acc_g;
    part_b[ty][tx] = acc_b;
    __syncthreads();
    for (int half = kSumLanes / 2; half > 0; half >>= 1) {
      if (ty < half) {
        part_g[ty][tx] += part_g[ty + half][tx];
        part_b[ty][tx] += part_b[ty + half][tx];
      }
      __syncthreads();
    }
    if (ty == 0 && c < C) {
      if (dgamma) put_column_sum(part_g[0][tx], dgamma, scratch, 0, C, c);
      if (dbeta) put_column_sum(part_b[0][tx], dbeta, scratch, 1, C, c);
    }
    // The next chunk overwrites the partials that row 0 just read.
    __syncthreads();
  }
}

}  // namespace

void layernorm_forward(cudaStream_t s, const float* x, const float* gamma, const float* beta,
                       float eps, Out y, float* mean, float* rstd, int64_t rows, int64_t C) {
  if (rows <= 0 || C <= 0) return;
  with_elements(y.bf16, [&](auto yt) {
    layernorm_forward_kernel<<<grid_for(rows, kRowsPerBlock), kRowsPerBlock * 32, 0, s>>>(
        x, gamma, beta, eps, static_cast<decltype(yt)*>(y.data), mean, rstd, rows, C);
  });
  check_launch("layernorm_forward");
}

void layernorm_backward(cudaStream_t s, const float* dy, const float* x, const float* gamma,
                        const float* mean, const float* rstd, float* dx, bool accumulate_dx,
                        float* dgamma, float* dbeta, int64_t rows, int64_t C,
                        const ColumnScratch& scratch, DType round_dy, const BranchGrad& branch) {
  if (rows <= 0 || C <= 0) return;
  // Parameter gradients first: they read dy, which dx is allowed to overwrite.
  if (dgamma || dbeta) {
    const ColumnSplit split = column_split(rows, C, 2, scratch);
    layernorm_param_grad_kernel<<<split.grid, dim3(kSumCols, kSumLanes), 0, s>>>(
        dy, round_dy, x, mean, rstd, dgamma, dbeta, scratch.data, rows, split.chunk_rows, C);
    check_launch("layernorm_backward (dgamma, dbeta)");
    add_chunk_sums<2>(s, split, scratch.data, C, dgamma, dbeta);
  }
  if (!dx) return;
  layernorm_backward_dx_kernel<<<grid_for(rows, kRowsPerBlock), kRowsPerBlock * 32, 0, s>>>(
      dy, round_dy, x, gamma, mean, rstd, dx, accumulate_dx, branch.grad,
      row_dropout(branch.p, branch.key), rows, C);
  check_launch("layernorm_backward (dx)");
}

}  // namespace brisk::cuda
