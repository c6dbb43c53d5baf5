// The assembly of a run (see assembly.h).
#include "train/assembly.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <set>

#include "adapters/attach.h"
#include "backend/device_traits.h"
#include "core/step_control.h"
#include "core/switches.h"
#include "core/weight_files.h"
#include "data/first_samples.h"
#include "data/packing.h"
#include "data/synthetic.h"
#include "data/token_file.h"
#include "parallel/mesh.h"
#include "parallel/pipeline_parallel.h"
#include "train/checkpoint.h"
#include "train/deepspeed.h"
#include "train/parallelism_config.h"

namespace brisk {

namespace {
std::unique_ptr<Dataset> make_dataset(const TrainOptions& o, const ModelConfig& c,
                                      const BatchLayout& layout) {
  BRISK_CHECK(c.task != ModelTask::masked_lm,
              "masked language modeling learns from text files: give --train_file");
  if (o.dataset == "synthetic")
    return std::make_unique<SyntheticDataset>(
        SyntheticOptions{o.dataset_size, o.seq_len, 100, 30000, o.seed, o.synthetic_task},
        c.vocab_size, layout.labels_per_token);
  BRISK_CHECK(layout.labels_per_token, "token files train causal LMs; the ", c.type_name(),
              " model needs --dataset synthetic");
  return std::make_unique<TokenFileDataset>(o.dataset, o.seq_len, c.vocab_size);
}

// --packing: the training rows packed into rows of the run's length (TRL's "bfd"), noted in the
// log.
void pack_training_rows(RunAssembly& r, const BatchLayout& layout) {
  BRISK_CHECK(r.files.rows && layout.labels_per_token,
              "--packing packs rows of text: give --line_by_line or a file with prompt and "
              "completion columns (blocks are full already; a classifier's rows are not packed)");
  const int64_t samples = r.owned_data->size();
  auto packed = std::make_unique<PackedDataset>(std::move(r.owned_data), r.files.seq_len);
  char fill[32];
  std::snprintf(fill, sizeof fill, "%.1f%%", 100 * packed->fill_ratio());
  r.files.notes.push_back("--packing: " + std::to_string(samples) + " training samples in " +
                          std::to_string(packed->size()) + " rows of " +
                          std::to_string(r.files.seq_len) + " tokens, " + fill + " of them filled");
  r.owned_data = std::move(packed);
}

// The data of a run on text files: the training, evaluation and prediction sets read from them.
void assemble_file_data(RunAssembly& r, const BatchLayout& layout, bool evaluates) {
  const TrainOptions& o = r.options;
  BRISK_CHECK(!evaluates || r.files.eval || o.validation_file.empty(), "validation file '",
              o.validation_file, "' holds no rows to evaluate");
  BRISK_CHECK(!evaluates || r.files.eval, "evaluation needs --validation_file",
              layout.labels_per_token ? " (or --validation_split_percentage above 0)" : "");
  BRISK_CHECK(!o.do_predict || r.files.test, "do_predict needs --test_file");
  r.eval_data = r.files.eval.get();
  r.test_data = r.files.test.get();
  // A run that does not train still plans a loader: over the data it evaluates.
  r.owned_data = r.files.train ? std::move(r.files.train) : nullptr;
  if (o.packing && r.owned_data) pack_training_rows(r, layout);
  r.data = r.owned_data ? r.owned_data.get() : r.eval_data ? r.eval_data : r.test_data;
}

// The data of a run on the given training set, or on the options' synthetic data or token file;
// synthetic evaluation and prediction sets, seeded apart from the training samples.
void assemble_other_data(RunAssembly& r, const BatchLayout& layout, bool evaluates,
                         GivenData dataset) {
  const TrainOptions& o = r.options;
  BRISK_CHECK(!o.packing,
              "--packing packs rows of text files: give --train_file with "
              "--line_by_line or prompt and completion columns");
  r.owned_data = dataset.train
                     ? nullptr
                     : first_samples(make_dataset(o, r.config, layout), o.max_train_samples);
  r.data = dataset.train ? dataset.train : r.owned_data.get();
  if (!evaluates && !o.do_predict) return;
  BRISK_CHECK(o.dataset == "synthetic", "evaluation and prediction need --dataset synthetic ",
              "for now (a token file has no evaluation split)");
  const auto synthetic = [&](uint64_t seed) {
    return std::make_unique<SyntheticDataset>(
        SyntheticOptions{o.eval_dataset_size, o.seq_len, 100, 30000, seed, o.synthetic_task},
        r.config.vocab_size, layout.labels_per_token);
  };
  if (evaluates) r.owned_eval = synthetic(o.seed + 1);
  BRISK_CHECK(!o.do_predict || !layout.labels_per_token,
              "do_predict writes class predictions; a causal LM has no labels to predict");
  if (o.do_predict) r.owned_test = synthetic(o.seed + 2);
  r.eval_data = r.owned_eval.get();
  r.test_data = r.owned_test.get();
}

}  // namespace

const char* adapters_unbuilt_with(const ParallelLayout& layout, int zero_stage,
                                  bool quantized_base) {
  const bool stage3 = zero_stage > 2 && layout.replicas() > 1;
  return layout.on(MeshDim::pipeline)                   ? "--pp_size"
         : layout.on(MeshDim::sequence)                 ? "--sp_size"
         : layout.on(MeshDim::expert)                   ? "--ep_size"
         : stage3 && quantized_base                     ? "--load_in_4bit and --zero_stage 3"
         : stage3 && layout.on(MeshDim::tensor)         ? "--tp_size and --zero_stage 3"
         : quantized_base && layout.on(MeshDim::tensor) ? "--load_in_4bit and --tp_size"
                                                        : nullptr;
}

namespace {

// LoRA (--use_peft, or an adapter folder): its config from the folder or the lora_* options,
// attached to the model (its targets resolved against the model's linears: a bad name is
// refused here, before any data is read). Pipeline, sequence and expert parallelism, and ZeRO
// stage 3 beside a 4-bit base or tensor parallelism, are not built with adapters yet: refused
// by name.
void attach_adapters(RunAssembly& r) {
  const TrainOptions& o = r.options;
  if (!o.use_peft && o.adapter_name_or_path.empty()) return;
  LoraConfig given =
      o.adapter_name_or_path.empty()
          ? lora_config(o.lora_r, o.lora_alpha, o.lora_dropout, o.lora_target_modules,
                        o.lora_modules_to_save, o.use_rslora, o.lora_target_parameters)
          : read_adapter_folder(o.adapter_name_or_path, "--adapter_name_or_path");
  if (o.adapter_name_or_path.empty()) {
    given.rank_pattern = pattern_option(o.lora_rank_pattern, "--lora_rank_pattern", true);
    given.alpha_pattern = pattern_option(o.lora_alpha_pattern, "--lora_alpha_pattern", false);
  }
  const LoraConfig c = lora_for_task(given, *r.model);
  const char* layout = adapters_unbuilt_with(r.layout, o.zero_stage, o.load_in_4bit);
  BRISK_CHECK(layout == nullptr, "LoRA adapters with ", layout,
              " are not built yet: train them with data parallelism (DDP, or ZeRO stage 1 to "
              "3) and tensor parallelism (--tp_size, with a 16- or 32-bit base, ZeRO 1 or 2)");
  r.unmatched_targets = attach_lora(*r.model, c).unmatched;
  r.adapter = saved_adapter_config(c, *r.model, o.model_name_or_path);
}

// The frozen base's block linears in a store of their own, the model's weights staged in its
// slots (before the model's plan): QLoRA's 4-bit store, or in a bf16 or fp16 LoRA run one of that
// type (its products round the weights to it anyway: the same results at half the bytes).
void plan_frozen_base(RunAssembly& r, PlanOptions& model_options) {
  const TrainOptions& o = r.options;
  const DType compute = r.precision->compute_dtype();
  const bool half = r.adapter && compute != DType::f32 && o.switches.half_frozen_base;
  // (Under ZeRO stage 3 the ranks hold the base's blocks between them instead.)
  if ((!o.load_in_4bit && !half) || !r.parallel.base_shards.empty()) return;
  Quant4Options q{o.bnb_4bit_quant_type == "fp4" ? Quant4Type::fp4 : Quant4Type::nf4,
                  o.use_bnb_nested_quant};
  if (!o.load_in_4bit) q.half = compute;
  q.round_to_fp16 = o.load_in_4bit && compute == DType::f16;
  r.quantized = std::make_unique<QuantizedBase>(*r.model, q);
  if (q.kept_16bit() && r.quantized->quantized_params() == 0) {  // nothing to hold apart
    r.quantized.reset();
    return;
  }
  BRISK_CHECK(r.quantized->quantized_params() > 0, "--load_in_4bit: the ",
              r.model->config().type_name(),
              " model's blocks cannot be held in turn (too few blocks, or blocks unlike each "
              "other), so no linear would be kept 4-bit");
  model_options.weight_slots = QuantizedBase::kSlots;
  model_options.slot_holes = r.quantized->slot_holes();
  r.weights_copy = false;              // the blocks' weights are not resident: no bf16 copy of them
  model_options.resident_ends = true;  // the store brings back the blocks alone
}

// The model's config and the data: text files (their tokenizer sets the sequence length), the
// given dataset, or the options' synthetic data or token file. Returns the model's batch layout.
BatchLayout assemble_model_and_data(RunAssembly& r, GivenData dataset, int64_t B) {
  TrainOptions& o = r.options;
  r.config = resolve_config(o.model_name_or_path);
  if (o.mlm) use_masked_lm(r.config);
  use_router_options(r.config, o.router_z_loss_coef, o.moe_capacity_factor);
  const bool files = !dataset.train && (dataset.tokenized || uses_text_files(o));
  // Synthetic data is labelled: a head taken from `architectures` gives way to it, as to
  // labelled files (train/file_data).
  if (!files && r.config.task_from_architectures) use_sequence_classification(r.config);
  if (files) {
    // Classification: the config learns the labels.
    r.files = dataset.tokenized ? tokenized_data(o, r.config, *dataset.tokenized)
                                : load_file_data(o, r.config);
    r.files.train = first_samples(std::move(r.files.train), o.max_train_samples);
    r.files.eval = first_samples(std::move(r.files.eval), o.max_eval_samples);
    r.files.test = first_samples(std::move(r.files.test), o.max_predict_samples);
    o.seq_len = r.files.seq_len;
  }
  r.model = Model::create(rank_share(r.config, r.layout, r.place));
  attach_adapters(r);
  const BatchLayout layout = r.model->batch_layout(B, o.seq_len);
  const bool evaluates = o.do_eval || o.eval_strategy != "no";
  if (files)
    assemble_file_data(r, layout, evaluates);
  else
    assemble_other_data(r, layout, evaluates, dataset);
  return layout;
}

// Whether a bf16 run with master weights computes with float32 weights instead of a 16-bit
// compute copy and a master: where the products round their operands themselves (the CPU) or
// cast them as they read them (a GPU), always. That holds 4 bytes a parameter on the device
// against the compute copy's 4 and the master's (4, 4/N under ZeRO 1 and 2, none offloaded);
// weights_copy says where the products may read a bf16 copy of them besides.
bool computes_with_float32_weights(const DeviceTraits& traits) {
  return traits.products_round_operands || traits.bf16_weights_copy;
}

// Whether a GPU's products read a bf16 copy of the float32 weights, made once per hold
// (Backend::hold_weights), rather than casting each weight as they read it: where the copy's 2
// bytes a parameter hold no more than the master a compute copy would have kept (4 bytes, 4/N
// under ZeRO 1 and 2 over N replicas, none where it is offloaded). Not under ZeRO 3: its weights
// are gathered, not resident. (A CPU test asks for it wherever they are resident.)
bool weights_copy(const TrainOptions& o, const DeviceTraits& traits, bool offloaded, int replicas) {
  if (o.zero_stage == 3) return false;
  if (o.weights_copy_on_cpu) return true;
  const double master_bytes = offloaded           ? 0.0
                              : o.zero_stage >= 1 ? 4.0 / std::max(replicas, 1)
                                                  : 4.0;
  return traits.bf16_weights_copy && 2.0 <= master_bytes;
}

// Whether the run plans gradients and optimizer state. One that only evaluates or predicts needs
// neither, where its layout never reads them (data parallelism without ZeRO) and no checkpoint's
// optimizer state is loaded into it.
bool plans_training_state(const RunAssembly& r) {
  const TrainOptions& o = r.options;
  if (o.do_train || !o.resume_from_checkpoint.empty()) return true;
  return o.zero_stage > 0 || r.layout.model_parallel() || r.layout.on(MeshDim::expert);
}

// The precision policy, the optimizer, and where the optimizer's state lies; `replicas`: the
// ranks ZeRO partitions over.
void assemble_precision(RunAssembly& r, int replicas) {
  const TrainOptions& o = r.options;
  const DeviceTraits& traits = device_traits(r.device);
  // A CPU run's optimizer state is in host memory already: offload_optimizer changes nothing
  // there, unless a test asks for the GPU's path (offload_on_cpu).
  r.parallel.offload =
      o.do_train && o.offload_optimizer == "cpu" && (!traits.host_memory || o.offload_on_cpu);
  // fp16_full_eval / bf16_full_eval: as Trainer, a run that does not train evaluates in the
  // 16-bit type throughout (weights rounded, no float32 master copy); while training they have
  // no effect.
  const bool eval_only = !o.do_train;
  const DType compute = o.bf16 || (eval_only && o.bf16_full_eval)   ? DType::bf16
                        : o.fp16 || (eval_only && o.fp16_full_eval) ? DType::f16
                                                                    : DType::f32;
  const bool full_eval = eval_only && (o.bf16_full_eval || o.fp16_full_eval);
  // A run that plans no training state keeps no master copy either: fp16's weights are rounded
  // once, as an update would round them (bf16 computes with float32 weights there).
  const bool no_master = full_eval || (compute == DType::f16 && !plans_training_state(r));
  r.precision = no_master
                    ? std::make_unique<MixedPrecision>(compute, MixedPrecision::kNoMaster)
                    : std::make_unique<MixedPrecision>(
                          compute, o.bf16_master_weights, LossScalerOptions{},
                          MixedPrecision::float32_weights_on(computes_with_float32_weights(traits),
                                                             compute, o.bf16_master_weights));
  r.weights_copy = weights_copy(o, traits, r.parallel.offload, replicas);
  r.product = product_dtype(r.device, r.precision->compute_dtype(), o.switches.cpu_products);
  r.optimizer = make_optimizer(optimizer_config(o));
  if (r.parallel.offload) {
    r.precision->offload_master();
    r.optimizer->keep_state_in(Placement::host);
  }
}

// The dtype the products read their operands in: with float32 weights they round them to bf16,
// with or without bf16 units.
DType product_operands(const RunAssembly& r) {
  return r.precision->float32_weights() ? DType::bf16 : r.product;
}

// The backend's products in the run's operand dtype and TF32 choice, set before anything is
// planned that asks how it multiplies.
void configure_products(const RunAssembly& r, Backend* backend) {
  if (!backend) return;
  backend->set_matmul_dtype(product_operands(r));
  backend->set_tf32(r.options.tf32);
}

// Whether the products read the blocks' 16-bit stored activations as they lie: the backend's
// answer (configure_products set its dtype); planning without one, every backend's for bf16
// operands and activations (a GPU's BRISK_BF16_ACTIVATIONS=0 aside).
bool reads_stored_copies(const RunAssembly& r, const Backend* backend) {
  const DType stored = r.precision->compute_dtype();
  if (!backend) return stored == DType::bf16 && product_operands(r) == DType::bf16;
  return backend->reads_product_input(stored);
}

// The products' workspace: the backend's own declarations, or (planning without one) the same
// into `r.workspace`.
void plan_products(RunAssembly& r, Backend* backend) {
  MatmulOperands max_operands = r.model->matmul_operands();
  // The products' bf16 copy of float32 weights (weights_copy).
  if (r.weights_copy && r.precision->float32_weights())
    max_operands.weights = r.model->params().total_elements();
  // QLoRA's products of 4-bit weights: one weight dequantized at a time.
  if (r.quantized) {
    max_operands.quantized = r.quantized->largest_product();
    max_operands.quantized_blocked = r.quantized->largest_product_blocked();
  }
  if (backend)
    backend->plan_workspace(r.plan, r.binder, max_operands);
  else
    plan_backend_workspace(r.device, product_operands(r), max_operands, r.plan, r.binder,
                           r.workspace, r.options.switches.cpu_products);
}

// Whether every optimizer step is one micro-batch (no accumulation, no pipeline's): its
// gradients are needed from its backward to its update only (the ranks' sums included).
bool one_micro_batch(const TrainOptions& o, const ParallelLayout& layout) {
  return !layout.on(MeshDim::pipeline) && o.gradient_accumulation_steps == 1;
}

}  // namespace

void switch_paths(PlanOptions& p, const DeviceTraits& traits, const Switches& s) {
  p.recompute_norms = traits.recompute_norms;
  p.recompute_activation = traits.recompute_activation && s.recompute_activation;
  p.labelled_rows_only = s.labelled_rows_only;
  p.held_step = traits.records_steps && s.recorded_steps;
  p.unmasked_attention = s.unmasked_attention;
  p.key_lengths = s.key_lengths;
  p.fused_residual_norm = s.fused_residual_norm;
  p.pad_head = s.pad_head;
  p.bf16_head_grad = s.bf16_head_grad;
}

ResolvedRun resolve_run(const TrainOptions& given, int ranks) {
  ResolvedRun r;
  r.options =
      apply_parallelism_config(apply_deepspeed_config(given, ranks, &r.deepspeed_ignored), ranks);
  validate_options(r.options);  // once, over what the user gave and the config files add
  r.layout = parallel_layout(r.options, ranks);
  BRISK_CHECK(ranks <= 1 || !r.options.auto_find_batch_size, "--auto_find_batch_size in a run of ",
              ranks, " processes is not supported yet");
  r.device = resolve_device(r.options);
  return r;
}

void check_weights_to_evaluate(const TrainOptions& o) {
  if (o.do_train || !o.resume_from_checkpoint.empty() || is_builtin_config(o.model_name_or_path))
    return;
  const std::string& m = o.model_name_or_path;
  const bool weights = std::filesystem::is_directory(m) && !WeightFiles::find_in_folder(m).empty();
  BRISK_CHECK(weights, "'", m, "' holds no model.safetensors: evaluating or predicting ",
              "without training needs trained weights; give the folder of a trained model, or "
              "train first");
}

std::vector<AgreedValue> agreed_values(const TrainOptions& o) {
  std::vector<AgreedValue> values;
  auto add = [&](const std::string& name, const auto& value) {
    values.push_back({name, nlohmann::json(value).dump()});
  };
  // The options that shape the layout or a step (paths may differ between hosts).
  static const std::set<std::string> agreed = {"tp_size",
                                               "pp_size",
                                               "sp_size",
                                               "ep_size",
                                               "zero_stage",
                                               "tp_sequence_parallel",
                                               "per_device_train_batch_size",
                                               "gradient_accumulation_steps",
                                               "max_steps",
                                               "num_train_epochs",
                                               "seq_len",
                                               "max_seq_length",
                                               "block_size",
                                               "dataset_size",
                                               "bf16",
                                               "fp16",
                                               "bf16_master_weights",
                                               "gradient_checkpointing",
                                               "selective_recompute",
                                               "optim",
                                               "offload_optimizer",
                                               "seed",
                                               "learning_rate",
                                               "do_train",
                                               "do_eval"};
  visit_options(o, [&](const char* name, const auto& field, const char*) {
    if (agreed.count(name)) add(option_source(o, name), field);
  });
  const ModelConfig c = resolve_config(o.model_name_or_path);
  const std::string in = o.model_name_or_path + "'s config ";
  add(in + "model_type", c.type_name());
  for (const auto& [name, value] : {std::pair<const char*, int64_t>{"vocab_size", c.vocab_size},
                                    {"hidden_size", c.hidden_size},
                                    {"num_hidden_layers", c.num_layers},
                                    {"num_attention_heads", c.num_heads},
                                    {"num_key_value_heads", c.kv_heads()},
                                    {"intermediate_size", c.intermediate_size},
                                    {"max_position_embeddings", c.max_position_embeddings},
                                    {"experts", c.moe.experts},
                                    {"num_experts_per_tok", c.moe.top_k},
                                    {"moe_intermediate_size", c.moe.inner}})
    add(in + name, value);
  return values;
}

// "last" (or "true", as Trainer.train(resume_from_checkpoint=True)).
TrainOptions resolve_checkpoint(const TrainOptions& options) {
  TrainOptions o = options;
  if (o.resume_from_checkpoint == "last" || o.resume_from_checkpoint == "true")
    o.resume_from_checkpoint = last_checkpoint(o.output_dir);
  if (o.resume_from_checkpoint.empty()) return o;
  BRISK_CHECK(std::filesystem::is_directory(o.resume_from_checkpoint), "checkpoint folder '",
              o.resume_from_checkpoint, "' does not exist");
  o.seed = checkpoint_seed(o.resume_from_checkpoint);
  return o;
}

std::unique_ptr<RunAssembly> assemble_run(const TrainOptions& options, Device device,
                                          Backend* backend, GivenData dataset, int rank,
                                          int world) {
  return assemble_run(options, device, backend, dataset, parallel_layout(options, world), rank);
}

std::unique_ptr<RunAssembly> assemble_run(const TrainOptions& options, Device device,
                                          Backend* backend, GivenData dataset,
                                          const ParallelLayout& parallel, int rank) {
  BRISK_CHECK(!backend || backend->device() == device, "the backend runs on another device");
  BRISK_CHECK(options.resume_from_checkpoint != "last" && options.resume_from_checkpoint != "true",
              "internal: --resume_from_checkpoint ", options.resume_from_checkpoint,
              " reached the assembly unresolved (resolve_checkpoint)");
  auto run = std::make_unique<RunAssembly>();
  RunAssembly& r = *run;
  r.options = options;
  const TrainOptions& o = r.options;
  r.device = device;
  r.layout = parallel;
  r.place = parallel.place(rank);
  const int ranks = parallel.degree(MeshDim::data);  // the shares of the data
  // A run that does not train plans for the evaluation batch.
  const int64_t B = o.do_train ? o.per_device_train_batch_size : o.per_device_eval_batch_size;
  const BatchLayout layout = assemble_model_and_data(r, dataset, B);
  LoaderOptions loading;
  loading.background = o.dataloader_num_workers > 0;
  loading.dynamic_padding = !o.pad_to_max_length;
  loading.padding_free = o.padding_free;
  loading.length_group_batch =
      o.group_by_length ? B * o.gradient_accumulation_steps * static_cast<int64_t>(ranks) : 0;
  loading.rank = r.place.data;
  loading.ranks = ranks;
  loading.length_multiple = parallel.sequence_multiple();
  // Training's batches; a run that does not train has none (the evaluator loads its own).
  if (o.do_train) r.loader = std::make_unique<DataLoader>(*r.data, layout, o.seed, loading);
  // The replicas that sum the gradients (and share ZeRO's partitions).
  const int replica = r.place.replica;
  assemble_precision(r, parallel.replicas());
  configure_products(r, backend);
  PlanOptions model_options{o.gradient_checkpointing, r.precision->compute_dtype(), device,
                            o.selective_recompute};
  switch_paths(model_options, device_traits(device), o.switches);
  model_options.recompute_block_inputs = true;
  model_options.gradients_over_activations = one_micro_batch(o, parallel);
  model_options.stashed_inputs = pipeline_stashed_inputs(r.model->config());
  model_options.gradients = plans_training_state(r);
  model_options.reads_stored_copies = reads_stored_copies(r, backend);
  model_options.packed_samples = o.padding_free || o.packing;
  if (!model_options.gradients) {
    // Nothing is kept for a backward pass: each block's internals in one shared set, as gradient
    // checkpointing lays them out (the same forward, bit for bit).
    model_options.gradient_checkpointing = true;
    model_options.selective_recompute = false;
  }
  const ParallelPlanOptions layout_options{replica, parallel.replicas(), o.zero_stage,
                                           o.stage3_prefetch_bucket_size, o.ddp_bucket_cap_mb};
  partition_parameters(*r.model, *r.optimizer, layout_options, r.parallel, model_options);
  plan_frozen_base(r, model_options);
  r.model->plan(r.plan, {B, o.seq_len}, model_options);
  if (r.quantized) r.quantized->declare(r.plan, r.binder);
  // ZeRO: the float32 master copy (16-bit training) is partitioned with the optimizer state;
  // adapters: it holds the trained parameters alone.
  const ParameterSet& params = r.model->params();
  const bool zero = !r.parallel.shards.empty();
  const ParameterSet::Run trained = params.trained_run();
  // The master copy's run where it holds one: at its place in the weight buffer (staged
  // weights, QLoRA's), but in stage 3's weight shard, which holds this rank's run of them.
  const ElementRange held =
      zero ? r.parallel.shards[static_cast<size_t>(replica)].elements : trained.elements;
  r.precision->plan(r.plan, r.binder, params.total_elements(),
                    !zero && !params.frozen()                       ? ElementRange{0, -1}
                    : zero && o.zero_stage >= 3 && !params.frozen() ? held
                                                                    : r.model->weight_place(held));
  plan_products(r, backend);
  plan_zero_buffers(*r.model, layout_options, r.parallel, r.optimizer_params, r.plan, r.binder);
  if (params.frozen() && !zero)
    r.optimizer_params =
        shard_params(params, ParamShard{trained.first, trained.last, trained.elements});
  if (model_options.gradients)
    r.optimizer->plan(r.plan, r.binder, zero || params.frozen() ? r.optimizer_params : params);
  plan_offload_buffers(*r.model, *r.precision, r.parallel, r.plan, r.binder);
  if (r.loader) r.loader->plan(r.plan, r.binder);
  if (r.eval_data || r.test_data)
    r.evaluator.plan(*r.model, r.plan, r.binder, loading.dynamic_padding, o.padding_free);
  r.plan.finalize();
  return run;
}

}  // namespace brisk
