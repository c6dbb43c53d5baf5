// Multi-head and grouped-query attention on the CPU. Per (batch, query head): scores by a product
// on strided views of the packed qkv (the query head's key/value head shared by its group), masked
// softmax into `probs`, dropout on the probabilities from the counter-based RNG (regenerated in
// backward, never stored), and the weighted sum of values; the products by oneDNN in float32 where
// the backend's float32 products are oneDNN's (one instance per thread), else OpenBLAS; causal
// attention in blocks of query rows that stop at their last key (about half the products).
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_dropout.h"
#include "backend/cpu/cpu_exp.h"

namespace brisk {

namespace {
using AttnDims = AttentionDims;

// Causal attention goes in blocks of this many query rows, each over the keys up to its last row.
constexpr int64_t kCausalRows = 64;

// Index of probability (b, h, i, j) in the flat [B,H,T,T] layout: the dropout element id.
inline uint64_t prob_index(const AttnDims& d, int64_t bh, int64_t i, int64_t j) {
  return static_cast<uint64_t>((bh * d.T + i) * d.T + j);
}

// Where a token's heads start in a row of packed qkv [.., (H + 2K) * D]: query head h, and the
// key and value head that query head h reads (each key/value head serves a group of H/K
// consecutive query heads, as transformers' repeat_kv repeats it).
struct PackedRow {
  int64_t ld, group;  // row stride; query heads per key/value head
  explicit PackedRow(const AttnDims& d) : ld((d.H + 2 * d.K) * d.D), group(d.H / d.K) {}
  int64_t q(const AttnDims& d, int64_t h) const { return h * d.D; }
  int64_t k(const AttnDims& d, int64_t h) const { return d.C + (h / group) * d.D; }
  int64_t v(const AttnDims& d, int64_t h) const { return d.C + (d.K + h / group) * d.D; }
};
}  // namespace

void CpuBackend::attention_product(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                                   const float* a, int64_t lda, const float* b, int64_t ldb,
                                   float beta, float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  const int thread = omp_get_thread_num();
  if (thread < static_cast<int>(attention_dnnl_.size()) && k > 0) {
    attention_dnnl_[static_cast<size_t>(thread)]->run(trans_a, trans_b, m, n, k, a, lda, b, ldb,
                                                      beta != 0.0f, c, ldc);
    return;
  }
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, m, n, k, 1.0f, a, lda, b, ldb, beta, c, ldc);
}

void CpuBackend::attention_forward(const Tensor& qkv, const Tensor& key_mask, bool causal,
                                   int heads, int kv_heads, float scale, float dropout_p,
                                   const RngKey& key, const Tensor& probs, const Tensor& scratch,
                                   const Tensor& out) {
  const AttnDims d = attention_dims(qkv, heads, kv_heads, "attention_forward");
  check_attention_scale(scale, "attention_forward");
  expect(probs, DType::f32, Shape{d.B, d.H, d.T, d.T}, "attention_forward probs");
  expect(out, DType::f32, Shape{d.B, d.T, d.C}, "attention_forward output");
  if (!key_mask.empty()) expect(key_mask, DType::i32, Shape{d.B, d.T}, "attention mask");
  if (dropout_p > 0.0f)
    expect(scratch, DType::f32, Shape{d.B, d.H, d.T, d.T}, "attention_forward scratch");
  BRISK_CHECK(dropout_p >= 0.0f && dropout_p < 1.0f, "attention dropout ", dropout_p,
              " is outside [0, 1)");
  const PackedRow row_of(d);
  const int64_t ld = row_of.ld;
  const float* base = qkv.f32();
  const int32_t* mask = key_mask.empty() ? nullptr : key_mask.i32();
  float* P = probs.f32();
  float* o = out.f32();

  // Static: a thread takes the same tasks every step, so its oneDNN instance has made the
  // primitives for their shapes in the first step (with dynamic scheduling a thread that got no
  // task then would make them later, on a step that must not allocate).
#pragma omp parallel for schedule(static)
  for (int64_t bh = 0; bh < d.B * d.H; ++bh) {
    const int64_t b = bh / d.H, h = bh % d.H;
    const float* token0 = base + b * d.T * ld;
    const float* q = token0 + row_of.q(d, h);
    const float* k = token0 + row_of.k(d, h);
    const float* v = token0 + row_of.v(d, h);
    float* S = P + bh * d.T * d.T;
    float* ob = o + b * d.T * d.C + h * d.D;
    float* Pd = dropout_p > 0.0f ? scratch.f32() + bh * d.T * d.T : nullptr;
    // Causal: a block of query rows sees only the keys up to its last row; the probabilities of
    // the later keys are zero and neither computed nor multiplied.
    const int64_t rows_per_block = causal ? kCausalRows : d.T;
    for (int64_t i0 = 0; i0 < d.T; i0 += rows_per_block) {
      const int64_t i1 = std::min(d.T, i0 + rows_per_block), keys = causal ? i1 : d.T;
      float* block = S + i0 * d.T;
      attention_product(false, true, i1 - i0, keys, d.D, q + i0 * ld, ld, k, ld, 0.0f, block, d.T);
      for (int64_t i = i0; i < i1; ++i) {
        float* row = S + i * d.T;
        std::fill(row + keys, row + d.T, 0.0f);
        float mx = -std::numeric_limits<float>::infinity();
        for (int64_t j = 0; j < keys; ++j) {
          const bool allowed = (!causal || j <= i) && (!mask || mask[b * d.T + j] != 0);
          row[j] = allowed ? row[j] * scale : -std::numeric_limits<float>::infinity();
          mx = std::max(mx, row[j]);
        }
        if (mx == -std::numeric_limits<float>::infinity()) {  // every key hidden: attend nowhere
          std::memset(row, 0, keys * sizeof(float));
          continue;
        }
#pragma omp simd
        for (int64_t j = 0; j < keys; ++j) row[j] = vector_expf(row[j] - mx);
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int64_t j = 0; j < keys; ++j) sum += row[j];
        const float inv = 1.0f / sum;
        for (int64_t j = 0; j < keys; ++j) row[j] *= inv;
      }
      const float* weights = block;
      if (Pd) {  // the dropped-out probabilities of these rows' keys
        for (int64_t i = i0; i < i1; ++i)
          dropout_range(key, dropout_p, prob_index(d, bh, i, 0), keys, S + i * d.T, nullptr,
                        Pd + i * d.T);
        weights = Pd + i0 * d.T;
      }
      attention_product(false, false, i1 - i0, d.D, keys, weights, d.T, v, ld, 0.0f, ob + i0 * d.C,
                        d.C);
    }
  }
}

