// The op interface every backend implements (cpu/ is the reference, cuda/ the GPU's). A backend
// knows tensors and math, never models or the trainer. Gradients of parameters (dw, db, dgamma,
// dbeta, the embedding tables) accumulate (+=), so that tied weights and gradient accumulation need
// no extra buffers; gradients of activations (dx, dqkv, ...) are overwritten unless a flag says
// otherwise.
#pragma once

#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backend/attention.h"
#include "backend/workspace.h"
#include "core/grad_scale.h"
#include "core/memory_plan.h"
#include "core/quant4.h"
#include "core/rng.h"
#include "core/switches.h"
#include "core/tensor.h"

namespace brisk {

// nn.Linear stores weights [out, in]; GPT-2's Conv1D stores them [in, out].
enum class WeightLayout { out_in, in_out };
// The MLP's activation. models/config.cpp maps transformers' names (hidden_act,
// activation_function) onto these; backend/activation.h holds the formulas both backends use.
enum class Activation {
  gelu,        // x * Phi(x) in the exact erf form: "gelu" (BERT)
  gelu_tanh,   // the tanh approximation: "gelu_new" (GPT-2), "gelu_pytorch_tanh", "gelu_fast"
  relu,        // max(x, 0), derivative 0 at x = 0 as in PyTorch
  silu,        // x * sigmoid(x): "silu", "swish"
  quick_gelu,  // x * sigmoid(1.702 x)
  sigmoid,     // 1 / (1 + e^-x): a gate (Qwen2-MoE's shared expert's), not an MLP's activation
};

// Batch, sequence, query heads, key/value heads and head width of packed q/k/v
// [B, T, (H + 2K) * D]: the H query heads first, then K key heads, then K value heads.
struct RotaryDims {
  int64_t B, T, H, K, D;
};

// One AdamW update (torch.optim.AdamW) over flat float32 buffers. decay_ranges is int64 [R,2]:
// sorted [begin, end) element ranges that take weight decay. The gradient multiplier (clipping,
// loss unscaling) and the skip flag come from `control` (see core/step_control.h), which the
// backend's decide_step wrote, so no host round trip sits between the two.
// Backend::copy_rows: `rows` runs of `count` elements, run i from element src_at + i * src_pitch
// of the source to element dst_at + i * dst_pitch of the destination.
struct RowCopy {
  int64_t src_at = 0, src_pitch = 0, dst_at = 0, dst_pitch = 0, count = 0, rows = 0;
};

// Vocabulary parallelism (Megatron's): a tensor rank's rows of a word table, or columns of logits,
// are ids [first, first + count) of a vocabulary of `vocab`; a rank's table may hold more rows
// than `count` (padding, never read). vocab 0: the whole table (first 0, every row an id).
struct VocabShard {
  int64_t first = 0, vocab = 0;
  // The ids a table (or logits) of `rows` rows (columns) holds.
  int64_t count(int64_t rows) const {
    return vocab == 0 ? rows : std::max<int64_t>(0, std::min(rows, vocab - first));
  }
};

struct AdamWUpdate {
  Tensor weights, grads, exp_avg, exp_avg_sq, decay_ranges, control;
  float lr = 0, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0;
  int64_t step = 1;  // 1-based, for the bias corrections
};

// One parameter tensor within the flat weight and gradient buffers, for the optimizers whose
// arithmetic is per tensor (Adafactor's factored statistics and update RMS, 8-bit AdamW's
// quantization blocks). A host-side table: backends read it directly or launch per tensor.
struct ParamSlot {
  int64_t offset = 0, numel = 0;  // elements within the flat buffers
  int64_t rows = 1, cols = 0;     // the tensor as a matrix: cols = last dimension
  bool factored = false;          // Adafactor: row and column statistics (two or more dims)
  bool decay = false;             // takes weight decay
  int64_t state = 0;              // first element of the tensor's state in the state buffer(s)
  int64_t blocks = -1;            // 8-bit AdamW: first absmax block; -1 = 32-bit state
  bool share = false;             // a tensor rank's share, stepped as `split` says (SplitSlot)
};

// Throws naming `op` unless every slot lies within flat buffers of n elements.
void check_param_slots(const std::vector<ParamSlot>* slots, int64_t n, const char* op);

// torch.optim.SGD over flat float32 buffers: g += weight_decay * w on the decay ranges (L2, as
// torch), then momentum (buf = g on the first step, else momentum * buf + (1 - dampening) * g;
// nesterov: g + momentum * buf), w -= lr * g. momentum_buffer is empty without momentum.
struct SgdUpdate {
  Tensor weights, grads, momentum_buffer, decay_ranges, control;
  float lr = 0, momentum = 0, dampening = 0, weight_decay = 0;
  bool nesterov = false;
  bool first_step = true;
};

// transformers' Adafactor over flat float32 buffers, per tensor (slots): beta2t-averaged second
// moment of g^2 + eps1 (factored into row and column means for matrices, where the slot's state
// holds rows then cols values; full for vectors), update g / sqrt(v) divided by
// max(1, rms(update) / clip_threshold), step size `step_size`, times max(eps2, rms(w)) when
// scale_parameter; exp_avg (empty without beta1) averages the scaled update; decoupled weight
// decay w -= weight_decay * step * w on decay slots. beta2t and step_size come from the host.
//
// Tensor parallelism: a slot in `split` is one rank's share of a parameter split over a group, and
// its statistics are the whole parameter's. Its second moment (at the slot's state) is the whole
// one, whole_rows x whole_cols as a matrix (rows then cols values where factored), alike on every
// rank of the group; `row` and `col` give the whole row and column of each of the share's rows and
// columns (-1: padding, not stepped). The update takes each share's float64 partial sums into
// `sums` (from `sums_at`: the whole moment's sums, whole_rows + whole_cols of them where factored,
// else one per element, then the parameter's sum of squares; after every slot's, one sum of the
// update's squares per slot, in order), adding them over the group with `group_sum` twice: after
// the gradient statistics, and after the update's squares.
struct SplitSlot {
  size_t slot = 0;  // in slots
  int64_t whole_rows = 0, whole_cols = 0;
  std::vector<int64_t> row, col;
  bool counted = true;  // this rank's elements enter the sums (the first of a slice's copies)
  int64_t sums_at = 0;  // Adafactor: its place in the sums; 8-bit AdamW: in the maxima
};

struct AdafactorUpdate {
  Tensor weights, grads, second_moment, exp_avg, control;
  const std::vector<ParamSlot>* slots = nullptr;
  float step_size = 0, beta2t = 0, eps1 = 1e-30f, eps2 = 1e-3f, clip_threshold = 1.0f;
  float beta1 = 0, weight_decay = 0;
  bool scale_parameter = false;
  const std::vector<SplitSlot>* split = nullptr;  // null or empty: every slot whole
  Tensor sums;                                    // float64
  std::function<void(const Tensor&)> group_sum;
};

// 8-bit AdamW (block-wise quantized moments, as bitsandbytes): per slot with blocks >= 0 the
// moments are 8-bit codes into qmap_signed (first moment) and qmap_unsigned (second), scaled per
// block of kQuantBlock values by absmax1/absmax2; the update dequantizes, computes AdamW in
// float32 with the new moments, then re-quantizes them to the nearest code under the block's new
// absolute maximum. Slots with blocks < 0 keep float32 moments in exp_avg32/exp_avg_sq32.
inline constexpr int64_t kQuantBlock = 256;
//
// Tensor parallelism: an 8-bit slot in `split` (SplitSlot, as Adafactor's) is a tensor rank's
// share of a split parameter, whose blocks are the full parameter's (element at whole row r and
// column c in block (r x whole_cols + c) / kQuantBlock, from the slot's `blocks`; their maxima
// alike on every rank). The update takes each share's new block maxima into `maxima` (the first
// moment's for every split slot from its sums_at, then the second's, as many again), makes each
// the group's largest with `group_max`, and quantizes both moments under them.
struct AdamW8bitUpdate {
  Tensor weights, grads, control;
  Tensor exp_avg32, exp_avg_sq32;     // float32 state of the 32-bit slots
  Tensor exp_avg8, exp_avg_sq8;       // uint8 codes of the 8-bit slots
  Tensor absmax1, absmax2;            // float32, one per block
  Tensor qmap_signed, qmap_unsigned;  // float32 [256], ascending
  const std::vector<ParamSlot>* slots = nullptr;
  float lr = 0, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0;
  int64_t step = 1;
  const std::vector<SplitSlot>* split = nullptr;  // null or empty: every slot whole
  Tensor maxima;                                  // float32
  std::function<void(const Tensor&)> group_max;
};

// Work recorded once (Backend::record) and run again as recorded: the same ops on the same
// buffers with the same arguments; what changes between runs must be read from memory (a key's
// held step, RngKey::step_offset).
class RecordedWork {
 public:
  virtual ~RecordedWork() = default;
  virtual void run() = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual Device device() const = 0;
  virtual std::string name() const = 0;

