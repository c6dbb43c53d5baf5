// Token, position and token-type embeddings on CUDA (a gather forward, a scatter-add backward; a
// packed batch's positions read from memory), and the first-token pooling that classification
// heads read (a packed batch's samples' first tokens, where they start read from memory).
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_launch.h"

namespace brisk::cuda {

namespace {

// One block per token (b, t), threads across its C columns. The sum order is the CPU's:
// (word + pos) + type. The table holds ids [first, first + held); other ids' word part is zero.
// The position row is t's, or a packed batch's token's own (positions).
__global__ void embedding_forward_kernel(const int32_t* ids, const float* word, const float* pos,
                                         const int32_t* type_ids, const float* type_table,
                                         float* out, int64_t B, int64_t T, int64_t C, int64_t first,
                                         int64_t held, const int32_t* positions) {
  for (int64_t bt = blockIdx.x; bt < B * T; bt += gridDim.x) {
    const int64_t row = ids[bt] - first;
    const float* wr = row >= 0 && row < held ? word + row * C : nullptr;
    const int64_t p = positions ? positions[bt] : bt % T;
    const float* pr = pos ? pos + p * C : nullptr;
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

// A packed batch's (positions): one block per token, every table's row by atomics, the position
// rows too (a position's tokens lie anywhere in the batch).
__global__ void embedding_backward_tokens_kernel(const float* dout, const int32_t* ids,
                                                 int64_t padding_idx, const int32_t* type_ids,
                                                 float* dword, float* dpos, float* dtype_table,
                                                 int64_t N, int64_t C, int64_t first, int64_t held,
                                                 const int32_t* positions) {
  for (int64_t bt = blockIdx.x; bt < N; bt += gridDim.x) {
    const int64_t row = ids[bt] - first;
    float* wr =
        dword && ids[bt] != padding_idx && row >= 0 && row < held ? dword + row * C : nullptr;
    float* pr = dpos ? dpos + static_cast<int64_t>(positions[bt]) * C : nullptr;
    float* tr = dtype_table ? dtype_table + static_cast<int64_t>(type_ids[bt]) * C : nullptr;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
      const float g = dout[bt * C + c];
      if (wr) atomicAdd(wr + c, g);
      if (pr) atomicAdd(pr + c, g);
      if (tr) atomicAdd(tr + c, g);
    }
  }
}

// Sequence b's first token among the B * T: row b's, a packed batch's sample b's (starts), or
// none (-1) past its samples.
__device__ int64_t first_of(int64_t b, int64_t T, const int32_t* starts, int64_t samples) {
  if (b >= samples) return -1;
  return starts ? starts[b] : b * T;
}

__global__ void first_token_kernel(const float* x, float* out, int64_t B, int64_t T, int64_t C,
                                   const int32_t* starts, int64_t samples) {
  for (int64_t i = global_thread(); i < B * C; i += grid_threads()) {
    const int64_t b = i / C, c = i - b * C, token = first_of(b, T, starts, samples);
    out[i] = token < 0 ? 0.0f : x[token * C + c];
  }
}

__global__ void first_token_backward_kernel(const float* dout, float* dx, int64_t B, int64_t T,
                                            int64_t C, const int32_t* starts, int64_t samples) {
  for (int64_t i = global_thread(); i < B * C; i += grid_threads()) {
    const int64_t b = i / C, c = i - b * C, token = first_of(b, T, starts, samples);
    if (token >= 0) dx[token * C + c] += dout[i];
  }
}

}  // namespace

void embedding_forward(cudaStream_t s, const int32_t* ids, const float* word, const float* pos,
                       const int32_t* type_ids, const float* type_table, float* out, int64_t B,
                       int64_t T, int64_t C, int64_t first, int64_t held,
                       const int32_t* positions) {
  if (B <= 0 || T <= 0 || C <= 0) return;
  // The type term needs both the ids and the table; either alone means no token types.
  if (!type_ids || !type_table) type_ids = nullptr;
  const int threads = threads_for_row(C);
  embedding_forward_kernel<<<grid_for(B * T, 1, kMaxBlocks * 4), threads, 0, s>>>(
      ids, word, pos, type_ids, type_table, out, B, T, C, first, held, positions);
  check_launch("embedding_forward");
}

void embedding_backward(cudaStream_t s, const float* dout, const int32_t* ids, int64_t padding_idx,
                        const int32_t* type_ids, float* dword, float* dpos, float* dtype_table,
                        int64_t B, int64_t T, int64_t C, int64_t first, int64_t held,
                        const int32_t* positions) {
  if (B <= 0 || T <= 0 || C <= 0) return;
  if (!type_ids) dtype_table = nullptr;
  if (!dword && !dpos && !dtype_table) return;
  const int threads = threads_for_row(C);
  if (positions) {
    embedding_backward_tokens_kernel<<<grid_for(B * T, 1, kMaxBlocks * 4), threads, 0, s>>>(
        dout, ids, padding_idx, type_ids, dword, dpos, dtype_table, B * T, C, first, held,
        positions);
    check_launch("embedding_backward");
    return;
  }
  embedding_backward_kernel<<<grid_for(T, 1, kMaxBlocks * 4), threads, 0, s>>>(
      dout, ids, padding_idx, type_ids, dword, dpos, dtype_table, B, T, C, first, held);
  check_launch("embedding_backward");
}

void first_token(cudaStream_t s, const float* x, float* out, int64_t B, int64_t T, int64_t C,
                 const int32_t* starts, int64_t samples) {
  if (B <= 0 || T <= 0 || C <= 0) return;
  first_token_kernel<<<grid_for(B * C), kThreads, 0, s>>>(x, out, B, T, C, starts, samples);
  check_launch("first_token");
}

void first_token_backward(cudaStream_t s, const float* dout, float* dx, int64_t B, int64_t T,
                          int64_t C, const int32_t* starts, int64_t samples) {
  if (B <= 0 || T <= 0 || C <= 0) return;
  first_token_backward_kernel<<<grid_for(B * C), kThreads, 0, s>>>(dout, dx, B, T, C, starts,
                                                                   samples);
  check_launch("first_token_backward");
}

}  // namespace brisk::cuda
