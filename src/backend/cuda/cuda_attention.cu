// Flash attention in float32 on CUDA: tiles of queries and keys in shared memory, an online softmax
// forward and a backward that recomputes the probabilities, with the CPU's dropout masks. Grouped-
// query attention: query head h reads key/value head h / (H / K); the key/value gradient kernel
// sums over the group's query heads itself, in a fixed order.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>

#include "backend/cuda/cuda_elements.cuh"
#include "backend/cuda/cuda_kernels.h"
#include "core/error.h"
#include "core/rng.h"

namespace brisk::cuda {

namespace {

// Every attention block has 16 x 16 threads: tx = tid % 16 picks key columns (tx + 16c) and
// feature columns (tx + 16c), ty = tid / 16 picks a run of rows. The 16 lanes sharing a ty form
// one half-warp, so a row's reductions are shuffles within it.
constexpr int kThreads = 256;
constexpr int kMaxD = 128;

// Forward tiles: 64 queries x 64 keys (K and V take turns in one buffer). Backward tiles: 32 x 32,
// so that the Q, dO, K and V tiles all stay in shared memory; at D = 128 both kernels need under
// the 99 KiB a block may opt into on sm_86/sm_89.
constexpr int kFwdRows = 64;
constexpr int kFwdCols = 64;
constexpr int kBwdRows = 32;
constexpr int kBwdCols = 32;

// Row stride of a [rows][D] tile in shared memory: odd, so the 16 rows that a half-warp reads at
// one column fall in 16 distinct banks.
__host__ __device__ inline int tile_ld(int D) {
  return D | 1;
}

// Row stride of a [rows][COLS] score tile written by thread rows ty * RM + r: the two half-warps of
// a warp write rows RM apart, and the 16 / RM extra columns put those rows on opposite bank halves.
template <int RM, int COLS>
constexpr int kScoreLd = COLS + 16 / RM;

// Byte offsets into the dynamic shared memory of the forward kernel.
struct FwdLayout {
  size_t q, kv, p, kvis, keep, bytes;
};

__host__ __device__ inline FwdLayout fwd_layout(int D) {
  constexpr int PLD = kScoreLd<kFwdRows / 16, kFwdCols>;
  const size_t ld = static_cast<size_t>(tile_ld(D));
  FwdLayout L;
  L.q = 0;
  L.kv = L.q + kFwdRows * ld * sizeof(float);
  L.p = L.kv + kFwdCols * ld * sizeof(float);
  L.kvis = L.p + kFwdRows * PLD * sizeof(float);
  L.keep = L.kvis + kFwdCols * sizeof(int);
  L.bytes = L.keep + kFwdRows * kFwdCols;
  return L;
}

// Byte offsets into the dynamic shared memory of the two backward kernels (dQ leaves pd unused).
struct BwdLayout {
  size_t q, dout, k, v, pd, ds, lse, delta, kvis, keep, bytes;
};

__host__ __device__ inline BwdLayout bwd_layout(int D) {
  constexpr int PLD = kScoreLd<kBwdRows / 16, kBwdCols>;
  const size_t ld = static_cast<size_t>(tile_ld(D));
  BwdLayout L;
  L.q = 0;
  L.dout = L.q + kBwdRows * ld * sizeof(float);
  L.k = L.dout + kBwdRows * ld * sizeof(float);
  L.v = L.k + kBwdCols * ld * sizeof(float);
  L.pd = L.v + kBwdCols * ld * sizeof(float);
  L.ds = L.pd + kBwdRows * PLD * sizeof(float);
  L.lse = L.ds + kBwdRows * PLD * sizeof(float);
  L.delta = L.lse + kBwdRows * sizeof(float);
  L.kvis = L.delta + kBwdRows * sizeof(float);
  L.keep = L.kvis + kBwdCols * sizeof(int);
  L.bytes = L.keep + kBwdRows * kBwdCols;
  return L;
}

// dst[r][d] = src[(row0 + r) * src_ld + d] for r < rows, d < D; rows at or past T become zero so
// that padded rows never carry garbage (or NaN) into a product.
template <typename S>
__device__ __forceinline__ void load_rows(float* dst, int dst_ld, const S* __restrict__ src,
                                          int64_t src_ld, int row0, int rows, int T, int D) {
  for (int idx = threadIdx.x; idx < rows * D; idx += kThreads) {
    const int r = idx / D, d = idx - r * D;
    const int i = row0 + r;
    dst[r * dst_ld + d] = i < T ? widen(src[static_cast<int64_t>(i) * src_ld + d]) : 0.0f;
  }
}

// kvis[c] = whether key k0 + c exists and the key mask lets it be seen.
template <int COLS>
__device__ __forceinline__ void load_key_visibility(int* kvis, const int32_t* __restrict__ key_mask,
                                                    int64_t b, int k0, int T) {
  for (int c = threadIdx.x; c < COLS; c += kThreads) {
    const int j = k0 + c;
    kvis[c] = j < T && (key_mask == nullptr || key_mask[b * T + j] != 0);
  }
}

// keep[r * COLS + c] = dropout keep flag of probability (query q0 + r, key k0 + c) of head bh
// (attention_head_id: counted among every head), element id ((bh * T + i) * T + j) as on the CPU. A
// Philox call yields the words of four consecutive elements, so each call is made once per row and
// tile instead of once per element. Rows or keys past T get flags too (ids past the row's end);
// they are never used.
template <int ROWS, int COLS>
__device__ __forceinline__ void fill_keep(uint8_t* keep, const RngKey& key, uint32_t threshold,
                                          uint64_t bh, int T, int q0, int k0) {
  constexpr int kGroups = COLS / 4 + 1;  // Philox blocks overlapping COLS consecutive elements
  for (int task = threadIdx.x; task < ROWS * kGroups; task += kThreads) {
    const int r = task / kGroups, g = task - r * kGroups;
    const uint64_t first = (bh * T + static_cast<uint64_t>(q0 + r)) * T + k0;
    const uint64_t group = (first >> 2) + g;
    if (group * 4 >= first + COLS) continue;  // the row's elements end before this block
    const Philox4 words = rng_block(key, group);
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const uint64_t e = group * 4 + w;
      if (e >= first && e < first + COLS) keep[r * COLS + (e - first)] = words.v[w] >= threshold;
    }
  }
}

// acc[r][c] = sum_d A[ty * RM + r][d] * B[tx + 16c][d]: dot products between rows of two shared
// [rows][D] tiles (row stride ld).
template <int RM, int CM>
__device__ __forceinline__ void tile_dots(const float* A, const float* B, int ld, int D, int ty,
                                          int tx, float (&acc)[RM][CM]) {
#pragma unroll
  for (int r = 0; r < RM; ++r) {
#pragma unroll
    for (int c = 0; c < CM; ++c) acc[r][c] = 0.0f;
  }
  const float* a = A + ty * RM * ld;
  const float* b = B + tx * ld;
#pragma unroll 4
  for (int d = 0; d < D; ++d) {
    float av[RM], bv[CM];
#pragma unroll
    for (int r = 0; r < RM; ++r) av[r] = a[r * ld + d];
#pragma unroll
    for (int c = 0; c < CM; ++c) bv[c] = b[16 * c * ld + d];
#pragma unroll
    for (int r = 0; r < RM; ++r) {
#pragma unroll
      for (int c = 0; c < CM; ++c) acc[r][c] = fmaf(av[r], bv[c], acc[r][c]);
    }
  }
}

// acc[r][c] += sum_j W(ty * RM + r, j) * M[j][tx + 16c] over j < count: a tile of weights (P,
// dS; element (row, j) at W[row * w_row + j * w_col], so a transposed tile is read in place)
// applied to the rows of a shared [count][D] tile M (row stride ld).
template <int RM, int kSlots>
__device__ __forceinline__ void accumulate_weighted_rows(float (&acc)[RM][kSlots], const float* W,
                                                         int w_row, int w_col, const float* M,
                                                         int ld, int count, int D, int ty, int tx) {
  for (int j = 0; j < count; ++j) {
    float w[RM];
#pragma unroll
    for (int r = 0; r < RM; ++r) w[r] = W[(ty * RM + r) * w_row + j * w_col];
#pragma unroll
    for (int c = 0; c < kSlots; ++c) {
      const int d = tx + 16 * c;
      if (d < D) {
        const float m = M[j * ld + d];
#pragma unroll
        for (int r = 0; r < RM; ++r) acc[r][c] = fmaf(w[r], m, acc[r][c]);
      }
    }
  }
}

// Reductions over the 16 lanes of a half-warp (all 32 lanes take part).
__device__ __forceinline__ float halfwarp_max(float x) {
#pragma unroll
  for (int off = 8; off > 0; off >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, off, 16));
  return x;
}