// The probabilities saved by the forward pass already carry the mask and causality, so the
// backward pass needs neither (nor the forward's output); causality only lets it skip the blocks
// where they are zero. One task per (batch, key/value head):
// the query heads of its group add their key and value gradients in turn (the first writes, the
// others accumulate), so no two threads write the same rows and the sum has a fixed order.
void CpuBackend::attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& /*out*/,
                                    const Tensor& probs, const Tensor& /*key_mask*/, bool causal,
                                    int heads, int kv_heads, float scale, float dropout_p,
                                    const RngKey& key, const Tensor& scratch, const Tensor& dqkv) {
  const AttnDims d = attention_dims(qkv, heads, kv_heads, "attention_backward");
  check_attention_scale(scale, "attention_backward");
  expect(dout, DType::f32, Shape{d.B, d.T, d.C}, "attention_backward gradient");
  expect(probs, DType::f32, Shape{d.B, d.H, d.T, d.T}, "attention_backward probs");
  expect(scratch, DType::f32, Shape{d.B, d.H, d.T, d.T}, "attention_backward scratch");
  expect(dqkv, DType::f32, qkv.shape(), "attention_backward dqkv");
  const PackedRow row_of(d);
  const int64_t ld = row_of.ld;
  const float* base = qkv.f32();
  const float* g = dout.f32();
  float* dbase = dqkv.f32();

#pragma omp parallel for schedule(static)  // the same tasks per thread every step (see forward)
  for (int64_t bk = 0; bk < d.B * d.K; ++bk)
    for (int64_t member = 0; member < row_of.group; ++member) {
      const int64_t b = bk / d.K, h = (bk % d.K) * row_of.group + member, bh = b * d.H + h;
      // The group's first query head writes dK and dV; the others add to them.
      const float accumulate = member == 0 ? 0.0f : 1.0f;
      const int64_t token0 = b * d.T * ld;
      const float *q = base + token0 + row_of.q(d, h), *k = base + token0 + row_of.k(d, h);
      const float* v = base + token0 + row_of.v(d, h);
      float* dq = dbase + token0 + row_of.q(d, h);
      float* dk = dbase + token0 + row_of.k(d, h);
      float* dv = dbase + token0 + row_of.v(d, h);
      const float* go = g + b * d.T * d.C + h * d.D;
      const float* P = probs.f32() + bh * d.T * d.T;
      float* dP = scratch.f32() + bh * d.T * d.T;

      // Causal: the probabilities of a query row are zero beyond its own position, so every
      // product below stops at the last key (or starts at the first query) a block can reach.
      const int64_t rows_per_block = causal ? kCausalRows : d.T;
      // dV = P'^T dO with P' the dropped-out probabilities, rebuilt from P and the RNG: the keys
      // of a block are seen by the queries from the block's first row on.
      const float* weights = P;
      if (dropout_p > 0.0f) {
        for (int64_t i = 0; i < d.T; ++i) {
          const int64_t keys =
              causal ? std::min(d.T, (i / rows_per_block + 1) * rows_per_block) : d.T;
          dropout_range(key, dropout_p, prob_index(d, bh, i, 0), keys, P + i * d.T, nullptr,
                        dP + i * d.T);
        }
        weights = dP;
      }
      for (int64_t j0 = 0; j0 < d.T; j0 += rows_per_block) {
        const int64_t j1 = std::min(d.T, j0 + rows_per_block), first = causal ? j0 : 0;
        attention_product(true, false, j1 - j0, d.D, d.T - first, weights + first * d.T + j0, d.T,
                          go + first * d.C, d.C, accumulate, dv + j0 * ld, ld);
      }
      // Per block of query rows: dP' = dO V^T, through the dropout mask to dP, the softmax
      // backward dS = P * (dP - sum_j dP * P) with the score scale folded in, and dQ = dS K.
      for (int64_t i0 = 0; i0 < d.T; i0 += rows_per_block) {
        const int64_t i1 = std::min(d.T, i0 + rows_per_block), keys = causal ? i1 : d.T;
        float* block = dP + i0 * d.T;
        attention_product(false, true, i1 - i0, keys, d.D, go + i0 * d.C, d.C, v, ld, 0.0f, block,
                          d.T);
        for (int64_t i = i0; i < i1; ++i) {
          const float* pi = P + i * d.T;
          float* di = dP + i * d.T;
          if (dropout_p > 0.0f)
            dropout_range(key, dropout_p, prob_index(d, bh, i, 0), keys, di, nullptr, di);
          float dot = 0.0f;
          for (int64_t j = 0; j < keys; ++j) dot += pi[j] * di[j];
          for (int64_t j = 0; j < keys; ++j) di[j] = pi[j] * (di[j] - dot) * scale;
        }
        attention_product(false, false, i1 - i0, d.D, keys, block, d.T, k, ld, 0.0f, dq + i0 * ld,
                          ld);
      }
      // dK = dS^T Q: the keys of a block from the queries at and after the block's first row.
      for (int64_t j0 = 0; j0 < d.T; j0 += rows_per_block) {
        const int64_t j1 = std::min(d.T, j0 + rows_per_block), first = causal ? j0 : 0;
        attention_product(true, false, j1 - j0, d.D, d.T - first, dP + first * d.T + j0, d.T,
                          q + first * ld, ld, accumulate, dk + j0 * ld, ld);
      }
    }
}

