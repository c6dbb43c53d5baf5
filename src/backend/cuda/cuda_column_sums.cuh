// Sums over rows per column (the norms' parameter gradients) split into chunks of rows, so that a
// narrow matrix fills the GPU: GPT-2's 768 columns are only 24 blocks of 32, a fifth of an H100.
// Each chunk's sums go to a row of scratch and a second kernel adds those rows in chunk order, so
// the result does not depend on scheduling. One chunk (no scratch, or few rows) adds straight to
// the output.
#pragma once

#include <algorithm>
#include <cstdint>

#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_launch.h"

namespace brisk::cuda {

constexpr int kSumCols = 32;   // columns per block: one warp-wide chunk (128-byte rows) ...
constexpr int kSumLanes = 32;  // ... read by this many warps, each over a stride of rows
constexpr int kSumThreads = kSumCols * kSumLanes;
constexpr int64_t kMinChunkRows = 256;  // fewer rows per chunk gain nothing

struct ColumnSplit {
  int64_t chunks = 1, chunk_rows = 0;
  dim3 grid;
};

// Chunks for `outputs` column sums of rows x C: enough blocks for two per multiprocessor, within
// the scratch (outputs x chunks x C floats).
inline ColumnSplit column_split(int64_t rows, int64_t C, int outputs,
                                const ColumnScratch& scratch) {
  const int64_t col_blocks = std::min<int64_t>((C + kSumCols - 1) / kSumCols, kMaxBlocks);
  const int64_t wanted = (2 * int64_t{scratch.multiprocessors} + col_blocks - 1) / col_blocks;
  const int64_t fits = scratch.data ? scratch.floats / (int64_t{outputs} * C) : 1;
  ColumnSplit s;
  s.chunks = std::max<int64_t>(
      1, std::min({wanted, rows / kMinChunkRows, fits, int64_t{65535}}));  // grid.y's limit
  s.chunk_rows = (rows + s.chunks - 1) / s.chunks;
  s.grid = dim3(static_cast<unsigned>(col_blocks), static_cast<unsigned>(s.chunks));
  return s;
}

// The rows [first, end) of the calling block's chunk.
__device__ inline int64_t chunk_first_row(int64_t chunk_rows) {
  return static_cast<int64_t>(blockIdx.y) * chunk_rows;
}
__device__ inline int64_t chunk_end_row(int64_t chunk_rows, int64_t rows) {
  return min(rows, chunk_first_row(chunk_rows) + chunk_rows);
}

// Column c's sum over the block's chunk for output `o`: added to out when there is one chunk,
// else written to the chunk's row of the scratch.
__device__ inline void put_column_sum(float v, float* out, float* scratch, int o, int64_t C,
                                      int64_t c) {
  if (gridDim.y == 1)
    out[c] += v;
  else
    scratch[(static_cast<int64_t>(o) * gridDim.y + blockIdx.y) * C + c] = v;
}

// out_o[c] += the chunks' sums of column c in chunk order (null outputs skipped).
template <int kOutputs>
__global__ void add_chunk_sums_kernel(const float* scratch, int64_t chunks, int64_t C, float* out0,
                                      float* out1) {
  for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < C;
       c += static_cast<int64_t>(gridDim.x) * blockDim.x)
    for (int o = 0; o < kOutputs; ++o) {
      float* out = o == 0 ? out0 : out1;
      if (!out) continue;
      float sum = 0.0f;
      for (int64_t k = 0; k < chunks; ++k) sum += scratch[(o * chunks + k) * C + c];
      out[c] += sum;
    }
}

template <int kOutputs>
void add_chunk_sums(cudaStream_t s, const ColumnSplit& split, const float* scratch, int64_t C,
                    float* out0, float* out1 = nullptr) {
  if (split.chunks == 1) return;
  add_chunk_sums_kernel<kOutputs>
      <<<grid_for(C), kThreads, 0, s>>>(scratch, split.chunks, C, out0, out1);
  check_launch("column sums over row chunks");
}

}  // namespace brisk::cuda
