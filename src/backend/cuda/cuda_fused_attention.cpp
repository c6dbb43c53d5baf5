// CudaBackend's attention: the float32 kernels (cuda_attention.cu), and on tensor cores cuDNN's
// fused attention (fused_attention.h) for runs whose products are 16-bit. There q, k, v and the
// output are read as they lie where they are stored in the product dtype (a bf16 run's saved
// activations), else cast to it into the planned operand buffers (they hold 16-bit values
// already: the block rounds them); cuDNN runs, and its 16-bit results are cast back into the
// float32 containers (dqkv: or left in its dtype in its container's memory, for products that read
// it so). The key mask - a bias, or for a right-padded batch each row's query and key counts
// (cuDNN's padding mask, the key counts read where the model put them) - and cuDNN's workspace
// live in the planned attention workspace, the dropout seed in the attention scratch. A
// padding-free or packed batch's samples run as one ragged call (cuDNN's THD layout: each
// sample's length and where it starts, written into the attention workspace), not one call per
// sample.
#include <algorithm>
#include <climits>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_checks.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_launch.h"
#include "backend/cuda/fused_attention.h"

namespace brisk {

namespace {
using cuda::check_mask_on_device;
using cuda::check_rounding;
using cuda::dev;
using cuda::ids_or_null;

// int32 entries of each of a ragged shape's four arrays (lengths, three offsets): B + 1 rounded up
// to 4, so that each starts 16 bytes apart.
int64_t ragged_stride(const cuda::FusedAttentionShape& s) {
  return (s.B + 1 + 3) / 4 * 4;
}

// Bytes of the mask at the start of the attention workspace (the bias, a padded shape's queries
// per row, or a ragged shape's lengths and offsets), rounded up to 256.
int64_t mask_bytes(const cuda::FusedAttentionShape& s) {
  const int64_t n = s.masked   ? s.B * s.T * s.T * 2
                    : s.ragged ? ragged_stride(s) * 4 * 4
                    : s.padded ? s.B * 4
                               : 0;
  return (n + 255) / 256 * 256;
}

// Longest sample of a batch, rounded up to 64 tokens: a ragged graph's T, so that batches whose
// samples differ a little share one.
int64_t longest_sample(const PackedSamples& samples) {
  int64_t longest = 0;
  for (int64_t i = 0; i < samples.count(); ++i) longest = std::max(longest, samples.length(i));
  return (longest + 63) / 64 * 64;
}

char* bytes_at(const Tensor& t, int64_t elements) {
  return static_cast<char*>(t.data()) + elements * static_cast<int64_t>(dtype_size(t.dtype()));
}

// t in the fused attention's 16-bit `dtype`: t itself where it is stored so (a bf16 run's saved
// qkv and output), else cast into `staging`.
void* in_dtype(cudaStream_t stream, const Tensor& t, DType dtype, void* staging) {
  if (t.dtype() == dtype) return t.data();
  cuda::cast(stream, t.data(), t.dtype(), staging, dtype, t.numel());
  return staging;
}

}  // namespace

std::optional<cuda::FusedAttentionShape> CudaBackend::fused_attention(const AttentionDims& d,
                                                                      const KeyMask& mask,
                                                                      bool causal, float scale,
                                                                      float dropout_p) const {
  // Switches::fused_attention off keeps the float32 kernels (to compare the two).
  if (matmul_dtype_ == DType::f32 || !switches_.fused_attention) return std::nullopt;
  // 16-bit q, k, v and output in A's buffer, their gradients in B's; the seed in the attention
  // scratch (float32 [B,H,T]); the bias and cuDNN's workspace in the attention workspace.
  const int64_t staged = d.B * d.T * (d.C + d.K * d.D * 2 + d.C);
  if (ws_.operand_a.numel() < staged || ws_.operand_b.numel() < staged || d.B * d.H * d.T < 4 ||
      d.D % 8 != 0 || ws_.attention_workspace.empty())
    return std::nullopt;
  cuda::FusedAttentionShape shape;
  shape.B = d.B, shape.T = d.T, shape.H = d.H, shape.K = d.K, shape.D = d.D;
  if (mask.samples != nullptr) {  // the samples as batch rows; int32 offsets must reach the end
    // Their starts in memory (the model lays them there), else one call per sample.
    const Tensor& at = mask.samples->at;
    if (at.dtype() != DType::i32 || at.numel() != mask.samples->count() + 1 ||
        at.device() != Device::cuda)
      return std::nullopt;
    shape.ragged = true;
    shape.B = mask.samples->count(), shape.T = longest_sample(*mask.samples);
    if (d.B * d.T * (d.H + 2 * d.K) * d.D > INT32_MAX) return std::nullopt;
  }
  shape.padded = !mask.lengths.empty();
  shape.causal = causal, shape.masked = !mask.empty() && !shape.padded;
  shape.scale = scale, shape.dropout_p = dropout_p, shape.dtype = matmul_dtype_;
  shape.deterministic_first = switches_.attention_deterministic;
  int64_t workspace = 0;
  if (!cuda::fused_attention_supported(shape, nullptr, &workspace) ||
      mask_bytes(shape) + workspace > static_cast<int64_t>(ws_.attention_workspace.bytes()))
    return std::nullopt;
  return shape;
}

cuda::FusedAttentionArgs CudaBackend::fused_attention_inputs(const cuda::FusedAttentionShape& s,
                                                             const KeyMask& key_mask,
                                                             const RngKey& key,
                                                             const Tensor& scratch) {
  cuda::FusedAttentionArgs a;
  auto* seed_offset = static_cast<int64_t*>(scratch.data());
  char* mask = static_cast<char*>(ws_.attention_workspace.data());
  auto* seq_len_q = reinterpret_cast<int32_t*>(mask);
  cuda::fused_attention_inputs(stream_, s.masked ? key_mask.keep.i32() : nullptr, s.B, s.T, s.dtype,
                               s.masked ? mask : nullptr, s.dropout_p > 0 ? seed_offset : nullptr,
                               key, s.padded ? seq_len_q : nullptr);
  a.bias = s.masked ? mask : nullptr;
  a.seq_len_q = s.padded ? seq_len_q : nullptr;
  if (s.ragged) {
    const int64_t n = ragged_stride(s);
    cuda::RaggedLayout to{seq_len_q,
                          seq_len_q + n,
                          seq_len_q + 2 * n,
                          seq_len_q + 3 * n,
                          (s.H + 2 * s.K) * s.D,
                          s.H * s.D,
                          s.H};
    cuda::ragged_layout(stream_, key_mask.samples->at.i32(), s.B, to);
    a.seq_len_q = to.seq_len, a.ragged_qkv = to.qkv, a.ragged_out = to.out;
    a.ragged_stats = to.stats;
  }
  a.seq_len_kv = s.padded ? key_mask.lengths.i32() : nullptr;
  a.seed_offset = s.dropout_p > 0 ? seed_offset : nullptr;
  a.workspace = mask + mask_bytes(s);
  a.workspace_bytes = static_cast<int64_t>(ws_.attention_workspace.bytes()) - mask_bytes(s);
  return a;
}

void CudaBackend::fused_attention_forward(const cuda::FusedAttentionShape& s, const Tensor& qkv,
                                          const KeyMask& key_mask, const RngKey& key,
                                          const Tensor& stats, const Tensor& scratch,
                                          const Tensor& out) {
  cuda::FusedAttentionArgs a = fused_attention_inputs(s, key_mask, key, scratch);
  const int64_t n_qkv = qkv.numel(), n_out = out.numel();
  const bool direct = out.dtype() == s.dtype;
  void* out16 = direct ? out.data() : bytes_at(ws_.operand_a, n_qkv);
  a.qkv = in_dtype(stream_, qkv, s.dtype, ws_.operand_a.data());
  a.out = out16;
  a.stats = stats.f32();
  cuda::fused_attention_forward(stream_, s, a);
  if (!direct) cuda::cast(stream_, out16, s.dtype, out.data(), DType::f32, n_out);
}

void CudaBackend::fused_attention_backward(const cuda::FusedAttentionShape& s, const Tensor& dout,
                                           const Tensor& qkv, const Tensor& out,
                                           const Tensor& stats, const KeyMask& key_mask,
                                           const RngKey& key, const Tensor& scratch,
                                           const Tensor& dqkv, bool keeps_dtype) {
  cuda::FusedAttentionArgs a = fused_attention_inputs(s, key_mask, key, scratch);
  const int64_t n_qkv = qkv.numel(), n_out = out.numel();
  void* dqkv16 = keeps_dtype ? dqkv.data() : ws_.operand_b.data();
  void* dout16 = bytes_at(ws_.operand_b, n_qkv);
  cuda::cast(stream_, dout.data(), DType::f32, dout16, s.dtype, n_out);
  a.qkv = in_dtype(stream_, qkv, s.dtype, ws_.operand_a.data());
  a.out = in_dtype(stream_, out, s.dtype, bytes_at(ws_.operand_a, n_qkv));
  a.dout = dout16;
  a.dqkv = dqkv16;
  a.stats = stats.f32();
  cuda::fused_attention_backward(stream_, s, a);
  if (!keeps_dtype) cuda::cast(stream_, dqkv16, s.dtype, dqkv.data(), DType::f32, n_qkv);
}

bool CudaBackend::keeps_attention_dtype(const cuda::FusedAttentionShape& s) const {
  return switches_.attention_bf16_io && bf16_activations(s.dtype);
}

void CudaBackend::attention_forward(const Tensor& qkv, const KeyMask& key_mask, bool causal,
                                    int heads, int kv_heads, float scale, float dropout_p,
                                    const RngKey& key, const Tensor& stats, const Tensor& scratch,
                                    const Tensor& out) {
  attention_forward_to(qkv, key_mask, causal, heads, kv_heads, scale, dropout_p, key, stats,
                       scratch, out, nullptr);
}

void CudaBackend::attention_forward_stored(const Tensor& qkv, const KeyMask& key_mask, bool causal,
                                           int heads, int kv_heads, float scale, float dropout_p,
                                           const RngKey& key, const Tensor& stats,
                                           const Tensor& scratch, const Tensor& out,
                                           const Tensor& stored) {
  check_stored_output(out, stored);
  BRISK_CHECK(stored.device() == Device::cuda,
              "attention_forward: the stored output is not in GPU memory");
  attention_forward_to(qkv, key_mask, causal, heads, kv_heads, scale, dropout_p, key, stats,
                       scratch, out, &stored);
}

void CudaBackend::attention_forward_to(const Tensor& qkv, const KeyMask& key_mask, bool causal,
                                       int heads, int kv_heads, float scale, float dropout_p,
                                       const RngKey& key, const Tensor& stats,
                                       const Tensor& scratch, const Tensor& out,
                                       const Tensor* stored) {
  const AttentionDims d = attention_dims(qkv, heads, kv_heads, "attention_forward");
  check_attention_scale(scale, "attention_forward");
  const AttentionBuffers want = attention_buffers(Device::cuda, d.B, d.H, d.T, d.D);
  expect(stats, DType::f32, want.stats, "attention_forward statistics");
  expect(out, DType::f32, Shape{d.B, d.T, d.C}, "attention_forward output");
  check_key_mask(key_mask, d.B, d.T, "attention_forward");
  check_mask_on_device(key_mask);
  const cuda::In q = dev_in(qkv, "qkv");
  if (const auto fused = fused_attention(d, key_mask, causal, scale, dropout_p)) {
    expect(scratch, DType::f32, want.scratch, "attention_forward scratch");
    const bool direct = stored && stored->dtype() == fused->dtype && keeps_attention_dtype(*fused);
    fused_attention_forward(*fused, qkv, key_mask, key, stats, scratch, direct ? *stored : out);
    if (stored && !direct) cast(out, *stored);
    return;
  }
  cuda::attention_forward(stream_, q, ids_or_null(key_mask.keep, "key mask"), causal, d.B, d.T, d.H,
                          d.K, d.D, scale, dropout_p, key, dev(stats, "attention statistics"),
                          dev(out, "attention output"));
  if (stored) cast(out, *stored);
}

void CudaBackend::attention_decode(const Tensor& qkv, const Tensor& k_cache, const Tensor& v_cache,
                                   int64_t past, int heads, int kv_heads, float scale,
                                   const Tensor& out) {
  AttentionDims d{};
  check_attention_decode(qkv, k_cache, v_cache, past, heads, kv_heads, out, &d);
  check_attention_scale(scale, "attention_decode");
  BRISK_CHECK(d.D <= cuda::kMaxDecodeHeadWidth && d.T <= 65535,
              "attention_decode on CUDA: head width ", d.D, " (at most ", cuda::kMaxDecodeHeadWidth,
              ") or ", d.T, " new tokens (at most 65535)");
  cuda::attention_decode(stream_, dev(qkv, "qkv"), dev(k_cache, "key cache"),
                         dev(v_cache, "value cache"), dev(out, "attention output"), d.B, d.T,
                         k_cache.dim(1), d.H, d.K, d.D, past, scale);
}

Tensor CudaBackend::attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& out,
                                       const Tensor& stats, const KeyMask& key_mask, bool causal,
                                       int heads, int kv_heads, float scale, float dropout_p,
                                       const RngKey& key, const Tensor& scratch, const Tensor& dqkv,
                                       DType round_dout, DType round_dqkv) {
  const AttentionDims d = attention_dims(qkv, heads, kv_heads, "attention_backward");
  check_attention_scale(scale, "attention_backward");
  const AttentionBuffers want = attention_buffers(Device::cuda, d.B, d.H, d.T, d.D);
  expect(stats, DType::f32, want.stats, "attention_backward statistics");
  expect(scratch, DType::f32, want.scratch, "attention_backward scratch");
  expect(dout, DType::f32, Shape{d.B, d.T, d.C}, "attention_backward gradient");
  expect(out, out.dtype(), Shape{d.B, d.T, d.C}, "attention_backward output");
  expect(dqkv, DType::f32, qkv.shape(), "attention_backward dqkv");
  check_key_mask(key_mask, d.B, d.T, "attention_backward");
  check_mask_on_device(key_mask);
  check_rounding(round_dout, "attention_backward");
  check_rounding(round_dqkv, "attention_backward");
  const cuda::In q = dev_in(qkv, "qkv"), o = dev_in(out, "attention output");
  const auto fused = fused_attention(d, key_mask, causal, scale, dropout_p);
  // The fused attention takes dout in its 16-bit dtype and gives dqkv in it: roundings to that
  // dtype are its own casts (round to nearest even, exact back to float32), or where products
  // read it, dqkv is left in it (in dqkv's memory).
  const DType own = fused ? fused->dtype : DType::f32;
  const bool keeps_own = fused && round_dqkv == own && keeps_attention_dtype(*fused);
  if (round_dout != DType::f32 && round_dout != own) round_to(round_dout, dout);
  if (fused) {
    fused_attention_backward(*fused, dout, qkv, out, stats, key_mask, key, scratch, dqkv,
                             keeps_own);
  } else {
    cuda::attention_backward(
        stream_, dev(dout, "attention gradient"), q, o, dev(stats, "attention statistics"),
        ids_or_null(key_mask.keep, "key mask"), causal, d.B, d.T, d.H, d.K, d.D, scale, dropout_p,
        key, dev(scratch, "attention scratch"), dev(dqkv, "dqkv"));
  }
  if (round_dqkv != DType::f32 && round_dqkv != own) round_to(round_dqkv, dqkv);
  return keeps_own ? Tensor(dqkv.data(), dqkv.shape(), own, Device::cuda) : dqkv;
}

