// Multi-head attention on the CPU. Per (batch, head): scores by sgemm on strided views of the
// packed qkv, masked softmax into `probs`, dropout on the probabilities from the counter-based RNG
// (regenerated in backward, never stored), and the weighted sum of values.
#include <cblas.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "backend/cpu/cpu_backend.h"

namespace brisk {

namespace {
struct AttnDims {
  int64_t B, T, C, H, D;
};

AttnDims attention_dims(const Tensor& qkv, int heads, const char* op) {
  BRISK_CHECK(qkv.rank() == 3 && qkv.dim(2) % 3 == 0, op, ": qkv must be [B, T, 3C], got ",
              qkv.shape().str());
  const int64_t C = qkv.dim(2) / 3;
  BRISK_CHECK(heads > 0 && C % heads == 0, op, ": ", C, " channels do not split into ", heads,
              " heads");
  return {qkv.dim(0), qkv.dim(1), C, heads, C / heads};
}

// Index of probability (b, h, i, j) in the flat [B,H,T,T] layout: the dropout element id.
inline uint64_t prob_index(const AttnDims& d, int64_t bh, int64_t i, int64_t j) {
  return static_cast<uint64_t>((bh * d.T + i) * d.T + j);
}
}  // namespace

void CpuBackend::attention_forward(const Tensor& qkv, const Tensor& key_mask, bool causal,
                                   int heads, float dropout_p, const RngKey& key,
                                   const Tensor& probs, const Tensor& out) {
  const AttnDims d = attention_dims(qkv, heads, "attention_forward");
  expect(probs, DType::f32, Shape{d.B, d.H, d.T, d.T}, "attention_forward probs");
  expect(out, DType::f32, Shape{d.B, d.T, d.C}, "attention_forward output");
  if (!key_mask.empty()) expect(key_mask, DType::i32, Shape{d.B, d.T}, "attention mask");
  BRISK_CHECK(dropout_p >= 0.0f && dropout_p < 1.0f, "attention dropout ", dropout_p,
              " is outside [0, 1)");
  const float scale = 1.0f / std::sqrt(static_cast<float>(d.D));
  const float keep_scale = 1.0f / (1.0f - dropout_p);
  const uint32_t threshold = dropout_threshold(dropout_p);
  const int64_t ld = 3 * d.C;
  const float* base = qkv.f32();
  const int32_t* mask = key_mask.empty() ? nullptr : key_mask.i32();
  float* P = probs.f32();
  float* o = out.f32();

#pragma omp parallel for schedule(dynamic)
  for (int64_t bh = 0; bh < d.B * d.H; ++bh) {
    const int64_t b = bh / d.H, h = bh % d.H;
    const float* q = base + b * d.T * ld + h * d.D;
    const float* k = q + d.C;
    const float* v = q + 2 * d.C;
    float* S = P + bh * d.T * d.T;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, d.T, d.T, d.D, scale, q, ld, k, ld, 0.0f,
                S, d.T);
    for (int64_t i = 0; i < d.T; ++i) {
      float* row = S + i * d.T;
      float mx = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < d.T; ++j) {
        const bool allowed = (!causal || j <= i) && (!mask || mask[b * d.T + j] != 0);
        if (!allowed) row[j] = -std::numeric_limits<float>::infinity();
        mx = std::max(mx, row[j]);
      }
      if (mx == -std::numeric_limits<float>::infinity()) {  // every key hidden: attend nowhere
        std::memset(row, 0, d.T * sizeof(float));
        continue;
      }
      float sum = 0.0f;
      for (int64_t j = 0; j < d.T; ++j) {
        row[j] = std::exp(row[j] - mx);
        sum += row[j];
      }
      const float inv = 1.0f / sum;
      for (int64_t j = 0; j < d.T; ++j) row[j] *= inv;
    }
    float* ob = o + b * d.T * d.C + h * d.D;
    if (dropout_p == 0.0f) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, d.T, d.D, d.T, 1.0f, S, d.T, v, ld,
                  0.0f, ob, d.C);
      continue;
    }
    for (int64_t i = 0; i < d.T; ++i) {
      float* oi = ob + i * d.C;
      std::memset(oi, 0, d.D * sizeof(float));
      for (int64_t j = 0; j < d.T; ++j) {
        const float pij = S[i * d.T + j];
        if (pij == 0.0f || !dropout_keep(key, prob_index(d, bh, i, j), threshold)) continue;
        const float w = pij * keep_scale;
        const float* vj = v + j * ld;
        for (int64_t c = 0; c < d.D; ++c) oi[c] += w * vj[c];
      }
    }
  }
}