__device__ __forceinline__ float halfwarp_sum(float x) {
#pragma unroll
  for (int off = 8; off > 0; off >>= 1) x += __shfl_xor_sync(0xffffffffu, x, off, 16);
  return x;
}

// Shape and dropout parameters shared by all attention kernels.
struct AttnParams {
  const int32_t* key_mask;  // [B,T] or null
  bool causal;
  int T, H, K, D;  // K key/value heads, each shared by H / K consecutive query heads
  float scale;     // of the scores q.k
  bool dropout;
  uint32_t threshold;
  float drop_scale;  // 1 / (1 - p)
  RngKey key;
};

// One block per (batch * head, tile of kFwdRows queries). Each thread keeps running max, sum and
// output for its kFwdRows / 16 rows and feature columns tx + 16c (c < kSlots, D <= 16 * kSlots).
template <int kSlots, typename Q>
__global__ void __launch_bounds__(kThreads)
    attention_forward_kernel(const Q* __restrict__ qkv, AttnParams a, float* __restrict__ lse,
                             float* __restrict__ out) {
  constexpr int R = kFwdRows, NC = kFwdCols, RM = R / 16, CM = NC / 16;
  constexpr int PLD = kScoreLd<RM, NC>;
  extern __shared__ __align__(16) unsigned char smem[];
  const FwdLayout L = fwd_layout(a.D);
  float* Qs = reinterpret_cast<float*>(smem + L.q);
  float* KV = reinterpret_cast<float*>(smem + L.kv);
  float* Ps = reinterpret_cast<float*>(smem + L.p);
  int* kvis = reinterpret_cast<int*>(smem + L.kvis);
  uint8_t* keep = smem + L.keep;

  const int T = a.T, D = a.D, ld = tile_ld(D);
  const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
  const int64_t bh = blockIdx.x, b = bh / a.H, h = bh % a.H, kh = h / (a.H / a.K);
  const int q0 = blockIdx.y * R;
  const int64_t C = static_cast<int64_t>(a.H) * D,
                row_stride = C + 2 * static_cast<int64_t>(a.K) * D;
  const Q* token0 = qkv + b * T * row_stride;
  const Q* q_base = token0 + h * D;
  const Q* k_base = token0 + C + kh * D;
  const Q* v_base = k_base + static_cast<int64_t>(a.K) * D;

  load_rows(Qs, ld, q_base, row_stride, q0, R, T, D);

  float m[RM], l[RM], o[RM][kSlots];
#pragma unroll
  for (int r = 0; r < RM; ++r) {
    m[r] = -INFINITY;
    l[r] = 0.0f;
#pragma unroll
    for (int c = 0; c < kSlots; ++c) o[r][c] = 0.0f;
  }

  // Causal: keys past the tile's last query are hidden from every row, so those tiles are skipped.
  const int k_end = a.causal ? min(T, q0 + R) : T;
  for (int k0 = 0; k0 < k_end; k0 += NC) {
    __syncthreads();  // the previous tile's readers of KV, Ps, kvis and keep are done
    load_rows(KV, ld, k_base, row_stride, k0, NC, T, D);
    load_key_visibility<NC>(kvis, a.key_mask, b, k0, T);
    if (a.dropout)
      fill_keep<R, NC>(
          keep, a.key, a.threshold,
          attention_head_id(a.key, static_cast<uint64_t>(bh), static_cast<uint64_t>(a.H)), T, q0,
          k0);
    __syncthreads();

    float s[RM][CM];
    tile_dots<RM, CM>(Qs, KV, ld, D, ty, tx, s);
#pragma unroll
    for (int r = 0; r < RM; ++r) {
      const int i = q0 + ty * RM + r;
#pragma unroll
      for (int c = 0; c < CM; ++c) {
        const int j = k0 + tx + 16 * c;
        const bool visible = kvis[tx + 16 * c] && (!a.causal || j <= i);
        s[r][c] = visible ? s[r][c] * a.scale : -INFINITY;
      }
    }
    __syncthreads();  // everyone is done with K: V takes its place
    load_rows(KV, ld, v_base, row_stride, k0, NC, T, D);

#pragma unroll
    for (int r = 0; r < RM; ++r) {
      const int row = ty * RM + r;
      float tile_max = s[r][0];
#pragma unroll
      for (int c = 1; c < CM; ++c) tile_max = fmaxf(tile_max, s[r][c]);
      const float m_new = fmaxf(m[r], halfwarp_max(tile_max));
      // While a row has seen no key, m stays -inf; subtracting 0 instead keeps exp() free of
      // (-inf) - (-inf) and gives p = 0, alpha = 0 on an all-zero state.
      const float m_ref = m_new == -INFINITY ? 0.0f : m_new;
      const float alpha = expf(m[r] - m_ref);
      float sum = 0.0f;
#pragma unroll
      for (int c = 0; c < CM; ++c) {
        const int col = tx + 16 * c;
        float p = expf(s[r][c] - m_ref);
        sum += p;  // the normalizer counts every probability, dropped or not
        if (a.dropout) p = keep[row * NC + col] ? p * a.drop_scale : 0.0f;
        Ps[row * PLD + col] = p;
      }
      l[r] = l[r] * alpha + halfwarp_sum(sum);
      m[r] = m_new;
#pragma unroll
      for (int c = 0; c < kSlots; ++c) o[r][c] *= alpha;
    }
    __syncthreads();  // V and Ps are complete

    accumulate_weighted_rows<RM, kSlots>(o, Ps, PLD, 1, KV, ld, min(NC, T - k0), D, ty, tx);
  }

#pragma unroll
  for (int r = 0; r < RM; ++r) {
    const int i = q0 + ty * RM + r;
    if (i >= T) continue;
    // Any visible key contributes exp(0) = 1 to l, so l == 0 means the row saw no key (a NaN l
    // from NaN scores counts as seen, so the NaN reaches the output as on the CPU).
    const bool seen = l[r] != 0.0f;
    const float inv = seen ? 1.0f / l[r] : 0.0f;
    float* out_row = out + (b * T + i) * C + h * D;
#pragma unroll
    for (int c = 0; c < kSlots; ++c) {
      const int d = tx + 16 * c;
      if (d < D) out_row[d] = o[r][c] * inv;
    }
    if (tx == 0) lse[bh * T + i] = seen ? m[r] + logf(l[r]) : INFINITY;
  }
}

