// A model: parameters named as in transformers, a plan of every buffer one micro-batch needs,
// and explicit forward and backward passes over the blocks. Each architecture's file (bert.cpp,
// distilbert.cpp, gpt2.cpp, llama.cpp) supplies the embeddings, the head and the name map; the
// block loop and gradient checkpointing are model.cpp's, the plan model_plan.cpp's, the
// language-model head model_head.cpp's, the segments and staged buffers model_segments.cpp's,
// the weights' initialization and loading model_weights.cpp's, the step statistics and decoding
// hooks model_stats.cpp's.
#pragma once

#include <array>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/device_traits.h"
#include "core/memory_plan.h"
#include "core/parameters.h"
#include "core/safetensors.h"
#include "core/segment_layout.h"
#include "core/step_control.h"
#include "core/weight_files.h"
#include "data/batch.h"
#include "models/config.h"
#include "models/linears.h"
#include "models/model_adapters.h"
#include "models/model_options.h"
#include "models/model_parallelism.h"
#include "models/moe_layer.h"
#include "models/transformer_block.h"

namespace brisk {

class Model : public BatchTarget {
 public:
  static std::unique_ptr<Model> create(const ModelConfig& config);
  virtual ~Model() = default;

  const ModelConfig& config() const { return config_; }
  const ParameterSet& params() const { return params_; }
  // The parameters one token's forward pass reads: all of them but, in a mixture of experts'
  // sparse layers, the experts it is not routed to (E - k of E); the whole model's, for an expert
  // rank's share too.
  int64_t active_parameters() const;
  // Statistics of the training micro-batches since the last call, for the step log (a mixture
  // of experts: the routed pairs per expert and their balance); an empty object where none.
  virtual nlohmann::json take_log_statistics() { return nlohmann::json::object(); }

  // Declares weights, gradients, data, activations and temporaries for micro-batches of `shape`.
  void plan(MemoryPlan& plan, BatchShape shape, PlanOptions options);
  void bind(Arena& arena);
  // Runs the next micro-batches at sequence length `seq` (1 to the planned length) in the
  // planned buffers, every view shaped as a plan for that length shapes it (dynamic padding:
  // shorter batches compute less in the same memory). The shapes for a length are found once,
  // by planning the model again for it. The batch's contents are not kept, nor its samples
  // (use_samples after it).
  void use_seq(int64_t seq) override;
  // The next micro-batches' samples laid end to end (padding-free: attention within each,
  // positions from 0 at each, a sequence head's token of each), or none.
  void use_samples(const PackedSamples& samples) override { samples_ = samples; }
  const PackedSamples* packed_samples() const { return samples_.empty() ? nullptr : &samples_; }
  // The host-side batch the data loader writes; forward() validates it and copies it to the
  // device.
  const Batch& batch() const override { return batch_; }
  // The shape of the current micro-batch (use_seq), and the one the buffers were planned for.
  BatchShape batch_shape() const { return shape_; }
  BatchShape planned_shape() const { return planned_; }
  // The tokens of each planned sequence in this model's residual stream: all of them, or under
  // sequence parallelism its share (its activations' length; under Megatron's, its tensor rank's
  // slice of that).
  int64_t planned_tokens() const { return stream_tokens(planned_); }
  // The ids of the vocabulary this rank's vocabulary tables hold (VocabShard{}: all of them),
  // and the tables' rows (vocab_param).
  VocabShard vocab_shard() const;
  int64_t vocab_rows() const;
  // The last forward pass's logits (overwritten by their gradient when it computed gradients).
  // A language-model head holds them whole only when the batch's rows fit its chunk
  // (PlanOptions::logits_rows); otherwise asking for them fails. Their rows are
  // logits_width() wide: a padded head's (declare_lm_logits) past the vocabulary.
  const Tensor& logits() const;
  int64_t logits_width() const { return lm_width_ > 0 ? lm_width_ : head_width(); }

  // The most elements the operands of the model's linear layers have at the planned batch shape
  // (A: activations and their gradients; B: weights, or activations in a weight gradient's
  // product): what a backend sizes its matmul buffers by.
  MatmulOperands matmul_operands() const;

  // Fills the batch with defaults: attention mask 1, token types 0, labels ignored.
  void reset_batch();
  // Targets the loss of the current batch is summed over (labels other than kIgnoreIndex).
  int64_t count_targets() const;
  // Per-step statistics on the device, float64 [kStatsSize] (core/step_control.h): forward
  // passes add their summed loss to kStatLoss; the trainer adds the gradients' sum of squares.
  const Tensor& step_stats() const { return stats_; }
  // The decision made from them on the device, float32 [kControlSize]: what optimizers read.
  const Tensor& step_control() const { return control_; }
  void reset_step_stats(Backend& be);
  // Copies the statistics to the host (waits for the device).
  std::array<double, 2> read_step_stats(Backend& be);