  // Element type of matrix-product operands: f32, or bf16 in bf16 mixed precision (operands
  // holding bf16 values are multiplied on bf16 units with float32 accumulation where the
  // backend has them; otherwise in float32, with the same result up to summation order).
  virtual void set_matmul_dtype(DType dtype) = 0;
  // Float32 products may use TF32 tensor cores (TrainingArguments.tf32); no effect on the CPU.
  virtual void set_tf32(bool /*enabled*/) {}
  // Bytes of device memory in use as the driver reports it ("GPU memory occupied"); -1 when the
  // backend has no such figure (the CPU: see peak_rss_bytes).
  virtual int64_t device_memory_used() const { return -1; }
  // Device memory still free for an arena (the GPU's free memory); -1 where the memory is the
  // host's.
  virtual int64_t device_memory_free() const { return -1; }
  // Declares the backend's own buffers: for matrix products whose operands have at most
  // `operands` elements, and scratch for the optimizer ops (called after set_matmul_dtype,
  // before the plan is final).
  virtual void plan_workspace(MemoryPlan& plan, BufferBinder& binder, MatmulOperands operands) = 0;

  // ---- memory and transfers ----
  // Where Placement::device and Placement::host buffers of an Arena come from.
  virtual MemoryResource& device_memory() = 0;
  // Host staging: page-locked on a GPU when `pinned` (dataloader_pin_memory, faster uploads that
  // run alongside compute), ordinary host memory otherwise; the CPU's own memory on the CPU.
  virtual MemoryResource& staging_memory(bool pinned = true) = 0;
  // dst (device) = src (host staging); ordered with the ops that follow (asynchronous on a GPU).
  virtual void upload(const Tensor& src, const Tensor& dst) = 0;
  // Returns once every upload enqueued so far has read its source, so the host may overwrite
  // its staging buffers (they are read asynchronously on a GPU).
  virtual void wait_for_uploads() {}
  // dst (host) = src (device); returns when dst holds the data.
  virtual void download(const Tensor& src, const Tensor& dst) = 0;
  // Waits for all enqueued work (and reports asynchronous errors).
  virtual void synchronize() = 0;
  // The GPU stream every op is queued on (a cudaStream_t), so that work on another stream (NCCL's
  // collectives) can be ordered after it without the host waiting; null on the CPU.
  virtual void* device_stream() const { return nullptr; }
  // Whether record() can record (a GPU's graphs: one launch for a micro-batch's many kernels).
  virtual bool records_work() const { return false; }
  // Records the ops `work` issues without running them (nothing may wait for the device or
  // allocate meanwhile); null where the backend cannot record.
  virtual std::unique_ptr<RecordedWork> record(const std::function<void()>& /*work*/) {
    return nullptr;
  }