// delta[b,h,i] = dout_i . out_i, one warp per (b, i, h) row of D features.
template <typename O>
__global__ void __launch_bounds__(kThreads)
    attention_delta_kernel(const float* __restrict__ dout, const O* __restrict__ out, int64_t rows,
                           int T, int H, int D, float* __restrict__ delta) {
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (kThreads / 32) + threadIdx.x / 32;
  if (row >= rows) return;  // the whole warp leaves together
  // [B,T,C] with C = H * D is [B,T,H,D]: row (b*T + i)*H + h starts at row * D.
  const float* g = dout + row * D;
  const O* o = out + row * D;
  float sum = 0.0f;
  for (int d = lane; d < D; d += 32) sum = fmaf(g[d], widen(o[d]), sum);
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
  if (lane == 0) {
    const int64_t h = row % H, bt = row / H, b = bt / T, i = bt % T;
    delta[(b * H + h) * T + i] = sum;
  }
}

// For the thread's (query, key) pairs of a backward tile: P = exp(s - lse), the dropped P
// (into pd_tile when given) and dS = P * (dP - delta) with dP = dropout(dO . v) (into ds_tile).
// Query rows ty * RM + r of the tile start at q0, key columns tx + 16c at k0.
template <int RM, int CM, int NC, int PLD>
__device__ __forceinline__ void backward_scores(const AttnParams& a, const float* Qs,
                                                const float* dOs, const float* Ks, const float* Vs,
                                                const float* lse_s, const float* delta_s,
                                                const int* kvis, const uint8_t* keep, int q0,
                                                int k0, int tx, int ty, float* pd_tile,
                                                float* ds_tile) {
  const int ld = tile_ld(a.D);
  float s[RM][CM], dp[RM][CM];
  tile_dots<RM, CM>(Qs, Ks, ld, a.D, ty, tx, s);
  tile_dots<RM, CM>(dOs, Vs, ld, a.D, ty, tx, dp);
#pragma unroll
  for (int r = 0; r < RM; ++r) {
    const int row = ty * RM + r, i = q0 + row;
#pragma unroll
    for (int c = 0; c < CM; ++c) {
      const int col = tx + 16 * c, j = k0 + col;
      const bool visible = i < a.T && kvis[col] && (!a.causal || j <= i);
      // A row that saw no key has lse = +inf and no visible key, so it never reaches expf.
      const float p = visible ? expf(s[r][c] * a.scale - lse_s[row]) : 0.0f;
      float pd = p, g = dp[r][c];
      if (a.dropout) {
        const bool kept = keep[row * NC + col];
        pd = kept ? p * a.drop_scale : 0.0f;
        g = kept ? g * a.drop_scale : 0.0f;
      }
      if (pd_tile) pd_tile[row * PLD + col] = pd;
      ds_tile[row * PLD + col] = p * (g - delta_s[row]);
    }
  }
}

