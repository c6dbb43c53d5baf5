// One transformer block with explicit forward and backward, shared by BERT (post-LayerNorm,
// nn.Linear weights), GPT-2 (pre-LayerNorm, Conv1D weights) and the llama family (pre-RMSNorm,
// rotary positions, grouped-query attention, the gated SwiGLU MLP), with the MLP activation the
// config names. It declares what it saves for backward, and can recompute those internals from its
// input alone.
#pragma once

#include <array>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "core/memory_plan.h"
#include "models/model_parallelism.h"
#include "models/product_adapters.h"
#include "models/sequence_parallel.h"

namespace brisk {

// A sparse MLP in place of a block's dense one, for the layers it claims (a mixture of experts:
// models/moe_layer.h). It holds its layers' weights, gradients and what their backward reads.
class SparseMlp {
 public:
  virtual ~SparseMlp() = default;
  virtual bool sparse(int layer) const = 0;
  // y [B, T, C] float32 = layer `layer`'s MLP of x [B, T, C] (the MLP's input: float32, or its
  // 16-bit stored copy in mixed precision), with the layer's adapters on its dense products.
  virtual void forward(Backend& be, int layer, const Tensor& x, const Tensor& y,
                       const LayerAdapters& adapters) = 0;
  // dx [B, T, C] written from dy, the MLP output's gradient (dy and dx do not overlap); the layer's
  // parameter gradients written, or added to where accumulate_dw.
  virtual void backward(Backend& be, int layer, const Tensor& x, const Tensor& dy, const Tensor& dx,
                        bool accumulate_dw, const LayerAdapters& adapters) = 0;
  // Layer `layer`'s dense products' weights, where adapters may add to them (ProductSite's
  // router, shared_fc, shared_out, shared_gate; an empty tensor where the layer has none).
  virtual std::vector<std::pair<ProductSite, Tensor>> products(int layer) const = 0;
  // Inference without a backward (incremental decoding): declare(tensor, name, dtype, shape) for
  // the buffers of up to `tokens` tokens, then infer writes y [.., C] = the MLP of x [.., C] for
  // as many.
  using Declare = std::function<void(Tensor*, const std::string&, DType, Shape)>;
  virtual void declare_inference(const Declare& declare, int64_t tokens) = 0;
  virtual void infer(Backend& be, int layer, const Tensor& x, const Tensor& y) = 0;
};

struct BlockStyle {
  bool pre_norm = false;  // GPT-2: LN before each sublayer; BERT: LN after each residual
  // A residual add and the norm after it (and their gradients) in one backend call each; off
  // (PlanOptions::fused_residual_norm) they are separate calls (round_to, the norm, the dropout),
  // to compare.
  bool fused_residual_norm = true;
  bool causal = false;
  WeightLayout layout = WeightLayout::out_in;
  Activation activation = Activation::gelu;
  float eps = 1e-12f;
  float attention_dropout = 0.0f;
  float residual_dropout = 0.0f;  // after the MLP
  // After the attention's output projection (BERT, GPT-2: the residual dropout; DistilBERT: 0).
  float attention_output_dropout = 0.0f;
  // GPT-2's scale_attn_by_inverse_layer_idx: block l divides its attention scores by l + 1 too.
  bool scale_by_inverse_layer = false;
  int heads = 1;
  // Key/value heads: heads for multi-head attention, fewer for grouped-query attention (heads a
  // multiple of it). 0 by default so that a model which forgets to set it is refused by the
  // attention ops rather than run with a layout it did not mean.
  int kv_heads = 0;
  // Multiplies the attention scores q.k. NaN by default so that a model which forgets to set it
  // fails in the attention ops (they refuse a non-finite scale) instead of training quietly wrong.
  float attention_scale = std::numeric_limits<float>::quiet_NaN();
  // The llama family: RMSNorm instead of LayerNorm (no centring, no bias: the ln_*_b parameters
  // are empty), and the gated MLP: fc holds gate_proj's and up_proj's outputs end to end [2F],
  // the activation is silu(gate) * up (SwiGLU).
  bool rms_norm = false;
  bool gated_mlp = false;
  // OLMoE's query/key norms: each token's query heads, then its key heads, RMSNormed as one row
  // (q_norm [heads * D], k_norm [kv_heads * D]) between the qkv product and the rotary positions.
  // Rotary blocks without tensor or sequence parallelism.
  bool qk_norm = false;
  // Rotary position embedding tables [positions, head_dim / 2] from position 0 (rope.h); empty:
  // none. A sequence's tokens take the rows of their positions.
  Tensor rope_cos, rope_sin;
  // The groups the block runs in (model_parallelism.h). Tensor parallelism (Megatron's): heads,
  // kv_heads and the MLP width above are this rank's share; the query/key/value and first MLP
  // products are split by output (column-parallel), the attention output and second MLP products
  // by input (row-parallel), their partial outputs and the column-parallel products' input
  // gradients summed over parallel.tensor. Sequence parallelism (DeepSpeed-Ulysses'): the block's
  // tensors hold this rank's tokens of every sequence (sequence_parallel.h); attention runs on
  // every token of heads / size() of the heads (and kv_heads / size()), its input and output
  // exchanged by all-to-all over parallel.sequence; rotary positions start at this rank's first
  // token. A null group: one rank.
  ModelParallelism parallel;
  // Megatron's sequence parallelism under tensor parallelism: x, the residual stream, its norms
  // and dropouts hold this tensor rank's slice of the tokens (TokenSlice: of the sequence group's
  // tokens, where there is one); the column-parallel products read their inputs all-gathered,
  // the row-parallel products' partial outputs are reduce-scattered, and the norms' parameters get
  // each rank's tokens' part of their gradients (the group sums them; Model::token_param).
  bool tensor_slices_tokens = false;
  // Storage type of activations that feed matrix products (f32, or bf16/f16 in mixed
  // precision). On the CPU the math stays float32 and such outputs are rounded to this type.
  DType act_dtype = DType::f32;
  // The layers whose MLP is sparse run this one instead of fc/out (their fc_pre and fc_act are
  // neither planned (BlockDims::inner 0), written nor read); pre-norm blocks without tensor
  // parallelism. Null: none.
  SparseMlp* sparse_mlp = nullptr;
  // Low-rank adapters on the products; null: none. In training, the step's key (their dropout's).
  const ProductAdapters* adapters = nullptr;
  std::optional<RngKey> adapter_key;
  // Mixed precision: the 16-bit outputs backward rebuilds from what the block keeps
  // (block_recompute) rather than keep per block: a pre-norm block's norm outputs, the MLP
  // activation's output (PlanOptions::recompute_norms, recompute_activation).
  bool rebuilds_norms = false;
  bool rebuilds_activation = false;
};

// Parameters (or their gradients) of one block. ln_a is the LayerNorm (or RMSNorm) around
// attention, ln_b the one around the MLP; qkv is the packed [q | k | v] projection (H query heads,
// then K key and K value heads); fc the MLP's first product ([gate | up] when gated). Biases the
// architecture lacks are empty tensors.
struct BlockParams {
  Tensor qkv_w, qkv_b, proj_w, proj_b;
  Tensor ln_a_g, ln_a_b;
  Tensor fc_w, fc_b, out_w, out_b;
  Tensor ln_b_g, ln_b_b;
  Tensor q_norm, k_norm;  // BlockStyle::qk_norm's
  // Weights kept 4-bit and multiplied where they are kept (QLoRA), by ProductSite qkv, proj, fc,
  // out (null: the tensor above); their tensors above are then empty or not to be read.
  std::array<const Backend::Quant4Matrix*, 4> quantized{};
  const Backend::Quant4Matrix* quantized_at(ProductSite site) const {
    const auto i = static_cast<size_t>(site);
    return i < quantized.size() ? quantized[i] : nullptr;  // (a sparse MLP's sites: none)
  }
};

// What the block saves for backward. a_in is the attention input (pre-norm: LN_a(x); post-norm:
// x itself, so it is not stored); attn_stats is what the backend's attention keeps; res1 = x +
// attention; m_in is the MLP input; res2 (post-norm only) is the input of the final LayerNorm.
// With query/key norms: q_in [B, T, heads * D] and k_in [B, T, kv_heads * D], the norms' inputs,
// and their rstd_q and rstd_k.
struct BlockSaved {
  Tensor a_in, qkv, attn_stats, ctx, res1, m_in, fc_pre, fc_act, res2;
  Tensor mean_a, rstd_a, mean_b, rstd_b;
  Tensor q_in, k_in, rstd_q, rstd_k;
};

// The saved tensors kept in the activation dtype under mixed precision (those that feed matrix
// products, attention or the MLP's activation); the rest (residual sums, attention's
// log-sum-exp, norm statistics) stay float32. Entries for tensors a style does not use are
// empty. Where the backend reads the activation dtype as it is (Backend::reads_product_input),
// their 16-bit copies are the only ones either pass reads.
std::array<Tensor*, 6> low_precision_tensors(BlockSaved& s);
// Every saved tensor (for sharing one set among blocks).
std::array<Tensor*, 17> all_saved_tensors(BlockSaved& s);
// The low-precision tensors backward rebuilds cheaply from what a block keeps, by the element-wise
// ops that made them (block_recompute): a pre-norm block's norm outputs a_in and m_in (from its
// input and res1) where style.rebuilds_norms, and the MLP activation's output fc_act (from
// fc_pre) where style.rebuilds_activation. Entries a style does not rebuild are null.
std::array<Tensor*, 3> recomputable_tensors(BlockSaved& s, const BlockStyle& style);

// Buffers shared by all blocks, used only within one block's forward or backward.
// d_gate_up (gated MLPs whose saved gate_up is a 16-bit stored copy): where SwiGLU's input
// gradient goes, the slot of the float32 working gate_up; else empty (the gradient is written over
// the saved gate_up). Under sequence parallelism: exchange, the all-to-all's buffer; heads_ctx
// and heads_qkv, the attention's output (or its gradient) and input gradient over every token of
// this rank's heads; else empty.
// Under Megatron's sequence parallelism: gathered, a product's all-gathered input [B, T, C]
// (float32's room, viewed in the input's dtype), and token_exchange, the gathers' and
// reduce-scatters' buffer; tmp and tmp2 then hold whole tokens' partial products or gradients,
// or slices' values in slice-sized parts.
struct BlockScratch {
  Tensor tmp, tmp2, d_ctx, d_qkv, d_fc, attn, d_gate_up;
  Tensor exchange, heads_ctx, heads_qkv;
  Tensor gathered, token_exchange;
};

// inner 0: the layer's MLP is a sparse one (BlockStyle::sparse_mlp), which plans its own buffers.
struct BlockDims {
  int64_t batch, seq, hidden, inner, heads, kv_heads, head_dim;
  bool gated;                  // the gated MLP: its first product is 2 * inner wide
  AttentionBuffers attention;  // the backend's, for these dimensions
  // Sequence parallelism: the ranks that share the sequences (seq is this rank's tokens; the
  // saved qkv holds every token of its share of the heads).
  int64_t seq_ranks = 1;
  // Megatron's sequence parallelism: the tensor ranks whose slices of seq's tokens make the
  // residual stream (x, the residual sums, the norms' inputs and outputs hold stream_seq()).
  int64_t token_slices = 1;
  int64_t stream_seq() const { return seq / token_slices; }