namespace {
KeyMask samples_mask(const PackedSamples& samples) {
  KeyMask mask;
  mask.samples = &samples;
  return mask;
}
}  // namespace

std::optional<cuda::FusedAttentionShape> CudaBackend::ragged_attention(
    const Tensor& qkv, const PackedSamples& samples, bool causal, int heads, int kv_heads,
    float scale, float dropout_p, const Tensor& stats, const Tensor& scratch,
    const char* op) const {
  const AttentionDims d = attention_dims(qkv, heads, kv_heads, op);
  check_packed_samples(samples, d.B, d.T, op);
  const auto fused = fused_attention(d, samples_mask(samples), causal, scale, dropout_p);
  if (!fused) return fused;
  check_attention_scale(scale, op);
  const AttentionBuffers want = attention_buffers(Device::cuda, d.B, d.H, d.T, d.D);
  expect(stats, DType::f32, want.stats, "packed attention statistics");
  expect(scratch, DType::f32, want.scratch, "packed attention scratch");
  return fused;
}

// The ragged call reads the samples' starts from memory: its launches follow their count and its
// graph's length (the longest sample's, rounded up) only. Elsewhere one call per sample.
void CudaBackend::add_packed_signature(const PackedSamples& samples, const AttentionDims& d,
                                       bool causal, float scale, float dropout_p,
                                       std::vector<int64_t>& out) const {
  const auto fused = fused_attention(d, samples_mask(samples), causal, scale, dropout_p);
  if (!fused) return Backend::add_packed_signature(samples, d, causal, scale, dropout_p, out);
  out.push_back(fused->B);
  out.push_back(fused->T);
}