  // ---- matrix products ----
  // y[M,N] = x[M,K] W^T + b (out_in, W [N,K]) or x W + b (in_out, W [K,N]); b may be empty.
  // x may have any rank; its last dimension is K and the leading ones are flattened into M.
  // x is float32, or stored in `dtype` where reads_product_input(dtype) says so (for
  // linear_backward too, and there its dy as well).
  virtual void linear_forward(const Tensor& x, const Tensor& w, const Tensor& b,
                              WeightLayout layout, const Tensor& y) = 0;
  // dx = dy W (or += when accumulate_dx; skipped when dx is empty); dw = dy^T x (laid out as
  // w) and db = column sums of dy (db skipped when empty), or += both when accumulate_dw. A
  // weight's first gradient of an optimizer step is written (accumulate_dw false): no zeroed
  // gradient is read, and the product needs no summing pass.
  virtual void linear_backward(const Tensor& x, const Tensor& w, const Tensor& dy,
                               WeightLayout layout, const Tensor& dx, bool accumulate_dx,
                               const Tensor& dw, const Tensor& db, bool accumulate_dw) = 0;
  // linear_backward of a product whose input x was act(pre), its input gradient taken on through
  // the activation: dx = act'(pre) * (dy W), with dy W rounded to `round` first
  // (activation_backward's round_dy), written (not added); dw and db as linear_backward's. pre and
  // x are saved activations (float32, or stored in 16 bits where reads_product_input). Returns the
  // tensor holding dx: dx itself (float32), or where the backend's products read `round` (a GPU's
  // bf16 run) a view of dx's memory in it, dx rounded as it is stored (as the products would
  // round it; a bias gradient then sums the rounded values), for a tanh GELU the product's
  // float32 dy W times act' in one rounding (cuBLASLt's DGELU epilogue). A later linear_backward
  // takes either as its dy, bias gradient included. The default: linear_backward, then
  // activation_backward in place.
  virtual Tensor linear_activation_backward(const Tensor& x, const Tensor& w, const Tensor& dy,
                                            WeightLayout layout, Activation kind, const Tensor& pre,
                                            DType round, const Tensor& dx, const Tensor& dw,
                                            const Tensor& db, bool accumulate_dw);
  // Whether linear_forward and linear_backward read an input x stored in the 16-bit `dtype` as it
  // is (the CPU's bf16 products: no float32 copy, no packing per product).
  virtual bool reads_product_input(DType /*dtype*/) const { return false; }
  // Whether linear_forward may write y stored in the 16-bit `dtype`: the float32 result rounded
  // to nearest even as it is stored, the bits round_to gives (the CPU's bf16 products on bf16
  // units; the rounding pass after the product and half the bytes written go away).
  // dropout_add then reads its r in that dtype too.
  virtual bool stores_product_output(DType /*dtype*/) const { return false; }
  // The caller promises that w does not change until release_weight(): the products that read
  // it may read one copy prepared now (the CPU's bf16 products round it once, into the planned
  // MatmulOperands::held buffer, not once per product). One weight at a time; where there is
  // nothing to prepare (or no buffer planned) both do nothing.
  virtual void hold_weight(const Tensor& /*w*/) {}
  virtual void release_weight() {}
  // hold_weight for a backend whose bf16 products may read a weight [V, C] padded with zero
  // rows: returns the weight to give the products, [rows, C] (rows >= V), its first V rows w's
  // rounded to bf16, the rest zeros, valid until release_weight(). A linear_backward given it
  // may write a dw of w's V rows (the products' K and N then span all rows, M only V: every
  // operand's extent a multiple of 8 but dw's rows) and a db of the first V columns; its
  // linear_forward takes a bias of all rows. Needs MatmulOperands::held >= rows * C.
  // Backends without it throw (DeviceTraits::bf16_head_row_multiple is 1 for them).
  virtual Tensor hold_padded_weight(const Tensor& w, int64_t rows);
  // The caller promises that no value of `weights` (float32: a model's whole weights) changes
  // until release_weights(): where a copy is planned (MatmulOperands::weights) they are rounded
  // into it once, now, and the products whose weight lies inside them read it, not their own
  // rounding of it (the GPU's bf16 products: one cast per optimizer step instead of one per
  // product). The same bits either way. Where no copy is planned both do nothing.
  virtual void hold_weights(const Tensor& /*weights*/) {}
  virtual void release_weights() {}

