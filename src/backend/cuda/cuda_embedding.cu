// Token, position and token-type embeddings on CUDA (a gather forward, a scatter-add backward),
// and the first-token pooling that classification heads read.
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_launch.h"

namespace brisk::cuda {

namespace {

// One block per token (b, t), threads across its C columns. The sum order is the CPU's:
// (word + pos) + type. The table holds ids [first, first + held); other ids' word part is zero.
__global__ void embedding_forward_kernel(const int32_t* ids, const float* word, const float* pos,
                                         const int32_t* type_ids, const float* type_table,
                                         float* out, int64_t B, int64_t T, int64_t C, int64_t first,
                                         int64_t held) {
  for (int64_t bt = blockIdx.x; bt < B * T; bt += gridDim.x) {
    const int64_t row = ids[bt] - first;
    const float* wr = row >= 0 && row < held ? word + row * C : nullptr;
    const float* pr = pos ? pos + (bt % T) * C : nullptr;
    const float* tr = type_ids ? type_table + static_cast<int64_t>(type_ids[bt]) * C : nullptr;
    float* orow = out + bt * C;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
      float v = wr ? wr[c] : 0.0f;
      if (pr) v += pr[c];
      if (tr) v += tr[c];
      orow[c] = v;
    }
  }
}

// One block per position t, threads across columns, looping over the batch. The position row
// (t, c) belongs to one thread, which adds the batch's gradients in the CPU's order (b = 0, 1,
// ...): deterministic without atomics. Word and type rows are shared by repeated ids anywhere in
// the batch, so they take atomicAdd; their summation order, and so their last bits, can vary
// between runs (the type table has few rows, but the contention is spread over C addresses).
__global__ void embedding_backward_kernel(const float* dout, const int32_t* ids,
                                          int64_t padding_idx, const int32_t* type_ids,
                                          float* dword, float* dpos, float* dtype_table, int64_t B,
                                          int64_t T, int64_t C, int64_t first, int64_t held) {
  for (int64_t t = blockIdx.x; t < T; t += gridDim.x) {
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
      float acc = dpos ? dpos[t * C + c] : 0.0f;
      for (int64_t b = 0; b < B; ++b) {
        const int64_t bt = b * T + t;
        const float g = dout[bt * C + c];
        const int64_t row = ids[bt] - first;
        if (dword && ids[bt] != padding_idx && row >= 0 && row < held)
          atomicAdd(dword + row * C + c, g);
        if (dtype_table) atomicAdd(dtype_table + static_cast<int64_t>(type_ids[bt]) * C + c, g);
        acc += g;
      }
      if (dpos) dpos[t * C + c] = acc;
    }
  }
}

__global__ void first_token_kernel(const float* x, float* out, int64_t B, int64_t T, int64_t C) {
  for (int64_t i = global_thread(); i < B * C; i += grid_threads()) {
    const int64_t b = i / C, c = i - b * C;
    out[i] = x[b * T * C + c];
  }
}

__global__ void first_token_backward_kernel(const float* dout, float* dx, int64_t B, int64_t T,
                                            int64_t C) {
  for (int64_t i = global_thread(); i < B * C; i += grid_threads()) {
    const int64_t b = i / C, c = i - b * C;
    dx[b * T * C + c] += dout[i];
  }
}

}  // namespace

void embedding_forward(cudaStream_t s, const int32_t* ids, const float* word, const float* pos,
                       const int32_t* type_ids, const float* type_table, float* out, int64_t B,
                       int64_t T, int64_t C, int64_t first, int64_t held) {
  if (B <= 0 || T <= 0 || C <= 0) return;
  // The type term needs both the ids and the table; either alone means no token types.
  if (!type_ids || !type_table) type_ids = nullptr;
  const int threads = threads_for_row(C);
  embedding_forward_kernel<<<grid_for(B * T, 1, kMaxBlocks * 4), threads, 0, s>>>(
      ids, word, pos, type_ids, type_table, out, B, T, C, first, held);
  check_launch("embedding_forward");
}

void embedding_backward(cudaStream_t s, const float* dout, const int32_t* ids, int64_t padding_idx,
                        const int32_t* type_ids, float* dword, float* dpos, float* dtype_table,
                        int64_t B, int64_t T, int64_t C, int64_t first, int64_t held) {
  if (B <= 0 || T <= 0 || C <= 0) return;
  if (!type_ids) dtype_table = nullptr;
  if (!dword && !dpos && !dtype_table) return;
  const int threads = threads_for_row(C);
  embedding_backward_kernel<<<grid_for(T, 1, kMaxBlocks * 4), threads, 0, s>>>(
      dout, ids, padding_idx, type_ids, dword, dpos, dtype_table, B, T, C, first, held);
  check_launch("embedding_backward");
}

void first_token(cudaStream_t s, const float* x, float* out, int64_t B, int64_t T, int64_t C) {
  if (B <= 0 || T <= 0 || C <= 0) return;
  first_token_kernel<<<grid_for(B * C), kThreads, 0, s>>>(x, out, B, T, C);
  check_launch("first_token");
}

void first_token_backward(cudaStream_t s, const float* dout, float* dx, int64_t B, int64_t T,
                          int64_t C) {
  if (B <= 0 || T <= 0 || C <= 0) return;
  first_token_backward_kernel<<<grid_for(B * C), kThreads, 0, s>>>(dout, dx, B, T, C);
  check_launch("first_token_backward");
}

}  // namespace brisk::cuda
