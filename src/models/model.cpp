// The model-independent part: planning, the block loop with optional recomputation, weight
// initialization and loading.
#include "models/model.h"

#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "backend/device_traits.h"
#include "core/checked.h"
#include "core/random_init.h"
#include "core/switches.h"
#include "models/bert.h"
#include "models/distilbert.h"
#include "models/expert_weights.h"
#include "models/gpt2.h"
#include "models/llama.h"

namespace brisk {

std::unique_ptr<Model> Model::create(const ModelConfig& config) {
  std::unique_ptr<Model> m;
  switch (config.model_type) {
    case ModelType::bert:
      m = make_bert(config);
      break;
    case ModelType::distilbert:
      m = make_distilbert(config);
      break;
    case ModelType::gpt2:
      m = make_gpt2(config);
      break;
    case ModelType::llama:
    case ModelType::mistral:
    case ModelType::qwen2:
    case ModelType::mixtral:
    case ModelType::qwen2_moe:
    case ModelType::olmoe:
      m = make_llama(config);
      break;
  }
  m->declare_params();
  m->find_grad_segments();
  return m;
}

int64_t Model::active_parameters() const {
  const MoeConfig& m = config_.moe;
  int64_t sparse = 0;
  for (int64_t l = config_.first_layer(); l < config_.end_layer(); ++l) sparse += m.sparse(l);
  const int64_t expert = 3 * m.inner * config_.hidden_size;  // gate, up and down
  // An expert rank's share holds local_experts of them; a token's active ones are the whole's.
  return params_.total_elements() - sparse * expert * (m.local_experts() - m.top_k);
}

bool Model::stage_holds(ParamRole role) const {
  const ModelConfig& c = config_;
  if (section_ < 0) return c.first_stage() || (c.last_stage() && role.embedding && role.product);
  if (section_ >= c.num_layers) return c.last_stage();
  return section_ >= c.first_layer() && section_ < c.end_layer();
}

int Model::numbered(int index) {
  const int stream = declared_++;
  if (index >= 0) {
    params_.set_stream(index, stream);
    param_sections_.resize(static_cast<size_t>(index) + 1, -1);
    param_sections_[static_cast<size_t>(index)] = section_;
  }
  return index;
}

int Model::param(const std::string& name, Shape shape, ParamRole role) {
  return numbered(stage_holds(role) ? params_.add(name, shape, role) : -1);
}

int Model::split_param(const std::string& name, Shape shape, ParamRole role, int dim, int pieces) {
  if (config_.tensor_ranks == 1) return param(name, shape, role);
  return numbered(stage_holds(role) ? params_.add(name, shape, role, 0,
                                                  ParamSplit{dim, pieces, config_.tensor_rank,
                                                             config_.tensor_ranks})
                                    : -1);
}

int64_t Model::vocab_rows() const {
  const ModelConfig& c = config_;
  return c.tensor_ranks == 1 ? c.vocab_size : (c.vocab_size + c.tensor_ranks - 1) / c.tensor_ranks;
}

VocabShard Model::vocab_shard() const {
  if (config_.tensor_ranks == 1) return {};
  return {vocab_rows() * config_.tensor_rank, config_.vocab_size};
}

int Model::vocab_param(const std::string& name, Shape shape, ParamRole role) {
  const ModelConfig& c = config_;
  BRISK_CHECK(shape[0] == c.vocab_size, "internal error: a vocabulary table of ", shape[0],
              " rows");
  if (c.tensor_ranks == 1) return param(name, shape, role);
  BRISK_CHECK(vocab_rows() * (c.tensor_ranks - 1) < c.vocab_size, "--tp_size ", c.tensor_ranks,
              " leaves a tensor rank without a row of the vocabulary of ", c.vocab_size,
              " (vocabulary parallelism gives each rank ", vocab_rows(), ")");
  Shape share{vocab_rows()};
  for (int i = 1; i < shape.rank(); ++i) share.push_back(shape[i]);
  const ParamSplit split{0, 1, c.tensor_rank, c.tensor_ranks, c.vocab_size};
  return numbered(stage_holds(role) ? params_.add(name, share, role, 0, split) : -1);
}

void Model::embed_tokens(Backend& be, const Tensor& ids, int word, const Tensor& pos,
                         const Tensor& type_ids, const Tensor& types, const Tensor& out) {
  if (config_.tensor_ranks == 1) {
    be.embedding_forward(ids, w(word), pos, type_ids, types, out, {});
    return;
  }
  // Each rank's rows give their tokens' embeddings, zero elsewhere; the first adds the
  // positions and types, once.
  const bool first = config_.tensor_rank == 0;
  be.embedding_forward(ids, w(word), first ? pos : Tensor(), first ? type_ids : Tensor(),
                       first ? types : Tensor(), out, vocab_shard());
  tensor_group_->all_reduce_sum(be, out);
}

void Model::embed_tokens_backward(Backend& be, const Tensor& dout, const Tensor& ids,
                                  int64_t padding_idx, const Tensor& type_ids, int word,
                                  const Tensor& dpos, const Tensor& dtypes) {
  be.embedding_backward(dout, ids, padding_idx, type_ids, g(word), dpos, dtypes, vocab_shard());
}

int Model::token_param(const std::string& name, Shape shape) {
  if (!slices_tokens()) return param(name, shape, kBiasOrNorm);
  ParamSplit split{-1, 1, config_.tensor_rank, config_.tensor_ranks};
  split.partial = true;
  return numbered(stage_holds(kBiasOrNorm) ? params_.add(name, shape, kBiasOrNorm, 0, split) : -1);
}

int Model::kv_param(const std::string& name, Shape shape, ParamRole role) {
  const int copies = config_.kv_head_copies;
  if (copies == 1) return split_param(name, shape, role, 0);
  const ParamSplit split{0, 1,     config_.tensor_rank / copies, config_.tensor_ranks / copies,
                         0, copies};
  return numbered(stage_holds(role) ? params_.add(name, shape, role, 0, split) : -1);
}

void Model::clear_padding(Backend& be, int i) {
  const ParamInfo& p = params_.list()[static_cast<size_t>(i)];
  if (!p.split.split() || p.split.full == 0) return;
  const SplitGeometry g = split_geometry(p);
  if (g.held == g.piece) return;
  const Tensor t = params_.weight(i);
  be.fill(element_range(t, g.held * g.inner, (g.piece - g.held) * g.inner), 0.0f);
}

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
  const int64_t n = params_.total_elements();
  const StagedLayout weights = staged_layout(options.weight_slots, false);
  weight_layout_ =
      !options.weights_only && weights.slots > 0 && weights.length < n ? weights : StagedLayout();
  binder_.declare(plan, &flat_weights_,
                  staged_weights() ? "params.weights_staged" : "params.weights", Category::weights,
                  DType::f32, Shape{staged_weights() ? weight_layout_.length : n});
  declare_constants(plan, shape);
  grad_layout_ = StagedLayout();
  grads_over_blocks_ = false;
  if (!replanning_) tied_apart_ = -1;
  if (options.weights_only || !options.gradients) return;
  const StagedLayout grads = staged_layout(options.gradient_slots, head_reads_embeddings());
  if (grads.slots > 0 && grads.length < n) grad_layout_ = grads;
  grads_over_blocks_ =
      options.gradients_over_activations && !staged_gradients() && segments_.size() > 2;
  if (grads_over_blocks_) return;  // declare_gradients_over_blocks, after the blocks' tensors
  binder_.declare(
      plan, &flat_grads_, staged_gradients() ? "params.gradients_staged" : "params.gradients",
      Category::gradients, DType::f32, Shape{staged_gradients() ? grad_layout_.length : n});
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

int Model::tied_table() const {
  const std::vector<ParamInfo>& list = params_.list();
  for (size_t i = 0; i < list.size(); ++i)
    if (list[i].embedding && list[i].product) return static_cast<int>(i);
  return -1;
}

Tensor Model::head_weight_grad(int weight) const {
  return weight == tied_apart_ ? tied_head_grad_ : g(weight);
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
    declare_uploaded(plan, &held_step_host_, &held_step_, "step.held", DType::i64, Shape{1});
  declare(plan, &stats_, "step_stats", Category::temporaries, DType::f64, Shape{kStatsSize});
  declare(plan, &control_, "step_control", Category::temporaries, DType::f32, Shape{kControlSize});
  binder_.declare(plan, &stats_host_, "step_stats.host", Category::temporaries, DType::f64,
                  Shape{kStatsSize}, Placement::host);
  declare_buffers(plan, local);
}

BatchShape Model::token_shape(BatchShape shape) const {
  return {shape.batch, shape.seq / config_.sequence_ranks};
}

int64_t Model::stream_tokens(const BatchShape& shape) const {
  return token_shape(shape).seq / (slices_tokens() ? config_.tensor_ranks : 1);
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

void Model::upload_constants(Backend& be) const {
  if (constants_uploaded_) return;
  for (const auto& [host, device] : planned_constants_) be.upload(host, device);
  constants_uploaded_ = true;
}

void Model::reset_step_stats(Backend& be) {
  std::fill(stats_host_.as<double>(), stats_host_.as<double>() + kStatsSize, 0.0);
  be.upload(stats_host_, stats_);
}

void Model::add_to_loss(Backend& be, double value) {
  be.download(stats_, stats_host_);
  stats_host_.as<double>()[kStatLoss] += value;
  be.upload(stats_host_, stats_);
}

std::array<double, 2> Model::read_step_stats(Backend& be) {
  be.download(stats_, stats_host_);
  const double* p = stats_host_.as<double>();
  return {p[kStatLoss], p[kStatGradSumSq]};
}

void Model::embed_at(Backend&, const Tensor&, int64_t, const Tensor&) const {
  BRISK_FAIL("a ", class_name(), " does not generate text: it is not a causal language model");
}

void Model::next_token_logits(Backend&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                              const Tensor&) const {
  BRISK_FAIL("a ", class_name(), " does not generate text: it is not a causal language model");
}

void Model::bind(Arena& arena) {
  binder_.bind(arena);
  std::vector<int64_t> weight_offsets, grad_offsets;
  for (const ParamInfo& p : params_.list()) {
    if (staged_weights()) weight_offsets.push_back(staged_offset(p.offset, weight_layout_));
    if (staged_gradients()) grad_offsets.push_back(staged_offset(p.offset, grad_layout_));
  }
  params_.bind(flat_weights_, flat_grads_, weight_offsets, grad_offsets);
  grad_segments_ = flat_grads_.empty() ? std::vector<ElementRange>() : segments_;
  arena_ = &arena;
  shape_ = planned_;
  fill_constants();
  planned_constants_.clear();
  for (const auto& [host, device] : constants_) planned_constants_.emplace_back(*host, *device);
  constants_uploaded_ = false;
}

void Model::use_seq(int64_t seq) {
  if (seq == shape_.seq) return;
  BRISK_CHECK(arena_ && seq > 0 && seq <= planned_.seq, "sequence length ", seq,
              " is outside the planned 1..", planned_.seq);
  if (seq == planned_.seq) {
    binder_.bind(*arena_);
    shape_ = planned_;
    return;
  }
  auto it = seq_shapes_.find(seq);
  if (it == seq_shapes_.end()) {
    // The same declarations into a scratch plan, with a fresh binder: same views, new shapes.
    BufferBinder bound = std::move(binder_);
    std::map<int64_t, std::vector<Shape>> known = std::move(seq_shapes_);
    const BatchShape planned = planned_;
    binder_ = BufferBinder();
    MemoryPlan scratch;
    struct Replanning {  // declarations decided by the full length's plan stay as they were
      bool& flag;
      explicit Replanning(bool& f) : flag(f) { flag = true; }
      ~Replanning() { flag = false; }
    } replanning(replanning_);
    plan(scratch, {planned.batch, seq}, options_);
    BRISK_CHECK(binder_.same_views(bound), "internal error: planning for length ", seq,
                " declared other buffers than the plan");
    std::vector<Shape> shapes = binder_.shapes(scratch);
    binder_ = std::move(bound);
    seq_shapes_ = std::move(known);
    planned_ = planned;
    it = seq_shapes_.emplace(seq, std::move(shapes)).first;
  }
  binder_.bind_shaped(*arena_, it->second);  // the flat weights keep their place and shape
  shape_ = {planned_.batch, seq};
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

const Tensor& Model::logits() const {
  if (lm_chunk_rows_ > 0) {
    const int64_t rows = shape_.batch * tokens(), kept = logits_.numel() / lm_width_;
    BRISK_CHECK(lm_rows_ < 0 || lm_rows_ == rows, "the logits were computed for ", lm_rows_,
                " of the ", rows,
                " rows (a masked LM's labelled rows: plan with "
                "labelled_rows_only false)");
    BRISK_CHECK(kept == rows, "the logits of ", rows, " rows were computed ", kept,
                " rows at a time and are not kept whole; plan with logits_rows >= ", rows);
  }
  return logits_;
}

void Model::declare_lm_logits(MemoryPlan& plan, const BatchShape& s, int weight, bool biased) {
  lm_head_weight_ = weight;
  lm_chunk_rows_ = lm_width_ = 0;
  if (!config_.last_stage()) return;  // a pipeline stage without the head
  const int64_t rows = s.batch * s.seq;
  lm_width_ = vocab_rows();
  const int64_t multiple = device_traits(options_.device).bf16_head_row_multiple;
  if (config_.tensor_ranks == 1 && options_.activation_dtype == DType::bf16)
    lm_width_ = checked_add(lm_width_, multiple - 1, "the logits' width") / multiple * multiple;
  const int64_t V = lm_width_;
  if (biased && V > vocab_rows())
    declare(plan, &head_bias_, "lm_head.padded_bias", Category::activations, DType::f32, {V});
  // 64 rows times a power of two (chunks that divide the usual batch x length, and keep a GPU
  // product's operands 256-byte aligned) within the device's chunk bytes; the same at every
  // length.
  const int64_t chunk_bytes = device_traits(options_.device).logits_chunk_bytes;
  lm_chunk_rows_ = options_.logits_rows;
  if (lm_chunk_rows_ <= 0)
    for (lm_chunk_rows_ = 64; lm_chunk_rows_ * 2 * V * 4 <= chunk_bytes;) lm_chunk_rows_ *= 2;
  if (rows <= lm_chunk_rows_)
    declare(plan, &logits_, "logits", Category::activations, DType::f32, {s.batch, s.seq, V});
  else
    declare(plan, &logits_, "logits", Category::activations, DType::f32, {lm_chunk_rows_, V});
  // bf16 products read the logits' gradient rounded once, as the loss writes it, a group of
  // DeviceTraits::head_grad_chunks chunks at a time (in runs that compute gradients). Decided for
  // the planned length: a shorter one (use_seq) declares the same buffers, this one however few
  // its rows.
  const int64_t group = device_traits(options_.device).head_grad_chunks;
  if (!replanning_)
    lm_grouped_ = options_.gradients && options_.activation_dtype == DType::bf16 &&
                  (group > 1 ? rows > lm_chunk_rows_ : group == 1 && !biased);
  if (lm_grouped_)
    declare(plan, &head_dlogits_, "lm_head.dlogits", Category::activations, DType::bf16,
            {std::min(rows, group * lm_chunk_rows_), V});
  declare(plan, &head_dx_, "lm_head.dx", Category::activations, DType::f32,
          {s.batch, s.seq, config_.hidden_size});
  // Vocabulary parallelism: each tensor rank's statistics of a chunk's rows, summed across them
  // (a padded head's, of its one rank).
  if (config_.tensor_ranks > 1 || V > vocab_rows())
    declare(plan, &head_stats_, "lm_head.vocab_stats", Category::activations, DType::f32,
            {config_.tensor_ranks, std::min(rows, lm_chunk_rows_), 3});
}

void Model::lm_loss(Backend& be, const StepOptions& o, const Tensor& logits, const Tensor& labels,
                    const Tensor& grad) {
  if (config_.tensor_ranks == 1 && lm_width_ == vocab_rows()) {
    be.softmax_cross_entropy(logits, labels, o.compute_grad, o.loss_grad_scale, loss_sum(), grad);
    return;
  }
  // Vocabulary parallelism's two steps (a padded head's too, on its one rank: its padding
  // columns take no probability and no gradient).
  // Every rank's maximum, sum of exponentials and label logit of each row, each at its place.
  const int64_t n = labels.numel(), R = config_.tensor_ranks;
  const Tensor stats(head_stats_.data(), Shape{R, n, 3}, DType::f32, head_stats_.device());
  be.fill(stats, 0.0f);
  const VocabShard shard =
      config_.tensor_ranks > 1 ? vocab_shard() : VocabShard{0, config_.vocab_size};
  const Tensor mine(stats.f32() + config_.tensor_rank * n * 3, Shape{n, 3}, DType::f32,
                    stats.device());
  be.cross_entropy_stats(logits, labels, shard, mine);
  if (config_.tensor_ranks > 1) tensor_group_->all_reduce_sum(be, stats);
  be.cross_entropy_from_stats(logits, labels, shard, stats, o.compute_grad, o.loss_grad_scale,
                              loss_sum(), grad);
}

Tensor Model::head_bias(Backend& be, const Tensor& bias) const {
  if (head_bias_.empty()) return bias;
  be.fill(element_range(head_bias_, bias.numel(), head_bias_.numel() - bias.numel()), 0.0f);
  be.copy(bias, element_range(head_bias_, 0, bias.numel()));
  return head_bias_;
}

void Model::lm_head_forward(Backend& be, const StepOptions& o, const Tensor& x, int weight,
                            int bias, const Tensor& labels) {
  const int64_t rows = labels.numel(), chunk = logits_.numel() / lm_width_;
  lm_rows_ = rows;
  const Tensor b = bias >= 0 ? head_bias(be, w(bias)) : Tensor();
  // A padded head's bias gradient: of the vocabulary's columns, the first (Backend::
  // linear_backward).
  const Tensor db = bias >= 0 && o.compute_grad ? g(bias) : Tensor();
  // The weight is read by two products per chunk and does not change meanwhile; a padded head's
  // products read it padded.
  struct Held {
    Backend& be;
    Tensor weight;
    Held(Backend& backend, const Tensor& w, int64_t rows) : be(backend), weight(w) {
      if (rows > w.dim(0))
        weight = be.hold_padded_weight(w, rows);
      else
        be.hold_weight(w);
    }
    ~Held() { be.release_weight(); }
  } held(be, w(weight), lm_width_);
  const Tensor& wt = held.weight;
  // The input gradient and dW of rows [group, r0) still to add (grouped: their dlogits in
  // head_dlogits_).
  const bool grouped = !head_dlogits_.empty() && be.reads_product_input(DType::bf16);
  const int64_t group_rows = grouped ? head_dlogits_.dim(0) : 0;
  int64_t group = 0;
  for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
    const int64_t n = std::min(chunk, rows - r0);
    // One chunk of the logits' planned rows: the tensors as they are.
    const bool whole = n == rows && rows * lm_width_ == logits_.numel();
    const Tensor xs = whole ? x : row_range(x, r0, n);
    const Tensor ls = whole ? logits_ : row_range(logits_, 0, n);
    const Tensor dx = whole ? head_dx_ : row_range(head_dx_, r0, n);
    be.linear_forward(xs, wt, b, WeightLayout::out_in, ls);
    // Grouped without a bias: the gradient written in bf16 straight into its rows of dlogits
    // (the bias's gradient needs the unrounded one in ls).
    const Tensor dl =
        grouped && o.compute_grad ? row_range(head_dlogits_, r0 - group, n) : Tensor();
    lm_loss(be, o, ls, whole ? labels : row_range(labels, r0, n, true), db.empty() ? dl : Tensor());
    if (!o.compute_grad) continue;
    if (!grouped) {
      be.linear_backward(xs, wt, ls, WeightLayout::out_in, dx, false, head_weight_grad(weight), db,
                         !o.first_micro_batch || r0 > 0);
      continue;
    }
    if (!db.empty()) {
      be.cast(ls, dl);  // from the unrounded gradient, as unchunked
      be.linear_backward(xs, wt, ls, WeightLayout::out_in, Tensor(), false, Tensor(), db,
                         !o.first_micro_batch || r0 > 0);
    }
    // The group's input gradient and its share of dW, from its rounded dlogits.
    if (r0 + n - group == group_rows || r0 + n == rows) {
      const int64_t span = r0 + n - group;
      be.linear_backward(row_range(x, group, span), wt, row_range(head_dlogits_, 0, span),
                         WeightLayout::out_in, row_range(head_dx_, group, span), false,
                         head_weight_grad(weight), Tensor(), !o.first_micro_batch || group > 0);
      group = r0 + n;
    }
  }
  // Vocabulary parallelism: each rank's columns gave a part of the input gradient.
  if (o.compute_grad && config_.tensor_ranks > 1)
    tensor_group_->all_reduce_sum(be, row_range(head_dx_, 0, rows));
}

void Model::reset_batch() {
  auto set = [](const Tensor& t, int32_t v) {
    if (t.empty()) return;
    int32_t* p = t.i32();
    for (int64_t i = 0; i < t.numel(); ++i) p[i] = v;
  };
  set(batch_.input_ids, 0);
  set(batch_.attention_mask, 1);
  set(batch_.token_type_ids, 0);
  set(batch_.labels, kIgnoreIndex);
  reset_label_values(batch_);
}

void Model::check_ids(const Tensor& ids, int64_t limit, const char* what) const {
  const int32_t* p = ids.i32();
  const int64_t cols = ids.rank() == 2 ? ids.dim(1) : 1;
  for (int64_t i = 0; i < ids.numel(); ++i)
    BRISK_CHECK(p[i] >= 0 && p[i] < limit, what, " ", p[i], " (sequence ", i / cols, ", position ",
                i % cols, ") is outside [0, ", limit, ")");
}

void Model::check_token_labels() const {
  const int32_t* y = batch_.labels.i32();
  for (int64_t i = 0; i < batch_.labels.numel(); ++i)
    BRISK_CHECK(y[i] == kIgnoreIndex || (y[i] >= 0 && y[i] < config_.vocab_size), "label ", y[i],
                " at position ", i, " is outside the vocabulary of ", config_.vocab_size);
}

void Model::shift_labels(const Tensor& targets) const {
  const int64_t B = shape_.batch, T = shape_.seq;
  const int32_t* y = batch_.labels.i32();
  int32_t* t = targets.i32();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < T; ++i) t[b * T + i] = i + 1 < T ? y[b * T + i + 1] : kIgnoreIndex;
}

int64_t Model::count_targets() const {
  const int64_t B = shape_.batch, T = shape_.seq;
  int64_t n = 0;
  // A sequence's own label (classification, regression) is the first token's rank's.
  if (first_token() > 0 && (!batch_.label_values.empty() || batch_.labels.rank() == 1)) return 0;
  if (!batch_.label_values.empty()) {
    const float* v = batch_.label_values.f32();
    for (int64_t b = 0; b < B; ++b) n += !no_label_value(v[b]);
    return n;
  }
  const int32_t* y = batch_.labels.i32();
  if (batch_.labels.rank() == 1) {
    for (int64_t b = 0; b < B; ++b) n += y[b] != kIgnoreIndex;
  } else {  // a causal LM's position t predicts label t+1; a masked LM's, label t
    // Under sequence parallelism, of this rank's positions only.
    const int64_t shift = config_.task == ModelTask::causal_lm ? 1 : 0;
    const int64_t from = first_token() + shift, to = std::min(first_token() + tokens() + shift, T);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = from; t < to; ++t) n += y[b * T + t] != kIgnoreIndex;
  }
  return n;
}