// Loads lse and delta of queries [q0, q0 + ROWS); padded rows get lse = +inf (P = 0).
template <int ROWS>
__device__ __forceinline__ void load_row_stats(float* lse_s, float* delta_s,
                                               const float* __restrict__ lse,
                                               const float* __restrict__ delta, int64_t bh, int q0,
                                               int T) {
  for (int r = threadIdx.x; r < ROWS; r += kThreads) {
    const int i = q0 + r;
    lse_s[r] = i < T ? lse[bh * T + i] : INFINITY;
    delta_s[r] = i < T ? delta[bh * T + i] : 0.0f;
  }
}

// dK and dV: one block per (batch * key/value head, tile of kBwdCols keys), looping over the query
// heads of the group (one, without grouping) and for each over the query tiles that can see those
// keys. Each thread accumulates keys ty * KM + r, feature columns tx + 16c.
template <int kSlots, typename Q>
__global__ void __launch_bounds__(kThreads)
    attention_backward_dkdv_kernel(const float* __restrict__ dout, const Q* __restrict__ qkv,
                                   const float* __restrict__ lse, const float* __restrict__ delta,
                                   AttnParams a, float* __restrict__ dqkv) {
  constexpr int R = kBwdRows, NC = kBwdCols, RM = R / 16, CM = NC / 16, KM = NC / 16;
  constexpr int PLD = kScoreLd<RM, NC>;
  extern __shared__ __align__(16) unsigned char smem[];
  const BwdLayout L = bwd_layout(a.D);
  float* Qs = reinterpret_cast<float*>(smem + L.q);
  float* dOs = reinterpret_cast<float*>(smem + L.dout);
  float* Ks = reinterpret_cast<float*>(smem + L.k);
  float* Vs = reinterpret_cast<float*>(smem + L.v);
  float* Pd = reinterpret_cast<float*>(smem + L.pd);
  float* dS = reinterpret_cast<float*>(smem + L.ds);
  float* lse_s = reinterpret_cast<float*>(smem + L.lse);
  float* delta_s = reinterpret_cast<float*>(smem + L.delta);
  int* kvis = reinterpret_cast<int*>(smem + L.kvis);
  uint8_t* keep = smem + L.keep;

  const int T = a.T, D = a.D, ld = tile_ld(D);
  const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
  const int64_t bk = blockIdx.x, b = bk / a.K, kh = bk % a.K, group = a.H / a.K;
  const int k0 = blockIdx.y * NC;
  const int64_t C = static_cast<int64_t>(a.H) * D,
                row_stride = C + 2 * static_cast<int64_t>(a.K) * D;
  const Q* token0 = qkv + b * T * row_stride;
  const Q* k_base = token0 + C + kh * D;
  const Q* v_base = k_base + static_cast<int64_t>(a.K) * D;

  load_rows(Ks, ld, k_base, row_stride, k0, NC, T, D);
  load_rows(Vs, ld, v_base, row_stride, k0, NC, T, D);
  load_key_visibility<NC>(kvis, a.key_mask, b, k0, T);

  float dk[KM][kSlots], dv[KM][kSlots];
#pragma unroll
  for (int r = 0; r < KM; ++r) {
#pragma unroll
    for (int c = 0; c < kSlots; ++c) dk[r][c] = dv[r][c] = 0.0f;
  }

  // Causal: queries before k0 see none of these keys; start at the tile holding query k0.
  const int q_begin = a.causal ? k0 - k0 % R : 0;
  for (int64_t h = kh * group; h < (kh + 1) * group; ++h) {
    const int64_t bh = b * a.H + h;
    const Q* q_base = token0 + h * D;
    const float* do_base = dout + b * T * C + h * D;
    for (int q0 = q_begin; q0 < T; q0 += R) {
      __syncthreads();  // the previous tile's readers of Qs, dOs, Pd, dS, the stats, keep are done
      load_rows(Qs, ld, q_base, row_stride, q0, R, T, D);
      load_rows(dOs, ld, do_base, C, q0, R, T, D);
      load_row_stats<R>(lse_s, delta_s, lse, delta, bh, q0, T);
      if (a.dropout)
        fill_keep<R, NC>(
            keep, a.key, a.threshold,
            attention_head_id(a.key, static_cast<uint64_t>(bh), static_cast<uint64_t>(a.H)), T, q0,
            k0);
      __syncthreads();

      backward_scores<RM, CM, NC, PLD>(a, Qs, dOs, Ks, Vs, lse_s, delta_s, kvis, keep, q0, k0, tx,
                                       ty, Pd, dS);
      __syncthreads();  // Pd and dS are complete

      // dV_j += sum_i Pd_ij dO_i; dK_j += sum_i dS_ij Q_i (the scale is applied at the end).
      // Pd and dS are [query][key] tiles; keys are this block's rows, so they are read transposed.
      const int qcount = min(R, T - q0);
      accumulate_weighted_rows<KM, kSlots>(dv, Pd, 1, PLD, dOs, ld, qcount, D, ty, tx);
      accumulate_weighted_rows<KM, kSlots>(dk, dS, 1, PLD, Qs, ld, qcount, D, ty, tx);
    }
  }

#pragma unroll
  for (int r = 0; r < KM; ++r) {
    const int j = k0 + ty * KM + r;
    if (j >= T) continue;
    float* dk_row = dqkv + (b * T + j) * row_stride + C + kh * D;
    float* dv_row = dk_row + static_cast<int64_t>(a.K) * D;
#pragma unroll
    for (int c = 0; c < kSlots; ++c) {
      const int d = tx + 16 * c;
      if (d < D) {
        dk_row[d] = dk[r][c] * a.scale;
        dv_row[d] = dv[r][c];
      }
    }
  }
}