void CpuBackend::attention_decode(const Tensor& qkv, const Tensor& k_cache, const Tensor& v_cache,
                                  int64_t past, int heads, int kv_heads, float scale,
                                  const Tensor& out) {
  AttnDims d{};
  check_attention_decode(qkv, k_cache, v_cache, past, heads, kv_heads, out, &d);
  check_attention_scale(scale, "attention_decode");
  const PackedRow row_of(d);
  // The caches hold the K key/value heads of each position: rows of KD = K * D.
  const int64_t S = k_cache.dim(1), ld = row_of.ld, KD = d.K * d.D;
  const float* base = qkv.f32();
  float* kc = k_cache.f32();
  float* vc = v_cache.f32();
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t t = 0; t < d.T; ++t) {
      const float* row = base + (b * d.T + t) * ld;
      std::memcpy(kc + (b * S + past + t) * KD, row + row_of.k(d, 0), sizeof(float) * KD);
      std::memcpy(vc + (b * S + past + t) * KD, row + row_of.v(d, 0), sizeof(float) * KD);
    }
  float* o = out.f32();
#pragma omp parallel
  {
    std::vector<float> p(static_cast<size_t>(past + d.T));
#pragma omp for schedule(static) collapse(3)
    for (int64_t b = 0; b < d.B; ++b)
      for (int64_t h = 0; h < d.H; ++h)
        for (int64_t t = 0; t < d.T; ++t) {
          const float* q = base + (b * d.T + t) * ld + h * d.D;
          const int64_t keys = past + t + 1;
          float mx = -std::numeric_limits<float>::infinity();
          for (int64_t j = 0; j < keys; ++j) {
            const float* k = kc + (b * S + j) * KD + (h / row_of.group) * d.D;
            float s = 0.0f;
            for (int64_t i = 0; i < d.D; ++i) s += q[i] * k[i];
            p[j] = s * scale;
            mx = std::max(mx, p[j]);
          }
          double sum = 0.0;
          for (int64_t j = 0; j < keys; ++j) {
            p[j] = std::exp(p[j] - mx);
            sum += p[j];
          }
          const float inv = static_cast<float>(1.0 / sum);
          float* y = o + (b * d.T + t) * d.C + h * d.D;
          std::fill(y, y + d.D, 0.0f);
          for (int64_t j = 0; j < keys; ++j) {
            const float* v = vc + (b * S + j) * KD + (h / row_of.group) * d.D;
            const float w = p[j] * inv;
            for (int64_t i = 0; i < d.D; ++i) y[i] += w * v[i];
          }
        }
  }
}

}  // namespace brisk