  // Adds the loss summed over the targets of the batch to step_stats() without waiting for it:
  // load_step, then forward_compute.
  void forward_step(Backend& be, const StepOptions& options);
  // The host's part of a forward pass: the batch checked, its decisions made (which keys the
  // attention reads, a masked LM's labelled rows), its inputs uploaded.
  void load_step(Backend& be);
  // The backend's part, on the batch load_step left: the same work again for the same
  // step_signature (what a recorded step replays, models/step_recorder.h).
  void forward_compute(Backend& be, const StepOptions& options);
  // Everything of the loaded batch and of `options` that forward_compute and backward decide by
  // on the host, but what a replay reads from memory (the dropout keys' step, the loss's gradient
  // scale, a packed batch's layout): two micro-batches with equal signatures launch the same work
  // on the same buffers. Written into `out` (kept by the caller: no allocation a step).
  void step_signature(const Backend& be, const StepOptions& options,
                      std::vector<int64_t>& out) const;
  // Whether a micro-batch's forward and backward are this model's own work alone, on buffers
  // fixed by the plan (no exchanges with other ranks, no weights gathered into slots, no
  // routing decided on the host): what a recorded step needs.
  bool computes_alone() const;
  // PlanOptions::held_step's two words, host and where the kernels read them: the micro-step
  // (uint64, RngKey::step_offset), then the loss's gradient scale (a float in the second word's
  // first bytes, GradScale::held).
  std::pair<Tensor, Tensor> held_step() const { return {held_step_host_, held_step_}; }
  // forward_step from zeroed statistics; returns that summed loss (waits for the device).
  double forward(Backend& be, const StepOptions& options);
  // The flat gradients in the order backward finishes them: element ranges of flat_grads() (the
  // head, the blocks from last to first, the embeddings), each starting where the next ends, that
  // together cover every parameter; one range when the blocks' parameters are not laid out block
  // after block or some are frozen (the trained ones', from the buffer's start:
  // ParameterSet::gradient_origin); none for a plan of the weights only. Data parallelism starts a
  // range's all-reduce once backward reports it final.
  const std::vector<ElementRange>& grad_segments() const { return grad_segments_; }
  // The same ranges of the parameter layout, known from creation (before any plan).
  const std::vector<ElementRange>& param_segments() const { return segments_; }
  // The linears this model's share holds (linears.h), in declaration order: what adapters wrap.
  std::vector<LinearDecl> linears() const;
  // Freezes every parameter `trained` does not name (before plan): they get no gradient and no
  // optimizer state; the gradient buffer holds the trained ones alone, as one segment.
  void freeze_except(const std::function<bool(const ParamInfo&)>& trained);
  // LoRA (adapters/lora attaches them, before the plan): each linear's A [r, in] and B [out, r]
  // declared after the base's parameters ("<module>.lora_A.weight", ".lora_B.weight"; A drawn
  // as PEFT's kaiming_uniform(a = sqrt 5), B zero), and every other parameter `trained` does not
  // name frozen.
  // Experts' adapters (`experts`) likewise after them: A [E r, in], B [E out, r] (MoeLora's
  // layouts), handed to the layer's experts (adapt_experts).
  void add_adapters(const std::vector<AdapterDecl>& decls,
                    const std::vector<ExpertAdapterDecl>& experts,
                    const std::function<bool(const ParamInfo&)>& trained);
  // A mixture's fused expert weights (none elsewhere), and a LoRA of them (parameters a and b):
  // what the model's sparse layers compute with.
  virtual std::vector<ExpertWeightsDecl> expert_weights() const { return {}; }
  // A mixture's routers among `linears` (LinearDecl::router), under transformers 5's names.
  virtual void mark_routers(std::vector<LinearDecl>& /*linears*/) const {}
  virtual void adapt_experts(const ExpertWeightsDecl& w, int a, int b, int64_t r, float scale);
  const ModelAdapters* adapters() const { return adapters_.get(); }
  // Where segment i's gradients are: its range of flat_grads(), or with staged gradients its
  // place, which other segments' places may overlap (they hold their gradients in turn).
  Tensor grad_segment(int segment) const;
  // The places of the segments in the gradient and weight buffers (plain unless the plan's
  // PlanOptions::gradient_slots / weight_slots staged them; core/segment_layout.h).
  const SegmentLayout& grad_layout() const { return grad_layout_; }
  const SegmentLayout& weight_layout() const { return weight_layout_; }
  // Elements `e` of the parameters in the weight buffer: where it holds them together (staged
  // weights: a run within one resident segment, such as a LoRA's trained parameters).
  ElementRange weight_place(ElementRange e) const;
  bool staged_gradients() const { return grad_layout_.is_staged(); }
  // Whether the head reads the embeddings' weights (a tied language-model head): staged gradients
  // then keep the embeddings' apart, before the slots.
  virtual bool head_reads_embeddings() const { return false; }
  // Whether the plan stages the weights. `slots` fills the places (and hears of every segment
  // written while weights are initialized or loaded); without it the weights must not be staged.
  bool staged_weights() const { return weight_layout_.is_staged(); }
  Tensor weight_segment(int segment) const;
  void set_weight_slots(WeightSlots* slots) { weight_source_ = slots; }
  // Where a weight the buffer does not hold (PlanOptions::slot_holes) is written to be kept.
  void set_outside_weights(const Tensor& landing) { params_.set_landing(landing); }
  // The groups this model's share runs in, which its layers exchange over (filled by the run's
  // parallel layout, parallel/layout.h's make_parallel; the blocks consult this value alone).
  void set_parallelism(const ModelParallelism& p) { parallelism_ = p; }
  const ModelParallelism& parallelism() const { return parallelism_; }
  // Megatron's sequence parallelism: the residual stream between the blocks' products holds this
  // tensor rank's slice of the tokens.
  bool slices_tokens() const { return config_.tensor_slices_tokens && config_.tensor_ranks > 1; }
  // Pipeline parallelism (config().pipeline_stages > 1): the stage's input, which a stage after
  // the first receives before forward_step; its output, after forward_step; the gradient
  // flowing backwards, which a stage before the last receives (of its output) before backward,
  // and which after backward holds that of its input. Views of the current length.
  const Tensor& stage_input() const { return hidden_[static_cast<size_t>(config_.first_layer())]; }
  const Tensor& stage_output() const { return hidden_[static_cast<size_t>(config_.end_layer())]; }
  const Tensor& hidden_gradient() const { return d_hidden_; }
  // PlanOptions::stashed_inputs: slot i of the stage inputs kept for backward, at the current
  // length (each slot holds one of the planned length).
  Tensor stashed_input(int slot) const;
  bool gathers_weights() const { return weight_source_ != nullptr; }
  // The weights as one buffer that nothing else writes during a step (Backend::hold_weights);
  // empty where they are gathered (ZeRO 3, staged or not).
  Tensor resident_weights() const {
    return staged_weights() || gathers_weights() ? Tensor() : params().flat_weights();
  }
  // Whether a forward pass takes part in collectives of other ranks (ZeRO stage 3's gathers of
  // the weights, expert parallelism's exchanges of routed rows): every rank then runs as many.
  bool forward_meets_peers() const { return gathers_weights() || config_.moe.expert_ranks > 1; }
  // backward's report: grad_segments()[i] is final (its computation issued: on a GPU, in stream
  // order), for the last micro-batch of an accumulated step (every micro-batch when staged).
  using SegmentDone = std::function<void(int)>;
  void backward(Backend& be, const StepOptions& options, const SegmentDone& done = {});
  void zero_grads(Backend& be);
  // Sets to zero the gradients an optimizer step's first micro-batch adds to (StepOptions::
  // first_micro_batch): all but the matrix products' weights (ParamInfo::product), whose first
  // gradient it writes over what the buffer holds.
  // Where the gradients lie over consumed activations (PlanOptions::gradients_over_activations),
  // only those of the segments backward does not zero itself.
  void zero_accumulated_grads(Backend& be);
  // Those of the parameters starting in `range` of the flat gradients (count -1: to the end).
  void zero_accumulated_grads(Backend& be, ElementRange range);