BlockStyle Model::config_block_style(bool training) const {
  const ModelConfig& c = config_;
  BlockStyle s;
  s.causal = c.causal;
  s.activation = c.activation;
  s.eps = c.layer_norm_eps;
  s.attention_dropout = training ? c.attention_dropout : 0.0f;
  s.attention_output_dropout = training ? c.attention_output_dropout : 0.0f;
  s.residual_dropout = training ? c.hidden_dropout : 0.0f;
  s.heads = static_cast<int>(c.num_heads);
  s.kv_heads = static_cast<int>(c.kv_heads());  // = heads unless grouped-query attention
  s.attention_scale =
      c.scale_by_head_dim ? 1.0f / std::sqrt(static_cast<float>(c.head_dim())) : 1.0f;
  s.scale_by_inverse_layer = c.scale_by_inverse_layer;
  return s;
}

BlockStyle Model::style(bool training) const {
  BlockStyle s = block_style(training);
  s.act_dtype = options_.activation_dtype;
  s.tensor_group = tensor_group_;
  s.sequence_group = sequence_group_;
  s.tensor_slices_tokens = slices_tokens();
  s.rebuilds_norms = options_.recompute_norms;
  s.rebuilds_activation = options_.recompute_activation;
  return s;
}

void Model::token_dropout(Backend& be, const Tensor& x, float p, const RngKey& key, const Tensor& y,
                          bool backward) const {
  per_sequence(token_slice(sequence_group_), x, key, [&](auto view, const RngKey& k) {
    if (backward)
      be.dropout_backward(view(x), p, k, view(y));
    else
      be.dropout_forward(view(x), p, k, view(y));
  });
}