// dQ: one block per (batch * head, tile of kBwdRows queries), looping over the key tiles the
// queries can see; no atomics, so results are reproducible. Each thread accumulates query rows
// ty * RM + r, feature columns tx + 16c.
template <int kSlots, typename Q>
__global__ void __launch_bounds__(kThreads)
    attention_backward_dq_kernel(const float* __restrict__ dout, const Q* __restrict__ qkv,
                                 const float* __restrict__ lse, const float* __restrict__ delta,
                                 AttnParams a, float* __restrict__ dqkv) {
  constexpr int R = kBwdRows, NC = kBwdCols, RM = R / 16, CM = NC / 16;
  constexpr int PLD = kScoreLd<RM, NC>;
  extern __shared__ __align__(16) unsigned char smem[];
  const BwdLayout L = bwd_layout(a.D);
  float* Qs = reinterpret_cast<float*>(smem + L.q);
  float* dOs = reinterpret_cast<float*>(smem + L.dout);
  float* Ks = reinterpret_cast<float*>(smem + L.k);
  float* Vs = reinterpret_cast<float*>(smem + L.v);
  float* dS = reinterpret_cast<float*>(smem + L.ds);
  float* lse_s = reinterpret_cast<float*>(smem + L.lse);
  float* delta_s = reinterpret_cast<float*>(smem + L.delta);
  int* kvis = reinterpret_cast<int*>(smem + L.kvis);
  uint8_t* keep = smem + L.keep;

  const int T = a.T, D = a.D, ld = tile_ld(D);
  const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
  const int64_t bh = blockIdx.x, b = bh / a.H, h = bh % a.H, kh = h / (a.H / a.K);
  const int q0 = blockIdx.y * R;
  const int64_t C = static_cast<int64_t>(a.H) * D,
                row_stride = C + 2 * static_cast<int64_t>(a.K) * D;
  const Q* token0 = qkv + b * T * row_stride;
  const Q* q_base = token0 + h * D;
  const Q* k_base = token0 + C + kh * D;
  const Q* v_base = k_base + static_cast<int64_t>(a.K) * D;

  load_rows(Qs, ld, q_base, row_stride, q0, R, T, D);
  load_rows(dOs, ld, dout + b * T * C + h * D, C, q0, R, T, D);
  load_row_stats<R>(lse_s, delta_s, lse, delta, bh, q0, T);

  float dq[RM][kSlots];
#pragma unroll
  for (int r = 0; r < RM; ++r) {
#pragma unroll
    for (int c = 0; c < kSlots; ++c) dq[r][c] = 0.0f;
  }

  const int k_end = a.causal ? min(T, q0 + R) : T;
  for (int k0 = 0; k0 < k_end; k0 += NC) {
    __syncthreads();  // the previous tile's readers of Ks, Vs, dS, kvis and keep are done
    load_rows(Ks, ld, k_base, row_stride, k0, NC, T, D);
    load_rows(Vs, ld, v_base, row_stride, k0, NC, T, D);
    load_key_visibility<NC>(kvis, a.key_mask, b, k0, T);
    if (a.dropout)
      fill_keep<R, NC>(
          keep, a.key, a.threshold,
          attention_head_id(a.key, static_cast<uint64_t>(bh), static_cast<uint64_t>(a.H)), T, q0,
          k0);
    __syncthreads();

    backward_scores<RM, CM, NC, PLD>(a, Qs, dOs, Ks, Vs, lse_s, delta_s, kvis, keep, q0, k0, tx, ty,
                                     nullptr, dS);
    __syncthreads();  // dS is complete

    // dQ_i += sum_j dS_ij K_j (the scale is applied at the end).
    accumulate_weighted_rows<RM, kSlots>(dq, dS, PLD, 1, Ks, ld, min(NC, T - k0), D, ty, tx);
  }

#pragma unroll
  for (int r = 0; r < RM; ++r) {
    const int i = q0 + ty * RM + r;
    if (i >= T) continue;
    float* dq_row = dqkv + (b * T + i) * row_stride + h * D;
#pragma unroll
    for (int c = 0; c < kSlots; ++c) {
      const int d = tx + 16 * c;
      if (d < D) dq_row[d] = dq[r][c] * a.scale;
    }
  }
}

