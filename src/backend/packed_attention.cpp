// Attention over the samples of a padding-free or packed batch, by default one sample at a time
// through the backend's own attention (no padded row or key computed; a recorded pass follows
// every start), and the checks of a batch's samples.
#include <algorithm>

#include "backend/backend.h"
#include "core/checked.h"

namespace brisk {

void Backend::check_packed_samples(const PackedSamples& samples, int64_t B, int64_t T,
                                   const char* op) {
  const int64_t n = samples.count();
  BRISK_CHECK(n >= 1 && samples.starts.front() == 0 && samples.starts.back() == B * T, op,
              ": the packed samples do not cover the batch's ", B, " x ", T, " tokens");
  for (int64_t s = 0; s < n; ++s) {
    const int64_t first = samples.starts[static_cast<size_t>(s)], len = samples.length(s);
    BRISK_CHECK(len >= 1 && first / T == (first + len - 1) / T, op, ": packed sample ", s,
                " (tokens ", first, "..", first + len, ") is empty or crosses a row");
  }
}

namespace {
// The `count` elements of t from element `first` as a tensor of `shape`.
Tensor elements(const Tensor& t, int64_t first, const Shape& shape) {
  const Tensor range = element_range(t, first, shape.numel());
  return Tensor(range.data(), shape, t.dtype(), t.device());
}
}  // namespace

Tensor sample_tokens(const Tensor& tokens, const PackedSamples& samples, int64_t s) {
  const int64_t X = tokens.dim(-1), len = samples.length(s);
  return elements(tokens, samples.starts[static_cast<size_t>(s)] * X, Shape{1, len, X});
}

Tensor one_row(const Tensor& tokens) {
  const int64_t X = tokens.dim(-1);
  return Tensor(tokens.data(), Shape{1, tokens.numel() / X, X}, tokens.dtype(), tokens.device());
}

namespace {

// One sample's view of a packed attention call's tensors.
struct SampleViews {
  Tensor qkv, out, stats, scratch;
  RngKey key;
};

// Sample s's tokens of qkv [B,T,W] and out [B,T,C] as a batch of one row, its stats at
// H * starts[s], the first of the scratch, and its own dropout stream.
SampleViews sample_views(Device device, const AttentionDims& d, const PackedSamples& samples,
                         int64_t s, const Tensor& qkv, const Tensor& out, const Tensor& stats,
                         const Tensor& scratch, const RngKey& key) {
  const int64_t first = samples.starts[static_cast<size_t>(s)], len = samples.length(s);
  const AttentionBuffers ab = attention_buffers(device, 1, d.H, len, d.D);
  SampleViews v{sample_tokens(qkv, samples, s), sample_tokens(out, samples, s),
                elements(stats, d.H * first, ab.stats), elements(scratch, 0, ab.scratch), key};
  v.key.seed = key.seed + static_cast<uint64_t>(s + 1) * 0x9E3779B97F4A7C15ull;
  return v;
}

void check_packed_call(const Tensor& qkv, const PackedSamples& samples, const Tensor& stats,
                       const Tensor& out, const AttentionDims& d, const char* op) {
  Backend::check_packed_samples(samples, d.B, d.T, op);
  BRISK_CHECK(stats.numel() >= d.B * d.H * d.T && out.numel() == d.B * d.T * d.C, op,
              ": statistics ", stats.shape().str(), " and output ", out.shape().str(), " for qkv ",
              qkv.shape().str());
}
}  // namespace

void Backend::packed_attention_forward(const Tensor& qkv, const PackedSamples& samples, bool causal,
                                       int heads, int kv_heads, float scale, float dropout_p,
                                       const RngKey& key, const Tensor& stats,
                                       const Tensor& scratch, const Tensor& out) {
  const char* op = "packed_attention_forward";
  const AttentionDims d = attention_dims(qkv, heads, kv_heads, op);
  check_packed_call(qkv, samples, stats, out, d, op);
  for (int64_t s = 0; s < samples.count(); ++s) {
    const SampleViews v = sample_views(device(), d, samples, s, qkv, out, stats, scratch, key);
    attention_forward(v.qkv, KeyMask(), causal, heads, kv_heads, scale, dropout_p, v.key, v.stats,
                      v.scratch, v.out);
  }
}

Tensor Backend::packed_attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& out,
                                          const Tensor& stats, const PackedSamples& samples,
                                          bool causal, int heads, int kv_heads, float scale,
                                          float dropout_p, const RngKey& key, const Tensor& scratch,
                                          const Tensor& dqkv, DType round_dout, DType round_dqkv) {
  const char* op = "packed_attention_backward";
  const AttentionDims d = attention_dims(qkv, heads, kv_heads, op);
  check_packed_call(qkv, samples, stats, out, d, op);
  BRISK_CHECK(
      dout.numel() == out.numel() && dqkv.numel() == qkv.numel() && dqkv.dtype() == DType::f32, op,
      ": gradients ", dout.shape().str(), " and ", dqkv.shape().str(), " for qkv ",
      qkv.shape().str());
  for (int64_t s = 0; s < samples.count(); ++s) {
    const SampleViews v = sample_views(device(), d, samples, s, qkv, out, stats, scratch, key);
    // float32 per sample (a view in another dtype would not lie where the whole's does), rounded
    // once after.
    attention_backward(sample_tokens(dout, samples, s), v.qkv, v.out, v.stats, KeyMask(), causal,
                       heads, kv_heads, scale, dropout_p, v.key, v.scratch,
                       sample_tokens(dqkv, samples, s), round_dout, DType::f32);
  }
  if (round_dqkv != DType::f32) round_to(round_dqkv, dqkv);
  return dqkv;
}

void Backend::add_packed_signature(const PackedSamples& samples, const AttentionDims& /*d*/,
                                   bool /*causal*/, float /*scale*/, float /*dropout_p*/,
                                   std::vector<int64_t>& out) const {
  out.insert(out.end(), samples.starts.begin(), samples.starts.end());
}

}  // namespace brisk
