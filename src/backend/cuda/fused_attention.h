// Attention on tensor cores: cuDNN's fused scaled dot-product attention (flash attention) through
// the cudnn-frontend graph API, forward and backward in bf16 or fp16 with float32 statistics.
// libcudnn is opened with dlopen on first need, so a run that never asks for it never maps it,
// and brisk runs where cuDNN is absent (the float32 kernels of cuda_attention.cu then serve).
// Built where the cudnn-frontend headers were found (BRISK_HAVE_CUDNN_FRONTEND); elsewhere the
// functions below report "not available".
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "core/dtype.h"

namespace brisk::cuda {

// One attention problem over packed qkv [B, T, (H + 2K) * D] (cuda_kernels.h's layout), as the
// graphs are cached by it.
struct FusedAttentionShape {
  int64_t B = 0, T = 0, H = 0, K = 0, D = 0;
  bool causal = false;
  bool masked = false;  // a key mask, passed as an additive bias [B, 1, T, T]
  bool padded = false;  // a right-padded batch's key mask, as each row's key count (no bias)
  // The samples of a padding-free or packed batch laid end to end (cuDNN's ragged THD layout): B
  // samples of at most T tokens each, each attending within itself; seq_len_q (each sample's
  // length, for queries and keys alike) and the ragged offsets say where each lies. The
  // statistics are token-major: sample s's [length, H] at H x its first token.
  bool ragged = false;
  float scale = 1.0f;
  float dropout_p = 0.0f;
  DType dtype = DType::bf16;  // of q, k, v, the output and their gradients
  // Backward: cuDNN's deterministic plan tried first (the same bits run after run), else its
  // fastest (Switches::attention_deterministic).
  bool deterministic_first = true;
  bool operator==(const FusedAttentionShape&) const = default;
};

// Device pointers of one call. qkv, out, dout and dqkv are in `dtype`; stats is float32 [B,H,T]
// (the natural log-sum-exp of each query row's scaled scores, as the forward writes it); bias is
// `dtype` [B,1,T,T] or null; seq_len_q and seq_len_kv are int32 [B] (a padded shape's queries per
// row, T each, and keys per row) or null; seed_offset is int64 [2] (cuDNN's Philox seed and offset)
// or null without dropout. The workspace is `workspace_bytes` of device memory. A ragged shape's
// offsets are int32 [B + 1], in elements, where each sample starts: ragged_qkv in qkv and dqkv
// (its first token times (H + 2K) D), ragged_out in out and dout (times H D), ragged_stats in
// stats (times H); its seq_len_q serves the keys too.
struct FusedAttentionArgs {
  const void* qkv = nullptr;
  const void* bias = nullptr;
  const int32_t* seq_len_q = nullptr;
  const int32_t* seq_len_kv = nullptr;
  const int32_t* ragged_qkv = nullptr;
  const int32_t* ragged_out = nullptr;
  const int32_t* ragged_stats = nullptr;
  const int64_t* seed_offset = nullptr;
  void* out = nullptr;
  float* stats = nullptr;
  const void* dout = nullptr;  // backward only
  void* dqkv = nullptr;        // backward only
  void* workspace = nullptr;
  int64_t workspace_bytes = 0;
};

// Whether cuDNN can be opened and builds both the forward and the backward graph of `shape`
// (built once per shape and cached). Never throws; when false, why_not (if given) says why; when
// true, workspace (if given) receives the bytes the larger of the two needs (asked once per
// shape, when built).
bool fused_attention_supported(const FusedAttentionShape& shape, std::string* why_not = nullptr,
                               int64_t* workspace = nullptr);
// Bytes of workspace the forward (backward = false) or backward graph of a supported shape needs.
int64_t fused_attention_workspace(const FusedAttentionShape& shape, bool backward);
// Enqueue the forward (out, stats) or the backward (dqkv) on stream s; throw naming cuDNN's
// message when execution fails or the workspace is too small.
void fused_attention_forward(cudaStream_t s, const FusedAttentionShape& shape,
                             const FusedAttentionArgs& args);
void fused_attention_backward(cudaStream_t s, const FusedAttentionShape& shape,
                              const FusedAttentionArgs& args);
// Whether libcudnn opens (it is opened now, once per process) and makes a handle; when not,
// why_not (if given) says why.
bool cudnn_available(std::string* why_not = nullptr);
// Whether libcudnn has been opened in this process (tests: a CPU run never opens it).
bool cudnn_opened();
// Whether libcudnn opens, of a version fused attention needs, GPU or not (opened now, once per
// process); when not, why_not (if given) says why.
bool cudnn_loadable(std::string* why_not = nullptr);
// Whether the forward and backward graphs of `shape` pass the frontend's validation against the
// library for a GPU of compute capability sm_version (90: Hopper's; their tensors' dimensions and
// strides, the mask's and dropout's attributes), which needs libcudnn but no GPU: what a machine
// without one can check of the graphs brisk builds. When not, why_not (if given) says why
// (libcudnn absent included: see cudnn_loadable).
bool fused_attention_graphs_valid(const FusedAttentionShape& shape, int sm_version,
                                  std::string* why_not = nullptr);

}  // namespace brisk::cuda