void check_launch(const char* kernel) {
  const cudaError_t err = cudaGetLastError();
  BRISK_CHECK(err == cudaSuccess, kernel, " launch failed: ", cudaGetErrorString(err));
}

// Lets `kernel` use `bytes` of dynamic shared memory (above 48 KiB a kernel must opt in).
template <typename Kernel>
void allow_shared_memory(Kernel* kernel, size_t bytes, const char* name) {
  if (bytes <= 48 * 1024) return;
  int device = 0, limit = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess)
    err = cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  BRISK_CHECK(err == cudaSuccess, name, ": cannot query shared memory: ", cudaGetErrorString(err));
  BRISK_CHECK(bytes <= static_cast<size_t>(limit), name, " needs ", bytes,
              " bytes of shared memory; the device allows ", limit, " per block");
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(bytes));
  BRISK_CHECK(err == cudaSuccess, name,
              ": cannot set its shared memory size: ", cudaGetErrorString(err));
}

// Checks the sizes and fills the parameters; false when there is nothing to compute.
bool make_params(const char* op, const int32_t* key_mask, bool causal, int64_t B, int64_t T,
                 int64_t H, int64_t K, int64_t D, float scale, float dropout_p, const RngKey& key,
                 AttnParams* a) {
  BRISK_CHECK(B >= 0 && T >= 0 && H >= 0, op, ": negative size B=", B, " T=", T, " H=", H);
  BRISK_CHECK(K >= 1 && K <= H && H % K == 0, op, ": ", H, " query heads do not share ", K,
              " key/value heads evenly");
  BRISK_CHECK(D >= 1 && D <= kMaxD, op, ": head size ", D, " is outside [1, ", kMaxD, "]");
  BRISK_CHECK(dropout_p >= 0.0f && dropout_p < 1.0f, op, ": dropout ", dropout_p,
              " is outside [0, 1)");
  BRISK_CHECK(T <= INT_MAX - kFwdRows && H <= INT_MAX && B * H <= INT_MAX, op,
              ": sizes too large (B=", B, " T=", T, " H=", H, ")");
  BRISK_CHECK((T + kBwdRows - 1) / kBwdRows <= 65535, op, ": sequence length ", T,
              " needs more than 65535 tiles");
  if (B == 0 || T == 0 || H == 0) return false;
  a->key_mask = key_mask;
  a->causal = causal;
  a->T = static_cast<int>(T);
  a->H = static_cast<int>(H);
  a->K = static_cast<int>(K);
  a->D = static_cast<int>(D);
  a->scale = scale;
  a->dropout = dropout_p > 0.0f;
  a->threshold = dropout_threshold(dropout_p);
  a->drop_scale = 1.0f / (1.0f - dropout_p);
  a->key = key;
  return true;
}