  // ---- normalization ----
  // Over the last dimension C: y = (x - mean) * rstd * gamma + beta; saves mean and rstd
  // (one float per row) for the backward pass.
  virtual void layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                 float eps, const Tensor& y, const Tensor& mean,
                                 const Tensor& rstd) = 0;
  // dx = (or += when accumulate_dx) the input gradient; dgamma += ; dbeta += .
  virtual void layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma,
                                  const Tensor& mean, const Tensor& rstd, const Tensor& dx,
                                  bool accumulate_dx, const Tensor& dgamma,
                                  const Tensor& dbeta) = 0;
  // RMSNorm (transformers' LlamaRMSNorm, T5's LayerNorm) over the last dimension C, in float32:
  // y = x * rstd * gamma with rstd = 1 / sqrt(mean(x^2) + eps), no centring and no bias. Saves
  // rstd (one float per row) for the backward pass. y may alias x.
  virtual void rmsnorm_forward(const Tensor& x, const Tensor& gamma, float eps, const Tensor& y,
                               const Tensor& rstd) = 0;
  // dx = (or += when accumulate_dx) the input gradient, from the forward's x and rstd; dgamma +=
  // (skipped when empty). dx may alias dy.
  virtual void rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma,
                                const Tensor& rstd, const Tensor& dx, bool accumulate_dx,
                                const Tensor& dgamma) = 0;
  // Throws naming `op` unless x [..., C], gamma [C], rstd (one per row) and `other` (y, dy or
  // dx: x's element count) fit together and are float32 (`other` bf16 too, where `bf16_mode`: a
  // CPU bf16 run's output y).
  static void check_rmsnorm(const Tensor& x, const Tensor& gamma, const Tensor& rstd,
                            const Tensor& other, const char* op, bool bf16_mode = false);
  // A norm's parameters and the statistics it saves: LayerNorm's, or with `rms` RMSNorm's (beta
  // and mean empty).
  struct Norm {
    Tensor gamma, beta;
    float eps = 0.0f;
    bool rms = false;
    Tensor mean, rstd;
  };
  // y = the norm of x: layernorm_forward or rmsnorm_forward, as `n` says.
  void norm_forward(const Tensor& x, const Norm& n, const Tensor& y);
  // A residual branch's gradient through its dropout, taken where the gradient of the residual sum
  // is written (norm_backward): grad = dropout_backward(that gradient) with p and key. grad
  // empty: none.
  struct BranchDropout {
    Tensor grad;
    float p = 0.0f;
    RngKey key;
  };
  // The gradient through norm n (x its input, its saved statistics) for dy: dx = (or += when
  // accumulate_dx) the input gradient, dgamma += and dbeta += (skipped when empty), dy's values
  // rounded to round_dy as they are read (f32: as they are) - what round_to, layernorm_backward or
  // rmsnorm_backward and, with branch.grad, dropout_backward of the dx just written give, in one
  // pass over the rows where the backend fuses them (by default those calls). dx aliases neither
  // dy nor x; branch.grad may alias dy. dy may be left rounded in place.
  virtual void norm_backward(const Tensor& dy, const Tensor& x, const Norm& n, const Tensor& dx,
                             bool accumulate_dx, const Tensor& dgamma, const Tensor& dbeta,
                             DType round_dy, const BranchDropout& branch);
  // check_rmsnorm's checks of x, n's gamma and rstd and y, and LayerNorm's beta [C] and mean (one
  // per row), or their absence under `rms`.
  static void check_norm(const Tensor& x, const Norm& n, const Tensor& y, const char* op,
                         bool bf16_mode);

  // ---- rotary position embedding ----
  // RoPE as transformers' Llama applies it (q * cos + rotate_half(q) * sin), in place on the
  // query and key heads of packed qkv [B,T,(H+2K)*D] (H = heads query heads, then K = kv_heads key
  // heads, then K value heads, D columns each, D even): in every query and key head of the token at
  // position p = first_position + t, the pair (x_i, x_{i+D/2}) becomes
  // (x_i c - x_{i+D/2} s, x_{i+D/2} c + x_i s) with c = cos[p, i], s = sin[p, i], i < D/2. The
  // values are untouched. cos and sin are float32 [P, D/2] tables in the backend's memory (rope.h
  // computes them); rows first_position..first_position+T-1 are read, so first_position + T <= P.
  // Given `positions` (int32 [B*T]: a packed batch's, PackedSamples), token i's is positions[i]
  // (first_position 0; the CPU checks each is below P, a GPU cannot: callers lay them so).
  virtual void rotary_forward(const Tensor& qkv, int heads, int kv_heads, const Tensor& cos,
                              const Tensor& sin, int64_t first_position,
                              const Tensor& positions) = 0;
  // The gradient through rotary_forward, in place on dqkv (qkv's layout, same arguments): each
  // query and key pair turned back by its angle (a rotation's transpose is its inverse); the value
  // gradients are untouched.
  virtual void rotary_backward(const Tensor& dqkv, int heads, int kv_heads, const Tensor& cos,
                               const Tensor& sin, int64_t first_position,
                               const Tensor& positions) = 0;
  // Throws naming `op` unless qkv, the head counts, the tables and the positions fit together.
  static RotaryDims check_rotary(const Tensor& qkv, int heads, int kv_heads, const Tensor& cos,
                                 const Tensor& sin, int64_t first_position, const Tensor& positions,
                                 const char* op);
  // Throws naming `op` unless `positions` is empty or int32 of `tokens` elements in `device`'s
  // memory.
  static void check_token_positions(const Tensor& positions, int64_t tokens, Device device,
                                    const char* op);

  // ---- elementwise ----
  // y = f(x) for the activation `kind`.
  virtual void activation_forward(Activation kind, const Tensor& x, const Tensor& y) = 0;
  // dx = dy * f'(x); dx may alias dy. For both and SwiGLU's below, x (gate_up) may be stored in
  // the 16-bit dtype where reads_product_input(dtype) says so, as a block's saved MLP input is.
  // With `round_dy` a 16-bit dtype, dy's values are rounded to it as they are read (the gradient
  // of a 16-bit activation: round_to's bits, without a pass of its own); f32: as they are.
  virtual void activation_backward(Activation kind, const Tensor& x, const Tensor& dy,
                                   const Tensor& dx, DType round_dy) = 0;
  // SwiGLU, Llama's gated MLP activation act_fn(gate_proj(x)) * up_proj(x) with SiLU: gate_up is
  // [..., 2F], each row the gate in its first F columns and up in its last F (gate_proj and
  // up_proj laid end to end, so that one product computes both); out [..., F] =
  // silu(gate) * up, with activation.h's SiLU.
  virtual void swiglu_forward(const Tensor& gate_up, const Tensor& out) = 0;
  // dgate_up [..., 2F] (overwritten) = the gradient of both halves for dout [..., F]:
  // dgate = dout * up * silu'(gate), dup = dout * silu(gate). dgate_up may alias gate_up. It is
  // float32, or bf16 where reads_product_input(bf16) says so (the float32 results rounded as they
  // are stored, for the products that read it). dout rounded as read to `round_dout` as
  // activation_backward's dy.
  virtual void swiglu_backward(const Tensor& gate_up, const Tensor& dout, const Tensor& dgate_up,
                               DType round_dout) = 0;
  // Throws naming `op` unless gate_up [..., 2F] and half [..., F] (out or dout) are float32 (or
  // bf16, where `bf16_mode`) with the same rows; returns F.
  static int64_t check_swiglu(const Tensor& gate_up, const Tensor& half, const char* op,
                              bool bf16_mode = false);
  virtual void tanh_forward(const Tensor& x, const Tensor& y) = 0;
  // dx = dy * (1 - y^2) from the saved output y; dx may alias dy.
  virtual void tanh_backward(const Tensor& y, const Tensor& dy, const Tensor& dx) = 0;
  // y = dropout(x) with keep probability 1 - p and scaling 1 / (1 - p); y may alias x. Element
  // i's mask is that of element key.first_element + i (a part of a larger tensor draws the
  // whole's masks); so for the two below and dropout_add.
  virtual void dropout_forward(const Tensor& x, float p, const RngKey& key, const Tensor& y) = 0;
  // dx = the same mask applied to dy; dx may alias dy.
  virtual void dropout_backward(const Tensor& dy, float p, const RngKey& key, const Tensor& dx) = 0;
  // y = x + dropout(r): the residual add after a sublayer; y may alias x. r may be stored in
  // the dtype stores_product_output names (a product's output as it stored it).
  virtual void dropout_add(const Tensor& x, const Tensor& r, float p, const RngKey& key,
                           const Tensor& y) = 0;
  // sum = x + dropout(r) (dropout_add's), then y = the norm of sum (norm_forward's): the residual
  // add before a norm, in one pass over the rows, which the norm reads as they are summed rather
  // than from memory - the bits of the two calls. sum may alias x; y aliases none of them.
  virtual void dropout_add_norm(const Tensor& x, const Tensor& r, float p, const RngKey& key,
                                const Tensor& sum, const Norm& norm, const Tensor& y) = 0;
  // y += x
  virtual void add_inplace(const Tensor& y, const Tensor& x) = 0;
  virtual void fill(const Tensor& t, float value) = 0;
  virtual void copy(const Tensor& src, const Tensor& dst) = 0;
  // Strided runs of elements from src to dst (one dtype, both in the backend's memory, not
  // overlapping): what an exchange of a tensor's columns or tokens between ranks packs with.
  virtual void copy_rows(const Tensor& src, const Tensor& dst, const RowCopy& c) = 0;
  // Throws unless every run of `c` lies inside src and dst and the two are of one dtype; returns
  // the bytes of an element.
  static int64_t check_copy_rows(const Tensor& src, const Tensor& dst, const RowCopy& c);
  // dst = src converted between float32, bfloat16 and float16 (round to nearest even; values
  // beyond fp16's range become inf). Same dtypes: a copy.
  virtual void cast(const Tensor& src, const Tensor& dst) = 0;
  // Rounds a float32 tensor in place to the nearest value of `dtype` (bf16 or f16; f32: no-op):
  // how the CPU emulates 16-bit storage while computing in float32.
  // dst = src rounded the same way (dst may alias src; f32: a copy).
  virtual void round_to(DType dtype, const Tensor& src, const Tensor& dst) = 0;
  void round_to(DType dtype, const Tensor& t) { round_to(dtype, t, t); }
  // Rounds a float32 tensor in place to bf16 values stochastically: up with probability equal
  // to the distance from the value below (in units of the gap), from the RNG at `key` (element
  // ids are flat indices). Exact bf16 values stay; used to update bf16 weights without a master
  // copy.
  virtual void stochastic_round(DType dtype, const Tensor& t, const RngKey& key) = 0;

  // ---- embeddings ----
  // out[b,t,:] = word[ids[b,t]] + pos[t] + type_table[type_ids[b,t]]; pos and the type pair
  // may be empty. Callers validate ids on the host first (Model::check_ids): the CPU throws on
  // an id outside a table, a GPU cannot.
  // `shard`: the word table holds those ids only; the word part of a token whose id it does not
  // hold is zero (vocabulary parallelism: the tensor ranks' outputs then sum to the whole's).
  // Given `positions` (int32 [B*T]: a packed batch's, PackedSamples), token i reads
  // pos[positions[i]], not pos[t] (the CPU checks each is a row of pos, a GPU cannot).
  virtual void embedding_forward(const Tensor& ids, const Tensor& word, const Tensor& pos,
                                 const Tensor& type_ids, const Tensor& type_table,
                                 const Tensor& out, const VocabShard& shard,
                                 const Tensor& positions) = 0;
  // Scatter-adds dout into the tables' gradients (empty ones are skipped). Tokens whose id is
  // padding_idx (-1: none) add nothing to dword, as nn.Embedding(padding_idx=...) keeps the
  // padding row's gradient at zero; they still add to dpos and dtype_table, whose embeddings have
  // no padding row in transformers.
  // `shard`: tokens whose id the word table does not hold add nothing to dword (padding_idx is
  // the whole vocabulary's id). `positions` as embedding_forward's: token i adds to
  // dpos[positions[i]] (scatter-added, with atomics on a GPU).
  virtual void embedding_backward(const Tensor& dout, const Tensor& ids, int64_t padding_idx,
                                  const Tensor& type_ids, const Tensor& dword, const Tensor& dpos,
                                  const Tensor& dtype_table, const VocabShard& shard,
                                  const Tensor& positions) = 0;

  // ---- attention ----
  // Scaled dot-product attention over packed qkv [B,T,(H+2K)*D] with H = heads query heads and
  // K = kv_heads key/value heads: the H query heads (D columns each), then the K key heads, then
  // the K value heads along the last dimension. Grouped-query attention (transformers' repeat_kv):
  // query head h reads key/value head h / (H/K), so H % K == 0; K == H is multi-head attention
  // over [B,T,3C] (head h uses columns [h*D, (h+1)*D) of q, k and v), C = H*D; K == 1 is
  // multi-query attention. key_mask says which keys each row may see (KeyMask); causal hides
  // later keys. Scores q.k are multiplied by `scale`, a
  // finite number the model chooses (usually 1/sqrt(D)). A query that can see no key at all gets
  // zero probabilities and a zero output (transformers would spread it uniformly; such rows only
  // occur at padding, whose loss is ignored).
  // stats and scratch are shaped by attention_buffers(device()); stats keeps what the backward
  // pass needs (the log-sum-exp of each query row's scores). out is [B,T,C].
  virtual void attention_forward(const Tensor& qkv, const KeyMask& key_mask, bool causal, int heads,
                                 int kv_heads, float scale, float dropout_p, const RngKey& key,
                                 const Tensor& stats, const Tensor& scratch, const Tensor& out) = 0;
  // attention_forward with its output rounded into `stored` (out's shape, 16-bit: a saved
  // output's stored copy), out then scratch that may be left unwritten. The default:
  // attention_forward into out, then cast. A backend whose attention gives stored's dtype writes
  // it there itself (the GPU's cuDNN attention in a bf16 run): no float32 output, no cast.
  virtual void attention_forward_stored(const Tensor& qkv, const KeyMask& key_mask, bool causal,
                                        int heads, int kv_heads, float scale, float dropout_p,
                                        const RngKey& key, const Tensor& stats,
                                        const Tensor& scratch, const Tensor& out,
                                        const Tensor& stored);
  // That `stored` is 16-bit and shaped as out.
  static void check_stored_output(const Tensor& out, const Tensor& stored);
  // Both read qkv stored in the 16-bit dtype where reads_product_input(dtype) says so, as a
  // block's saved qkv is.
  // dqkv [B,T,(H+2K)*D] = the gradient of the packed input (a shared key/value head gets the sum
  // over its query heads), from the forward pass's qkv, out and stats and the same mask,
  // causality, scale, dropout and key. dout's values are rounded to round_dout as they are read
  // (dout may be left so, in place) and dqkv's to round_dqkv as they are written (f32: as they
  // are): a 16-bit run's roundings of these gradients, which an attention that takes and gives
  // that dtype does in its own casts. Returns the tensor holding dqkv: dqkv itself (float32), or
  // where the attention gives its gradient in round_dqkv and products read that dtype
  // (reads_product_input: the GPU's fused attention in a bf16 run) a view of dqkv's memory in it,
  // the same values without a widening pass; a later linear_backward takes either as its dy.
  virtual Tensor attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& out,
                                    const Tensor& stats, const KeyMask& key_mask, bool causal,
                                    int heads, int kv_heads, float scale, float dropout_p,
                                    const RngKey& key, const Tensor& scratch, const Tensor& dqkv,
                                    DType round_dout, DType round_dqkv) = 0;
  // Attention over the samples of a padding-free or packed batch (PackedSamples): qkv, out, dout
  // and dqkv as attention_forward's and attention_backward's [B,T,...], each sample's queries
  // reading its own keys only (causal within it where `causal`); no key mask. stats and scratch
  // are attention_buffers' for [B, T]; how stats holds the samples' statistics is the backend's
  // own (the default: sample s's [H, length] at H * starts[s]). The default's dropout draws sample
  // s's masks from a stream of its own: the key's seed plus (s + 1) x 0x9E3779B97F4A7C15.
  // dqkv comes back float32, rounded to round_dqkv. The default runs attention_forward and
  // attention_backward on each sample's tokens in turn; a backend may run them in one call (the
  // GPU's fused attention: cuDNN's ragged layout, its own dropout masks).
  virtual void packed_attention_forward(const Tensor& qkv, const PackedSamples& samples,
                                        bool causal, int heads, int kv_heads, float scale,
                                        float dropout_p, const RngKey& key, const Tensor& stats,
                                        const Tensor& scratch, const Tensor& out);
  virtual Tensor packed_attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& out,
                                           const Tensor& stats, const PackedSamples& samples,
                                           bool causal, int heads, int kv_heads, float scale,
                                           float dropout_p, const RngKey& key,
                                           const Tensor& scratch, const Tensor& dqkv,
                                           DType round_dout, DType round_dqkv);
  // Throws naming `op` unless `samples` covers the B * T tokens, each sample within one row.
  static void check_packed_samples(const PackedSamples& samples, int64_t B, int64_t T,
                                   const char* op);
  // What packed_attention_forward and _backward decide on the host from a batch's samples, for
  // a recorded step's signature (Model::step_signature), appended to `out`: two batches that
  // give the same launch the same work. The default, one call per sample, follows every start; a
  // backend whose packed attention reads the layout from memory (PackedSamples::at) gives less.
  virtual void add_packed_signature(const PackedSamples& samples, const AttentionDims& d,
                                    bool causal, float scale, float dropout_p,
                                    std::vector<int64_t>& out) const;

  // Attention of new tokens over a key/value cache (incremental decoding): qkv [B,T,(H+2K)*D]
  // packs the T new tokens at positions past..past+T-1 as attention_forward's. Their keys and
  // values are first written into rows past..past+T-1 of k_cache and v_cache [B,S,K*D]
  // (past + T <= S); query t then attends to the keys of positions 0..past+t. Scores scaled by
  // `scale` as in attention_forward; no mask, no dropout. out is [B,T,H*D].
  virtual void attention_decode(const Tensor& qkv, const Tensor& k_cache, const Tensor& v_cache,
                                int64_t past, int heads, int kv_heads, float scale,
                                const Tensor& out) = 0;
  // Throws naming `op` unless the tensors have the shapes attention_decode needs.
  static void check_attention_decode(const Tensor& qkv, const Tensor& k_cache,
                                     const Tensor& v_cache, int64_t past, int heads, int kv_heads,
                                     const Tensor& out, AttentionDims* dims);
  // Throws naming `op` unless the attention score scale is finite.
  static void check_attention_scale(float scale, const char* op);
  // Throws naming `op` unless the key mask is empty or keep is int32 [B,T], and lengths empty or
  // int32 [B] beside a keep (its values are not read here).
  static void check_key_mask(const KeyMask& mask, int64_t B, int64_t T, const char* op);
  // Throws naming `op` unless padding_idx is -1 (none) or a row of a word table of `rows` rows.
  static void check_padding_idx(int64_t padding_idx, int64_t rows, const char* op);

  // ---- heads and loss ----
  // out[b,:] = x[b,0,:] for x [B,T,C]; where `starts` (int32 [S+1], S <= B, in the backend's
  // memory: a packed batch's PackedSamples::at) is given, out[b,:] is token starts[b]'s of the
  // B*T (each sample's first) for b < S and zero past them (the CPU checks each start is a token,
  // a GPU cannot: callers lay them so).
  virtual void first_token(const Tensor& x, const Tensor& out, const Tensor& starts) = 0;
  // dx[b,0,:] += dout[b,:]; with `starts`, token starts[b]'s row of dx for b < S.
  virtual void first_token_backward(const Tensor& dout, const Tensor& dx, const Tensor& starts) = 0;
  // Softmax cross-entropy over rows of logits [N,V] with int32 labels [N] (kIgnoreIndex rows
  // are skipped; others must lie in [0, V): callers validate them on the host, since only the
  // CPU can throw here; a GPU skips such rows). Adds the summed loss of the counted rows to
  // loss_sum (float64 [1], in device memory). With write_grad the gradient (softmax - onehot) *
  // grad_scale (zero on ignored rows; the losses' scales are applied(grad_scale), their held
  // factor read as the op runs) overwrites the logits, so probabilities are never stored;
  // or, where `grad` is given ([N,V] float32 or bf16), it is written there (bf16: the float32
  // gradient rounded to nearest even) and the logits are left overwritten with scratch values.
  virtual void softmax_cross_entropy(const Tensor& logits, const Tensor& labels, bool write_grad,
                                     const GradScale& grad_scale, const Tensor& loss_sum,
                                     const Tensor& grad) = 0;
  // Vocabulary-parallel softmax cross-entropy in two steps around a sum over the tensor ranks
  // (Megatron's; the logits never gathered). Logits [N,V'] are columns of the whole's, `shard`
  // saying which (columns past shard.count(V') are padding: no probability, zero gradient).
  // First, stats [N,3] float32 = each row's maximum over its columns, the sum of e^(z - maximum)
  // there, and the label's logit where this shard holds the label (else 0); zeros on ignored rows.
  virtual void cross_entropy_stats(const Tensor& logits, const Tensor& labels,
                                   const VocabShard& shard, const Tensor& stats) = 0;
  // Then, from `stats` [R,N,3] (every shard's stats, each at its place and zeros elsewhere, summed
  // over the ranks), softmax_cross_entropy's loss (every rank adds the whole rows' loss) and
  // its gradient on these columns.
  virtual void cross_entropy_from_stats(const Tensor& logits, const Tensor& labels,
                                        const VocabShard& shard, const Tensor& stats,
                                        bool write_grad, const GradScale& grad_scale,
                                        const Tensor& loss_sum, const Tensor& grad) = 0;
  // Throws unless the tensors have the shapes the two steps need; returns the logits' columns
  // that are ids (shard.count).
  static int64_t check_cross_entropy_shard(const Tensor& logits, const Tensor& labels,
                                           const VocabShard& shard, const Tensor& stats,
                                           int64_t stat_slots, const char* op);
  // Whether softmax_cross_entropy writes its gradient apart (write_grad and `grad` given); throws
  // unless such a `grad` is float32 or bf16 of the logits' rows and columns.
  static bool check_loss_grad(const Tensor& logits, bool write_grad, const Tensor& grad);
  // Squared error of predictions [N,1] (or [N]) against float32 targets [N] (NaN targets are
  // skipped: rows without a label): adds the summed (p - y)^2 of the counted rows to loss_sum
  // (float64 [1], in device memory); with write_grad the predictions are overwritten by
  // 2 (p - y) * grad_scale (zero on skipped rows). transformers' regression loss (MSELoss, the
  // mean) is this sum with grad_scale = 1 / counted rows.
  virtual void mse_loss(const Tensor& predictions, const Tensor& targets, bool write_grad,
                        const GradScale& grad_scale, const Tensor& loss_sum) = 0;

  // ---- mixture of experts ----
  // Routing (moe_route.h: transformers' Mixtral, Qwen2-MoE and OLMoE routers) of N tokens by
  // their float32 router logits [N,E]: probs [N,E] their softmax, experts [N,k] (int32) each
  // token's k most probable (the lower of two alike first), weights [N,k] their probabilities,
  // divided by their sum where `normalize`.
  virtual void moe_route_forward(const Tensor& logits, bool normalize, const Tensor& probs,
                                 const Tensor& weights, const Tensor& experts) = 0;
  // dlogits [N,E] (written): the logits' gradient from the weights' (dweights [N,k]) and, unless
  // empty, a term dprobs [N,E] added to the probabilities' gradient.
  virtual void moe_route_backward(const Tensor& probs, const Tensor& weights, const Tensor& experts,
                                  const Tensor& dweights, const Tensor& dprobs, bool normalize,
                                  const Tensor& dlogits) = 0;
  // Throws unless probs [N,E], weights [N,k] and experts [N,k] are a routing's (float32, int32;
  // 1 <= k <= E); returns E and k.
  static std::pair<int64_t, int64_t> check_moe_route(const Tensor& probs, const Tensor& weights,
                                                     const Tensor& experts, const char* op);
  // The dispatch of N tokens' routed pairs (experts [N,k], int32, each in [0, E)) into rows
  // grouped by expert, for products over each expert's rows alone: counts [E] (int32) the pairs
  // each expert receives, positions [N,k] (int32) each pair's row. Expert e's rows are
  // [offset_e, offset_e + counts[e]), offset_e = counts[0] + ... + counts[e-1], its pairs in the
  // order of the tokens (then of their slots): the same rows on every backend. An expert out of
  // range throws where the backend can check (the CPU) and gets no row elsewhere.
  virtual void moe_dispatch(const Tensor& experts, int64_t num_experts, const Tensor& counts,
                            const Tensor& positions) = 0;
  // rows [N*k, C]: rows[positions[n,j]] = x[n] (float32): each token's input to its k experts.
  virtual void moe_gather(const Tensor& x, const Tensor& positions, const Tensor& rows) = 0;
  // y [N,C] = (or += when accumulate) sum over j of weights[n,j] * rows[positions[n,j]], j in
  // order; without weights (empty) the plain sum: the gather's backward, a token's gradient from
  // its k rows'. Without positions (empty), k = 1 and token n's row is row n: rows scaled by a
  // weight each (Qwen2-MoE's shared expert under its gate).
  virtual void moe_combine(const Tensor& rows, const Tensor& positions, const Tensor& weights,
                           const Tensor& y, bool accumulate) = 0;
  // moe_combine's backward (written): drows[positions[n,j]] = weights[n,j] * dy[n] and
  // dweights[n,j] = dy[n] . rows[positions[n,j]].
  virtual void moe_combine_backward(const Tensor& dy, const Tensor& rows, const Tensor& positions,
                                    const Tensor& weights, const Tensor& drows,
                                    const Tensor& dweights) = 0;
  // One layer's statistics for transformers' load-balancing loss over N tokens, those whose mask
  // is 0 (int32 [N]; empty: none) left out: stats [2, E] float32 = (how many of the tokens' routed
  // pairs went to each expert, exact up to 2^24; the sum of each expert's probabilities), each
  // summed over the tokens in order.
  virtual void moe_balance_stats(const Tensor& probs, const Tensor& experts, const Tensor& mask,
                                 const Tensor& stats) = 0;
  // The loss's gradient for one layer's probabilities: dprobs [N, E] (written) = mask[n] *
  // scale[e] (mask as moe_balance_stats'; scale float32 [E]).
  virtual void moe_balance_backward(const Tensor& mask, const Tensor& scale,
                                    const Tensor& dprobs) = 0;
  // ST-MoE's router z-loss for one layer's router logits [N,E] (float32), tokens whose mask is 0
  // (as moe_balance_stats') left out: z [N] (written) each token's logsumexp of its logits (0
  // where masked out), sum [1] (written) the sum of z^2 over the tokens in order.
  virtual void moe_z_stats(const Tensor& logits, const Tensor& mask, const Tensor& z,
                           const Tensor& sum) = 0;
  // The gradient of scale * that sum: dlogits [N,E] += scale * 2 z[n] * probs[n,e], probs being
  // the logits' softmax (moe_route_forward's).
  virtual void moe_z_backward(const Tensor& probs, const Tensor& z, float scale,
                              const Tensor& dlogits) = 0;
  // Throw unless the arguments are as the two ops above take them; return N, E (and k).
  struct MoeBalance {
    int64_t N, E, k;
  };
  static MoeBalance check_moe_balance_stats(const Tensor& probs, const Tensor& experts,
                                            const Tensor& mask, const Tensor& stats);
  static MoeBalance check_moe_balance_backward(const Tensor& mask, const Tensor& scale,
                                               const Tensor& dprobs);
  // For moe_z_stats (`values`: logits, `other`: the sum [1]) and moe_z_backward (probs, dlogits).
  static MoeBalance check_moe_z(const Tensor& values, const Tensor& mask, const Tensor& z,
                                const Tensor& other, bool backward);
  // Throws unless experts and positions are int32 [N,k] and counts int32 [num_experts >= 1];
  // returns N * k.
  static int64_t check_moe_dispatch(const Tensor& experts, int64_t num_experts,
                                    const Tensor& counts, const Tensor& positions);
  // Throws unless positions [N,k] (int32; empty: k = 1, each token's own row), rows [N*k, C] and
  // tokens [N, C] (float32) and, unless empty, weights [N,k] (float32) belong together; returns
  // N, k and C.
  struct MoeRows {
    int64_t N, k, C;
  };
  static MoeRows check_moe_rows(const Tensor& positions, const Tensor& rows, const Tensor& tokens,
                                const Tensor& weights, const char* op);
  // check_moe_rows for moe_gather's arguments, positions given.
  static MoeRows check_moe_gather(const Tensor& x, const Tensor& positions, const Tensor& rows);
  // check_moe_rows for moe_combine_backward's arguments, weights and dweights given.
  static MoeRows check_moe_combine_backward(const Tensor& dy, const Tensor& rows,
                                            const Tensor& positions, const Tensor& weights,
                                            const Tensor& drows, const Tensor& dweights);

  // ---- low-rank adapters (LoRA, adapters/) ----
  // A product's output gains an adapter's low-rank term. x [N, in], a [r, in], b [out, r], u and
  // v [N, r], y and dy [N, width] whose columns [at, at + out) are the adapted product's; all
  // float32 in the backend's memory.
  // lora_forward: u = scale * x a^T (kept for backward); y[:, at:at+out] += u b^T.
  virtual void lora_forward(const Tensor& x, const Tensor& a, const Tensor& b, float scale,
                            const Tensor& u, const Tensor& y, int64_t at) = 0;
  // lora_backward: db (+)= dy[:, at:at+out]^T u; v = scale * dy[:, at:at+out] b; da (+)= v^T x;
  // dx [N, in] += v a (dx empty: no input gradient). `accumulate`: da and db added to.
  virtual void lora_backward(const Tensor& x, const Tensor& a, const Tensor& b, float scale,
                             const Tensor& u, const Tensor& dy, int64_t at, const Tensor& v,
                             const Tensor& da, const Tensor& db, const Tensor& dx,
                             bool accumulate) = 0;
  // Throw unless the tensors are as the two ops take them; return the sizes.
  struct LoraDims {
    int64_t N, in, r, out, width;
  };
  static LoraDims check_lora_forward(const Tensor& x, const Tensor& a, const Tensor& b,
                                     const Tensor& u, const Tensor& y, int64_t at);
  static LoraDims check_lora_backward(const Tensor& x, const Tensor& a, const Tensor& b,
                                      const Tensor& u, const Tensor& dy, int64_t at,
                                      const Tensor& v, const Tensor& da, const Tensor& db,
                                      const Tensor& dx);

  // ---- 4-bit weights (QLoRA's frozen base, core/quant4.h) ----
  // out [layout.numel] (float32, or bf16 / f16 rounded to nearest even) = each value's 4-bit
  // code's value x its block's absmax, in float32, as bitsandbytes' dequantize_4bit. q's
  // tensors in the backend's memory: packed (u8), and absmax (float32 [blocks]) or, nested,
  // qabsmax (u8 [blocks]), absmax2 (float32 [nested blocks]) and code2 (the dynamic map, float32
  // [256]) with the offset.
  struct Quant4Tensor {
    Quant4Layout layout;
    Tensor packed, absmax, qabsmax, absmax2, code2;
    float offset = 0;
    // Non-zero: the values are a [numel / cols, cols] matrix (a linear's weight as nn.Linear
    // holds it, [out, in]) written into out transposed, [cols, numel / cols] (a Conv1D's layout).
    int64_t transposed_cols = 0;
  };
  virtual void dequantize_4bit(const Quant4Tensor& q, const Tensor& out) = 0;
  static void check_dequantize_4bit(const Quant4Tensor& q, const Tensor& out);
  // A linear's weight kept 4-bit, [rows, cols] as nn.Linear holds it, in parts of whole rows
  // quantized apart (query, key and value as one matrix), each rounded after dequantization to
  // its `dtype` (quant_state's), then to fp16 where `fp16`, as bitsandbytes' matmul_4bit does.
  struct Quant4Part {
    Quant4Tensor q;  // [numel / cols, cols], transposed_cols 0
    DType dtype = DType::f32;
  };
  struct Quant4Matrix {
    std::vector<Quant4Part> parts;
    int64_t cols = 0;
    bool fp16 = false;
    int64_t rows() const;
  };
  // y[M, rows] = x[M, cols] W^T + b (b may be empty), as linear_forward with W's values, W
  // dequantized into the planned workspace (MatmulOperands::quantized) for this product only (on
  // bf16 units the CPU's straight into the blocked layout its kernel reads B in).
  virtual void quantized_linear_forward(const Tensor& x, const Quant4Matrix& w, const Tensor& b,
                                        const Tensor& y);
  // dx[M, cols] = (accumulate_dx ? dx : 0) + dy[M, rows] W (a frozen weight: no dW).
  virtual void quantized_linear_backward(const Tensor& dy, const Quant4Matrix& w, const Tensor& dx,
                                         bool accumulate_dx);
  // Throws unless every part is a [part rows, cols] matrix the workspace holds.
  void check_quant4_matrix(const Quant4Matrix& w, const char* op) const;

  // The buffer one weight is dequantized into (BackendWorkspace::dequantized; empty: none),
  // where, between products, a weight's values land to be quantized (adapters/quantized_base.h).
  virtual Tensor dequantized_buffer() const { return {}; }

 protected:
  // W's values, rounded as w says, into the float32 [rows, cols] at the buffer's start.
  Tensor dequantize_matrix(const Quant4Matrix& w);

 public:
  // ---- the optimizer step ----
  // acc (float64 [1]) += the sum of squares of x (inf/NaN propagate: the overflow check).
  virtual void sum_squares(const Tensor& x, const Tensor& acc) = 0;
  // control (float32 [kControlSize]) = decide_step(stats (float64 [kStatsSize]), ...): see
  // core/step_control.h.
  virtual void decide_step(const Tensor& stats, double loss_scale, double max_norm,
                           const Tensor& control) = 0;
  virtual void adamw_update(const AdamWUpdate& u) = 0;
  virtual void sgd_update(const SgdUpdate& u) = 0;
  virtual void adafactor_update(const AdafactorUpdate& u) = 0;
  // Whether adafactor_update steps split slots (AdafactorUpdate::split).
  virtual bool sums_split_statistics() const { return false; }
  virtual void adamw_8bit_update(const AdamW8bitUpdate& u) = 0;
};