  // Initializes weights as transformers does (normal(0, initializer_range), zero biases, unit
  // LayerNorm), deterministically from `seed`.
  void init_weights(Backend& be, uint64_t seed);
  // Reads every parameter by its transformers name; extra entries (buffers) are ignored.
  void load_weights(Backend& be, const WeightFiles& file);
  // As from_pretrained loads a model folder: a parameter is found by its name or by its name
  // without the base model's prefix (base-model files such as sentence-transformers' store
  // "embeddings.*", not "bert.embeddings.*"); parameters of the task head that the file lacks
  // are initialized from `seed` and returned by name; a missing base-model parameter is an error.
  // A tensor whose shape differs from the parameter's is an error too, or with
  // `ignore_mismatched_sizes` initialized and returned as the missing ones are. The weights may
  // be one file or shards (WeightFiles), and a linear's weight bitsandbytes' 4-bit codes (a
  // "-bnb-4bit" checkpoint: its values dequantized as bitsandbytes does, core/bnb_weights.h).
  std::vector<std::string> load_pretrained(Backend& be, const WeightFiles& file, uint64_t seed,
                                           bool ignore_mismatched_sizes = false);
  // The tensor of `file` that parameter `param` loads from ("" where none): its name, its name
  // without the base model's prefix, an alias, or a packed tensor.
  std::string source_name(const WeightFiles& file, size_t param) const {
    return weight_source(file, param).name;
  }
  // ---- incremental decoding (models/decoder.h) ----
  // Copies the constants (declare_constants) to the device the first time after bind; forward
  // passes and the decoder call it.
  void upload_constants(Backend& be) const;
  // Whether the model predicts the next token (what brisk generate needs).
  virtual bool causal_lm() const { return false; }
  BlockStyle inference_style() const { return style(false); }
  BlockParams layer_weights(int layer) const { return block_weights(layer); }
  // The parameters of each of layer `layer`'s dense products (WeightSlots, adapters).
  virtual BlockProducts layer_products(int layer) const = 0;
  // out [1,T,C] = the input embeddings of ids [1,T] at positions first..first+T-1.
  virtual void embed_at(Backend& be, const Tensor& ids, int64_t first, const Tensor& out) const;
  // logits [1,1,V] of the last hidden state hidden [1,1,C] (normed [1,1,C] and the statistics
  // mean, rstd [1,1] are scratch).
  virtual void next_token_logits(Backend& be, const Tensor& hidden, const Tensor& normed,
                                 const Tensor& mean, const Tensor& rstd,
                                 const Tensor& logits) const;