Tensor Model::position_rows(const Tensor& table, int64_t first, int64_t count, const char* what) {
  BRISK_CHECK(first >= 0 && first + count <= table.dim(0), "positions ", first, "..", first + count,
              " exceed ", what, " = ", table.dim(0));
  const int64_t C = table.dim(1);
  return Tensor(table.f32() + first * C, Shape{table.dim(0) - first, C}, DType::f32,
                table.device());
}

void Model::drop_sequence_labels() {
  if (batch_.labels.rank() == 1) {
    int32_t* y = batch_.labels.i32();
    for (int64_t b = 0; b < batch_.labels.numel(); ++b) y[b] = kIgnoreIndex;
  }
  reset_label_values(batch_);
}

void Model::slice_inputs() const {
  for (const auto& [whole, tokens] : sliced_) {
    const int64_t B = tokens->dim(0), t = tokens->dim(1), T = whole->dim(1);
    const size_t bytes = dtype_size(tokens->dtype());
    const auto* from = static_cast<const char*>(whole->data());
    auto* to = static_cast<char*>(tokens->data());
    for (int64_t b = 0; b < B; ++b)
      std::memcpy(to + static_cast<size_t>(b * t) * bytes,
                  from + static_cast<size_t>(b * T + first_token()) * bytes,
                  static_cast<size_t>(t) * bytes);
  }
}

