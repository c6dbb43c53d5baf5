// Launchers of brisk's own CUDA kernels, one .cu per family. Plain functions over raw device
// pointers: CudaBackend (cuda_backend.cpp) checks shapes and dtypes and calls these. Every
// launcher enqueues on `stream` and returns without synchronizing; launch errors are reported
// by CudaBackend. Element counts are int64; float tensors are float32 unless a dtype is given.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/backend.h"
#include "core/grad_scale.h"
#include "core/rng.h"

namespace brisk::cuda {

// Device arrays of float32 or bf16 elements (a bf16 run's saved activations and product outputs,
// Backend::reads_product_input): read widened to float32, written rounded to nearest even.
struct In {
  const void* data;
  bool bf16;
};
struct Out {
  void* data;
  bool bf16;
};
inline In f32_in(const float* p) {
  return {p, false};
}
inline Out f32_out(float* p) {
  return {p, false};
}

// ---- cuda_elementwise.cu ----
void activation_forward(cudaStream_t s, Activation kind, In x, Out y, int64_t n);
// dx = round(dy) * f'(x), dy rounded to round_dy (bf16, f16; f32: as it is); dy and dx both
// float32 or both bf16 (dx rounded as it is stored); dx may alias dy.
void activation_backward(cudaStream_t s, Activation kind, In x, In dy, DType round_dy, Out dx,
                         int64_t n);
// SwiGLU over rows of gate_up [rows, 2F] (gate | up): out [rows, F] = silu(gate) * up.
void swiglu_forward(cudaStream_t s, In gate_up, Out out, int64_t rows, int64_t F);
// dgate_up [rows, 2F] = (dout * up * silu'(gate) | dout * silu(gate)), dout rounded to
// round_dout; may alias gate_up.
void swiglu_backward(cudaStream_t s, In gate_up, const float* dout, DType round_dout, Out dgate_up,
                     int64_t rows, int64_t F);
void tanh_forward(cudaStream_t s, const float* x, float* y, int64_t n);
// dx = dy * (1 - y^2); dx may alias dy.
void tanh_backward(cudaStream_t s, const float* y, const float* dy, float* dx, int64_t n);
// out[i] = (add ? add[i] : 0) + (keep(i) ? in[i] / (1 - p) : 0), keep(i) =
// dropout_keep(key, key.first_element + i, dropout_threshold(p)) exactly as the CPU's.
// out may alias in or add. p == 0: out = add + in (a plain copy/add). `in` may be bf16 where
// there is an add (dropout_add's branch, stored rounded by its product).
void dropout(cudaStream_t s, In in, const float* add, float p, RngKey key, float* out, int64_t n);
// ---- cuda_residual_norm.cu ---- rows of C elements.
// sum = x + dropout(r) (dropout's values and masks; sum may alias x), then y = the norm of sum:
// LayerNorm (layernorm_forward's bits), or RMSNorm where beta is null (mean then unused).
void dropout_add_norm(cudaStream_t s, const float* x, In r, float p, RngKey key, float* sum,
                      const float* gamma, const float* beta, float eps, Out y, float* mean,
                      float* rstd, int64_t rows, int64_t C);
void add_inplace(cudaStream_t s, float* y, const float* x, int64_t n);
void fill(cudaStream_t s, float* x, float value, int64_t n);
// x[i] *= factor.
void scale(cudaStream_t s, float* x, float factor, int64_t n);
// dst = src converted (f32, bf16, f16; round to nearest even, fp16 overflow -> inf).
void cast(cudaStream_t s, const void* src, DType src_type, void* dst, DType dst_type, int64_t n);
// Rows of `cols` float32 values rounded into 16-bit rows `ld` >= cols elements apart.
void cast_rows(cudaStream_t s, const float* src, int64_t rows, int64_t cols, void* dst,
               DType dst_type, int64_t ld);
// dst = src rounded to the nearest value of `type` (bf16 or f16) and kept as float32.
void round_to(cudaStream_t s, DType type, const float* src, float* dst, int64_t n);

// Float32 scratch in device memory a kernel may use in stream order (the backend lends its
// cuBLASLt workspace between products), and the GPU's multiprocessor count. Empty: none.
struct ColumnScratch {
  float* data = nullptr;
  int64_t floats = 0;
  int multiprocessors = 0;
};

// A residual branch's gradient through its dropout, written by a norm's backward from the dx it has
// just written (Backend::BranchDropout): grad null: none.
struct BranchGrad {
  float* grad = nullptr;
  float p = 0.0f;
  RngKey key;
};

// ---- cuda_layernorm.cu ---- rows of C elements.
void layernorm_forward(cudaStream_t s, const float* x, const float* gamma, const float* beta,
                       float eps, Out y, float* mean, float* rstd, int64_t rows, int64_t C);
// dx = (or += when accumulate_dx) input gradient; dgamma += ; dbeta += (deterministic order,
// over chunks of rows where `scratch` holds their sums); dy rounded to round_dy as it is read
// (f32: as it is); branch.grad = dropout of the dx written (may alias dy).
void layernorm_backward(cudaStream_t s, const float* dy, const float* x, const float* gamma,
                        const float* mean, const float* rstd, float* dx, bool accumulate_dx,
                        float* dgamma, float* dbeta, int64_t rows, int64_t C,
                        const ColumnScratch& scratch, DType round_dy, const BranchGrad& branch);

// ---- cuda_rmsnorm.cu ---- rows of C elements.
// rstd = 1 / sqrt(mean(x^2) + eps), y = x * rstd * gamma; y may alias x.
void rmsnorm_forward(cudaStream_t s, const float* x, const float* gamma, float eps, Out y,
                     float* rstd, int64_t rows, int64_t C);
// dx = (or += when accumulate_dx) input gradient, may alias dy; dgamma += (null: skipped;
// deterministic order, over chunks of rows where `scratch` holds their sums); dy rounded and the
// branch's gradient as layernorm_backward's.
void rmsnorm_backward(cudaStream_t s, const float* dy, const float* x, const float* gamma,
                      const float* rstd, float* dx, bool accumulate_dx, float* dgamma, int64_t rows,
                      int64_t C, const ColumnScratch& scratch, DType round_dy,
                      const BranchGrad& branch);

// ---- cuda_rotary.cu ----
// rotary_forward (inverse false) or rotary_backward (inverse true) of backend.h, in place on
// packed qkv [B,T,(H+2K)*D]; cos and sin are [P, D/2] tables, rows first_position + t read, or
// where `positions` (int32 [B*T], device) is given, row positions[b*T + t].
void rotary(cudaStream_t s, float* qkv, const float* cos, const float* sin, int64_t B, int64_t T,
            int64_t H, int64_t K, int64_t D, int64_t first_position, const int32_t* positions,
            bool inverse);

// ---- cuda_embedding.cu ----
// out[b,t,:] = word[ids[b,t] - first] + (pos ? pos[p] : 0) + (type_ids ? type_table[type_ids[b,t]]
// : 0), the word part zero for an id outside [first, first + held) (a vocabulary-parallel rank's
// rows); p = t, or positions[b*T + t] where given (int32, device). Ids are validated on the host
// before upload.
void embedding_forward(cudaStream_t s, const int32_t* ids, const float* word, const float* pos,
                       const int32_t* type_ids, const float* type_table, float* out, int64_t B,
                       int64_t T, int64_t C, int64_t first, int64_t held, const int32_t* positions);
// Scatter-add of dout into the tables (null tables skipped); tokens whose id is padding_idx (-1:
// none) skip dword only. dpos: in a fixed order per row, or with `positions` by atomics.
void embedding_backward(cudaStream_t s, const float* dout, const int32_t* ids, int64_t padding_idx,
                        const int32_t* type_ids, float* dword, float* dpos, float* dtype_table,
                        int64_t B, int64_t T, int64_t C, int64_t first, int64_t held,
                        const int32_t* positions);
// out[b,:] = x[b,0,:]; backward: dx[b,0,:] += dout[b,:]. With `starts` (int32 [samples + 1],
// device; samples <= B), token starts[b]'s row of the B*T for b < samples, zero rows past them.
void first_token(cudaStream_t s, const float* x, float* out, int64_t B, int64_t T, int64_t C,
                 const int32_t* starts, int64_t samples);
void first_token_backward(cudaStream_t s, const float* dout, float* dx, int64_t B, int64_t T,
                          int64_t C, const int32_t* starts, int64_t samples);

// ---- cuda_loss.cu ----
// Softmax cross-entropy over rows of logits [N,V], int32 labels (kIgnoreIndex skipped). Adds the
// summed loss of counted rows to *loss_sum (double, device). With write_grad, grad (where
// grad.data is null: the logits themselves) becomes (softmax - onehot) * grad_scale (zero rows
// for ignored labels), float32 or bf16. The scales' held factors are read in the kernels.
void mse_loss(cudaStream_t s, float* predictions, const float* targets, int64_t N, bool write_grad,
              GradScale grad_scale, double* loss_sum);
void softmax_cross_entropy(cudaStream_t s, float* logits, Out grad, const int32_t* labels,
                           int64_t N, int64_t V, bool write_grad, GradScale grad_scale,
                           double* loss_sum);
// Vocabulary-parallel cross-entropy (Backend::cross_entropy_stats / _from_stats): logits [N,V]
// whose first `held` columns are ids [first, first + held); stats [N,3], then [slots,N,3].
void cross_entropy_stats(cudaStream_t s, const float* logits, const int32_t* labels, int64_t N,
                         int64_t V, int64_t first, int64_t held, float* stats);
void cross_entropy_from_stats(cudaStream_t s, float* logits, Out grad, const int32_t* labels,
                              int64_t N, int64_t V, int64_t first, int64_t held, const float* stats,
                              int64_t slots, bool write_grad, GradScale grad_scale,
                              double* loss_sum);

// ---- cuda_moe.cu ----
// Backend::moe_route_forward and moe_route_backward (moe_route.h), one thread per token; the
// experts must be a routing's (the CPU checks them; these trust them). dprobs may be null.
void moe_route(cudaStream_t s, const float* logits, int64_t N, int64_t E, int64_t k, bool normalize,
               float* probs, float* weights, int32_t* experts);
void moe_route_backward(cudaStream_t s, const float* probs, const float* weights,
                        const int32_t* experts, const float* dweights, const float* dprobs,
                        int64_t N, int64_t E, int64_t k, bool normalize, float* dlogits);
// Backend::moe_balance_stats (one thread per expert, the CPU's order) and moe_balance_backward.
void moe_balance_stats(cudaStream_t s, const float* probs, const int32_t* experts,
                       const int32_t* mask, int64_t N, int64_t E, int64_t k, float* stats);
void moe_balance_backward(cudaStream_t s, const int32_t* mask, const float* scale, int64_t N,
                          int64_t E, float* dprobs);
// Backend::moe_z_stats (a thread per token, then one summing in the CPU's order) and
// moe_z_backward.
void moe_z_stats(cudaStream_t s, const float* logits, const int32_t* mask, int64_t N, int64_t E,
                 float* z, float* sum);
void moe_z_backward(cudaStream_t s, const float* probs, const float* z, float scale, int64_t N,
                    int64_t E, float* dlogits);
// Backend::moe_dispatch, moe_gather, moe_combine and moe_combine_backward (weights null: the plain
// sum; positions null, in the combines: each pair's own row); positions out of range are skipped.
void moe_dispatch(cudaStream_t s, const int32_t* experts, int64_t pairs, int64_t E, int32_t* counts,
                  int32_t* positions);
void moe_gather(cudaStream_t s, const float* x, const int32_t* positions, int64_t N, int64_t k,
                int64_t C, float* rows);
void moe_combine(cudaStream_t s, const float* rows, const int32_t* positions, const float* weights,
                 int64_t N, int64_t k, int64_t C, bool accumulate, float* y);
void moe_combine_backward(cudaStream_t s, const float* dy, const float* rows,
                          const int32_t* positions, const float* weights, int64_t N, int64_t k,
                          int64_t C, float* drows, float* dweights);

// ---- cuda_quant4.cu ----
// A 4-bit tensor's device pointers (Backend::Quant4Tensor): absmax, or nested qabsmax, absmax2,
// code2 and offset.
struct Quant4Args {
  const uint8_t* packed = nullptr;
  const float* absmax = nullptr;
  const uint8_t* qabsmax = nullptr;
  const float* absmax2 = nullptr;
  const float* code2 = nullptr;
  float offset = 0;
  int64_t numel = 0, blocksize = 64;
  Quant4Type type = Quant4Type::nf4;
  bool nested = false;
  int64_t transposed_cols = 0;  // non-zero: [numel / cols, cols] values written transposed
};
// out[numel] (dtype 0 float32, 1 bf16, 2 f16) = value x absmax (Backend::dequantize_4bit).
void dequantize_4bit(cudaStream_t s, const Quant4Args& q, void* out, int dtype);

// ---- cuda_optim.cu ----
// *acc += sum of x[i]^2 (double accumulation; inf/NaN propagate).
void sum_squares(cudaStream_t s, const float* x, int64_t n, double* acc);
// One thread: control = decide_step(stats...) (see core/step_control.h).
void decide_step(cudaStream_t s, const double* stats, double loss_scale, double max_norm,
                 float* control);
// AdamW over the flat buffers in one launch. decay_ranges holds num_ranges sorted [begin, end)
// pairs (device int64) of elements that take weight decay. Reads the gradient multiplier and the
// skip flag from control (device), so a skipped step changes nothing.
struct AdamWArgs {
  float lr, beta1, beta2, eps, weight_decay;
  float step_size;  // lr / (1 - beta1^t)
  float bc2_sqrt;   // sqrt(1 - beta2^t)
};
void adamw(cudaStream_t s, float* w, const float* g, float* m, float* v, int64_t n,
           const int64_t* decay_ranges, int num_ranges, AdamWArgs args, const float* control);
// AdamW on one tensor's float32 moments with the same decay factor for every element (8-bit
// AdamW's small tensors): w = w * decay - ... as adamw.
void adamw_dense(cudaStream_t s, float* w, const float* g, float* m, float* v, int64_t n,
                 AdamWArgs args, float decay, const float* control);
// 8-bit AdamW on one tensor of n elements whose moments are codes into the 256-value maps
// (device), scaled per block of kQuantBlock elements by absmax1/absmax2 (one per block, updated).
void adamw_8bit(cudaStream_t s, float* w, const float* g, uint8_t* codes1, uint8_t* codes2,
                float* absmax1, float* absmax2, const float* qmap_signed,
                const float* qmap_unsigned, int64_t n, AdamWArgs args, float decay,
                const float* control);
// SGD over the flat buffers (torch.optim.SGD); momentum_buffer null without momentum. Decay
// ranges as for adamw.
struct SgdArgs {
  float lr, momentum, dampening, weight_decay;
  bool nesterov, first_step;
};
void sgd(cudaStream_t s, float* w, const float* g, float* momentum_buffer, int64_t n,
         const int64_t* decay_ranges, int num_ranges, SgdArgs args, const float* control);
// Adafactor on one tensor: rows x cols (a vector: rows 1, not factored). v holds rows + cols
// statistics when factored, else rows * cols; m (null without a first moment) rows * cols.
// scratch: kAdafactorScratch doubles of device memory for the tensor's reductions, reused by
// the next tensor in stream order.
inline constexpr int kAdafactorScratch = 3;
struct AdafactorTensor {
  float* w;
  const float* g;
  float* v;
  float* m;
  int64_t rows, cols;
  bool factored, decay;
};
struct AdafactorArgs {
  float step_size, beta2t, eps1, eps2, clip_threshold, beta1, weight_decay;
  bool scale_parameter;
};
void adafactor(cudaStream_t s, const AdafactorTensor& t, const AdafactorArgs& args,
               const float* control, double* scratch);
// x (float32) rounded in place to bf16 values stochastically, element i with the word
// rng_block(key, i / 4).v[i % 4] (stochastic_round_bf16), as the CPU.
void stochastic_round(cudaStream_t s, float* x, int64_t n, RngKey key);

// ---- cuda_decode.cu ----
// attention_decode (backend.h): appends the new tokens' keys and values to the [B,S,K*D] caches
// at row `past`, then attends each of the T queries to positions 0..past+t, scores times `scale`;
// query head h reads key/value head h / (H/K).
// D at most kMaxDecodeHeadWidth, T at most 65535.
inline constexpr int64_t kMaxDecodeHeadWidth = 512;
void attention_decode(cudaStream_t s, const float* qkv, float* k_cache, float* v_cache, float* out,
                      int64_t B, int64_t T, int64_t S, int64_t H, int64_t K, int64_t D,
                      int64_t past, float scale);

// ---- cuda_attention.cu ----
// Flash attention over packed qkv [B,T,(H+2K)*D] (H query heads, then K key heads, then K value
// heads; query head h reads key/value head h / (H/K); K == H: [B,T,3C]); key_mask
// int32 [B,T] or null; scores q.k times `scale`; the probability matrix is never stored.
// lse [B,H,T] receives each row's log-sum-exp of scaled, masked scores (+inf marks a row that sees
// no key: its output is zero). Dropout on probabilities uses element id ((b*H+h)*T+i)*T+j, as the
// CPU. out [B,T,C].
void attention_forward(cudaStream_t s, In qkv, const int32_t* key_mask, bool causal, int64_t B,
                       int64_t T, int64_t H, int64_t K, int64_t D, float scale, float dropout_p,
                       RngKey key, float* lse, float* out);
// dqkv [B,T,(H+2K)*D] (overwritten) from dout, the forward's out and lse; delta [B,H,T] is
// scratch. A shared key/value head's gradient sums its query heads in a fixed order.
void attention_backward(cudaStream_t s, const float* dout, In qkv, In out, const float* lse,
                        const int32_t* key_mask, bool causal, int64_t B, int64_t T, int64_t H,
                        int64_t K, int64_t D, float scale, float dropout_p, RngKey key,
                        float* delta, float* dqkv);
// The fused (cuDNN) attention's side inputs: bias [B,1,T,T] in the 16-bit `dtype` (for every query,
// 0 where key_mask keeps the key, a large negative number elsewhere) when key_mask is given, and
// seed_offset = {seed, 0} (cuDNN's dropout Philox seed and offset, int64: the first two words of
// the key's own random stream, so each layer and step draws its own mask, the same one forward and
// backward, and a slice of the heads its own; drawn on the device, where a key's step may lie) when
// seed_offset is given, and seq_len_q [B] = T (a padding mask's queries per row) when given.
void fused_attention_inputs(cudaStream_t s, const int32_t* key_mask, int64_t B, int64_t T,
                            DType dtype, void* bias, int64_t* seed_offset, RngKey key,
                            int32_t* seq_len_q);
// A padding-free or packed batch's samples for the fused attention's ragged layout, from their
// starts (int32 in device memory, PackedSamples::at: `count` samples, count + 1 starts in tokens,
// the last the tokens' end): seq_len [count], each sample's length; and [count + 1] element
// offsets of each start (and the end) in qkv (times qkv_row), in out (times out_row) and in the
// statistics (times heads). Read as the kernel runs, so a recorded pass serves any layout of as
// many samples.
struct RaggedLayout {
  int32_t* seq_len;
  int32_t* qkv;
  int32_t* out;
  int32_t* stats;
  int64_t qkv_row, out_row, heads;
};
void ragged_layout(cudaStream_t s, const int32_t* starts, int64_t count, const RaggedLayout& to);

}  // namespace brisk::cuda