  // transformers' class of this model ("BertForSequenceClassification", "GPT2LMHeadModel").
  virtual const char* class_name() const = 0;
  // (name, tensor) pairs over a flat buffer laid out as the parameters (the weights, or the fp32
  // master copy), for writing model.safetensors.
  std::vector<std::pair<std::string, Tensor>> named_views(const Tensor& flat) const;
  // The layout of this model's batches of `batch` x `seq` tokens.
  virtual BatchLayout batch_layout(int64_t batch, int64_t seq) const = 0;

 protected:
  explicit Model(const ModelConfig& config) : config_(config) {}
  ExpertGroup* expert_group() const { return parallelism_.experts; }
  // Subclass hooks.
  virtual void declare_params() = 0;
  // The block wiring the architecture fixes (norm placement, weight layout); the rest of the style
  // comes from the config (config_block_style).
  virtual BlockStyle block_style(bool training) const = 0;
  // Activation, epsilon, dropouts (zero when not training), causality, heads and attention
  // scale, as the config gives them.
  BlockStyle config_block_style(bool training) const;
  virtual BlockParams layer_params(int layer, bool grads) const = 0;
  // layer_params' weights, with the 4-bit matrices its weight slots multiply by where they keep
  // them (WeightSlots::matrix).
  BlockParams block_weights(int layer) const;
  virtual void declare_buffers(MemoryPlan& plan, const BatchShape& shape) = 0;
  // Buffers of values fixed by the config and the planned length, needed for inference too
  // (rotary tables), each declared with declare_constant; filled on the host after bind
  // (fill_constants) and copied to the device once (upload_constants).
  virtual void declare_constants(MemoryPlan&, const BatchShape&) {}
  virtual void fill_constants() {}
  virtual void validate_batch() const = 0;
  // Host-side inputs derived from the batch (GPT-2's shifted labels), before the upload.
  virtual void prepare_batch() {}
  // What prepare_batch decided that forward and backward read on the host (step_signature).
  virtual void add_step_signature(std::vector<int64_t>&) const {}
  virtual void embed_forward(Backend& be, const StepOptions& o) = 0;  // writes hidden_[0]
  // From hidden_[L]; adds the summed loss to loss_sum().
  virtual void head_forward(Backend& be, const StepOptions& o) = 0;
  virtual void head_backward(Backend& be, const StepOptions& o) = 0;   // writes d_hidden_
  virtual void embed_backward(Backend& be, const StepOptions& o) = 0;  // from d_hidden_
  virtual float init_std(const std::string& name) const;
  // Initial values init_weights cannot derive from names and roles (e.g. sinusoidal positions):
  // runs after the generic initialization of parameter `param`, before the next one's.
  virtual void init_extra(Backend&, int /*param*/) {}
  // Staged weights: whether the embeddings' backward reads them (an embedding LayerNorm).
  virtual bool embed_backward_reads_weights() const { return false; }
  // Whether the blocks' linear weights are stored [in, out] (transformers' Conv1D).
  virtual bool blocks_store_linears_transposed() const { return false; }
  // The prefix of the base model's parameter names ("bert.", "transformer.").
  virtual const char* base_prefix() const = 0;
  // Width of the head's largest linear output (vocabulary for an LM head, hidden for a pooler).
  virtual int64_t head_width() const = 0;

  DType activation_dtype() const { return options_.activation_dtype; }
  Device device() const { return options_.device; }