namespace {
// Copies between a block's float32 working tensors and its 16-bit stored copies (unless only the
// stored copies are used: direct_saved_tensors).
// Tensors `rebuilt` names (the recomputable ones under elementwise recomputation: backward rebuilds
// them) are not moved.
// (A tensor a block does not have, a sparse MLP's fc_pre and fc_act, is not copied.)
void transfer(Backend& be, BlockSaved& from, BlockSaved& to,
              const std::array<Tensor*, 3>& rebuilt) {
  auto is_rebuilt = [&](const Tensor* t) {
    return std::find(rebuilt.begin(), rebuilt.end(), t) != rebuilt.end();
  };
  const auto src = low_precision_tensors(from);
  const auto dst = low_precision_tensors(to);
  for (size_t i = 0; i < src.size(); ++i)
    if (!src[i]->empty() && !dst[i]->empty() && !is_rebuilt(src[i]) && !is_rebuilt(dst[i]))
      be.cast(*src[i], *dst[i]);
}
}  // namespace

std::array<Tensor*, 3> Model::rebuilt(BlockSaved& s, const BlockStyle& st) const {
  return options_.recomputes_elementwise() ? recomputable_tensors(s, st) : std::array<Tensor*, 3>{};
}

bool Model::direct_saved_tensors(const Backend& be) const {
  const bool direct = !stored_.empty() && be.reads_product_input(options_.activation_dtype);
  BRISK_CHECK(direct || stored_.empty() || !options_.reads_stored_copies,
              "internal error: the blocks' backward buffers share a working set this backend "
              "reads (planned with reads_stored_copies)");
  return direct;
}