  int64_t qkv_width() const { return (heads + 2 * kv_heads) * head_dim; }
  // A sequence rank's qkv over every token: its query heads and its share of the key/value
  // heads, or one copy where the ranks outnumber them.
  int64_t heads_qkv_width() const {
    return (heads / seq_ranks + 2 * std::max<int64_t>(1, kv_heads / seq_ranks)) * head_dim;
  }
  int64_t attention_width() const { return heads * head_dim; }
  int64_t fc_width() const { return gated ? 2 * inner : inner; }
};

// Which saved tensors to declare: all of them, only the low-precision ones, or only the rest;
// the low-precision ones but the recomputable ones (recomputable_tensors), or only those. A
// float32 working set whose readers read the 16-bit stored copies as they lie (working_set) is
// low_precision's, but an ungated MLP's fc_pre and fc_act share one room (its forward writes
// fc_act straight into the stored copy, from fc_pre's copy, once fc_pre's float32 is rounded),
// and a pre-norm block's norm outputs a_in and m_in have none (written straight into theirs).
enum class SavedPart {
  all,
  low_precision,
  full_precision,
  low_precision_kept,
  recomputable,
  working_set
};

// Declares saved tensors; the low-precision ones get `low_dtype` and `low_category`. Without
// `with_attn_stats` the attention core's statistics are left to the caller (selective
// recomputation shares one buffer among all blocks).
void declare_block_saved(MemoryPlan& plan, BufferBinder& binder, BlockSaved& saved,
                         const std::string& prefix, const BlockStyle& style, const BlockDims& d,
                         SavedPart part = SavedPart::all, DType low_dtype = DType::f32,
                         Category low_category = Category::activations,
                         bool with_attn_stats = true);
// `room`: a float32 working set of the blocks' saved tensors that backward never reads (the
// backend reads their 16-bit stored copies as they lie); backward's own buffers of the same shapes
// (d_ctx, d_qkv, d_fc) then take its room instead of their own. Without `backward` (forward
// passes only) the buffers only backward uses are not planned: d_ctx only with `qk_norm` (the
// blocks' query/key norms, whose forward uses it).
void declare_block_scratch(MemoryPlan& plan, BufferBinder& binder, BlockScratch& scratch,
                           const BlockDims& d, const BlockSaved* room = nullptr,
                           bool backward = true, bool qk_norm = false);

// The attention scale of block `layer` (GPT-2's scale_attn_by_inverse_layer_idx divides by
// layer + 1).
float layer_attention_scale(const BlockStyle& style, int layer);

// Dropout sites of a block, for RngKey::site.
uint32_t block_rng_site(int layer, int which);

// out = block(x); key_mask is int32 [B,T] or empty. With out empty, only the saved internals are
// (re)computed: the recompute path of gradient checkpointing, bit-identical to the first pass.
// With `stored`, the low-precision tensors (low_precision_tensors) are rounded into stored's
// 16-bit copies and their readers read those; s's float32 ones are then scratch (m_in of a
// post-norm block, a residual too, stays rounded in s as well).
void block_forward(Backend& be, const BlockStyle& style, const BlockParams& w, const Tensor& x,
                   const KeyMask& key_mask, const Tensor& out, const BlockSaved& s,
                   const BlockScratch& scratch, const RngKey& key, int layer,
                   const BlockSaved* stored = nullptr);

// The recomputable tensors (recomputable_tensors) of the block whose input is x, as block_forward
// computed them, bit for bit (the same calls on the same kept inputs: x, s.res1 and fc_pre, the
// latter two read from `stored` where block_forward was given it); the norm statistics are
// written again, with the same values.
void block_recompute(Backend& be, const BlockStyle& style, const BlockParams& w, const Tensor& x,
                     const BlockSaved& s, const BlockSaved* stored = nullptr);

// A post-norm block's output LN_b(res2) from what the block keeps (s.res2; the statistics are
// written again, with the same values): block_forward's last op, so the next block's input is
// rebuilt bit for bit.
void post_norm_output(Backend& be, const BlockStyle& style, const BlockParams& w,
                      const BlockSaved& s, const Tensor& out);

// The attention core of block_forward alone: s.attn_stats from qkv (the saved one, rounded as
// the forward pass rounds it, or its 16-bit stored copy), its output into `out`, or where
// `stored` is given rounded into that 16-bit copy (out then scratch: attention_forward_stored).
// Selective recomputation calls it in backward to rebuild the statistics it did not keep,
// bit-identical to the first pass.
void block_attention_core(Backend& be, const BlockStyle& style, const KeyMask& key_mask,
                          const Tensor& qkv, const BlockSaved& s, const BlockScratch& scratch,
                          const Tensor& out, const RngKey& key, int layer,
                          const Tensor* stored = nullptr);

// On entry dh holds the gradient of the block's output; on exit the gradient of its input x.
// Parameter gradients accumulate into g; the linear layers' weight and bias gradients are
// written instead when `accumulate_dw` is false (the step's first micro-batch).
void block_backward(Backend& be, const BlockStyle& style, const BlockParams& w,
                    const BlockParams& g, const Tensor& x, const KeyMask& key_mask,
                    const BlockSaved& s, const BlockScratch& scratch, const Tensor& dh,
                    const RngKey& key, int layer, bool accumulate_dw);

// Buffers of block_decode for [1,T] new tokens (widths as BlockDims gives them): a/mean/rstd the
// norm's outputs, qkv, ctx the attention output, res the residual after attention, fc/fc_act the
// MLP's inner layer, tmp the sublayers' outputs.
struct DecodeScratch {
  Tensor a, mean, rstd, qkv, ctx, res, fc, fc_act, tmp;
};

// Incremental decoding (inference, float32): out [1,T,C] = block(x) for T new tokens at
// positions past..past+T-1, their keys and values appended to the block's caches
// [1,S,kv_heads*head_dim].
// Pre-norm causal blocks (GPT-2's, the llama family's).
void block_decode(Backend& be, const BlockStyle& style, int layer, const BlockParams& w,
                  const Tensor& x, const Tensor& k_cache, const Tensor& v_cache, int64_t past,
                  const DecodeScratch& s, const Tensor& out);

}  // namespace brisk