  // Helpers for subclasses.
  // A parameter (declared in order: the embeddings', each block's after enter_layer, the head's
  // after enter_head). Returns its index, or -1 when a pipeline stage does not hold it: a block
  // outside its run, the embeddings past the first stage (but a tied head's on the last), the
  // head before the last.
  int param(const std::string& name, Shape shape, ParamRole role);
  // A parameter of the whole model this one does not hold (another expert rank's expert): it
  // keeps the others' places in the order, so that every rank's initial values are the whole
  // model's.
  void skip_param() { numbered(-1); }
  void enter_layer(int64_t layer) { section_ = layer; }
  void enter_head() { section_ = config_.num_layers; }
  // A parameter tensor parallelism splits along `dim` (its `pieces` parts each: ParamSplit):
  // `shape` is this rank's share of it (the config's counts are); whole without tensor
  // parallelism.
  int split_param(const std::string& name, Shape shape, ParamRole role, int dim, int pieces = 1);
  // A vocabulary table (word embeddings, a language-model head's weight or bias): `shape`'s
  // first dimension is the whole vocabulary. Under tensor parallelism each rank holds an equal
  // run of its rows (Megatron's vocabulary parallelism), the last rank's padded where the ranks
  // do not divide the vocabulary.
  int vocab_param(const std::string& name, Shape shape, ParamRole role);
  // A block's norm parameter: under Megatron's sequence parallelism each tensor rank's gradient
  // of it is its tokens' part (ParamSplit::partial), which the group sums.
  int token_param(const std::string& name, Shape shape);
  // Parameter `param` may be read too from tensor `name` of a weights file, shaped `shape`, from
  // its element `first` on: a layout packing several parameters into one tensor (transformers
  // 5's experts, [E, 2F, C] gate_up_proj). Its own name is looked for first.
  void also_packed_in(int param, const std::string& name, Shape shape, int64_t first);
  // Parameter `param` may be read too from tensor `name` of its own shape (another spelling a
  // converter writes); its own name is looked for first.
  void also_named(int param, const std::string& name);
  // A key/value projection's weight or bias (split by output like split_param's dim 0), which
  // tensor ranks beyond the key/value heads hold in copies (ParamSplit::copies).
  int kv_param(const std::string& name, Shape shape, ParamRole role);
  // embedding_forward of the word table `word` (a vocab_param) and the given position rows and
  // type table into out [B,T,C]; under tensor parallelism each rank adds its rows' tokens and
  // the ranks' outputs are summed (the positions and types added once).
  void embed_tokens(Backend& be, const Tensor& ids, int word, const Tensor& pos,
                    const Tensor& type_ids, const Tensor& types, const Tensor& out);
  // Its backward: dout's rows into this rank's rows of `word`'s gradient, dpos and dtypes.
  void embed_tokens_backward(Backend& be, const Tensor& dout, const Tensor& ids,
                             int64_t padding_idx, const Tensor& type_ids, int word,
                             const Tensor& dpos, const Tensor& dtypes);
  void declare(MemoryPlan& plan, Tensor* view, const std::string& name, Category category,
               DType dtype, Shape shape) {
    binder_.declare(plan, view, name, category, dtype, shape);
  }
  // An input the host writes: a host buffer (category data) and, on a GPU, its device copy
  // (on the CPU the two views are the same buffer). forward_step uploads every input. Under
  // sequence parallelism a [B, T] input (`shape` this rank's tokens) is the whole sequences'
  // [B, T * ranks] on the host, and the device copy holds this rank's tokens (copied out on the
  // host, then uploaded), but for `whole_sequences` (the attention mask: attention reads every
  // token).
  void declare_input(MemoryPlan& plan, Tensor* host, Tensor* device, const std::string& name,
                     Shape shape, DType dtype = DType::i32, bool whole_sequences = false);
  const PlanOptions& plan_options() const { return options_; }
  // A constant: host and device copies as an input's, uploaded once after bind.
  void declare_constant(MemoryPlan& plan, Tensor* host, Tensor* device, const std::string& name,
                        Shape shape, DType dtype);
  // The embeddings' output [B, T, C] and the head's input, and their gradients: hidden_[0],
  // hidden_[L] and d_hidden_, or under Megatron's sequence parallelism (where those hold this
  // tensor rank's tokens) every token's, which the model slices and gathers around the blocks.
  const Tensor& embedding_output() const { return slices_tokens() ? tokens_ : hidden_[0]; }
  const Tensor& head_input() const {
    return slices_tokens() ? tokens_ : hidden_[static_cast<size_t>(config_.num_layers)];
  }
  const Tensor& head_input_grad() const { return slices_tokens() ? d_tokens_ : d_hidden_; }
  const Tensor& embedding_grad() const { return slices_tokens() ? d_tokens_ : d_hidden_; }
  Tensor w(int index) const { return params_.weight(index); }
  Tensor g(int index) const { return params_.grad(index); }
  Tensor loss_sum() const {
    return Tensor(stats_.as<double>() + kStatLoss, Shape{1}, DType::f64, stats_.device());
  }
  // Adds `value` to the summed loss (a term computed on the host).
  void add_to_loss(Backend& be, double value);
  void check_ids(const Tensor& ids, int64_t limit, const char* what) const;
  // Causal LM: each label is a token id or kIgnoreIndex; position t's target is label t + 1.
  void check_token_labels() const;
  void shift_labels(const Tensor& targets) const;
  // The embedding table whose row config().pad_token_id is padding (nn.Embedding's
  // padding_idx): initialized to zero; the model's backward gives it no gradient.
  void set_padded_embedding(int index) { padded_embedding_ = index; }
  static RngKey site(const StepOptions& o, uint32_t site) {
    RngKey k = o.rng;
    k.site = site;
    return k;
  }
  // Dropout (backward: its gradient) over x [B, T, C] of the model's tokens, keyed as one process
  // keys the whole sequences (per_sequence).
  void token_dropout(Backend& be, const Tensor& x, float p, const RngKey& key, const Tensor& y,
                     bool backward = false) const;
  // The tokens of each sequence this model computes on (all but under sequence parallelism), and
  // the position of the first.
  int64_t tokens() const { return token_shape(shape_).seq; }
  int64_t first_token() const { return config_.sequence_rank * tokens(); }
  // A position table [P, C]'s rows from row `first` on (embedding_forward adds row t to token
  // t): refused unless `count` tokens from `first` lie in the table (`what` names it). Without
  // `first`, from the model's first token, for its tokens.
  static Tensor position_rows(const Tensor& table, int64_t first, int64_t count, const char* what);
  Tensor position_rows(const Tensor& table) const {
    return position_rows(table, first_token(), tokens(), "the position table");
  }
  ModelConfig config_;
  ParameterSet params_;
  BatchShape shape_, planned_;
  Batch batch_;      // host
  Batch dev_batch_;  // what the kernels read
  // Whether the micro-batch's attention mask hides a key (forward_step): where it hides none the
  // blocks' attention runs unmasked (key_mask()), the same values without the mask's work (a
  // GPU's fused attention builds a [B, T, T] bias from it). BRISK_UNMASKED_ATTENTION=0 keeps it.
  bool hides_keys_ = true;
  // Whether the mask is right-padded (each row keeps its first keys): then key_mask() gives the
  // rows' key counts with it (key_lengths_, uploaded from key_lengths_host_ per micro-batch).
  // BRISK_KEY_LENGTHS=0 gives the mask alone, to compare.
  bool keys_right_padded_ = false;
  Tensor key_lengths_host_, key_lengths_;
  PackedSamples samples_;              // use_samples
  Tensor held_step_host_, held_step_;  // PlanOptions::held_step
  // PlanOptions::packed_samples: where samples_.at and .positions lie (load_samples).
  Tensor sample_starts_host_, sample_starts_, positions_host_, positions_;
  void load_samples(Backend& be);
  // A buffer the host writes and uploads itself (not one of the batch's inputs): its host copy,
  // and a device copy where the device has its own memory.
  void declare_uploaded(MemoryPlan& plan, Tensor* host, Tensor* device, const std::string& name,
                        DType dtype, Shape shape);
  KeyMask key_mask() const;
  std::vector<Tensor> hidden_;  // hidden_[l] is the input of block l; hidden_[L] the last output
  // How the blocks' inputs are kept: each its own buffer, or (between the stage's first and last)
  // two buffers in turn, which backward reads nothing from (no gradients) or rebuilds.
  enum class BlockInputs : uint8_t { kept, in_turn, rebuilt };
  BlockInputs block_inputs_ = BlockInputs::kept;
  BlockInputs block_inputs(const PlanOptions& options, const BlockStyle& style) const;
  void declare_hidden(MemoryPlan& plan, const Shape& btc);
  // Whether block l's input was written over in forward (in_turn's buffers) and backward must
  // rebuild it.
  bool rebuilds_input(int64_t l) const;
  Tensor d_hidden_;  // gradient flowing backwards through the blocks
  Tensor logits_;
  BlockScratch scratch_;