namespace {
// Whether the host's attention mask [B, T] hides a key (a zero); BRISK_UNMASKED_ATTENTION=0: always
// taken as hiding one, to compare.
bool hides_keys(const Tensor& mask) {
  static const bool skips = !switched_off("BRISK_UNMASKED_ATTENTION");
  if (!skips || mask.empty()) return !mask.empty();
  const int32_t* m = mask.i32();
  return std::any_of(m, m + mask.numel(), [](int32_t v) { return v == 0; });
}
}  // namespace

KeyMask Model::key_mask() const {
  if (!hides_keys_) return {};
  if (keys_right_padded_) return {dev_batch_.attention_mask, key_lengths_};
  return dev_batch_.attention_mask;
}

void Model::forward_step(Backend& be, const StepOptions& o) {
  load_step(be);
  forward_compute(be, o);
}

void Model::load_step(Backend& be) {
  BRISK_CHECK(config_.tensor_ranks == 1 || tensor_group_ != nullptr,
              "internal error: a tensor-parallel share runs without its group");
  BRISK_CHECK(config_.sequence_ranks == 1 || sequence_group_ != nullptr,
              "internal error: a sequence-parallel share runs without its group");
  BRISK_CHECK(config_.moe.expert_ranks == 1 || expert_group_ != nullptr,
              "internal error: an expert-parallel share runs without its group");
  validate_batch();
  prepare_batch();
  slice_inputs();
  hides_keys_ = hides_keys(batch_.attention_mask);
  static const bool counts_keys = !switched_off("BRISK_KEY_LENGTHS");
  keys_right_padded_ =
      counts_keys && hides_keys_ && right_padded_lengths(batch_.attention_mask, key_lengths_host_);
  if (keys_right_padded_) be.upload(key_lengths_host_, key_lengths_);
  if (first_token() > 0) drop_sequence_labels();
  for (const auto& [host, device] : inputs_)
    if (!host->empty()) be.upload(*host, *device);
  upload_constants(be);
}

void Model::step_signature(const StepOptions& o, std::vector<int64_t>& s) const {
  uint32_t scale_bits = 0;
  std::memcpy(&scale_bits, &o.loss_grad_scale, sizeof scale_bits);
  s.assign({shape_.batch, shape_.seq, hides_keys_, keys_right_padded_, o.training, o.compute_grad,
            o.first_micro_batch, scale_bits});
  add_step_signature(s);
}

bool Model::computes_alone() const {
  return config_.tensor_ranks == 1 && config_.sequence_ranks == 1 && config_.pipeline_stages == 1 &&
         config_.moe.experts == 0 && !gathers_weights() && !staged_weights() && !staged_gradients();
}

void Model::forward_compute(Backend& be, const StepOptions& o) {
  const BlockStyle st = style(o.training);
  const bool direct = direct_saved_tensors(be);
  // The segments (param_segments()) of the stage's blocks [first, end): the head 0, block l
  // end - l, the embeddings end - first + 1.
  const auto first = static_cast<int>(config_.first_layer());
  const auto end = static_cast<int>(config_.end_layer());
  const int embeddings = end - first + 1;
  if (config_.first_stage()) {
    need_weights(embeddings, end - first);  // the first block on its way while they compute
    embed_forward(be, o);
    if (slices_tokens())  // every rank holds the same embeddings: its own tokens of them
      slice_tokens(be, tokens_, hidden_[static_cast<size_t>(first)], tensor_group_->rank());
  }
  for (int l = first; l < end; ++l) {
    need_weights(end - l, end - l - 1);  // then the next block's, or after the last the head's
    block_forward(be, st, layer_params(l, false), hidden_[l], key_mask(), hidden_[l + 1], saved_[l],
                  scratch_, o.rng, l, direct ? &stored_[l] : nullptr);
    if (!stored_.empty() && !direct) transfer(be, work_, stored_[l], rebuilt(stored_[l], st));
  }
  if (!config_.last_stage()) return;
  const bool tied = head_reads_embeddings();
  need_weights(0, tied ? embeddings : -1);
  if (tied) need_weights(embeddings, -1);
  if (slices_tokens())
    gather_tokens(be, *tensor_group_, hidden_[static_cast<size_t>(end)], tokens_,
                  scratch_.token_exchange);
  head_forward(be, o);
}

