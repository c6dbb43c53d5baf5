// The model-independent part: the parameters' declaration, the batch and its
// checks, the forward and backward passes over the blocks with optional recomputation.
#include "models/model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "backend/device_traits.h"
#include "core/checked.h"
#include "core/random_init.h"
#include "models/expert_weights.h"

namespace brisk {

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
  // Each tensor rank's rows give their tokens' embeddings, zero elsewhere; the first adds the
  // positions and types, once (one rank: all of it).
  // A packed batch's positions restart at each sample (read from memory).
  const bool first = config_.tensor_rank == 0;
  be.embedding_forward(ids, w(word), first ? pos : Tensor(), first ? type_ids : Tensor(),
                       first ? types : Tensor(), out, vocab_shard(), samples_.positions);
  if (config_.tensor_ranks > 1) parallelism_.tensor->all_reduce_sum(be, out);
}

void Model::embed_tokens_backward(Backend& be, const Tensor& dout, const Tensor& ids,
                                  int64_t padding_idx, const Tensor& type_ids, int word,
                                  const Tensor& dpos, const Tensor& dtypes) {
  const Tensor dword = g(word);
  if (dword.empty() && dpos.empty() && dtypes.empty()) return;  // frozen embeddings
  be.embedding_backward(dout, ids, padding_idx, type_ids, dword, dpos, dtypes, vocab_shard(),
                        samples_.positions);
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

BatchShape Model::token_shape(BatchShape shape) const {
  return {shape.batch, shape.seq / config_.sequence_ranks};
}

int64_t Model::stream_tokens(const BatchShape& shape) const {
  return token_shape(shape).seq / (slices_tokens() ? config_.tensor_ranks : 1);
}

void Model::bind(Arena& arena) {
  binder_.bind(arena);
  std::vector<int64_t> weight_offsets, grad_offsets;
  for (const ParamInfo& p : params_.list()) {
    if (staged_weights()) weight_offsets.push_back(weight_layout_.offset(p.offset));
    if (staged_gradients()) grad_offsets.push_back(grad_layout_.offset(p.offset));
  }
  params_.bind(flat_weights_, flat_grads_, weight_offsets, grad_offsets);
  if (adapters_) place_adapters();
  grad_segments_ = flat_grads_.empty() ? std::vector<ElementRange>()
                   : params_.frozen()  ? std::vector<ElementRange>{{0, flat_grads_.numel()}}
                                       : segments_;
  arena_ = &arena;
  shape_ = planned_;
  fill_constants();
  planned_constants_.clear();
  for (const auto& [host, device] : constants_) planned_constants_.emplace_back(*host, *device);
  constants_uploaded_ = false;
}

void Model::place_adapters() {
  const SparseMlp* sparse = style(true).sparse_mlp;
  adapters_->place([&](int layer) { return layer_products(layer); },
                   [&](int layer) {
                     return sparse != nullptr ? sparse->products(layer)
                                              : std::vector<std::pair<ProductSite, Tensor>>();
                   });
}

BlockParams Model::block_weights(int layer) const {
  BlockParams b = layer_params(layer, false);
  for (size_t s = 0; weight_source_ && s < b.quantized.size(); ++s)
    b.quantized[s] = weight_source_->matrix(layer, static_cast<int>(s));
  return b;
}

void Model::use_seq(int64_t seq) {
  samples_.starts.clear();  // rows of one sample each, unless use_samples follows (its capacity
                            // kept: assigning the next samples allocates nothing)
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
  if (const PackedSamples* samples = packed_samples()) {  // within each sample
    for (int64_t s = 0; s < samples->count(); ++s) {
      const int64_t end = samples->starts[static_cast<size_t>(s) + 1];
      for (int64_t i = samples->starts[static_cast<size_t>(s)]; i < end; ++i)
        t[i] = i + 1 < end ? y[i + 1] : kIgnoreIndex;
    }
    return;
  }
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
    const PackedSamples* samples = packed_samples();
    for (int64_t s = 0; samples && s < samples->count(); ++s)  // each sample's, as a row's
      for (int64_t t = samples->starts[static_cast<size_t>(s)] + shift;
           t < samples->starts[static_cast<size_t>(s) + 1]; ++t)
        n += y[t] != kIgnoreIndex;
    if (samples) return n;
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
  s.parallel = parallelism_;
  s.tensor_slices_tokens = slices_tokens();
  s.rebuilds_norms = options_.recompute_norms;
  s.rebuilds_activation = options_.recompute_activation;
  s.fused_residual_norm = options_.fused_residual_norm;
  s.adapters = adapters_.get();
  return s;
}

BlockStyle Model::step_style(const StepOptions& o) const {
  BlockStyle s = style(o.training);
  if (o.training && adapters_) s.adapter_key = o.rng;
  return s;
}

void Model::token_dropout(Backend& be, const Tensor& x, float p, const RngKey& key, const Tensor& y,
                          bool backward) const {
  per_sequence(token_slice(parallelism_.sequence), x, key, [&](auto view, const RngKey& k) {
    if (backward)
      be.dropout_backward(view(x), p, k, view(y));
    else
      be.dropout_forward(view(x), p, k, view(y));
  });
}

Tensor Model::position_rows(const Tensor& table, int64_t first, int64_t count, const char* what) {
  if (table.empty()) return Tensor();  // a frozen table's gradient
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
// Whether the host's attention mask [B, T] hides a key (a zero); without `skips`
// (PlanOptions::unmasked_attention) always taken as hiding one, to compare.
bool hides_keys(const Tensor& mask, bool skips) {
  if (!skips || mask.empty()) return !mask.empty();
  const int32_t* m = mask.i32();
  return std::any_of(m, m + mask.numel(), [](int32_t v) { return v == 0; });
}
}  // namespace

KeyMask Model::key_mask() const {
  if (const PackedSamples* samples = packed_samples()) {
    KeyMask packed;
    packed.samples = samples;
    return packed;
  }
  if (!hides_keys_) return {};
  if (keys_right_padded_) return {dev_batch_.attention_mask, key_lengths_};
  return dev_batch_.attention_mask;
}

void Model::forward_step(Backend& be, const StepOptions& o) {
  load_step(be);
  forward_compute(be, o);
}

void Model::load_step(Backend& be) {
  BRISK_CHECK(config_.tensor_ranks == 1 || parallelism_.tensor != nullptr,
              "internal error: a tensor-parallel share runs without its group");
  BRISK_CHECK(config_.sequence_ranks == 1 || parallelism_.sequence != nullptr,
              "internal error: a sequence-parallel share runs without its group");
  BRISK_CHECK(config_.moe.expert_ranks == 1 || parallelism_.experts != nullptr,
              "internal error: an expert-parallel share runs without its group");
  validate_batch();
  prepare_batch();
  slice_inputs();
  load_samples(be);
  hides_keys_ = samples_.empty() && hides_keys(batch_.attention_mask, options_.unmasked_attention);
  keys_right_padded_ = options_.key_lengths && hides_keys_ &&
                       right_padded_lengths(batch_.attention_mask, key_lengths_host_);
  if (keys_right_padded_) be.upload(key_lengths_host_, key_lengths_);
  if (first_token() > 0) drop_sequence_labels();
  for (const auto& [host, device] : inputs_)
    if (!host->empty()) be.upload(*host, *device);
  upload_constants(be);
}

void Model::load_samples(Backend& be) {
  samples_.at = samples_.positions = Tensor();
  if (samples_.empty()) return;
  const int64_t n = samples_.count(), tokens = shape_.batch * shape_.seq;
  // Laid over the rows as one row of the batch's tokens.
  Backend::check_packed_samples(samples_, 1, tokens, "the padding-free batch");
  BRISK_CHECK(!sample_starts_host_.empty(),
              "internal error: a padding-free batch in a model planned without its samples");
  int32_t* starts = sample_starts_host_.i32();
  int32_t* positions = positions_host_.i32();
  for (int64_t s = 0; s <= n; ++s) starts[s] = static_cast<int32_t>(samples_.starts[s]);
  for (int64_t s = 0; s < n; ++s)
    for (int64_t t = samples_.starts[s]; t < samples_.starts[s + 1]; ++t)
      positions[t] = static_cast<int32_t>(t - samples_.starts[s]);
  be.upload(element_range(sample_starts_host_, 0, n + 1), element_range(sample_starts_, 0, n + 1));
  be.upload(element_range(positions_host_, 0, tokens), element_range(positions_, 0, tokens));
  samples_.at = element_range(sample_starts_, 0, n + 1);
  samples_.positions = element_range(positions_, 0, tokens);
}

void Model::step_signature(const Backend& be, const StepOptions& o, std::vector<int64_t>& s) const {
  uint32_t scale_bits = 0;  // the value's (1 where the scale is held in memory: StepRecorder)
  std::memcpy(&scale_bits, &o.loss_grad_scale.value, sizeof scale_bits);
  s.assign({shape_.batch, shape_.seq, hides_keys_, keys_right_padded_, o.training, o.compute_grad,
            o.first_micro_batch, scale_bits, o.loss_grad_scale.held != nullptr});
  s.push_back(samples_.count());  // a packed batch's calls follow its samples
  if (!samples_.empty()) {        // and its attention's host decisions
    const BlockStyle st = step_style(o);
    const int64_t D = config_.head_dim();
    const AttentionDims d{1, shape_.batch * shape_.seq, st.heads * D, st.heads, D, st.kv_heads};
    be.add_packed_signature(samples_, d, st.causal, st.attention_scale, st.attention_dropout, s);
  }
  add_step_signature(s);
}

bool Model::computes_alone() const {
  return config_.tensor_ranks == 1 && config_.sequence_ranks == 1 && config_.pipeline_stages == 1 &&
         config_.moe.experts == 0 && !gathers_weights() && !staged_weights() && !staged_gradients();
}

void Model::forward_compute(Backend& be, const StepOptions& o) {
  const BlockStyle st = step_style(o);
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
      slice_tokens(be, tokens_, hidden_[static_cast<size_t>(first)], parallelism_.tensor->rank());
  }
  for (int l = first; l < end; ++l) {
    need_weights(end - l, end - l - 1);  // then the next block's, or after the last the head's
    block_forward(be, st, block_weights(l), hidden_[l], key_mask(), hidden_[l + 1], saved_[l],
                  scratch_, o.rng, l, direct ? &stored_[l] : nullptr);
    if (!stored_.empty() && !direct) transfer(be, work_, stored_[l], rebuilt(stored_[l], st));
  }
  if (!config_.last_stage()) return;
  const bool tied = head_reads_embeddings();
  need_weights(0, tied ? embeddings : -1);
  if (tied) need_weights(embeddings, -1);
  if (slices_tokens())
    gather_tokens(be, *parallelism_.tensor, hidden_[static_cast<size_t>(end)], tokens_,
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

void Model::backward(Backend& be, const StepOptions& o, const SegmentDone& done) {
  BRISK_CHECK(o.compute_grad, "backward needs a forward pass with compute_grad");
  BRISK_CHECK(!staged_gradients() || done,
              "internal error: staged gradients need backward's reports");
  const BlockStyle st = step_style(o);
  const bool direct = direct_saved_tensors(be);
  const bool split = grad_segments_.size() > 1;
  auto report = [&](int segment) {
    if (done && split) done(segment);
  };
  if (config_.last_stage()) {  // else d_hidden_ holds the output's gradient
    head_backward(be, o);
    // Every rank's head computes the same input gradient: its own tokens of it.
    if (slices_tokens()) slice_tokens(be, d_tokens_, d_hidden_, parallelism_.tensor->rank());
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
      block_forward(be, st, block_weights(l), hidden_[l], key_mask(), Tensor(), saved_[l], scratch_,
                    o.rng, l);
    if (!stored_.empty() && !last && !direct)
      transfer(be, stored_[l], work_, rebuilt(stored_[l], st));
    if (rebuilds_input(l))
      post_norm_output(be, st, block_weights(l - 1), saved_[l - 1], hidden_[l]);
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
      block_recompute(be, st, block_weights(l), hidden_[l], saved_[l],
                      direct ? &stored_[l] : nullptr);
    // Selective recomputation: the statistics of this block, from its kept qkv (the last
    // block's are still in place).
    if (options_.selective_recompute && !last)
      block_attention_core(be, st, key_mask(), saved.qkv, saved, scratch_, scratch_.d_ctx, o.rng,
                           l);
    if (grads_over_blocks_ && o.first_micro_batch)  // forward wrote over them
      zero_accumulated_grads(be, segments_[static_cast<size_t>(end - l)]);
    block_backward(be, st, block_weights(l), layer_params(l, true), hidden_[l], key_mask(), saved,
                   scratch_, d_hidden_, o.rng, l, !o.first_micro_batch);
    report(end - l);
  }
  if (config_.first_stage()) {
    if (embeddings_read) need_weights(embeddings, -1);
    if (slices_tokens())
      gather_tokens(be, *parallelism_.tensor, d_hidden_, d_tokens_, scratch_.token_exchange);
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

}  // namespace brisk