// A packed batch's attention: its samples in one ragged call where the fused attention serves
// them, else one call per sample (Backend's).
void CudaBackend::packed_attention_forward(const Tensor& qkv, const PackedSamples& samples,
                                           bool causal, int heads, int kv_heads, float scale,
                                           float dropout_p, const RngKey& key, const Tensor& stats,
                                           const Tensor& scratch, const Tensor& out) {
  const auto fused = ragged_attention(qkv, samples, causal, heads, kv_heads, scale, dropout_p,
                                      stats, scratch, "packed_attention_forward");
  if (!fused) {
    Backend::packed_attention_forward(qkv, samples, causal, heads, kv_heads, scale, dropout_p, key,
                                      stats, scratch, out);
    return;
  }
  expect(out, DType::f32, Shape{qkv.dim(0), qkv.dim(1), fused->H * fused->D},
         "packed_attention_forward output");
  fused_attention_forward(*fused, qkv, samples_mask(samples), key, stats, scratch, out);
}

Tensor CudaBackend::packed_attention_backward(const Tensor& dout, const Tensor& qkv,
                                              const Tensor& out, const Tensor& stats,
                                              const PackedSamples& samples, bool causal, int heads,
                                              int kv_heads, float scale, float dropout_p,
                                              const RngKey& key, const Tensor& scratch,
                                              const Tensor& dqkv, DType round_dout,
                                              DType round_dqkv) {
  const char* op = "packed_attention_backward";
  const auto fused =
      ragged_attention(qkv, samples, causal, heads, kv_heads, scale, dropout_p, stats, scratch, op);
  if (!fused)
    return Backend::packed_attention_backward(dout, qkv, out, stats, samples, causal, heads,
                                              kv_heads, scale, dropout_p, key, scratch, dqkv,
                                              round_dout, round_dqkv);
  const Shape flat{qkv.dim(0), qkv.dim(1), fused->H * fused->D};
  expect(dout, DType::f32, flat, "packed_attention_backward gradient");
  expect(out, out.dtype(), flat, "packed_attention_backward output");
  expect(dqkv, DType::f32, qkv.shape(), "packed_attention_backward dqkv");
  check_rounding(round_dout, op);
  check_rounding(round_dqkv, op);
  // The fused attention reads dout and gives dqkv in its 16-bit dtype: roundings to it are its
  // own casts; dqkv comes back float32.
  if (round_dout != DType::f32 && round_dout != fused->dtype) round_to(round_dout, dout);
  fused_attention_backward(*fused, dout, qkv, out, stats, samples_mask(samples), key, scratch, dqkv,
                           false);
  if (round_dqkv != DType::f32 && round_dqkv != fused->dtype) round_to(round_dqkv, dqkv);
  return dqkv;
}

}  // namespace brisk