Tensor Model::stashed_input(int slot) const {
  // Slots a planned length apart: each keeps its micro-batch's length.
  const int64_t stride = planned_.batch * planned_tokens() * config_.hidden_size;
  BRISK_CHECK(slot >= 0 && slot < options_.stashed_inputs, "internal error: stashed input ", slot,
              " outside the planned slots");
  return Tensor(stashed_.f32() + slot * stride, stage_input().shape(), DType::f32,
                stashed_.device());
}

double Model::forward(Backend& be, const StepOptions& o) {
  reset_step_stats(be);
  forward_step(be, o);
  return read_step_stats(be)[kStatLoss];
}

// Each block's parameters (those declared after its enter_layer: BlockParams' and a sparse MLP's)
// must fill one range, the blocks one after another; the head's parameters follow the last block
// and the embeddings precede the first (the declaration order of every model here; tests check
// that each range is final when reported). Otherwise one segment: correct, without overlap.
void Model::find_grad_segments() {
  const int64_t total = params_.total_elements();
  segments_.assign(1, ElementRange{0, total});
  const auto first_layer = static_cast<int>(config_.first_layer());
  const std::vector<ParamInfo>& list = params_.list();
  std::vector<ElementRange> blocks;
  for (int l = first_layer; l < static_cast<int>(config_.end_layer()); ++l) {
    int64_t lo = total, hi = 0, covered = 0;
    for (size_t i = 0; i < list.size(); ++i) {
      if (i >= param_sections_.size() || param_sections_[i] != l) continue;
      lo = std::min(lo, list[i].offset);
      hi = std::max(hi, list[i].offset + list[i].shape.numel());
      covered += list[i].shape.numel();
    }
    if (lo >= hi || covered != hi - lo ||
        (l > first_layer && blocks.back().offset + blocks.back().count != lo))
      return;
    blocks.push_back({lo, hi - lo});
  }
  if (blocks.empty()) return;
  const int64_t first = blocks.front().offset;
  const int64_t end = blocks.back().offset + blocks.back().count;
  segments_.assign(1, ElementRange{end, total - end});
  segments_.insert(segments_.end(), blocks.rbegin(), blocks.rend());
  segments_.push_back({0, first});
}

// Staged buffers (partitioned data parallelism): the blocks' parameters in `slots` slots used in
// turn (block b in slot b mod slots), the head's and the embeddings' side by side at the end of the
// slots' space (or after it where they are longer). Possible when the blocks are laid out alike
// (every model here) and outnumber the slots. A tied head's gradient and the embeddings' are one
// tensor that the head's chunks start in forward and the embeddings' backward ends: the embeddings'
// gradients are then kept apart, before the slots.
int64_t Model::block_elements(int slots) const {
  const size_t L = segments_.size() >= 3 ? segments_.size() - 2 : 0;
  if (slots < 1 || L <= static_cast<size_t>(slots)) return 0;
  for (size_t i = 1; i <= L; ++i)
    if (segments_[i].count != segments_[1].count) return 0;
  return segments_[1].count;
}

Model::StagedLayout Model::staged_layout(int slots, bool embeddings_apart) const {
  StagedLayout l;
  const int64_t block = block_elements(slots);
  if (block == 0) return l;
  const int64_t E = segments_.back().count, H = segments_.front().count;
  l.slots = slots;
  l.block = block;
  l.slots_at = embeddings_apart ? E : 0;
  const int64_t space = std::max(slots * block, embeddings_apart ? H : E + H);
  l.length = l.slots_at + space;
  l.embeddings_at = embeddings_apart ? 0 : l.length - E;
  l.head_at = l.length - H - (embeddings_apart ? 0 : E);
  return l;
}

int64_t Model::staged_offset(int64_t at, const StagedLayout& l) const {
  if (l.slots == 0) return at;
  const int64_t first = segments_.back().count;  // the embeddings: [0, first)
  const int64_t end = segments_.front().offset;  // the head: [end, total)
  if (at < first) return l.embeddings_at + at;
  if (at >= end) return l.head_at + (at - end);
  return l.slots_at + (at - first) / l.block % l.slots * l.block + (at - first) % l.block;
}

int64_t Model::staged_weight_elements(int slots) const {
  const StagedLayout l = staged_layout(slots, false);
  return l.slots > 0 ? l.length : params_.total_elements();
}

int64_t Model::staged_gradient_elements(int slots) const {
  const StagedLayout l = staged_layout(slots, head_reads_embeddings());
  return l.slots > 0 ? l.length : params_.total_elements();
}

// Segment i of L + 2 (L: the blocks, a pipeline stage's) is the head (0), block L - i counted from
// the first, or the embeddings (L + 1); its place in a buffer of `layout`.
ElementRange Model::place(int segment, const StagedLayout& layout) const {
  const ElementRange r = segments_.at(static_cast<size_t>(segment));
  return {staged_offset(r.offset, layout), r.count};
}

bool Model::places_overlap(int a, int b, const StagedLayout& layout) const {
  const ElementRange x = place(a, layout), y = place(b, layout);
  return x.offset < y.offset + y.count && y.offset < x.offset + x.count;
}

Tensor Model::grad_segment(int segment) const {
  const ElementRange r = place(segment, grad_layout_);
  return element_range(flat_grads_, r.offset, r.count);
}

Tensor Model::weight_segment(int segment) const {
  const ElementRange r = place(segment, weight_layout_);
  return element_range(flat_weights_, r.offset, r.count);
}

void Model::need_weights(int segment, int next) const {
  if (!weight_source_) return;
  weight_source_->need(segment);
  if (next >= 0 && !weights_overlap(segment, next)) weight_source_->prefetch(next);
}

int Model::segment_of(int64_t at) const {
  for (size_t s = 0; s < segments_.size(); ++s)
    if (at >= segments_[s].offset && at < segments_[s].offset + segments_[s].count)
      return static_cast<int>(s);
  BRISK_FAIL("internal error: element ", at, " is in no segment");
}

void Model::written(size_t i) const {
  if (!weight_source_ || !staged_weights()) return;
  const ParamInfo& p = params_.list()[i];
  const int64_t end = p.offset + p.shape.numel();
  for (size_t s = 0; s < segments_.size(); ++s)
    if (segments_[s].offset + segments_[s].count == end)
      weight_source_->filled(static_cast<int>(s));
}