// Each backend takes the run's measurement switches (core/switches.h; the defaults where none
// are given) and keeps them.
std::unique_ptr<Backend> make_cpu_backend(const Switches& switches = {});
// The CUDA backend on the current GPU; throws a clear error when this build has no CUDA backend
// or the machine has no usable GPU.
std::unique_ptr<Backend> make_cuda_backend(const Switches& switches = {});
// Whether make_cuda_backend can succeed here (a CUDA build and at least one GPU).
bool cuda_available(std::string* why_not = nullptr);
// The GPUs this process sees (0 without a usable driver or a CUDA build).
int cuda_device_count();
std::unique_ptr<Backend> make_backend(Device device, const Switches& switches = {});

// Elements [first, first + count) of t as a flat tensor in t's memory.
Tensor element_range(const Tensor& t, int64_t first, int64_t count);

// Fills dst (host or device memory) from host code without a whole host copy: host memory
// directly, in one piece; device memory piece by piece through a staging buffer of at most
// `piece_bytes`, fill(piece, first) writing elements [first, first + piece.numel()) in order.
// `staged` sends host memory through the staging path too (tests). For loading and
// initializing weights and optimizer state, never inside a training step.
void write_in_pieces(Backend& be, const Tensor& dst,
                     const std::function<void(const Tensor& piece, int64_t first)>& fill,
                     size_t piece_bytes = size_t{8} << 20, bool staged = false);

// Runs fn on a host view of t: t itself when it is in host memory, otherwise a temporary host
// copy, downloaded first when `read` and uploaded afterwards when `write`. For small tensors
// (tables, maps); large ones go through write_in_pieces or a streaming writer.
void with_host_view(Backend& be, const Tensor& t, bool read, bool write,
                    const std::function<void(const Tensor&)>& fn);

}  // namespace brisk