void CpuBackend::attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& probs,
                                    int heads, float dropout_p, const RngKey& key,
                                    const Tensor& scratch, const Tensor& dqkv) {
  const AttnDims d = attention_dims(qkv, heads, "attention_backward");
  expect(dout, DType::f32, Shape{d.B, d.T, d.C}, "attention_backward gradient");
  expect(probs, DType::f32, Shape{d.B, d.H, d.T, d.T}, "attention_backward probs");
  expect(scratch, DType::f32, Shape{d.B, d.H, d.T, d.T}, "attention_backward scratch");
  expect(dqkv, DType::f32, qkv.shape(), "attention_backward dqkv");
  const float scale = 1.0f / std::sqrt(static_cast<float>(d.D));
  const float keep_scale = 1.0f / (1.0f - dropout_p);
  const uint32_t threshold = dropout_threshold(dropout_p);
  const int64_t ld = 3 * d.C;
  const float* base = qkv.f32();
  const float* g = dout.f32();
  float* dbase = dqkv.f32();

#pragma omp parallel for schedule(dynamic)
  for (int64_t bh = 0; bh < d.B * d.H; ++bh) {
    const int64_t b = bh / d.H, h = bh % d.H;
    const int64_t off = b * d.T * ld + h * d.D;
    const float *q = base + off, *k = q + d.C, *v = q + 2 * d.C;
    float *dq = dbase + off, *dk = dq + d.C, *dv = dq + 2 * d.C;
    const float* go = g + b * d.T * d.C + h * d.D;
    const float* P = probs.f32() + bh * d.T * d.T;
    float* dP = scratch.f32() + bh * d.T * d.T;

    // dP' = dO V^T, the gradient of the dropped-out probabilities.
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, d.T, d.T, d.D, 1.0f, go, d.C, v, ld, 0.0f,
                dP, d.T);
    if (dropout_p == 0.0f) {
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, d.T, d.D, d.T, 1.0f, P, d.T, go, d.C,
                  0.0f, dv, ld);
    } else {
      for (int64_t j = 0; j < d.T; ++j) std::memset(dv + j * ld, 0, d.D * sizeof(float));
      for (int64_t i = 0; i < d.T; ++i) {
        const float* gi = go + i * d.C;
        for (int64_t j = 0; j < d.T; ++j) {
          const bool keep = dropout_keep(key, prob_index(d, bh, i, j), threshold);
          dP[i * d.T + j] = keep ? dP[i * d.T + j] * keep_scale : 0.0f;
          const float pij = P[i * d.T + j];
          if (!keep || pij == 0.0f) continue;
          const float w = pij * keep_scale;
          float* dvj = dv + j * ld;
          for (int64_t c = 0; c < d.D; ++c) dvj[c] += w * gi[c];
        }
      }
    }
    // Softmax backward: dS = P * (dP - sum_j dP * P), with the score scale folded in.
    for (int64_t i = 0; i < d.T; ++i) {
      const float* pi = P + i * d.T;
      float* di = dP + i * d.T;
      float dot = 0.0f;
      for (int64_t j = 0; j < d.T; ++j) dot += pi[j] * di[j];
      for (int64_t j = 0; j < d.T; ++j) di[j] = pi[j] * (di[j] - dot) * scale;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, d.T, d.D, d.T, 1.0f, dP, d.T, k, ld,
                0.0f, dq, ld);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, d.T, d.D, d.T, 1.0f, dP, d.T, q, ld, 0.0f,
                dk, ld);
  }
}

}  // namespace brisk