void Model::written_all() const {
  if (!weight_source_ || staged_weights()) return;  // staged: each segment reported as written
  for (size_t s = 0; s < segments_.size(); ++s) weight_source_->filled(static_cast<int>(s));
}

void Model::backward(Backend& be, const StepOptions& o, const SegmentDone& done) {
  BRISK_CHECK(o.compute_grad, "backward needs a forward pass with compute_grad");
  BRISK_CHECK(!staged_gradients() || done,
              "internal error: staged gradients need backward's reports");
  const BlockStyle st = style(o.training);
  const bool direct = direct_saved_tensors(be);
  const bool split = grad_segments_.size() > 1;
  auto report = [&](int segment) {
    if (done && split) done(segment);
  };
  if (config_.last_stage()) {  // else d_hidden_ holds the output's gradient
    head_backward(be, o);
    // Every rank's head computes the same input gradient: its own tokens of it.
    if (slices_tokens()) slice_tokens(be, d_tokens_, d_hidden_, tensor_group_->rank());
  }
  report(0);
  // Segments as forward_step numbers them.
  const auto first = static_cast<int>(config_.first_layer());
  const auto end = static_cast<int>(config_.end_layer());
  const int embeddings = end - first + 1;
  const bool embeddings_read = embed_backward_reads_weights();
  for (int l = end - 1; l >= first; --l) {
    // Then the block before, or after the first the embeddings' where their backward reads them.
    need_weights(end - l, l > first ? end - l + 1 : embeddings_read ? embeddings : -1);
    // The shared internals still hold the last block's values from the forward pass.
    const bool last = l == config_.end_layer() - 1;
    if (options_.gradient_checkpointing && !last)
      block_forward(be, st, layer_params(l, false), hidden_[l], key_mask(), Tensor(), saved_[l],
                    scratch_, o.rng, l);
    if (!stored_.empty() && !last && !direct)
      transfer(be, stored_[l], work_, rebuilt(stored_[l], st));
    if (rebuilds_input(l))
      post_norm_output(be, st, layer_params(l - 1, false), saved_[l - 1], hidden_[l]);
    // The 16-bit copies, read as they are.
    BlockSaved saved = saved_[l];
    if (direct) {
      const auto dst = low_precision_tensors(saved);
      const auto src = low_precision_tensors(stored_[l]);
      for (size_t i = 0; i < dst.size(); ++i) *dst[i] = *src[i];
    }
    // The recomputable tensors of this block, from what it kept (the last block's are still in
    // place).
    if (!stored_.empty() && options_.recomputes_elementwise() && !last)
      block_recompute(be, st, layer_params(l, false), hidden_[l], saved_[l],
                      direct ? &stored_[l] : nullptr);
    // Selective recomputation: the statistics of this block, from its kept qkv (the last
    // block's are still in place).
    if (options_.selective_recompute && !last)
      block_attention_core(be, st, key_mask(), saved.qkv, saved, scratch_, scratch_.d_ctx, o.rng,
                           l);
    if (grads_over_blocks_ && o.first_micro_batch)  // forward wrote over them
      zero_accumulated_grads(be, segments_[static_cast<size_t>(end - l)]);
    block_backward(be, st, layer_params(l, false), layer_params(l, true), hidden_[l], key_mask(),
                   saved, scratch_, d_hidden_, o.rng, l, !o.first_micro_batch);
    report(end - l);
  }
  if (config_.first_stage()) {
    if (embeddings_read) need_weights(embeddings, -1);
    if (slices_tokens())
      gather_tokens(be, *tensor_group_, d_hidden_, d_tokens_, scratch_.token_exchange);
    if (grads_over_blocks_ && o.first_micro_batch && embeddings_over_blocks()) {
      zero_accumulated_grads(be, segments_.back());
      if (tied_apart_ >= 0) be.copy(tied_head_grad_, g(tied_apart_));
    }
    embed_backward(be, o);
  }
  if (done) done(split ? static_cast<int>(grad_segments_.size()) - 1 : 0);
}

void Model::zero_grads(Backend& be) {
  be.fill(params_.flat_grads(), 0.0f);
}

void Model::zero_accumulated_grads(Backend& be) {
  if (!grads_over_blocks_) return zero_accumulated_grads(be, {0, -1});
  zero_accumulated_grads(be, segments_.front());  // the head's
  if (!embeddings_over_blocks()) zero_accumulated_grads(be, segments_.back());
}

void Model::zero_accumulated_grads(Backend& be, ElementRange range) {
  // Runs of neighbouring parameters filled at once (a block's norms and biases lie between its
  // weights; a staged slot holds each block's parameters at the same places).
  const std::vector<ParamInfo>& list = params_.list();
  const int64_t end = range.count < 0 ? params_.total_elements() : range.offset + range.count;
  Tensor run;
  auto flush = [&] {
    if (!run.empty()) be.fill(run, 0.0f);
    run = Tensor();
  };
  for (int i = 0; i < static_cast<int>(list.size()); ++i) {
    if (list[i].offset < range.offset || list[i].offset >= end) continue;
    if (list[i].product) {
      flush();
      continue;
    }
    const Tensor g = params_.grad(i);
    if (!run.empty() && static_cast<const char*>(run.data()) + run.bytes() == g.data())
      run = Tensor(run.data(), Shape{run.numel() + g.numel()}, DType::f32, run.device());
    else {
      flush();
      run = g;
    }
  }
  flush();
}

float Model::init_std(const std::string& name) const {
  const auto& src = config_.source;
  return src.contains("initializer_range") && src["initializer_range"].is_number()
             ? src["initializer_range"].get<float>()
             : 0.02f;
}

// Parameter by parameter in declaration order from one generator, written where the weights
// live piece by piece (no whole host copy of a model on a GPU).
// Each parameter's normal values are their own counter-based stream (core/random_init.h), so the
// init runs on every thread and does not depend on how the weights are staged.
void Model::init_weights(Backend& be, uint64_t seed) {
  for (size_t i = 0; i < params_.list().size(); ++i) {
    const ParamInfo& p = params_.list()[i];
    const bool bias = p.name.ends_with(".bias");
    const bool is_norm = !p.decay && !bias;
    const float stddev = init_std(p.name);
    write_in_pieces(be, params_.weight(static_cast<int>(i)), [&](const Tensor& piece, int64_t at) {
      float* x = piece.f32();
      const int64_t n = piece.numel();
      if (bias || is_norm)
        std::fill(x, x + n, bias ? 0.0f : 1.0f);
      else  // a split parameter's share draws its places' values in the full one
        for_each_split_run(p, at, n, [&](int64_t local, int64_t full, int64_t length) {
          fill_normal(seed, static_cast<uint32_t>(p.stream >= 0 ? p.stream : static_cast<int>(i)),
                      full, length, stddev, x + (local - at));
        });
    });
    if (static_cast<int>(i) == padded_embedding_) {  // the padding id's row, where held
      const Tensor table = params_.weight(padded_embedding_);
      const int64_t C = table.dim(1), row = config_.pad_token_id - vocab_shard().first;
      if (row >= 0 && row < table.dim(0)) be.fill(element_range(table, row * C, C), 0.0f);
    }
    init_extra(be, static_cast<int>(i));
    clear_padding(be, static_cast<int>(i));
    written(i);  // staged weights: its segment's place may be overwritten after this
  }
  written_all();
}

