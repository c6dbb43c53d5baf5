// The shared transformer block's buffers: what each block saves for backward (and mixed
// precision's 16-bit copies of it), the scratch its passes share, and the groups of its saved
// tensors the model's plan lays out (models/transformer_block.h).
#include <algorithm>

#include "models/transformer_block.h"

namespace brisk {

std::array<Tensor*, 6> low_precision_tensors(BlockSaved& s) {
  return {&s.a_in, &s.qkv, &s.ctx, &s.m_in, &s.fc_pre, &s.fc_act};
}

std::array<Tensor*, 3> recomputable_tensors(BlockSaved& s, const BlockStyle& style) {
  const bool norms = style.pre_norm && style.rebuilds_norms;
  return {norms ? &s.a_in : nullptr, norms ? &s.m_in : nullptr,
          style.rebuilds_activation ? &s.fc_act : nullptr};
}

std::array<Tensor*, 17> all_saved_tensors(BlockSaved& s) {
  return {&s.a_in,   &s.qkv,    &s.attn_stats, &s.ctx,    &s.res1,   &s.m_in,
          &s.fc_pre, &s.fc_act, &s.res2,       &s.mean_a, &s.rstd_a, &s.mean_b,
          &s.rstd_b, &s.q_in,   &s.k_in,       &s.rstd_q, &s.rstd_k};
}

void declare_block_saved(MemoryPlan& plan, BufferBinder& binder, BlockSaved& s,
                         const std::string& prefix, const BlockStyle& style, const BlockDims& d,
                         SavedPart part, DType low_dtype, Category low_category,
                         bool with_attn_stats) {
  // The residual stream's tokens (under Megatron's sequence parallelism this rank's slice): the
  // norms' inputs, outputs and statistics, and the residual sums.
  const Shape btc{d.batch, d.stream_seq(), d.hidden};
  const Shape bt{d.batch, d.stream_seq()};
  const auto recomputable = recomputable_tensors(s, style);
  auto low = [&](Tensor* t, const char* name, Shape shape) {
    const bool rebuilt =
        std::find(recomputable.begin(), recomputable.end(), t) != recomputable.end();
    const bool wanted = part == SavedPart::all || part == SavedPart::low_precision ||
                        part == SavedPart::working_set ||
                        (part == SavedPart::low_precision_kept && !rebuilt) ||
                        (part == SavedPart::recomputable && rebuilt);
    if (wanted) binder.declare(plan, t, prefix + name, low_category, low_dtype, shape);
  };
  auto full = [&](Tensor* t, const char* name, Shape shape) {
    if (part == SavedPart::all || part == SavedPart::full_precision)
      binder.declare(plan, t, prefix + name, Category::activations, DType::f32, shape);
  };
  // A pre-norm block's norms write their outputs straight into the stored copies: a working set
  // has no room for them.
  if (style.pre_norm && part != SavedPart::working_set) low(&s.a_in, "a_in", btc);
  // Under sequence parallelism the attention's input: every token of this rank's heads.
  low(&s.qkv, "qkv", Shape{d.batch, d.seq * d.seq_ranks, d.heads_qkv_width()});
  if (with_attn_stats) full(&s.attn_stats, "attn_stats", d.attention.stats);
  low(&s.ctx, "ctx", Shape{d.batch, d.seq, d.attention_width()});
  full(&s.res1, "res1", btc);
  if (!style.pre_norm || part != SavedPart::working_set) low(&s.m_in, "m_in", btc);
  if (d.inner > 0 && part == SavedPart::working_set && !style.gated_mlp) {
    low(&s.fc_act, "fc_act", Shape{d.batch, d.seq, d.inner});
    binder.alias(&s.fc_pre, &s.fc_act);
  } else if (d.inner > 0) {  // (a sparse MLP's layer has none)
    low(&s.fc_pre, "fc_pre", Shape{d.batch, d.seq, d.fc_width()});
    low(&s.fc_act, "fc_act", Shape{d.batch, d.seq, d.inner});
  }
  if (!style.pre_norm) full(&s.res2, "res2", btc);
  if (!style.rms_norm) full(&s.mean_a, "mean_a", bt);
  full(&s.rstd_a, "rstd_a", bt);
  if (!style.rms_norm) full(&s.mean_b, "mean_b", bt);
  full(&s.rstd_b, "rstd_b", bt);
  if (!style.qk_norm) return;
  full(&s.q_in, "q_in", Shape{d.batch, d.seq, d.attention_width()});
  full(&s.k_in, "k_in", Shape{d.batch, d.seq, d.kv_heads * d.head_dim});
  full(&s.rstd_q, "rstd_q", Shape{d.batch, d.seq});
  full(&s.rstd_k, "rstd_k", Shape{d.batch, d.seq});
}

void declare_block_scratch(MemoryPlan& plan, BufferBinder& binder, BlockScratch& s,
                           const BlockDims& d, const BlockSaved* room, bool backward,
                           bool qk_norm) {
  const Shape btc{d.batch, d.seq, d.hidden};
  auto add = [&](Tensor* t, const char* name, Shape shape) {
    binder.declare(plan, t, std::string("block_scratch.") + name, Category::temporaries, DType::f32,
                   shape);
  };
  add(&s.tmp, "tmp", btc);
  add(&s.tmp2, "tmp2", btc);
  // The working set's ctx, qkv and fc_act have these shapes where its qkv is this rank's tokens'
  // (no sequence parallelism) and it has an MLP.
  if (room != nullptr && d.seq_ranks == 1 && d.inner > 0) {
    binder.alias(&s.d_ctx, &room->ctx);
    binder.alias(&s.d_qkv, &room->qkv);
    binder.alias(&s.d_fc, &room->fc_act);
  } else {
    // (A forward pass uses d_ctx under query/key norms, d_qkv under sequence parallelism.)
    if (backward || qk_norm) add(&s.d_ctx, "d_ctx", Shape{d.batch, d.seq, d.attention_width()});
    if (backward || d.seq_ranks > 1) add(&s.d_qkv, "d_qkv", Shape{d.batch, d.seq, d.qkv_width()});
    if (backward) add(&s.d_fc, "d_fc", Shape{d.batch, d.seq, d.inner});
  }
  add(&s.attn, "attn", d.attention.scratch);
  if (d.token_slices > 1) {
    add(&s.gathered, "gathered_tokens", btc);
    add(&s.token_exchange, "token_exchange", Shape{d.batch * d.seq * d.hidden});
  }
  if (d.seq_ranks == 1) return;
  const int64_t N = d.seq_ranks, T = d.seq * N;
  add(&s.exchange, "sequence_exchange", Shape{d.batch * T * d.heads_qkv_width()});
  add(&s.heads_ctx, "heads_ctx", Shape{d.batch, T, d.attention_width() / N});
  add(&s.heads_qkv, "heads_qkv", Shape{d.batch, T, d.heads_qkv_width()});
}

}  // namespace brisk