template <int kSlots, typename Q>
void launch_forward(cudaStream_t s, const Q* qkv, const AttnParams& a, int64_t BH, float* lse,
                    float* out) {
  const size_t smem = fwd_layout(a.D).bytes;
  allow_shared_memory(attention_forward_kernel<kSlots, Q>, smem, "attention_forward_kernel");
  const dim3 grid(static_cast<unsigned>(BH),
                  static_cast<unsigned>((a.T + kFwdRows - 1) / kFwdRows));
  attention_forward_kernel<kSlots><<<grid, kThreads, smem, s>>>(qkv, a, lse, out);
  check_launch("attention_forward_kernel");
}

template <int kSlots, typename Q>
void launch_backward(cudaStream_t s, const float* dout, const Q* qkv, const float* lse,
                     const float* delta, const AttnParams& a, int64_t B, float* dqkv) {
  const int64_t BH = B * a.H, BK = B * a.K;
  const size_t smem = bwd_layout(a.D).bytes;
  allow_shared_memory(attention_backward_dkdv_kernel<kSlots, Q>, smem,
                      "attention_backward_dkdv_kernel");
  allow_shared_memory(attention_backward_dq_kernel<kSlots, Q>, smem,
                      "attention_backward_dq_kernel");
  const dim3 kv_grid(static_cast<unsigned>(BK),
                     static_cast<unsigned>((a.T + kBwdCols - 1) / kBwdCols));
  attention_backward_dkdv_kernel<kSlots>
      <<<kv_grid, kThreads, smem, s>>>(dout, qkv, lse, delta, a, dqkv);
  check_launch("attention_backward_dkdv_kernel");
  const dim3 q_grid(static_cast<unsigned>(BH),
                    static_cast<unsigned>((a.T + kBwdRows - 1) / kBwdRows));
  attention_backward_dq_kernel<kSlots>
      <<<q_grid, kThreads, smem, s>>>(dout, qkv, lse, delta, a, dqkv);
  check_launch("attention_backward_dq_kernel");
}

}  // namespace

void attention_forward(cudaStream_t s, In qkv, const int32_t* key_mask, bool causal, int64_t B,
                       int64_t T, int64_t H, int64_t K, int64_t D, float scale, float dropout_p,
                       RngKey key, float* lse, float* out) {
  AttnParams a;
  if (!make_params("attention_forward", key_mask, causal, B, T, H, K, D, scale, dropout_p, key, &a))
    return;
  // Fewer feature slots per thread for small heads: fewer registers, no idle columns.
  with_elements(qkv.bf16, [&](auto qt) {
    const auto* q = static_cast<const decltype(qt)*>(qkv.data);
    if (D <= 64)
      launch_forward<4>(s, q, a, B * H, lse, out);
    else
      launch_forward<8>(s, q, a, B * H, lse, out);
  });
}