void Model::also_packed_in(int param, const std::string& name, Shape shape, int64_t first) {
  if (param >= 0) packed_[param] = {name, std::move(shape), first};
}

void Model::also_named(int param, const std::string& name) {
  if (param >= 0) aliases_[param] = name;
}

void Model::load_weights(Backend& be, const WeightFiles& file) {
  check_expert_tensors(config_, file);  // before a missing expert is named in another layout
  for (size_t i = 0; i < params_.list().size(); ++i)
    BRISK_CHECK(!weight_source(file, i).name.empty(), "weights file '", file.path(),
                "' lacks parameter '", params_.list()[i].name, "' of the ", config_.type_name(),
                " model");
  load_pretrained(be, file, 0);  // every parameter is present: nothing is initialized
}

Model::WeightSource Model::weight_source(const WeightFiles& file, size_t i) const {
  const ParamInfo& p = params_.list()[i];
  const std::string prefix = base_prefix();
  if (file.has(p.name)) return {p.name};
  if (p.name.rfind(prefix, 0) == 0 && file.has(p.name.substr(prefix.size())))
    return {p.name.substr(prefix.size())};
  const auto alias = aliases_.find(static_cast<int>(i));
  if (alias != aliases_.end() && file.has(alias->second)) return {alias->second};
  const auto packed = packed_.find(static_cast<int>(i));
  if (packed == packed_.end() || !file.has(packed->second.name)) return {};
  const PackedSource& s = packed->second;
  BRISK_CHECK(file.get(s.name).shape() == s.shape, "tensor '", s.name, "' in '",
              file.file_of(s.name).path(), "': shape ", file.get(s.name).shape().str(), " where ",
              s.shape.str(), " is expected");
  return {s.name, s.first, true};
}

std::vector<std::string> Model::load_pretrained(Backend& be, const WeightFiles& file, uint64_t seed,
                                                bool ignore_mismatched_sizes) {
  check_expert_tensors(config_, file);
  const std::string prefix = base_prefix();
  // Each parameter's tensor in the file; no name where the file does not give it.
  std::vector<WeightSource> source(params_.list().size());
  std::vector<std::string> missing;
  for (size_t i = 0; i < params_.list().size(); ++i) {
    const ParamInfo& p = params_.list()[i];
    const bool in_base = p.name.rfind(prefix, 0) == 0;
    source[i] = weight_source(file, i);
    const std::string& name = source[i].name;
    if (!name.empty() && !source[i].packed && file.get(name).shape() != p.full_shape()) {
      BRISK_CHECK(ignore_mismatched_sizes, "parameter '", name, "' in '", file.file_of(name).path(),
                  "': shape ", file.get(name).shape().str(), " where ", p.full_shape().str(),
                  " is expected (--ignore_mismatched_sizes initializes it anew)");
      source[i] = {};
    } else if (name.empty()) {
      BRISK_CHECK(!in_base, "weights file '", file.path(), "' lacks parameter '", p.name,
                  "' of the ", config_.type_name(), " model");
    }
    if (source[i].name.empty()) missing.push_back(p.name);
  }
  if (!missing.empty()) init_weights(be, seed);  // what the file does not give keeps its init
  // Staged weights: a segment the file gives in part is first gathered, with its
  // initialized values, into its place, which other segments have overwritten since.
  const bool gathered = weight_source_ && staged_weights();
  std::vector<bool> partial(segments_.size(), false);
  if (gathered)
    for (const std::string& name : missing)
      partial[static_cast<size_t>(segment_of(params_.list()[params_.index(name)].offset))] = true;
  for (size_t i = 0; i < params_.list().size(); ++i) {
    const ParamInfo& p = params_.list()[i];
    if (gathered) {  // at a partial segment's first parameter
      const int segment = segment_of(p.offset);
      if (partial[static_cast<size_t>(segment)] &&
          p.offset == segments_[static_cast<size_t>(segment)].offset)
        weight_source_->need(segment);
    }
    const std::string& name = source[i].name;
    if (name.empty()) {
      written(i);
      continue;
    }
    const int64_t from = source[i].first;  // within a packed tensor
    const Tensor& src = file.get(name);
    const SafetensorsFile& holder = file.file_of(name);
    const std::string what = "parameter '" + name + "' in '" + holder.path() + "'";
    // In 8 MiB ranges, each released once copied: the file's pages and the weights they fill
    // are never both resident in whole.
    write_in_pieces(
        be, params_.weight(static_cast<int>(i)), [&](const Tensor& piece, int64_t first) {
          constexpr int64_t kRange = int64_t{2} << 20;  // elements
          for (int64_t at = 0; at < piece.numel(); at += kRange) {
            const int64_t n = std::min(kRange, piece.numel() - at);
            // A split parameter's share: its runs' places in the full one.
            for_each_split_run(p, first + at, n, [&](int64_t local, int64_t full, int64_t length) {
              const Tensor part = element_range(src, from + full, length);
              copy_to_f32(part, element_range(piece, local - first, length), what);
              holder.release(part);
            });
          }
        });
    clear_padding(be, static_cast<int>(i));
    written(i);
  }
  written_all();
  std::sort(missing.begin(), missing.end());
  return missing;
}

std::vector<std::pair<std::string, Tensor>> Model::named_views(const Tensor& flat) const {
  BRISK_CHECK(flat.numel() == params_.total_elements(), "a flat buffer of ", flat.numel(),
              " values does not hold the model's ", params_.total_elements(), " parameters");
  std::vector<std::pair<std::string, Tensor>> out;
  for (const ParamInfo& p : params_.list())
    out.emplace_back(p.name, Tensor(flat.f32() + p.offset, p.shape, DType::f32, flat.device()));
  return out;
}

}  // namespace brisk
