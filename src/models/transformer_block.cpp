// Forward and backward of the shared transformer block (its buffers: block_buffers.cpp).
#include "models/transformer_block.h"

#include <algorithm>

#include "models/block_products.h"

namespace brisk {

namespace {
enum Site : int { kAttnProbs = 0, kAttnResidual = 1, kMlpResidual = 2, kSitesPerLayer = 4 };

RngKey site_key(const RngKey& key, int layer, int which) {
  RngKey k = key;
  k.site = block_rng_site(layer, which);
  return k;
}

// Megatron's sequence parallelism: whether the residual stream holds this tensor rank's slice
// of the tokens.
bool slices_tokens(const BlockStyle& st) {
  return st.tensor_slices_tokens && st.parallel.tensor != nullptr && st.parallel.tensor->size() > 1;
}

// Where the residual stream's tokens lie in each whole sequence: Ulysses' slice, and within it
// the tensor rank's.
TokenSlice stream_slice(const BlockStyle& st) {
  const TokenSlice sequence = token_slice(st.parallel.sequence);
  if (!slices_tokens(st)) return sequence;
  return token_slice(sequence, st.parallel.tensor->rank(), st.parallel.tensor->size());
}

// Part k of float32 buffer `buf` shaped as the stream tensor `like` (tmp and tmp2 hold whole
// tokens: several slices).
Tensor slice_space(const Tensor& buf, const Tensor& like, int64_t k) {
  BRISK_CHECK((k + 1) * like.numel() <= buf.numel(), "internal error: slice ", k, " of ",
              like.shape().str(), " outside a buffer of ", buf.numel());
  return Tensor(buf.f32() + k * like.numel(), like.shape(), DType::f32, buf.device());
}

// A product's input over every token: under Megatron's sequence parallelism x (this rank's
// tokens, any dtype) all-gathered into `into` (viewed in x's dtype); else x itself.
Tensor all_tokens(Backend& be, const BlockStyle& st, const Tensor& x, const Tensor& into,
                  const BlockScratch& sc) {
  if (!slices_tokens(st)) return x;
  const Tensor full(into.data(), Shape{x.dim(0), x.dim(1) * st.parallel.tensor->size(), x.dim(2)},
                    x.dtype(), into.device());
  gather_tokens(be, *st.parallel.tensor, x, full, sc.token_exchange);
  return full;
}

// Tensor parallelism: whether this rank brings the terms every rank holds alike to a sum over the
// group (rank 0 does: the row-parallel products' biases, the residual gradient of a post-norm
// block), and that sum.
bool adds_shared_terms(const BlockStyle& st) {
  return st.parallel.tensor == nullptr || st.parallel.tensor->rank() == 0;
}
void sum_over_group(Backend& be, const BlockStyle& st, const Tensor& t) {
  if (st.parallel.tensor != nullptr) st.parallel.tensor->all_reduce_sum(be, t);
}

// The gradient of stream tensor `like` from a partial one over every token (float32, in `full`):
// under Megatron's sequence parallelism this rank's tokens of the group's sum, into part k of
// `into`; else the group's sum in place (full itself).
Tensor stream_sum(Backend& be, const BlockStyle& st, const Tensor& full, const Tensor& like,
                  const Tensor& into, int64_t k, const BlockScratch& sc) {
  if (!slices_tokens(st)) {
    sum_over_group(be, st, full);
    return full;
  }
  const Tensor slice = slice_space(into, like, k);
  scatter_tokens_sum(be, *st.parallel.tensor, full, slice, sc.token_exchange);
  return slice;
}

// LayerNorm or RMSNorm, as the style says (RMSNorm has no bias and no mean), with parameters
// gamma and beta, saving mean and rstd.
Backend::Norm block_norm(const BlockStyle& st, const Tensor& gamma, const Tensor& beta,
                         const Tensor& mean, const Tensor& rstd) {
  if (st.rms_norm) return {gamma, Tensor(), st.eps, true, Tensor(), rstd};
  return {gamma, beta, st.eps, false, mean, rstd};
}

void norm_forward(Backend& be, const BlockStyle& st, const Tensor& x, const Tensor& gamma,
                  const Tensor& beta, const Tensor& y, const Tensor& mean, const Tensor& rstd) {
  be.norm_forward(x, block_norm(st, gamma, beta, mean, rstd), y);
}

// MLP activation: SwiGLU over [gate | up] when gated.
void mlp_activation_forward(Backend& be, const BlockStyle& st, const Tensor& fc,
                            const Tensor& act) {
  if (st.gated_mlp)
    be.swiglu_forward(fc, act);
  else
    be.activation_forward(st.activation, fc, act);
}

// Whether the products a gradient goes to round it to the 16-bit `lp` themselves, to the bits a
// rounding pass would give: bf16 products that read bf16 as it lies round a float32 dy as they
// take it in, and nothing else reads the gradient unless a bias gradient (db, empty if none) sums
// it.
bool products_round(const Backend& be, DType lp, const Tensor& db) {
  return lp == DType::bf16 && db.empty() && be.reads_product_input(DType::bf16);
}

// SwiGLU's gradient, from d_act (the float32 gradient of its output, rounded to the activation
// dtype as it is read): written over fc (its saved [gate | up], not needed after this), or where
// fc is a 16-bit stored copy into d_gate_up's slot, there in bf16 where the products would round
// it anyway (products_round, given fc's bias gradient fc_db) and no adapter reads it (`adapted`:
// theirs take a float32 gradient).
Tensor swiglu_backward_into(Backend& be, const BlockStyle& st, const Tensor& fc,
                            const Tensor& d_act, const Tensor& d_gate_up, const Tensor& fc_db,
                            bool adapted) {
  Tensor d = fc.dtype() == DType::f32 ? fc : d_gate_up;
  if (fc.dtype() == DType::bf16 && products_round(be, st.act_dtype, fc_db) && !adapted)
    d = Tensor(d.data(), d.shape(), DType::bf16, d.device());
  be.swiglu_backward(fc, d_act, d, st.act_dtype);
  return d;
}

// The gradient at the MLP's first product's output, from d_mlp at its second's: the second
// product's backward (its weight's and bias's gradients) taken on through the activation, in one
// backend call for an activation (linear_activation_backward: in the product where the backend
// can, written in bf16 there), SwiGLU's after.
Tensor mlp_output_backward(Backend& be, const BlockStyle& st, const BlockParams& w,
                           const BlockParams& g, const BlockSaved& s, const BlockScratch& sc,
                           const Tensor& d_mlp, bool accumulate_dw, int layer) {
  const bool adapted = st.adapters != nullptr && st.adapters->on(layer, ProductSite::out);
  // The first product's adapters read the gradient this returns in float32.
  const bool fc_adapted = st.adapters != nullptr && st.adapters->on(layer, ProductSite::fc);
  if (!st.gated_mlp && !adapted && !fc_adapted && w.quantized_at(ProductSite::out) == nullptr)
    return be.linear_activation_backward(s.fc_act, w.out_w, d_mlp, st.layout, st.activation,
                                         s.fc_pre, st.act_dtype, sc.d_fc, g.out_w, g.out_b,
                                         accumulate_dw);
  adapted_backward(be, st, layer, ProductSite::out, s.fc_act, w, d_mlp, sc.d_fc, false, g.out_w,
                   g.out_b, accumulate_dw);
  if (!st.gated_mlp) {  // the adapters' input gradient joins before the activation's
    be.activation_backward(st.activation, s.fc_pre, sc.d_fc, sc.d_fc, st.act_dtype);
    return sc.d_fc;
  }
  return swiglu_backward_into(be, st, s.fc_pre, sc.d_fc, sc.d_gate_up, g.fc_b, fc_adapted);
}

// The gradient through a residual branch's dropout: into tmp, or without dropout dy itself (the
// products read it before the residual stream's gradient is added to).
Tensor dropped(Backend& be, const BlockStyle& st, const Tensor& dy, float p, const RngKey& key,
               const Tensor& tmp_buffer) {
  if (p == 0.0f) return dy;
  const Tensor tmp = slice_space(tmp_buffer, dy, 0);
  per_sequence(stream_slice(st), dy, key,
               [&](auto view, const RngKey& k) { be.dropout_backward(view(dy), p, k, view(tmp)); });
  return tmp;
}

// y = x + dropout(r) over the block's tokens (per_sequence's keys under sequence parallelism).
void residual_add(Backend& be, const BlockStyle& st, const Tensor& x, const Tensor& r, float p,
                  const RngKey& key, const Tensor& y) {
  per_sequence(stream_slice(st), x, key, [&](auto view, const RngKey& k) {
    be.dropout_add(view(x), view(r), p, k, view(y));
  });
}

// The gradient through norm n whose input was a residual sum (dy rounded to round_dy as it is
// read, into dx, added to it where accumulate_dx), and that sum's residual branch's gradient
// through its dropout (p, key): into tmp_buffer by the same backend call where the stream is
// whole, else after it (dropped's); without dropout dx itself. Returns the branch's gradient.
Tensor norm_backward_branch(Backend& be, const BlockStyle& st, const Tensor& dy, const Tensor& x,
                            const Backend::Norm& n, const Tensor& dx, bool accumulate_dx,
                            const Tensor& dgamma, const Tensor& dbeta, DType round_dy, float p,
                            const RngKey& key, const Tensor& tmp_buffer) {
  if (!st.fused_residual_norm) {
    if (round_dy != DType::f32) be.round_to(round_dy, dy);
    be.norm_backward(dy, x, n, dx, accumulate_dx, dgamma, dbeta, DType::f32, {});
    return dropped(be, st, dx, p, key, tmp_buffer);
  }
  Backend::BranchDropout branch;
  if (p != 0.0f && stream_slice(st).count == 1) branch = {slice_space(tmp_buffer, dx, 0), p, key};
  be.norm_backward(dy, x, n, dx, accumulate_dx, dgamma, dbeta, round_dy, branch);
  return branch.grad.empty() ? dropped(be, st, dx, p, key, tmp_buffer) : branch.grad;
}

// sum = x + dropout(r), then y = the norm n of sum (its statistics saved) over the block's tokens:
// one backend call (per_sequence's keys under sequence parallelism, each sequence's rows).
void residual_norm(Backend& be, const BlockStyle& st, const Tensor& x, const Tensor& r, float p,
                   const RngKey& key, const Tensor& sum, const Backend::Norm& n, const Tensor& y) {
  if (!st.fused_residual_norm) {
    residual_add(be, st, x, r, p, key, sum);
    be.norm_forward(sum, n, y);
    return;
  }
  const int64_t C = x.dim(-1);
  per_sequence(stream_slice(st), x, key, [&](auto view, const RngKey& k) {
    auto rows = [&](const Tensor& t) {
      const Tensor v = view(t);
      return Tensor(v.data(), Shape{v.numel() / C, C}, v.dtype(), v.device());
    };
    Backend::Norm part = n;
    part.rstd = view(n.rstd);
    if (!n.rms) part.mean = view(n.mean);
    be.dropout_add_norm(rows(x), rows(r), p, k, rows(sum), part, rows(y));
  });
}

// The position of the block's first token: under sequence parallelism this rank's tokens of
// every sequence (t of them) start at rank * t.
int64_t first_position(const BlockStyle& st, const Tensor& tokens) {
  return splits_sequences(st.parallel.sequence) ? st.parallel.sequence->rank() * tokens.dim(1) : 0;
}

// Rotary positions (when the style has tables) on qkv's query and key heads, and their gradient;
// a packed batch's (`samples`) from 0 at each sample, read from memory.
void rotary_forward(Backend& be, const BlockStyle& st, const Tensor& qkv, int64_t first,
                    const PackedSamples* samples = nullptr) {
  if (st.rope_cos.empty()) return;
  be.rotary_forward(qkv, st.heads, st.kv_heads, st.rope_cos, st.rope_sin, samples ? 0 : first,
                    samples ? samples->positions : Tensor());
}

void rotary_backward(Backend& be, const BlockStyle& st, const Tensor& dqkv,
                     const PackedSamples* samples) {
  if (st.rope_cos.empty()) return;
  be.rotary_backward(dqkv, st.heads, st.kv_heads, st.rope_cos, st.rope_sin,
                     samples ? 0 : first_position(st, dqkv),
                     samples ? samples->positions : Tensor());
}

// The heads attention computes: all of them, or under sequence parallelism this rank's share.
int sequence_ranks(const BlockStyle& st) {
  return splits_sequences(st.parallel.sequence) ? st.parallel.sequence->size() : 1;
}

// The key/value heads attention computes with: under sequence parallelism this rank's share, or
// where the ranks outnumber them the one its query heads read (a copy).
int sequence_kv_heads(const BlockStyle& st) {
  return std::max(1, st.kv_heads / sequence_ranks(st));
}

// The column groups of qkv (query, key, value heads) and of ctx (query heads), D columns a head;
// key/value heads fewer than the sequence ranks go to ranks / kv_heads ranks each.
ColumnGroups qkv_columns(const BlockStyle& st, int64_t head_dim) {
  const int64_t kv = st.kv_heads * head_dim;
  const int64_t copies = std::max(1, sequence_ranks(st) / st.kv_heads);
  return {{st.heads * head_dim, kv, kv}, 3, {1, copies, copies}};
}
ColumnGroups ctx_columns(const BlockStyle& st, int64_t head_dim) {
  return {{st.heads * head_dim, 0, 0}, 1};
}

// A view of `t`'s memory shaped as the heads of `tokens` [B, t, W]: [B, t*N, W/N], in `dtype`.
Tensor heads_shaped(const Tensor& t, const Tensor& tokens, int64_t ranks, DType dtype) {
  return Tensor(t.data(), Shape{tokens.dim(0), tokens.dim(1) * ranks, tokens.dim(2) / ranks}, dtype,
                t.device());
}

// A saved tensor rounded to the activation dtype: into its 16-bit stored copy, which its readers
// then read, where there is one (with keep_work the float32 tensor, read elsewhere too, is
// rounded as well); else in place.
const Tensor& round_saved(Backend& be, DType lp, const Tensor& work, const Tensor* copy,
                          bool keep_work = false) {
  if (copy == nullptr) {
    be.round_to(lp, work);
    return work;
  }
  be.cast(work, *copy);
  if (keep_work) be.round_to(lp, work);
  return *copy;
}

// A saved tensor computed by produce(target): straight into its 16-bit stored copy where there is
// one (the backend rounds as it stores), else into the float32 tensor, rounded in place after.
template <typename Produce>
const Tensor& produce_saved(Backend& be, DType lp, const Tensor& work, const Tensor* copy,
                            Produce produce) {
  const Tensor& target = copy != nullptr ? *copy : work;
  produce(target);
  if (copy == nullptr) be.round_to(lp, work);
  return target;
}

// A saved product's output (produce(y) writes it). Where the backend's products store the 16-bit
// dtype: straight into the stored copy, or without one (a checkpointed forward) into `spare`, a
// buffer of backward's then unused, widened into the float32 work tensor after - so that a run
// with copies and one without get the same values where the product stores them otherwise than
// rounding after would (cuBLASLt adds a bf16 output's bias in bf16). Else into the float32 work
// tensor, then rounded (round_saved).
template <typename Produce>
const Tensor& product_saved(Backend& be, bool stores, DType lp, const Tensor& work,
                            const Tensor* copy, const Tensor& spare, Produce produce) {
  if (stores) {
    if (copy != nullptr) {
      produce(*copy);
      return *copy;
    }
    if (spare.bytes() >= work.numel() * dtype_size(lp) && spare.data() != work.data()) {
      const Tensor stored(spare.data(), work.shape(), lp, spare.device());
      produce(stored);
      be.cast(stored, work);
      return work;
    }
  }
  produce(work);
  return round_saved(be, lp, work, copy);
}

// A residual branch's product output, rounded to the activation dtype before it is added: stored
// rounded by the product itself in tmp's slot where the backend can, else written to tmp and
// rounded in place (with float32 activations: tmp as written).
template <typename Produce>
Tensor branch_product(Backend& be, bool stores, DType lp, const Tensor& tmp, Produce produce) {
  if (stores) {
    const Tensor rounded(tmp.data(), tmp.shape(), lp, tmp.device());
    produce(rounded);
    return rounded;
  }
  produce(tmp);
  be.round_to(lp, tmp);
  return tmp;
}

// A residual branch's last product x w (+ b) for the stream tensor `like`, row-parallel under
// tensor parallelism: each rank's partial product (in sc.tmp) summed over the group in float32
// (the bias added once; under Megatron's sequence parallelism this rank's tokens of the sum, in
// sc.tmp2), then rounded; else branch_product's, in sc.tmp.
Tensor branch_output(Backend& be, const BlockStyle& st, const Tensor& x, const BlockParams& w,
                     const Tensor& b, const Tensor& like, const BlockScratch& sc, int layer,
                     ProductSite site) {
  if (st.parallel.tensor == nullptr)
    return branch_product(be, stores_output(be, st, layer, site), st.act_dtype, sc.tmp,
                          [&](const Tensor& y) {
                            product_forward(be, st, w, site, x, b, y);
                            adapt(be, st, layer, site, x, y);
                          });
  product_forward(be, st, w, site, x, adds_shared_terms(st) ? b : Tensor(), sc.tmp);
  adapt(be, st, layer, site, x, sc.tmp);  // this rank's input columns' term, summed with it
  const Tensor sum = stream_sum(be, st, sc.tmp, like, sc.tmp2, 0, sc);
  be.round_to(st.act_dtype, sum);
  return sum;
}

// The key of the attention's dropout: under tensor parallelism this rank's heads draw the masks
// of their places among every head.
RngKey attention_key(const BlockStyle& st, const RngKey& key, int layer) {
  RngKey k = site_key(key, layer, kAttnProbs);
  const int ranks = sequence_ranks(st);
  const int tensor_rank = st.parallel.tensor != nullptr ? st.parallel.tensor->rank() : 0;
  const int tensor_ranks = st.parallel.tensor != nullptr ? st.parallel.tensor->size() : 1;
  if (ranks * tensor_ranks > 1) {  // and a sequence rank's share of the tensor rank's heads
    const int sequence_rank = ranks > 1 ? st.parallel.sequence->rank() : 0;
    k.first_head = static_cast<uint32_t>(tensor_rank * st.heads + sequence_rank * st.heads / ranks);
    k.heads_total = static_cast<uint32_t>(tensor_ranks * st.heads);
  }
  return k;
}

// The element-wise ops whose saved results block_recompute rebuilds (recomputable_tensors), one
// call each for it and block_forward: a pre-norm block's attention input LN_a(x) and MLP input
// LN_b(res1) (which block_forward takes with the sum res1: residual_norm's, the same bits), and
// the MLP activation's output.
const Tensor& attention_input(Backend& be, const BlockStyle& st, const BlockParams& w,
                              const Tensor& x, const BlockSaved& s, const Tensor* copy) {
  return produce_saved(be, st.act_dtype, s.a_in, copy, [&](const Tensor& y) {
    norm_forward(be, st, x, w.ln_a_g, w.ln_a_b, y, s.mean_a, s.rstd_a);
  });
}

const Tensor& mlp_input(Backend& be, const BlockStyle& st, const BlockParams& w,
                        const BlockSaved& s, const Tensor* copy) {
  return produce_saved(be, st.act_dtype, s.m_in, copy, [&](const Tensor& y) {
    norm_forward(be, st, s.res1, w.ln_b_g, w.ln_b_b, y, s.mean_b, s.rstd_b);
  });
}

const Tensor& mlp_output(Backend& be, const BlockStyle& st, const Tensor& fc_pre,
                         const BlockSaved& s, const Tensor* copy) {
  return produce_saved(be, st.act_dtype, s.fc_act, copy,
                       [&](const Tensor& y) { mlp_activation_forward(be, st, fc_pre, y); });
}

// The 16-bit stored copy of a saved tensor, where block_forward or block_recompute has them.
const Tensor* stored_copy(const BlockSaved* stored, const Tensor BlockSaved::*member) {
  return stored != nullptr ? &(stored->*member) : nullptr;
}

// The columns of a head in qkv [B, t, W] (this rank's tokens, every head).
int64_t head_columns(const BlockStyle& st, const Tensor& qkv_tokens) {
  return qkv_tokens.dim(2) / (st.heads + 2 * st.kv_heads);
}

// Sequence parallelism's attention input: qkv of this rank's tokens (produce(y) writes the
// product; rotary positions from its first token), rounded, then exchanged for every token of
// its heads into the saved qkv (and its 16-bit copy, which the attention then reads).
template <typename Produce>
const Tensor& sequence_split_qkv(Backend& be, const BlockStyle& st, Produce produce,
                                 const BlockSaved& s, const BlockScratch& sc, const Tensor* copy) {
  produce(sc.d_qkv);
  rotary_forward(be, st, sc.d_qkv, first_position(st, sc.d_qkv));
  be.round_to(st.act_dtype, sc.d_qkv);
  tokens_to_heads(be, *st.parallel.sequence, sc.d_qkv, s.qkv,
                  qkv_columns(st, head_columns(st, sc.d_qkv)), sc.exchange);
  if (copy == nullptr) return s.qkv;
  be.cast(s.qkv, *copy);
  return *copy;
}

// Sequence parallelism's attention over every token of this rank's heads, its output rounded and
// exchanged back into this rank's tokens of every head: the saved ctx (and its 16-bit copy).
const Tensor& sequence_split_attention(Backend& be, const BlockStyle& st, const KeyMask& key_mask,
                                       const Tensor& qkv, const BlockSaved& s,
                                       const BlockScratch& sc, const RngKey& key, int layer,
                                       const Tensor* copy) {
  block_attention_core(be, st, key_mask, qkv, s, sc, sc.heads_ctx, key, layer);
  be.round_to(st.act_dtype, sc.heads_ctx);
  heads_to_tokens(be, *st.parallel.sequence, sc.heads_ctx, s.ctx,
                  ctx_columns(st, head_columns(st, sc.d_qkv)), sc.exchange);
  return round_saved(be, st.act_dtype, s.ctx, copy);
}

// Its backward: sc.d_ctx (this rank's tokens) and the saved output exchanged for every token of
// this rank's heads, the attention's backward there, its input gradient exchanged back into
// sc.d_qkv (this rank's tokens, every head).
void sequence_split_attention_backward(Backend& be, const BlockStyle& st, const KeyMask& key_mask,
                                       const BlockSaved& s, const BlockScratch& sc,
                                       const RngKey& key, int layer) {
  SequenceGroup& group = *st.parallel.sequence;
  const int ranks = group.size();
  const ColumnGroups ctx = ctx_columns(st, head_columns(st, sc.d_qkv));
  tokens_to_heads(be, group, sc.d_ctx, sc.heads_ctx, ctx, sc.exchange);
  // The saved output's heads, in its dtype, where its gradient was (no longer needed).
  const Tensor out = heads_shaped(sc.d_ctx, s.ctx, ranks, s.ctx.dtype());
  tokens_to_heads(be, group, s.ctx, out, ctx, sc.exchange);
  be.attention_backward(sc.heads_ctx, s.qkv, out, s.attn_stats, key_mask, st.causal,
                        st.heads / ranks, sequence_kv_heads(st), layer_attention_scale(st, layer),
                        st.attention_dropout, key, sc.attn, sc.heads_qkv, DType::f32, DType::f32);
  heads_to_tokens(be, group, sc.heads_qkv, sc.d_qkv, qkv_columns(st, head_columns(st, sc.d_qkv)),
                  sc.exchange);
}
}  // namespace

// Columns [at, at + part's width) of every row of qkv [.., W] copied into part [.., width]
// (into_part), or back.
void copy_columns(Backend& be, const Tensor& qkv, int64_t at, const Tensor& part, bool into_part) {
  const int64_t W = qkv.dim(qkv.rank() - 1), width = part.dim(part.rank() - 1);
  const int64_t rows = part.numel() / width;
  if (into_part)
    be.copy_rows(qkv, part, {at, W, 0, width, width, rows});
  else
    be.copy_rows(part, qkv, {0, width, at, W, width, rows});
}

// BlockStyle::qk_norm's two parts of qkv [B, T, W]: the query heads' columns, then the key heads'.
std::array<std::pair<int64_t, int64_t>, 2> qk_columns(const BlockStyle& st, const Tensor& qkv) {
  BRISK_CHECK(!st.rope_cos.empty() && st.parallel.tensor == nullptr &&
                  !splits_sequences(st.parallel.sequence),
              "query/key norms need rotary blocks without tensor or sequence parallelism");
  const int64_t D = head_columns(st, qkv);
  return {{{0, st.heads * D}, {st.heads * D, st.kv_heads * D}}};
}

// qkv's query and key columns replaced by their norms: each part copied into in[i] (kept for the
// backward, or a temporary), normalized into `room`'s first elements (which may be in[i]), rstd[i]
// written, and copied back.
void qk_norm_forward(Backend& be, const BlockStyle& st, const BlockParams& w, const Tensor& qkv,
                     const std::array<Tensor, 2>& in, const std::array<Tensor, 2>& rstd,
                     const Tensor& room) {
  const auto parts = qk_columns(st, qkv);
  const std::array<Tensor, 2> gamma{w.q_norm, w.k_norm};
  for (size_t i = 0; i < 2; ++i) {
    copy_columns(be, qkv, parts[i].first, in[i], true);
    const Tensor y = slice_space(room, in[i], 0);
    be.rmsnorm_forward(in[i], gamma[i], st.eps, y, rstd[i]);
    copy_columns(be, qkv, parts[i].first, y, false);
  }
}

// Its backward, in place on the query and key columns of sc.d_qkv (sc.d_ctx the temporary).
void qk_norm_backward(Backend& be, const BlockStyle& st, const BlockParams& w, const BlockParams& g,
                      const BlockSaved& s, const BlockScratch& sc) {
  const auto parts = qk_columns(st, sc.d_qkv);
  const std::array<Tensor, 2> gamma{w.q_norm, w.k_norm}, d_gamma{g.q_norm, g.k_norm};
  const std::array<Tensor, 2> in{s.q_in, s.k_in}, rstd{s.rstd_q, s.rstd_k};
  for (size_t i = 0; i < 2; ++i) {
    const Tensor d = slice_space(sc.d_ctx, in[i], 0);
    copy_columns(be, sc.d_qkv, parts[i].first, d, true);
    be.rmsnorm_backward(d, in[i], gamma[i], rstd[i], d, false, d_gamma[i]);
    copy_columns(be, sc.d_qkv, parts[i].first, d, false);
  }
}

// Whether layer `layer`'s MLP is st.sparse_mlp's; refuses a block style it does not serve.
bool sparse_layer(const BlockStyle& st, int layer) {
  if (st.sparse_mlp == nullptr || !st.sparse_mlp->sparse(layer)) return false;
  BRISK_CHECK(st.pre_norm && st.parallel.tensor == nullptr,
              "a sparse MLP needs a pre-norm block without tensor parallelism");
  return true;
}

float layer_attention_scale(const BlockStyle& st, int layer) {
  return st.scale_by_inverse_layer ? st.attention_scale / static_cast<float>(layer + 1)
                                   : st.attention_scale;
}

uint32_t block_rng_site(int layer, int which) {
  return static_cast<uint32_t>(layer * kSitesPerLayer + which);
}

void block_attention_core(Backend& be, const BlockStyle& st, const KeyMask& key_mask,
                          const Tensor& qkv, const BlockSaved& s, const BlockScratch& scratch,
                          const Tensor& out, const RngKey& key, int layer, const Tensor* stored) {
  // qkv holds every token (of this rank's heads, under sequence parallelism): out, as many
  // elements, is shaped alike.
  const int64_t B = qkv.dim(0), T = qkv.dim(1);
  const Tensor o(out.data(), Shape{B, T, out.numel() / (B * T)}, out.dtype(), out.device());
  const int heads = st.heads / sequence_ranks(st);
  const float scale = layer_attention_scale(st, layer);
  const RngKey k = attention_key(st, key, layer);
  if (key_mask.samples != nullptr) {  // a packed batch: its tokens as one row of samples
    be.packed_attention_forward(one_row(qkv), *key_mask.samples, st.causal, heads,
                                sequence_kv_heads(st), scale, st.attention_dropout, k, s.attn_stats,
                                scratch.attn, one_row(o));
    if (stored != nullptr)
      be.cast(o, Tensor(stored->data(), o.shape(), stored->dtype(), stored->device()));
    return;
  }
  if (stored == nullptr) {
    be.attention_forward(qkv, key_mask, st.causal, heads, sequence_kv_heads(st), scale,
                         st.attention_dropout, k, s.attn_stats, scratch.attn, o);
    return;
  }
  const Tensor so(stored->data(), o.shape(), stored->dtype(), stored->device());
  be.attention_forward_stored(qkv, key_mask, st.causal, heads, sequence_kv_heads(st), scale,
                              st.attention_dropout, k, s.attn_stats, scratch.attn, o, so);
}

void block_forward(Backend& be, const BlockStyle& st, const BlockParams& w, const Tensor& x,
                   const KeyMask& key_mask, const Tensor& out, const BlockSaved& s,
                   const BlockScratch& scratch, const RngKey& key, int layer,
                   const BlockSaved* stored) {
  auto copy = [&](const Tensor BlockSaved::*member) { return stored_copy(stored, member); };
  // Attention sublayer.
  const DType lp = st.act_dtype;
  const Tensor* a_in = &x;
  if (st.pre_norm) a_in = &attention_input(be, st, w, x, s, copy(&BlockSaved::a_in));
  const Tensor a_all = all_tokens(be, st, *a_in, scratch.gathered, scratch);
  auto qkv_product = [&](const Tensor& y) {
    product_forward(be, st, w, ProductSite::qkv, a_all, w.qkv_b, y);
    adapt(be, st, layer, ProductSite::qkv, a_all, y);
  };
  const Tensor* qkv_copy = copy(&BlockSaved::qkv);
  const Tensor* qkv = nullptr;
  const Tensor* ctx = nullptr;
  if (splits_sequences(st.parallel.sequence)) {
    qkv = &sequence_split_qkv(be, st, qkv_product, s, scratch, qkv_copy);
    ctx = &sequence_split_attention(be, st, key_mask, *qkv, s, scratch, key, layer,
                                    copy(&BlockSaved::ctx));
  } else {
    if (st.rope_cos.empty()) {
      qkv = &product_saved(be, stores_output(be, st, layer, ProductSite::qkv), lp, s.qkv, qkv_copy,
                           scratch.d_qkv, qkv_product);
    } else {  // rotary positions go on the float32 product, rounded after
      qkv_product(s.qkv);
      if (st.qk_norm)
        qk_norm_forward(be, st, w, s.qkv, {s.q_in, s.k_in}, {s.rstd_q, s.rstd_k}, scratch.d_ctx);
      rotary_forward(be, st, s.qkv, 0, key_mask.samples);
      qkv = &round_saved(be, lp, s.qkv, qkv_copy);
    }
    const Tensor* ctx_copy = copy(&BlockSaved::ctx);
    block_attention_core(be, st, key_mask, *qkv, s, scratch, s.ctx, key, layer, ctx_copy);
    ctx = ctx_copy != nullptr ? ctx_copy : &round_saved(be, lp, s.ctx, nullptr);
  }
  const Tensor proj =
      branch_output(be, st, *ctx, w, w.proj_b, x, scratch, layer, ProductSite::proj);
  // The residual sum res1 and the MLP's input, its norm. A post-norm block's MLP input is its
  // residual too: computed in float32, then rounded into the stored copy and in place.
  auto attention_residual = [&](const Backend::Norm& n, const Tensor& y) {
    residual_norm(be, st, x, proj, st.attention_output_dropout, site_key(key, layer, kAttnResidual),
                  s.res1, n, y);
  };
  const Tensor* m_in = &s.m_in;
  if (st.pre_norm) {
    m_in = &produce_saved(be, lp, s.m_in, copy(&BlockSaved::m_in), [&](const Tensor& y) {
      attention_residual(block_norm(st, w.ln_b_g, w.ln_b_b, s.mean_b, s.rstd_b), y);
    });
  } else {
    attention_residual(block_norm(st, w.ln_a_g, w.ln_a_b, s.mean_a, s.rstd_a), s.m_in);
    m_in = &round_saved(be, lp, s.m_in, copy(&BlockSaved::m_in), true);
  }
  const Tensor m_all = all_tokens(be, st, *m_in, scratch.gathered, scratch);
  if (sparse_layer(st, layer)) {
    const Tensor y = slice_space(scratch.tmp, s.res1, 0);
    st.sparse_mlp->forward(be, layer, m_all, y, layer_adapters(st, layer));
    if (!out.empty())
      residual_add(be, st, s.res1, y, st.residual_dropout, site_key(key, layer, kMlpResidual), out);
    return;
  }
  const Tensor& fc_pre =
      product_saved(be, stores_output(be, st, layer, ProductSite::fc), lp, s.fc_pre,
                    copy(&BlockSaved::fc_pre), scratch.d_fc, [&](const Tensor& y) {
                      product_forward(be, st, w, ProductSite::fc, m_all, w.fc_b, y);
                      adapt(be, st, layer, ProductSite::fc, m_all, y);
                    });
  const Tensor& fc_act = mlp_output(be, st, fc_pre, s, copy(&BlockSaved::fc_act));
  if (st.pre_norm && out.empty()) return;  // the output itself is not needed by backward
  const Tensor mlp =
      branch_output(be, st, fc_act, w, w.out_b, s.res1, scratch, layer, ProductSite::out);
  const RngKey mlp_key = site_key(key, layer, kMlpResidual);
  if (st.pre_norm) {
    residual_add(be, st, s.res1, mlp, st.residual_dropout, mlp_key, out);
  } else if (!out.empty()) {
    residual_norm(be, st, s.m_in, mlp, st.residual_dropout, mlp_key, s.res2,
                  block_norm(st, w.ln_b_g, w.ln_b_b, s.mean_b, s.rstd_b), out);
  } else {  // only the statistics are needed: the norm's output goes over mlp, in tmp
    residual_add(be, st, s.m_in, mlp, st.residual_dropout, mlp_key, s.res2);
    post_norm_output(be, st, w, s, slice_space(scratch.tmp, s.res2, 0));
  }
}

void post_norm_output(Backend& be, const BlockStyle& st, const BlockParams& w, const BlockSaved& s,
                      const Tensor& out) {
  norm_forward(be, st, s.res2, w.ln_b_g, w.ln_b_b, out, s.mean_b, s.rstd_b);
}

void block_recompute(Backend& be, const BlockStyle& st, const BlockParams& w, const Tensor& x,
                     const BlockSaved& s, const BlockSaved* stored) {
  if (st.pre_norm && st.rebuilds_norms) {
    attention_input(be, st, w, x, s, stored_copy(stored, &BlockSaved::a_in));
    mlp_input(be, st, w, s, stored_copy(stored, &BlockSaved::m_in));
  }
  // block_forward's fc_pre: the stored copy where there is one, else the float32 one rounded
  // (none: a sparse MLP's layer).
  const Tensor& fc_pre = stored != nullptr ? stored->fc_pre : s.fc_pre;
  if (st.rebuilds_activation && !fc_pre.empty())
    mlp_output(be, st, fc_pre, s, stored_copy(stored, &BlockSaved::fc_act));
}

namespace {
// A pre-norm block's sparse MLP backward: the MLP input's gradient into sc.tmp (dy moved out of
// its way first where dropout left it there).
void sparse_mlp_backward(Backend& be, const BlockStyle& st, const BlockSaved& s,
                         const BlockScratch& sc, const Tensor& d_mlp, int layer,
                         bool accumulate_dw) {
  const Tensor dx = slice_space(sc.tmp, s.res1, 0);
  Tensor dy = d_mlp;
  if (dy.data() == dx.data()) {
    dy = slice_space(sc.tmp2, s.res1, 0);
    be.copy(d_mlp, dy);
  }
  st.sparse_mlp->backward(be, layer, s.m_in, dy, dx, accumulate_dw, layer_adapters(st, layer));
}
}  // namespace

void block_backward(Backend& be, const BlockStyle& st, const BlockParams& w, const BlockParams& g,
                    const Tensor& x, const KeyMask& key_mask, const BlockSaved& s,
                    const BlockScratch& sc, const Tensor& dh, const RngKey& key, int layer,
                    bool accumulate_dw) {
  // In mixed precision the gradients of 16-bit activations are 16-bit too (rounded here), so an
  // fp16 overflow shows up as inf in the parameter gradients.
  const DType lp = st.act_dtype;
  const RngKey attn_probs_key = attention_key(st, key, layer);
  const RngKey attn_res_key = site_key(key, layer, kAttnResidual);
  const RngKey mlp_key = site_key(key, layer, kMlpResidual);
  // d_res1 is the gradient flowing on the residual stream between the two sublayers, d_proj the
  // attention branch's below its dropout (res1 = x + drop(proj(attn(a_in)))), taken with d_res1.
  // Under Megatron's sequence parallelism the stream's gradients are this rank's tokens', gathered
  // for the row-parallel products' backward, and the column-parallel products' input gradients
  // are reduce-scattered (all_tokens, stream_sum).
  Tensor d_res1, d_proj;
  if (st.pre_norm) {
    // out = res1 + drop(mlp(LN_b(res1))): dh already is d_out, and d_res1 is dh itself.
    d_res1 = dh;
    const Tensor d_mlp =
        all_tokens(be, st, dropped(be, st, dh, st.residual_dropout, mlp_key, sc.tmp), sc.tmp2, sc);
    if (sparse_layer(st, layer)) {
      sparse_mlp_backward(be, st, s, sc, d_mlp, layer, accumulate_dw);
    } else {
      const Tensor d_fc_pre = mlp_output_backward(be, st, w, g, s, sc, d_mlp, accumulate_dw, layer);
      adapted_backward(be, st, layer, ProductSite::fc, all_tokens(be, st, s.m_in, sc.gathered, sc),
                       w, d_fc_pre, sc.tmp, false, g.fc_w, g.fc_b, accumulate_dw);
    }
    const Tensor d_m_in = stream_sum(be, st, sc.tmp, dh, sc.tmp2, 0, sc);
    d_proj = norm_backward_branch(
        be, st, d_m_in, s.res1, block_norm(st, w.ln_b_g, w.ln_b_b, s.mean_b, s.rstd_b), d_res1,
        true, g.ln_b_g, g.ln_b_b, lp, st.attention_output_dropout, attn_res_key, sc.tmp);
  } else {
    // out = LN_b(res2), res2 = m_in + drop(mlp(m_in)), m_in = LN_a(res1).
    const Tensor d_res2 = slice_space(sc.tmp2, dh, 0);
    const Tensor d_mlp = all_tokens(
        be, st,
        norm_backward_branch(be, st, dh, s.res2,
                             block_norm(st, w.ln_b_g, w.ln_b_b, s.mean_b, s.rstd_b), d_res2, false,
                             g.ln_b_g, g.ln_b_b, DType::f32, st.residual_dropout, mlp_key, sc.tmp),
        sc.gathered, sc);
    const Tensor d_fc_pre = mlp_output_backward(be, st, w, g, s, sc, d_mlp, accumulate_dw, layer);
    const Tensor m_all = all_tokens(be, st, s.m_in, sc.gathered, sc);
    Tensor d_m_in = sc.tmp2;
    if (slices_tokens(st)) {  // this rank's tokens of the sum, and the residual's gradient
      adapted_backward(be, st, layer, ProductSite::fc, m_all, w, d_fc_pre, sc.tmp, false, g.fc_w,
                       g.fc_b, accumulate_dw);
      d_m_in = stream_sum(be, st, sc.tmp, dh, sc.tmp2, 1, sc);
      be.add_inplace(d_m_in, d_res2);
    } else {  // rank 0 adds the residual's gradient to the sum
      adapted_backward(be, st, layer, ProductSite::fc, m_all, w, d_fc_pre, sc.tmp2,
                       adds_shared_terms(st), g.fc_w, g.fc_b, accumulate_dw);
      sum_over_group(be, st, sc.tmp2);
    }
    d_res1 = dh;  // dh is free again: it now receives d_res1
    d_proj = norm_backward_branch(
        be, st, d_m_in, s.res1, block_norm(st, w.ln_a_g, w.ln_a_b, s.mean_a, s.rstd_a), d_res1,
        false, g.ln_a_g, g.ln_a_b, DType::f32, st.attention_output_dropout, attn_res_key, sc.tmp);
  }
  // d_x starts as d_res1 (same buffer dh).
  const Tensor d_attn = all_tokens(be, st, d_proj, sc.tmp2, sc);
  adapted_backward(be, st, layer, ProductSite::proj, s.ctx, w, d_attn, sc.d_ctx, false, g.proj_w,
                   g.proj_b, accumulate_dw);
  // The gradients of the attention's output and of qkv rounded to lp: by the attention itself
  // (its 16-bit casts, where it has them) unless the exchanges, the rotary positions or the
  // query/key norms come between.
  const bool rounds_dqkv = !products_round(be, lp, g.qkv_b);
  const bool qkv_as_given = st.rope_cos.empty() && !st.qk_norm;
  Tensor d_qkv = sc.d_qkv;  // or, given in bf16 by the attention, its bf16 view
  if (splits_sequences(st.parallel.sequence)) {
    be.round_to(lp, sc.d_ctx);
    sequence_split_attention_backward(be, st, key_mask, s, sc, attn_probs_key, layer);
  } else if (key_mask.samples != nullptr) {
    be.packed_attention_backward(one_row(sc.d_ctx), one_row(s.qkv), one_row(s.ctx), s.attn_stats,
                                 *key_mask.samples, st.causal, st.heads, st.kv_heads,
                                 layer_attention_scale(st, layer), st.attention_dropout,
                                 attn_probs_key, sc.attn, one_row(sc.d_qkv), lp,
                                 rounds_dqkv && qkv_as_given ? lp : DType::f32);
  } else {
    d_qkv = be.attention_backward(sc.d_ctx, s.qkv, s.ctx, s.attn_stats, key_mask, st.causal,
                                  st.heads, st.kv_heads, layer_attention_scale(st, layer),
                                  st.attention_dropout, attn_probs_key, sc.attn, sc.d_qkv, lp,
                                  rounds_dqkv && qkv_as_given ? lp : DType::f32);
  }
  rotary_backward(be, st, sc.d_qkv, key_mask.samples);
  if (st.qk_norm) qk_norm_backward(be, st, w, g, s, sc);
  if (rounds_dqkv && (splits_sequences(st.parallel.sequence) || !qkv_as_given))
    be.round_to(lp, sc.d_qkv);
  if (st.pre_norm) {
    adapted_backward(be, st, layer, ProductSite::qkv, all_tokens(be, st, s.a_in, sc.gathered, sc),
                     w, d_qkv, sc.tmp, false, g.qkv_w, g.qkv_b, accumulate_dw);
    const Tensor d_a_in = stream_sum(be, st, sc.tmp, dh, sc.tmp2, 0, sc);
    norm_backward_branch(be, st, d_a_in, x, block_norm(st, w.ln_a_g, w.ln_a_b, s.mean_a, s.rstd_a),
                         dh, true, g.ln_a_g, g.ln_a_b, lp, 0.0f, RngKey{}, sc.tmp);
  } else if (slices_tokens(st)) {  // this rank's tokens of the sum, added to d_res1
    adapted_backward(be, st, layer, ProductSite::qkv, all_tokens(be, st, x, sc.gathered, sc), w,
                     d_qkv, sc.tmp, false, g.qkv_w, g.qkv_b, accumulate_dw);
    be.add_inplace(dh, stream_sum(be, st, sc.tmp, dh, sc.tmp2, 0, sc));
  } else {  // rank 0 adds d_res1 to the sum
    adapted_backward(be, st, layer, ProductSite::qkv, x, w, d_qkv, dh, adds_shared_terms(st),
                     g.qkv_w, g.qkv_b, accumulate_dw);
    sum_over_group(be, st, dh);
  }
}

void block_decode(Backend& be, const BlockStyle& style, int layer, const BlockParams& w,
                  const Tensor& x, const Tensor& k_cache, const Tensor& v_cache, int64_t past,
                  const DecodeScratch& s, const Tensor& out) {
  BRISK_CHECK(style.pre_norm && style.causal, "incremental decoding needs pre-norm causal blocks");
  BRISK_CHECK(style.adapters == nullptr,
              "generating with LoRA adapters is not built yet: merge them first (brisk merge)");
  norm_forward(be, style, x, w.ln_a_g, w.ln_a_b, s.a, s.mean, s.rstd);
  product_forward(be, style, w, ProductSite::qkv, s.a, w.qkv_b, s.qkv);
  if (style.qk_norm) {  // each part normalized in place in ctx's room, before the attention
    const int64_t T = s.qkv.dim(1), D = s.qkv.dim(2) / (style.heads + 2 * style.kv_heads);
    const Tensor q(s.ctx.data(), Shape{1, T, style.heads * D}, DType::f32, s.ctx.device());
    const Tensor k(s.ctx.data(), Shape{1, T, style.kv_heads * D}, DType::f32, s.ctx.device());
    qk_norm_forward(be, style, w, s.qkv, {q, k}, {s.rstd, s.rstd}, s.ctx);
  }
  rotary_forward(be, style, s.qkv, past);
  be.attention_decode(s.qkv, k_cache, v_cache, past, style.heads, style.kv_heads,
                      layer_attention_scale(style, layer), s.ctx);
  product_forward(be, style, w, ProductSite::proj, s.ctx, w.proj_b, s.tmp);
  be.copy(x, s.res);
  be.add_inplace(s.res, s.tmp);
  norm_forward(be, style, s.res, w.ln_b_g, w.ln_b_b, s.a, s.mean, s.rstd);
  if (style.sparse_mlp != nullptr && style.sparse_mlp->sparse(layer)) {
    style.sparse_mlp->infer(be, layer, s.a, s.tmp);
  } else {
    product_forward(be, style, w, ProductSite::fc, s.a, w.fc_b, s.fc);
    mlp_activation_forward(be, style, s.fc, s.fc_act);
    product_forward(be, style, w, ProductSite::out, s.fc_act, w.out_b, s.tmp);
  }
  be.copy(s.res, out);
  be.add_inplace(out, s.tmp);
}

}  // namespace brisk
