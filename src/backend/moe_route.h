// Mixture-of-experts routing of one token, as transformers' Mixtral, Qwen2-MoE and OLMoE routers
// compute it: the softmax of the token's E router logits in float32, the k most probable experts,
// and their probabilities as the experts' weights, divided by their sum where the architecture
// normalizes them (Mixtral always; the others by norm_topk_prob). The host and device code share
// these functions (kept C++17-clean for nvcc): both backends route by the same arithmetic (their
// exponentials may differ in the last bit).
#pragma once

#include <cmath>
#include <cstdint>

#include "core/rng.h"  // BRISK_HD

namespace brisk {

// The logsumexp of a token's E router logits (the maximum subtracted, exponentials summed in
// expert order): ST-MoE's router z-loss squares it.
BRISK_HD float moe_logsumexp(const float* logits, int E) {
  float top = logits[0];
  for (int e = 1; e < E; ++e) top = logits[e] > top ? logits[e] : top;
  float sum = 0.0f;
  for (int e = 0; e < E; ++e) sum += expf(logits[e] - top);
  return top + logf(sum);
}

// Whether expert a with probability pa comes before expert b with pb: the more probable first,
// and of two alike the lower (torch.topk's order on the CPU).
BRISK_HD bool moe_before(float pa, int a, float pb, int b) {
  return pa > pb || (pa == pb && a < b);
}

// probs[E] = softmax(logits[E]) (the maximum subtracted, exponentials summed in expert order);
// experts[k] the k first experts in moe_before's order, weights[k] their probabilities (divided
// by their sum where `normalize`).
BRISK_HD void moe_route_row(const float* logits, int E, int k, bool normalize, float* probs,
                            float* weights, int32_t* experts) {
  float top = logits[0];
  for (int e = 1; e < E; ++e) top = logits[e] > top ? logits[e] : top;
  float sum = 0.0f;
  for (int e = 0; e < E; ++e) {
    probs[e] = expf(logits[e] - top);
    sum += probs[e];
  }
  for (int e = 0; e < E; ++e) probs[e] /= sum;
  // The j-th pick: the first expert in moe_before's order after pick j - 1.
  float chosen = 0.0f;
  for (int j = 0; j < k; ++j) {
    int best = -1;
    for (int e = 0; e < E; ++e) {
      if (j > 0 && !moe_before(probs[experts[j - 1]], experts[j - 1], probs[e], e)) continue;
      if (best < 0 || moe_before(probs[e], e, probs[best], best)) best = e;
    }
    experts[j] = best;
    weights[j] = probs[best];
    chosen += weights[j];
  }
  if (normalize)
    for (int j = 0; j < k; ++j) weights[j] /= chosen;
}

// dlogits[E] (written) = the gradient of the token's logits, from that of its weights
// (dweights[k]) and, where dprobs is not null, a term dprobs[E] added to its probabilities'
// gradient (the load-balancing loss's): through the normalization (dw_j - sum_i dw_i w_i) / S,
// the selection and the softmax p_e (g_e - sum_f p_f g_f).
BRISK_HD void moe_route_row_backward(const float* probs, const float* weights,
                                     const int32_t* experts, const float* dweights,
                                     const float* dprobs, int E, int k, bool normalize,
                                     float* dlogits) {
  for (int e = 0; e < E; ++e) dlogits[e] = dprobs ? dprobs[e] : 0.0f;
  float chosen = 0.0f, dot = 0.0f;
  for (int j = 0; j < k; ++j) {
    chosen += probs[experts[j]];
    dot += dweights[j] * weights[j];
  }
  for (int j = 0; j < k; ++j)
    dlogits[experts[j]] += normalize ? (dweights[j] - dot) / chosen : dweights[j];
  float mean = 0.0f;
  for (int e = 0; e < E; ++e) mean += probs[e] * dlogits[e];
  for (int e = 0; e < E; ++e) dlogits[e] = probs[e] * (dlogits[e] - mean);
}

}  // namespace brisk