  // Language-model heads: logits_ holds a chunk of rows ([B,T,V] when all rows fit); the head's
  // input gradient [B,T,C] is written during the forward pass (lm_head_forward) and read by
  // head_backward (lm_head_dx).
  // `weight`: the head's weight parameter, as lm_head_forward gets it; `biased`: whether it gets
  // a bias too. In bf16 on a device that wants it (DeviceTraits::bf16_head_row_multiple), the
  // head's logits rows are padded: V' = logits_width() >= V columns, the weight padded with zero
  // rows alike (Backend::hold_padded_weight), a bias with zeros (head_bias_).
  void declare_lm_logits(MemoryPlan& plan, const BatchShape& s, int weight, bool biased);
  // logits = x W^T (+ b) over the rows of x [B,T,C], then their softmax cross-entropy against
  // labels (one per row; the loss added to loss_sum()), chunk by chunk; with o.compute_grad also
  // each chunk's backward: lm_head_dx's rows = dlogits W, and dW (db) += its share. W is
  // parameter `weight` ([V,C], out_in), b parameter `bias` (-1: none). Where the backend reads
  // bf16 product inputs and the device groups them (DeviceTraits::head_grad_chunks), the chunks'
  // dlogits are rounded once into head_dlogits_, which both products read as they are, and dW
  // gets the share of a group of chunks at a time (two: the [V,C] gradient is read and written
  // half as often).
  void lm_head_forward(Backend& be, const StepOptions& o, const Tensor& x, int weight, int bias,
                       const Tensor& labels);
  const Tensor& lm_head_dx() const { return head_dx_; }
  // The language-model loss of a chunk of logits and labels (its gradient in place, or in `grad`):
  // under tensor parallelism, of this rank's vocabulary columns, with the others' statistics.
  void lm_loss(Backend& be, const StepOptions& o, const Tensor& logits, const Tensor& labels,
               const Tensor& grad);

