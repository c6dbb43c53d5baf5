// A model's memory plan: the flat weights and gradients, the blocks' saved activations (and
// mixed precision's 16-bit copies, gradient checkpointing's inputs), a step's other buffers and
// the inputs and constants the host uploads.
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <limits>

#include "backend/device_traits.h"
#include "core/checked.h"
#include "models/model.h"

namespace brisk {

void Model::plan(MemoryPlan& plan, BatchShape shape, PlanOptions options) {
  const ModelConfig& c = config_;
  BRISK_CHECK(shape.batch > 0 && shape.seq > 0, "batch size and sequence length must be positive");
  BRISK_CHECK(shape.seq <= c.max_position_embeddings, "sequence length ", shape.seq,
              " exceeds max_position_embeddings = ", c.max_position_embeddings, " of the ",
              c.type_name(), " config");
  shape_ = planned_ = shape;
  options_ = options;
  inputs_.clear();
  constants_.clear();
  sliced_.clear();
  seq_shapes_.clear();
  plan_flat_buffers(plan, shape, options);
  if (options.weights_only) return;

  BRISK_CHECK(shape.seq % c.sequence_ranks == 0, "sequences of ", shape.seq,
              " tokens do not split evenly among --sp_size ", c.sequence_ranks,
              " ranks (make --seq_len, --block_size or --max_seq_length a multiple of it)");
  const BatchShape local = token_shape(shape);
  const int64_t slices = slices_tokens() ? c.tensor_ranks : 1;
  BRISK_CHECK(local.seq % slices == 0, "sequences of ", local.seq, " tokens",
              c.sequence_ranks > 1 ? " on each --sp_size rank" : "",
              " do not split evenly among --tp_size ", slices,
              " ranks under --tp_sequence_parallel (make --seq_len, --block_size or "
              "--max_seq_length a multiple of it)");
  const Shape btc{shape.batch, stream_tokens(shape), c.hidden_size};
  const BlockStyle style = this->style(true);
  block_inputs_ = block_inputs(options, style);
  declare_hidden(plan, btc);
  if (options.stashed_inputs > 0)
    declare(plan, &stashed_, "pipeline.stashed_inputs", Category::activations, DType::f32,
            {options.stashed_inputs, shape.batch, stream_tokens(shape), c.hidden_size});
  // Attention runs on every token of num_heads / sequence_ranks heads.
  const BlockDims dims{shape.batch,
                       local.seq,
                       c.hidden_size,
                       c.intermediate_size,
                       c.num_heads,
                       c.kv_heads(),
                       c.head_dim(),
                       style.gated_mlp,
                       attention_buffers(options.device, shape.batch,
                                         c.num_heads / c.sequence_ranks, shape.seq, c.head_dim()),
                       c.sequence_ranks,
                       slices};
  BRISK_CHECK(!(options.selective_recompute && options.gradient_checkpointing),
              "selective recomputation and gradient checkpointing contradict each other");
  plan_saved(plan, style, dims, options);
  plan_step_buffers(plan, shape, style, dims);
  if (adapters_)  // the products' rows: every token, gathered under Megatron's sequence parallelism
    adapters_->declare(plan, binder_, shape.batch * token_shape(shape).seq,
                       options.activation_dtype != DType::f32);
}

Model::BlockInputs Model::block_inputs(const PlanOptions& options, const BlockStyle& style) const {
  if (!options.gradients) return BlockInputs::in_turn;
  const bool rebuildable = !style.pre_norm && style.sparse_mlp == nullptr &&
                           !options.gradient_checkpointing && options.weight_slots == 0;
  return options.recompute_block_inputs && rebuildable ? BlockInputs::rebuilt : BlockInputs::kept;
}

// The stage's input and output each in its own buffer; the blocks' inputs between them too, or
// (block_inputs_ other than kept) in two buffers in turn: input l over input l - 2.
// Under gradient checkpointing the inputs are what each block keeps (begin_blocks_kept).
void Model::declare_hidden(MemoryPlan& plan, const Shape& btc) {
  const int64_t first = config_.first_layer(), end = config_.end_layer();
  const bool kept = options_.gradient_checkpointing;
  hidden_.assign(config_.num_layers + 1, Tensor());
  for (int64_t l = first; l <= end; ++l) {
    if (kept && l == first) begin_blocks_kept(plan);
    if (block_inputs_ != BlockInputs::kept && l > first + 2 && l < end)
      binder_.alias(&hidden_[l], &hidden_[l - 2]);
    else
      declare(plan, &hidden_[l], "hidden." + std::to_string(l), Category::activations, DType::f32,
              btc);
    if (kept && l < end) end_block_kept(plan, l + 1 == end);
  }
}

void Model::begin_blocks_kept(const MemoryPlan& plan) {
  blocks_start_ = plan.end(Placement::device);
  block_ends_.clear();
}

void Model::end_block_kept(MemoryPlan& plan, bool last) {
  block_ends_.push_back(plan.end(Placement::device));
  if (last && grads_over_blocks_) declare_gradients_over_blocks(plan);
}

// Input l's buffer took input l + 2 after it, unless that is the stage's output (its own).
bool Model::rebuilds_input(int64_t l) const {
  return block_inputs_ == BlockInputs::rebuilt && l > config_.first_layer() &&
         l + 2 < config_.end_layer();
}

// The flat weights (staged where options ask and it saves memory), the constants, and unless
// options.weights_only or not options.gradients the flat gradients (staged likewise).
void Model::plan_flat_buffers(MemoryPlan& plan, BatchShape shape, const PlanOptions& options) {
  weight_layout_ = options.weights_only
                       ? SegmentLayout::plain(segments_)
                       : SegmentLayout::staged(segments_, options.weight_slots, false,
                                               options.resident_ends, options.slot_holes);
  binder_.declare(plan, &flat_weights_,
                  staged_weights() ? "params.weights_staged" : "params.weights", Category::weights,
                  DType::f32, Shape{weight_layout_.length()});
  declare_constants(plan, shape);
  grad_layout_ = SegmentLayout::plain(segments_);
  grads_over_blocks_ = false;
  if (!replanning_) tied_apart_ = -1;
  if (options.weights_only || !options.gradients) return;
  if (params_.frozen()) {  // gradients for the trained parameters alone, one segment
    BRISK_CHECK(options.gradient_slots == 0,
                "internal error: staged gradients of a model with frozen parameters");
    const int64_t n = params_.trainable_elements();
    grad_layout_ = SegmentLayout::plain({ElementRange{0, n}});
    binder_.declare(plan, &flat_grads_, "params.gradients", Category::gradients, DType::f32,
                    Shape{n});
    return;
  }
  grad_layout_ = SegmentLayout::staged(segments_, options.gradient_slots, head_reads_embeddings());
  grads_over_blocks_ =
      options.gradients_over_activations && !staged_gradients() && segments_.size() > 2;
  if (grads_over_blocks_) return;  // declare_gradients_over_blocks, after the blocks' tensors
  binder_.declare(plan, &flat_grads_,
                  staged_gradients() ? "params.gradients_staged" : "params.gradients",
                  Category::gradients, DType::f32, Shape{grad_layout_.length()});
}

// Layer l's dimensions: a sparse MLP's layer has no dense MLP (inner 0: no fc_pre or fc_act).
BlockDims Model::layer_dims(const BlockDims& dims, const BlockStyle& style, int64_t l) const {
  BlockDims d = dims;
  if (style.sparse_mlp != nullptr && style.sparse_mlp->sparse(static_cast<int>(l))) d.inner = 0;
  return d;
}

// What the blocks save for backward: float32 tensors per block (one set, recomputed per block,
// under gradient checkpointing), or the 16-bit stored copies of mixed precision; under selective
// recomputation one buffer for every block's attention statistics.
void Model::plan_saved(MemoryPlan& plan, const BlockStyle& style, const BlockDims& dims,
                       const PlanOptions& options) {
  const ModelConfig& c = config_;
  const bool selective = options.selective_recompute;
  saved_.assign(c.num_layers, BlockSaved());
  stored_.clear();
  const bool low = options.activation_dtype != DType::f32;
  if (low && !options.gradient_checkpointing) plan_low_precision_saved(plan, style, dims, options);
  const int64_t first = c.first_layer();
  const bool per_block = stored_.empty() && !options.gradient_checkpointing;
  if (per_block) begin_blocks_kept(plan);
  for (int64_t l = first; l < c.end_layer() && stored_.empty(); ++l) {
    if (options.gradient_checkpointing && l > first) {
      // One set of internals, recomputed per block inside backward.
      const auto dst = all_saved_tensors(saved_[l]);
      const auto src = all_saved_tensors(saved_[first]);
      for (size_t i = 0; i < dst.size(); ++i) binder_.alias(dst[i], src[i]);
      continue;
    }
    const std::string prefix =
        options.gradient_checkpointing ? "block_recompute." : "block." + std::to_string(l) + ".";
    // (The recomputed set serves every layer: planned for a dense one.)
    const BlockDims d = options.gradient_checkpointing ? dims : layer_dims(dims, style, l);
    declare_block_saved(plan, binder_, saved_[l], prefix, style, d, SavedPart::all, DType::f32,
                        Category::activations, !selective);
    if (per_block) end_block_kept(plan, l + 1 == c.end_layer());
  }
  // Selective recomputation: the blocks' attention statistics share one buffer, rebuilt per block
  // in backward.
  if (selective) {
    declare(plan, &shared_attn_stats_, "block_selective.attn_stats", Category::activations,
            DType::f32, dims.attention.stats);
    for (BlockSaved& s : saved_) binder_.alias(&s.attn_stats, &shared_attn_stats_);
  }
}

// Mixed precision without checkpointing: per block the float32 tensors saved_[l] and the 16-bit
// copies stored_[l], the low-precision ones viewing one float32 work set (work_); with
// elementwise recomputation (PlanOptions::recomputes_elementwise) the recomputable copies share one
// set too.
void Model::plan_low_precision_saved(MemoryPlan& plan, const BlockStyle& style,
                                     const BlockDims& dims, const PlanOptions& options) {
  const ModelConfig& c = config_;
  const bool selective = options.selective_recompute;
  declare_block_saved(
      plan, binder_, work_, "block_work.", style, dims,
      options.reads_stored_copies ? SavedPart::working_set : SavedPart::low_precision, DType::f32,
      Category::temporaries);
  stored_.assign(c.num_layers, BlockSaved());
  const bool recompute = options.recomputes_elementwise();
  begin_blocks_kept(plan);
  for (int64_t l = c.first_layer(); l < c.end_layer(); ++l) {
    const std::string prefix = "block." + std::to_string(l) + ".";
    declare_block_saved(plan, binder_, saved_[l], prefix, style, dims, SavedPart::full_precision,
                        DType::f32, Category::activations, !selective);
    declare_block_saved(plan, binder_, stored_[l], prefix, style, layer_dims(dims, style, l),
                        recompute ? SavedPart::low_precision_kept : SavedPart::low_precision,
                        options.activation_dtype, Category::activations, !selective);
    const auto dst = low_precision_tensors(saved_[l]);
    const auto src = low_precision_tensors(work_);
    for (size_t i = 0; i < dst.size(); ++i) binder_.alias(dst[i], src[i]);
    end_block_kept(plan, l + 1 == c.end_layer());
  }
  // The recomputable tensors' 16-bit copies: one set, which every block writes in forward and
  // backward rebuilds per block (block_recompute).
  if (!recompute) return;
  declare_block_saved(plan, binder_, shared_stored_, "block_recompute.", style, dims,
                      SavedPart::recomputable, options.activation_dtype, Category::activations);
  for (int64_t l = c.first_layer(); l < c.end_layer(); ++l) {
    const auto dst = recomputable_tensors(stored_[l], style);
    const auto src = recomputable_tensors(shared_stored_, style);
    for (size_t i = 0; i < dst.size(); ++i)
      if (dst[i] != nullptr) binder_.alias(dst[i], src[i]);
  }
}

// The flat gradients over the blocks' saved tensors, reaching back as far as gradient_reach
// allows. A tied head's weight gradient goes apart (tied_head_grad_) where that lays more over
// them than it takes, by at least as much again: the table is copied in once a step (on a Zen 4,
// GPT-2 at batch 4 x 256 would keep 33 MiB less for 1.2% of its step).
void Model::declare_gradients_over_blocks(MemoryPlan& plan) {
  const size_t bytes = static_cast<size_t>(params_.total_elements()) * sizeof(float);
  const bool tied = head_reads_embeddings();
  const size_t reach = gradient_reach(!tied), apart_reach = gradient_reach(true);
  // Decided for the planned length (a shorter one's plan declares the same buffers).
  const int table = tied ? tied_table() : -1;
  if (table >= 0 && !replanning_) {
    const size_t table_bytes =
        params_.list()[static_cast<size_t>(table)].shape.numel() * sizeof(float);
    const bool apart = std::min(apart_reach, bytes) >= std::min(reach, bytes) + 2 * table_bytes;
    tied_apart_ = apart ? table : -1;
  }
  binder_.declare_over(plan, &flat_grads_, "params.gradients", Category::gradients, DType::f32,
                       Shape{params_.total_elements()}, tied_apart_ >= 0 ? apart_reach : reach);
  if (tied_apart_ >= 0)
    declare(plan, &tied_head_grad_, "lm_head.tied_gradient", Category::gradients, DType::f32,
            params_.list()[static_cast<size_t>(tied_apart_)].shape);
}

// How far before the blocks' end the gradients may start (PlanOptions::
// gradients_over_activations): the most any segment allows, given the lowest place it may take.
// Segments as find_grad_segments lays them: the head's, the blocks' from the last, the
// embeddings'.
size_t Model::gradient_reach(bool embeddings_over_blocks) const {
  const size_t end = block_ends_.back(), bytes = dtype_size(DType::f32);
  const size_t blocks = block_ends_.size(), last = segments_.size() - 1;
  int64_t start = 0;  // the lowest start every segment allows
  for (size_t s = 0; s <= last; ++s) {
    size_t lowest = end;  // the head's, and the embeddings' where a tied head writes them
    if (s > 0 && s < last) lowest = block_ends_[blocks - s];  // after its block's tensors
    if (s == last && embeddings_over_blocks) lowest = blocks_start_;
    start = std::max(
        start, static_cast<int64_t>(lowest) - segments_[s].offset * static_cast<int64_t>(bytes));
  }
  return end - static_cast<size_t>(std::min(start, static_cast<int64_t>(end)));
}

// The buffers of a step outside the saved activations: the blocks' scratch, the hidden
// gradient, the batch's inputs, the step's statistics and control, and the model's own.
void Model::plan_step_buffers(MemoryPlan& plan, BatchShape shape, const BlockStyle& style,
                              const BlockDims& dims) {
  const BatchShape local = token_shape(shape);
  const Shape btc{shape.batch, stream_tokens(shape), config_.hidden_size};
  const bool unread_work = !stored_.empty() && options_.reads_stored_copies;
  // A run that computes no gradients (PlanOptions::gradients) has no backward pass.
  const bool backward = options_.gradients;
  declare_block_scratch(plan, binder_, scratch_, dims, unread_work ? &work_ : nullptr, backward,
                        style.qk_norm);
  if (!stored_.empty() && style.gated_mlp) binder_.alias(&scratch_.d_gate_up, &work_.fc_pre);
  if (backward) declare(plan, &d_hidden_, "grad.hidden", Category::temporaries, DType::f32, btc);
  // The embeddings' output (first stage), the head's input (last), over every token.
  if (slices_tokens() && (config_.first_stage() || config_.last_stage())) {
    const Shape all{shape.batch, local.seq, config_.hidden_size};
    declare(plan, &tokens_, "hidden.all_tokens", Category::activations, DType::f32, all);
    declare(plan, &d_tokens_, "grad.hidden_all_tokens", Category::temporaries, DType::f32, all);
  }
  declare_input(plan, &batch_.input_ids, &dev_batch_.input_ids, "batch.input_ids",
                Shape{shape.batch, local.seq});
  declare_input(plan, &batch_.attention_mask, &dev_batch_.attention_mask, "batch.attention_mask",
                Shape{shape.batch, shape.seq}, DType::i32, /*whole_sequences=*/true);
  declare_uploaded(plan, &key_lengths_host_, &key_lengths_, "batch.key_lengths", DType::i32,
                   Shape{shape.batch});
  if (options_.held_step)
    declare_uploaded(plan, &held_step_host_, &held_step_, "step.held", DType::i64, Shape{2});
  if (options_.packed_samples) {
    const int64_t tokens = checked_mul(shape.batch, shape.seq, "the batch's tokens");
    BRISK_CHECK(tokens < INT32_MAX, "a padding-free or packed batch of ", tokens,
                " tokens: its samples' starts are int32, so at most ", INT32_MAX - 1);
    declare_uploaded(plan, &sample_starts_host_, &sample_starts_, "batch.sample_starts", DType::i32,
                     Shape{tokens + 1});
    declare_uploaded(plan, &positions_host_, &positions_, "batch.positions", DType::i32,
                     Shape{tokens});
  }
  declare(plan, &stats_, "step_stats", Category::temporaries, DType::f64, Shape{kStatsSize});
  declare(plan, &control_, "step_control", Category::temporaries, DType::f32, Shape{kControlSize});
  binder_.declare(plan, &stats_host_, "step_stats.host", Category::temporaries, DType::f64,
                  Shape{kStatsSize}, Placement::host);
  declare_buffers(plan, local);
}

void Model::declare_input(MemoryPlan& plan, Tensor* host, Tensor* device, const std::string& name,
                          Shape shape, DType dtype, bool whole_sequences) {
  const int64_t ranks = config_.sequence_ranks;
  if (ranks > 1 && !whole_sequences && shape.rank() == 2) {
    BRISK_CHECK(sliced_.size() < token_inputs_.size(),
                "internal error: more sequence inputs than planned");
    Tensor* tokens = &token_inputs_[sliced_.size()];
    binder_.declare(plan, host, name, Category::data, dtype, Shape{shape[0], shape[1] * ranks},
                    Placement::host);
    sliced_.emplace_back(host, tokens);
    host = tokens;  // the upload's source: this rank's tokens
    binder_.declare(plan, host, name + ".tokens", Category::data, dtype, shape, Placement::host);
  } else {
    binder_.declare(plan, host, name, Category::data, dtype, shape, Placement::host);
  }
  if (device_traits(options_.device).host_memory)
    binder_.alias(device, host);
  else
    binder_.declare(plan, device, name + ".device", Category::data, dtype, shape);
  inputs_.emplace_back(host, device);
}

void Model::declare_uploaded(MemoryPlan& plan, Tensor* host, Tensor* device,
                             const std::string& name, DType dtype, Shape shape) {
  binder_.declare(plan, host, name, Category::data, dtype, shape, Placement::host);
  if (device_traits(options_.device).host_memory)
    binder_.alias(device, host);
  else
    declare(plan, device, name + ".device", Category::data, dtype, shape);
}

void Model::declare_constant(MemoryPlan& plan, Tensor* host, Tensor* device,
                             const std::string& name, Shape shape, DType dtype) {
  declare_input(plan, host, device, name, shape, dtype, /*whole_sequences=*/true);
  constants_.push_back(inputs_.back());
  inputs_.pop_back();
}

MatmulOperands Model::matmul_operands() const {
  const ModelConfig& c = config_;
  const char* what = "a matrix product's operand";
  // The gated MLP's first product is [gate | up], twice the intermediate width.
  const int64_t inner = checked_mul(style(true).gated_mlp ? 2 : 1, c.intermediate_size, what);
  const int64_t rows = checked_mul(shape_.batch, tokens(), what);
  // A language-model head multiplies a chunk of rows at a time, and holds its weight while it
  // runs (Backend::hold_weight): that weight is the `held` operand, not one of B's.
  const bool lm_head = lm_chunk_rows_ > 0;
  const int64_t head_rows = lm_head ? std::min(rows, lm_chunk_rows_) : rows;
  // A mixture of experts: each expert's gate and up as one [2F, C] on at most every row (a
  // token takes an expert once), the shared expert's likewise.
  const int64_t experts_inner = checked_mul(2, std::max(c.moe.inner, c.moe.shared_inner), what);
  const int64_t widest = std::max({c.qkv_width(), inner, c.hidden_size, experts_inner});
  int64_t largest_weight = 0;
  for (int i = 0; i < static_cast<int>(params_.list().size()); ++i)
    if (params_.list()[i].product && !(lm_head && i == lm_head_weight_))
      largest_weight = std::max(largest_weight, params_.list()[i].shape.numel());
  // Query, key and value weights are multiplied as one [(H + 2K) D, C] matrix, gate and up as
  // one [2F, C].
  largest_weight = std::max({largest_weight, checked_mul(c.qkv_width(), c.hidden_size, what),
                             checked_mul(inner, c.hidden_size, what),
                             checked_mul(experts_inner, c.hidden_size, what)});
  // A is an activation or its gradient (the head's: a chunk of logits' gradient); B a weight (the
  // head's, [width, hidden], tied or not), or an activation in a weight gradient's product.
  const int64_t head = checked_mul(logits_width(), c.hidden_size, what);
  const int64_t activations = checked_mul(rows, widest, what);
  const bool holds_head = c.last_stage();
  const int64_t a =
      std::max(activations, holds_head ? checked_mul(head_rows, logits_width(), what) : 0);
  const int64_t b = std::max({activations, lm_head || !holds_head ? 0 : head, largest_weight});
  MatmulOperands operands{a, b, lm_head ? head : 0, lm_head ? c.hidden_size : 0};
  operands.a_rows = rows;
  operands.attention =
      checked_mul(rows, checked_add(c.qkv_width(), c.attention_width(), what), what);
  operands.attention_workspace = fused_attention_workspace_bound(
      shape_.batch, shape_.seq, c.num_heads / c.sequence_ranks,
      std::max<int64_t>(1, c.kv_heads() / c.sequence_ranks), c.head_dim());
  return operands;
}

}  // namespace brisk