void attention_backward(cudaStream_t s, const float* dout, In qkv, In out, const float* lse,
                        const int32_t* key_mask, bool causal, int64_t B, int64_t T, int64_t H,
                        int64_t K, int64_t D, float scale, float dropout_p, RngKey key,
                        float* delta, float* dqkv) {
  AttnParams a;
  if (!make_params("attention_backward", key_mask, causal, B, T, H, K, D, scale, dropout_p, key,
                   &a))
    return;
  // delta = rowsum(dO * O) equals sum_j P_ij dP_ij, the softmax backward's correction, because O
  // already holds the dropped-out probabilities times V.
  const int64_t rows = B * T * H;
  constexpr int kRowsPerBlock = kThreads / 32;
  with_elements(out.bf16, [&](auto ot) {
    attention_delta_kernel<<<static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock),
                             kThreads, 0, s>>>(dout, static_cast<const decltype(ot)*>(out.data),
                                               rows, a.T, a.H, a.D, delta);
  });
  check_launch("attention_delta_kernel");
  with_elements(qkv.bf16, [&](auto qt) {
    const auto* q = static_cast<const decltype(qt)*>(qkv.data);
    if (D <= 64)
      launch_backward<4>(s, dout, q, lse, delta, a, B, dqkv);
    else
      launch_backward<8>(s, dout, q, lse, delta, a, B, dqkv);
  });
}

namespace {

template <typename Half>
__global__ void fused_attention_inputs_kernel(const int32_t* key_mask, int64_t n, int64_t T,
                                              Half masked, Half* bias, int64_t* seed_offset,
                                              RngKey key, int32_t* seq_len_q, int64_t B) {
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (first == 0 && seed_offset) {
    const Philox4 r = rng_block(key, ~uint64_t{0} - key.first_head);
    seed_offset[0] = static_cast<int64_t>((static_cast<uint64_t>(r.v[1]) << 32) | r.v[0]);
    seed_offset[1] = 0;
  }
  if (seq_len_q)
    for (int64_t b = first; b < B; b += static_cast<int64_t>(gridDim.x) * blockDim.x)
      seq_len_q[b] = static_cast<int32_t>(T);
  if (!bias) return;
  // Element i of [B, 1, T, T] reads key i % T of batch row i / T^2.
  for (int64_t i = first; i < n; i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    bias[i] = key_mask[i / (T * T) * T + i % T] ? static_cast<Half>(0.0f) : masked;
}

}  // namespace

void fused_attention_inputs(cudaStream_t s, const int32_t* key_mask, int64_t B, int64_t T,
                            DType dtype, void* bias, int64_t* seed_offset, RngKey key,
                            int32_t* seq_len_q) {
  const int64_t n = key_mask && bias ? B * T * T : 0;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((n + 255) / 256 + 1, 1024));
  // Far below any score, yet finite: a query row that sees no key spreads evenly instead of NaN.
  constexpr float kMasked = -1e9f;
  if (dtype == DType::bf16) {
    fused_attention_inputs_kernel<<<blocks, 256, 0, s>>>(
        key_mask, n, T, __float2bfloat16_rn(kMasked),
        static_cast<__nv_bfloat16*>(key_mask ? bias : nullptr), seed_offset, key, seq_len_q, B);
  } else {
    BRISK_CHECK(dtype == DType::f16, "fused attention inputs: bf16 or f16, not ",
                dtype_name(dtype));
    // fp16's largest finite magnitude is 65504.
    fused_attention_inputs_kernel<<<blocks, 256, 0, s>>>(
        key_mask, n, T, __float2half_rn(-65504.0f), static_cast<__half*>(key_mask ? bias : nullptr),
        seed_offset, key, seq_len_q, B);
  }
  check_launch("fused_attention_inputs_kernel");
}

namespace {

// One thread per sample and one for the end: its length and where it starts in each tensor.
__global__ void ragged_layout_kernel(const int32_t* starts, int64_t count, RaggedLayout to) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i <= count;
       i += stride) {
    const int64_t start = starts[i];
    if (i < count) to.seq_len[i] = static_cast<int32_t>(starts[i + 1] - start);
    to.qkv[i] = static_cast<int32_t>(start * to.qkv_row);
    to.out[i] = static_cast<int32_t>(start * to.out_row);
    to.stats[i] = static_cast<int32_t>(start * to.heads);
  }
}

}  // namespace

void ragged_layout(cudaStream_t s, const int32_t* starts, int64_t count, const RaggedLayout& to) {
  if (count <= 0) return;
  const auto blocks = static_cast<unsigned>(std::min<int64_t>((count + 256) / 256, 1024));
  ragged_layout_kernel<<<blocks, 256, 0, s>>>(starts, count, to);
  check_launch("ragged_layout_kernel");
}

}  // namespace brisk::cuda