 private:
  // A weights file's tensor a parameter is read from, from its element `first` on (`packed`: a
  // tensor also_packed_in names, its shape checked).
  struct WeightSource {
    std::string name;
    int64_t first = 0;
    bool packed = false;
  };
  // Where `file` holds parameter i: its name, its name without the base model's prefix
  // (base_only), or a packed tensor (also_packed_in); an empty name where it holds none of them.
  WeightSource weight_source(const WeightFiles& file, size_t i) const;
  // The shape of tensor `name` as parameter `param` reads it (a 4-bit weight's, turned back to
  // the parameter's layout where the blocks store their linears transposed).
  Shape source_shape(const WeightFiles& file, const std::string& name, size_t param) const;
  // Whether parameter `param` is a linear's weight the blocks store [in, out] (a Conv1D's).
  bool stored_transposed(size_t param) const;

  struct PackedSource {
    std::string name;
    Shape shape;
    int64_t first = 0;
  };
  std::map<int, PackedSource> packed_;  // by parameter index
  std::map<int, std::string> aliases_;  // by parameter index

  BufferBinder binder_;
  PlanOptions options_;
  Tensor head_dx_;
  Tensor head_stats_;          // [tensor ranks, chunk rows, 3]: vocabulary parallelism's (lm_loss)
  Tensor head_dlogits_;        // [rows of a group of chunks, V] bf16 (bf16 runs; else empty)
  Tensor head_bias_;           // [V'] a padded head's bias, zeros past the vocabulary's (or empty)
  bool lm_grouped_ = false;    // head_dlogits_ is declared (decided by the full length's plan)
  bool replanning_ = false;    // use_seq is planning a shorter length
  int64_t lm_chunk_rows_ = 0;  // rows of a logits chunk (0: no LM head)
  int64_t lm_width_ = 0;       // its columns: the vocabulary rows, or padded (declare_lm_logits)
  int64_t lm_rows_ = -1;       // the rows the last lm_head_forward computed
  int lm_head_weight_ = -1;    // the LM head's weight parameter
  Arena* arena_ = nullptr;
  std::map<int64_t, std::vector<Shape>> seq_shapes_;  // use_seq: the views' shapes per length
  BlockStyle style(bool training) const;
  // Where each adapter adds (ModelAdapters::place): the products of its layer, the block's and
  // its sparse MLP's.
  void place_adapters();
  // A step's: its dropout and, in training, its key for the adapters'.
  BlockStyle step_style(const StepOptions& o) const;
  std::vector<BlockSaved> saved_;  // what each block's forward and backward work on
  // Mixed precision without checkpointing: the 16-bit copies of each block's low-precision
  // tensors, and the shared float32 set the block computes in (saved_[l] views it).
  std::vector<BlockSaved> stored_;
  BlockSaved work_;
  BlockSaved shared_stored_;  // the recomputable tensors' shared 16-bit copies
  Tensor shared_attn_stats_;  // selective recomputation: every block's statistics, in turn
  // plan's parts: the flat weights, constants and gradients; the blocks' saved activations
  // (plan_low_precision_saved: mixed precision's 16-bit copies); a step's other buffers.
  void plan_flat_buffers(MemoryPlan& plan, BatchShape shape, const PlanOptions& options);
  BlockDims layer_dims(const BlockDims& dims, const BlockStyle& style, int64_t l) const;
  void plan_saved(MemoryPlan& plan, const BlockStyle& style, const BlockDims& dims,
                  const PlanOptions& options);
  void plan_low_precision_saved(MemoryPlan& plan, const BlockStyle& style, const BlockDims& dims,
                                const PlanOptions& options);
  void plan_step_buffers(MemoryPlan& plan, BatchShape shape, const BlockStyle& style,
                         const BlockDims& dims);
  // PlanOptions::gradients_over_activations: whether the plan lays them so (decided by
  // plan_flat_buffers, which then leaves them to declare_gradients_over_blocks), and where the
  // tensors the blocks keep for backward start and each block's end: their saved tensors, or
  // under gradient checkpointing their inputs. Whoever declares those, block after block, calls
  // begin_blocks_kept first and end_block_kept after each block, which after the last lays the
  // gradients over them.
  bool grads_over_blocks_ = false;
  size_t blocks_start_ = 0;
  std::vector<size_t> block_ends_;
  void begin_blocks_kept(const MemoryPlan& plan);
  void end_block_kept(MemoryPlan& plan, bool last);
  void declare_gradients_over_blocks(MemoryPlan& plan);
  // How far before the blocks' end the flat gradients may start; `embeddings_over_blocks`:
  // whether the embeddings' segment may lie over the blocks' tensors (nothing writes it before
  // their backward).
  size_t gradient_reach(bool embeddings_over_blocks) const;
  // A tied head's weight gradient apart from the flat gradients (gradients_over_activations),
  // where that lays more of them over the blocks' tensors than it takes (decided for the planned
  // length): the tied table's parameter, or -1 where its gradient lies in the flat gradients.
  int tied_apart_ = -1;
  Tensor tied_head_grad_;
  // Whether the embeddings' gradients lie over the blocks' tensors: nothing writes them before
  // the embeddings' backward (no tied head, or its gradient apart).
  bool embeddings_over_blocks() const { return !head_reads_embeddings() || tied_apart_ >= 0; }
  // The tied embedding table's parameter (embedding and product operand), or -1.
  int tied_table() const;
  // The gradient the language-model head's weight `weight` is written into.
  Tensor head_weight_grad(int weight) const;
  // The bias the head's products add: `bias`, or a padded head's copy of it (head_bias_).
  Tensor head_bias(Backend& be, const Tensor& bias) const;
  // Whether the blocks' low-precision tensors live only in their 16-bit stored copies, which the
  // backend reads as they are (block_forward's `stored`).
  bool direct_saved_tensors(const Backend& be) const;
  // Block tensors of `s` that backward rebuilds (PlanOptions::recomputes_elementwise), else none.
  std::array<Tensor*, 3> rebuilt(BlockSaved& s, const BlockStyle& st) const;
  Tensor flat_weights_, flat_grads_;
  // The gradient segments of the parameter layout (found at creation) and, after bind, of the
  // bound buffers (none for the weights alone).
  std::vector<ElementRange> segments_, grad_segments_;
  void find_grad_segments();
  std::vector<ElementRange> segments_by_block() const;
  SegmentLayout weight_layout_, grad_layout_;
  WeightSlots* weight_source_ = nullptr;
  ModelParallelism parallelism_;
  std::unique_ptr<ModelAdapters> adapters_;  // LoRA's, where attached
  // Whether parameter i is an adapter's A or B; their initial values (init_weights).
  bool adapter_param(size_t i) const;
  void init_adapter(Backend& be, size_t i, uint64_t seed);
  // Sequence parallelism's [B, T] inputs: (whole sequences on the host, this rank's tokens on
  // the host), copied by slice_inputs before the uploads; token_inputs_ holds the latter.
  std::vector<std::pair<Tensor*, Tensor*>> sliced_;
  std::array<Tensor, 4> token_inputs_;
  void slice_inputs() const;
  // A rank past a sequence's first token: the batch's per-sequence labels (a classifier's, a
  // regression's) become "none", so its head adds no loss and no gradient (the rank holding the
  // first token computes them).
  void drop_sequence_labels();
  // The plan's shape of this model's tokens.
  BatchShape token_shape(BatchShape shape) const;
  // Declaring parameters: the section (-1 the embeddings, a block's layer, num_layers the head)
  // and how many the whole model has declared so far.
  int64_t section_ = -1;
  std::vector<int64_t> param_sections_;  // by parameter: the section it was declared in
  int declared_ = 0;
  bool stage_holds(ParamRole role) const;
  // The stage's own parameter after params_.add returned `index` (-1: none).
  int numbered(int index);
  // Zeros the padding rows of vocabulary table i (vocab_param), which no id reads.
  void clear_padding(Backend& be, int i);
  Tensor stashed_;  // [stashed_inputs, B, T, C]
  // Megatron's sequence parallelism: every token's embeddings or head input, and their gradient
  // (on the first and last pipeline stages).
  Tensor tokens_, d_tokens_;
  // The stream's tokens of `shape` (this tensor rank's under Megatron's sequence parallelism).
  int64_t stream_tokens(const BatchShape& shape) const;
  // Staged weights: segment `segment`'s weights before it runs, and `next`'s started (-1: none)
  // where its place overlaps none in use.
  void need_weights(int segment, int next) const;
  // The segment holding logical element `at`.
  int segment_of(int64_t at) const;
  // While weights are written (init, load): `i` of the parameters was written; reports the
  // segments complete by then to the weight slots.
  void written(size_t i) const;
  void written_all() const;
  std::vector<std::pair<Tensor*, Tensor*>> inputs_;     // (host, device) pairs to upload
  std::vector<std::pair<Tensor*, Tensor*>> constants_;  // the same, uploaded once
  // The constants' (host, device) views at the planned length, taken at bind: use_seq reshapes
  // the views to a prefix, and the upload must cover the whole table.
  std::vector<std::pair<Tensor, Tensor>> planned_constants_;
  mutable bool constants_uploaded_ = false;
  Tensor stats_, stats_host_, control_;
  int padded_embedding_ = -1;
};

}  // namespace brisk
