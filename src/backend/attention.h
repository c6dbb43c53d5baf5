// Attention's argument types, shared by the backends and the models that call them: the buffers
// a backend's attention keeps, the dimensions of packed qkv, the keys each row may see, and
// views of a padding-free or packed batch's samples (core/packed_samples.h).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "core/packed_samples.h"
#include "core/tensor.h"

namespace brisk {

// What a backend's attention keeps for its backward pass and the scratch it needs, per block:
// both backends' flash-style attention keeps one log-sum-exp per query row [B,H,T] (float32);
// the CUDA backend's scratch holds its delta per row, the CPU's a block of rows per (batch,
// head) task. A function of the device alone, so a run's memory can be planned on a machine
// without that device.
struct AttentionBuffers {
  Shape stats;
  Shape scratch;
};
AttentionBuffers attention_buffers(Device device, int64_t batch, int64_t heads, int64_t seq,
                                   int64_t head_dim);
// Floats of one CPU attention task's scratch (cpu_attention.cpp).
int64_t cpu_attention_scratch_floats(int64_t seq, int64_t head_dim);

// Batch, sequence, query channels C = H * D, query heads H, head width D and key/value heads K of
// packed qkv [B, T, (H + 2K) * D] (multi-head attention: K = H, [B,T,3C]); throws naming `op`
// unless K divides H.
struct AttentionDims {
  int64_t B, T, C, H, D, K;
};
AttentionDims attention_dims(const Tensor& qkv, int heads, int kv_heads, const char* op);

// Sample s's tokens of a tensor laid out as the batch's tokens ([B, T, X], or any shape whose
// last dimension X is per token) as a batch of one row [1, length, X].
Tensor sample_tokens(const Tensor& tokens, const PackedSamples& samples, int64_t s);
// A tensor of the batch's tokens as one row [1, B * T, X].
Tensor one_row(const Tensor& tokens);

// The keys each batch row's queries may see. `keep` is int32 [B,T] (nonzero keeps the key) or
// empty (every key). Where the batch is right-padded - each row keeps its first n keys, n >= 1 -
// `lengths` (int32 [B], each row's n) may come with it: the same mask, which a backend may read
// instead of keep (the GPU's fused attention then skips the padded keys and writes no bias).
// A padding-free or packed batch's model passes its samples instead (no keep): its blocks call
// the packed attention and restart the rotary positions at each sample.
struct KeyMask {
  Tensor keep;
  Tensor lengths;
  const PackedSamples* samples = nullptr;
  KeyMask() = default;
  KeyMask(Tensor keep_mask) : keep(std::move(keep_mask)) {}  // NOLINT: a mask alone converts
  KeyMask(Tensor keep_mask, Tensor row_lengths)
      : keep(std::move(keep_mask)), lengths(std::move(row_lengths)) {}
  bool empty() const { return keep.empty(); }
};

}  // namespace brisk
