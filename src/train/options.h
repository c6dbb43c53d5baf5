// Training options, named and defaulted as in transformers' TrainingArguments (plus brisk's data
// and model options). One table (visit_options) drives the command line, JSON option files and
// the echo of the options into checkpoints, so no option is spelled twice.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/switches.h"
#include "optim/optimizer.h"
#include "parallel/layout.h"
#include "train/schedule.h"

namespace brisk {

struct TrainOptions {
  // Model and data.
  std::string model_name_or_path = "bert-tiny";  // built-in name, config.json, or model folder
  std::string dataset = "synthetic";             // "synthetic" or a token file (causal LM)
  int64_t seq_len = 512;       // sequence length of the synthetic data / token file split
  int64_t dataset_size = 512;  // synthetic samples
  std::string synthetic_task = "random";  // "random" (the guides' dummy data) or "learnable"
  // The user's text files, as the example scripts take them (run_glue for BERT, run_clm for
  // GPT-2); when given they replace --dataset.
  std::string train_file, validation_file, test_file;
  std::string tokenizer_name;    // "": the model folder's tokenizer
  int64_t max_seq_length = 128;  // classification: tokens per example (truncated, padded)
  int64_t block_size = 0;        // causal LM: tokens per block (0: min(1024, n_positions))
  std::string text_column_name;
  int64_t validation_split_percentage = 5;  // causal/masked LM without a validation file
  // run_mlm: a BERT model learns masked tokens (BertForMaskedLM) instead of classifying.
  bool mlm = false;
  // ST-MoE's router z-loss on a mixture of experts (0: none, as the architectures define them).
  double router_z_loss_coef = 0;
  double moe_capacity_factor = 0;  // Switch's expert capacity (0: dropless)
  double mlm_probability = 0.15;
  // Masked or causal LM: one sample per non-blank line instead of grouped blocks.
  bool line_by_line = false;
  // Prompt/completion data (TRL's SFTTrainer): the loss on the completions' tokens only.
  bool completion_only_loss = true;
  // The example scripts' max_*_samples: only the first this many samples (0: all).
  int64_t max_train_samples = 0, max_eval_samples = 0, max_predict_samples = 0;
  // Load a model folder whose tensors differ in shape from the model's (a classifier of another
  // number of labels): those are initialized anew, as from_pretrained's option.
  bool ignore_mismatched_sizes = false;
  // LoRA (PEFT's LoraConfig, TRL's ModelConfig names and defaults): low-rank adapters on the
  // linears named by lora_target_modules (transformers' module names, comma-separated, or
  // "all-linear"; empty: PEFT's default for the model type), y = W x + (lora_alpha / lora_r)
  // B A dropout(x) (use_rslora: lora_alpha / sqrt(lora_r)); the base weights frozen;
  // lora_modules_to_save trained in full and saved with the adapter.
  bool use_peft = false;
  int64_t lora_r = 16;
  double lora_alpha = 32;
  double lora_dropout = 0.05;
  std::string lora_target_modules;
  std::string lora_modules_to_save;
  // PEFT's target_parameters: a mixture's fused expert weights ("mlp.experts.gate_up_proj",
  // "mlp.experts.down_proj"), each expert its own adapter.
  std::string lora_target_parameters;
  // PEFT's rank_pattern and alpha_pattern as JSON objects ({"q_proj": 8}): a target whose name
  // ends with a match of a pattern takes its rank or alpha. Empty: none.
  std::string lora_rank_pattern, lora_alpha_pattern;
  bool use_rslora = false;
  // A LoRA adapter folder (PEFT's adapter_config.json and adapter_model.safetensors, written by
  // PEFT or by brisk) loaded onto model_name_or_path: trained further, evaluated or predicted
  // with; its adapter_config.json sets the adapter (the lora_* options stay unset).
  std::string adapter_name_or_path;
  // QLoRA (TRL's ModelConfig names): the frozen base's block linears stored 4-bit as
  // bitsandbytes stores them (bnb_4bit_quant_type nf4 or fp4; use_bnb_nested_quant: the absmaxes
  // 8-bit too), dequantized block by block as the passes need them.
  bool load_in_4bit = false;
  std::string bnb_4bit_quant_type = "nf4";
  bool use_bnb_nested_quant = false;
  // TrainingArguments.
  std::string output_dir = "trainer_output";
  int64_t per_device_train_batch_size = 8;
  int64_t gradient_accumulation_steps = 1;
  bool selective_recompute = false;   // recompute only the attention core in backward
  bool auto_find_batch_size = false;  // fit the batch to max_memory from the plan
  std::string max_memory;             // e.g. "6GB"; empty: what is free on the device
  bool gradient_checkpointing = false;
  bool fp16 = false;
  bool bf16 = false;
  bool tf32 = false;  // accepted; takes effect on GPUs
  double learning_rate = 5e-5;
  double weight_decay = 0.0;
  double adam_beta1 = 0.9;
  double adam_beta2 = 0.999;
  double adam_epsilon = 1e-8;
  double max_grad_norm = 1.0;
  double warmup_steps = 0;  // an integer, or below 1 a fraction of the total steps
  double warmup_ratio = 0;  // the older spelling of a fraction
  std::string lr_scheduler_type = "linear";
  double num_train_epochs = 3.0;
  int64_t max_steps = -1;
  uint64_t seed = 42;
  std::string logging_strategy = "steps";  // steps (every logging_steps), epoch or no
  int64_t logging_steps = 500;
  std::string save_strategy = "steps";  // no, steps or epoch, as TrainingArguments
  int64_t save_steps = 500;
  int64_t save_total_limit = 0;  // 0 = keep all
  std::string resume_from_checkpoint;
  // Evaluation and prediction.
  bool do_train = true;
  bool do_eval = false;
  bool do_predict = false;
  std::string eval_strategy = "no";  // no, steps or epoch
  int64_t eval_steps = 0;            // 0: logging_steps
  int64_t per_device_eval_batch_size = 8;
  int64_t eval_dataset_size = 128;  // synthetic evaluation samples
  bool load_best_model_at_end = false;
  // Text classification data (run_glue): pad every batch to max_seq_length, or (false) to its
  // longest sample rounded up to 8, computing at that length.
  bool pad_to_max_length = false;
  bool group_by_length = false;     // batches of similar lengths (LengthGroupedSampler)
  bool padding_free = false;        // TRL's: a batch's samples end to end, no padding computed
  bool packing = false;             // TRL's "bfd": rows of the full length filled with samples
  bool keep_linebreaks = true;      // run_clm: plain-text lines keep their "\n"
  std::string tokenized_cache_dir;  // "": output_dir/tokenized_cache; "none": no cache
  bool overwrite_cache = false;     // tokenize the files again even when a cache matches
  std::string metric_for_best_model = "loss";
  std::string greater_is_better;  // "true", "false", or "" (false for loss, else true)
  int64_t dataloader_num_workers = 0;
  bool dataloader_pin_memory = true;
  std::string optim = "adamw_torch";
  std::string optim_args;           // "key=value,..." for the optimizer (e.g. SGD's momentum)
  bool bf16_master_weights = true;  // false: bf16 weights updated with stochastic rounding
  // A run that does not train evaluates in this 16-bit type throughout (as Trainer: no effect
  // while training).
  bool fp16_full_eval = false;
  bool bf16_full_eval = false;
  std::string device = "auto";  // cpu, cuda, or auto: cuda when a GPU is present
  bool use_cpu = false;         // TrainingArguments' spelling of --device cpu
  // Data parallel: gradients are summed across ranks in buckets of about this many MiB, each
  // started as soon as backward has finished it (PyTorch DDP's bucket_cap_mb).
  double ddp_bucket_cap_mb = 25;
  // Seconds a collective may wait for the other ranks before the run ends naming the
  // collective (a rank stuck or gone); 0: for ever.
  int64_t ddp_timeout = 1800;
  // ZeRO: 1 partitions the optimizer state among the ranks, 2 the summed gradients too
  // (parallel/zero.h); 0 keeps them whole.
  int64_t zero_stage = 0;
  // Tensor parallelism (accelerate's tp_size): ranks that hold each block's attention heads and
  // MLP width between them (Megatron-LM's column- and row-parallel layers); the data-parallel
  // replicas are the world's ranks over it. 0 or 1: none (TrainingArguments' default is 0).
  int64_t tp_size = 1;
  // Megatron's sequence parallelism under tensor parallelism: between the column- and
  // row-parallel products each tensor rank holds 1/tp_size of the tokens (the residual stream,
  // norms and dropouts), gathering the products' inputs and reduce-scattering their outputs.
  bool tp_sequence_parallel = true;
  // Pipeline parallelism: stages that hold an equal run of the blocks each (the embeddings on the
  // first, the head on the last), the micro-batches of a step (gradient_accumulation_steps) passing
  // through them in the 1F1B order. 0 or 1: none.
  int64_t pp_size = 1;
  // Sequence parallelism (accelerate's sp_size, DeepSpeed-Ulysses' method): ranks that hold an
  // equal run of every sequence's tokens each, attention exchanging tokens for heads by
  // all-to-all; their gradients are summed with the data-parallel replicas'. 0 or 1: none.
  int64_t sp_size = 1;
  // Expert parallelism (DeepSpeed-MoE's ep_size): data-parallel ranks that hold a mixture of
  // experts' experts between them, each routing its own tokens to the experts' ranks by
  // all-to-all; 0 or 1: none.
  int64_t ep_size = 1;
  // accelerate's ParallelismConfig as a JSON file (train/parallelism_config.h): its degrees set
  // tp_size and the data parallelism.
  std::string parallelism_config;
  // ZeRO stage 3: weights gathered ahead of the block that runs (DeepSpeed's
  // stage3_prefetch_bucket_size, in elements); below one block's, none are and one slot less is
  // planned. -1: one block ahead.
  int64_t stage3_prefetch_bucket_size = -1;
  // "cpu": a GPU run keeps the optimizer's state and the float32 master copy in host memory and
  // updates them there (DeepSpeed's offload_optimizer.device); "none": on the device. A CPU run's
  // state is in host memory either way.
  std::string offload_optimizer = "none";
  // Tests only (not an option): a CPU run with offload_optimizer "cpu" takes the GPU's path, its
  // state and master copy in the plan's host block, stepped by a backend of their own.
  bool offload_on_cpu = false;
  // Tests only (not an option): a CPU bf16 run's products read a bf16 copy of the weights made
  // once per step, as a GPU's do (DeviceTraits::bf16_weights_copy).
  bool weights_copy_on_cpu = false;
  std::string deepspeed;  // a DeepSpeed config file read as Trainer reads it (train/deepspeed.h)
  // Not an option: the DeepSpeed config's scheduler, whose curve the run follows (its nearest
  // lr_scheduler_type is set alongside, for the record).
  DeepSpeedCurve deepspeed_scheduler;
  bool disable_tqdm = false;
  std::string report_to = "none";  // none, tensorboard (or all: every integration brisk has)
  std::string logging_dir;         // "": output_dir/runs/<date and time>_<host>
  // Not an option: the TrainingArguments and example-script keys given that change nothing in
  // brisk (train/trainer_keys.h), listed once when the run starts.
  std::vector<std::string> ignored_keys;
  // Not an option: the config key that set an option, by the option's name, as messages name it
  // ("--deepspeed 'ds.json': tensor_parallel.autotp_size"); an option absent was given as a flag
  // or an options file's key (option_source).
  std::map<std::string, std::string> set_by;
  // The caller adds metrics of its own to each evaluation (the Python API's compute_metrics):
  // metric_for_best_model may name one of those, found when the first evaluation ends. Not an
  // option (no flag or key sets it).
  bool caller_metrics = false;
  // Not an option: the environment's measurement switches (core/switches.h), read once by the
  // front door (the CLI, the Python module) and passed down with the options; the defaults
  // where none reads them (tests).
  Switches switches;
};

// Calls v(name, field, help) for every option, in a stable order.
template <typename Options, typename Visitor>
void visit_options(Options& o, Visitor&& v) {
  v("model_name_or_path", o.model_name_or_path,
    "built-in config name, config.json or model folder");
  v("dataset", o.dataset, "\"synthetic\" (the Hugging Face guides' dummy data) or a token file");
  v("seq_len", o.seq_len, "sequence length of the training samples");
  v("dataset_size", o.dataset_size, "number of synthetic samples");
  v("synthetic_task", o.synthetic_task, "random (the guides' dummy data) or learnable");
  v("train_file", o.train_file,
    "training data: .csv, .tsv, .json/.jsonl or .txt (BERT: text columns and a label column, "
    "as run_glue; GPT-2: text, as run_clm)");
  v("validation_file", o.validation_file, "evaluation data in the same form");
  v("test_file", o.test_file, "data to predict (do_predict); its labels may be absent");
  v("tokenizer_name", o.tokenizer_name,
    "tokenizer folder or file (default: the model folder's tokenizer.json, vocab.txt or "
    "vocab.json + merges.txt)");
  v("max_seq_length", o.max_seq_length, "classification: tokens per example after truncation");
  v("block_size", o.block_size, "causal LM: tokens per training block (0: min(1024, n_positions))");
  v("text_column_name", o.text_column_name, "the column holding the text (default as the scripts)");
  v("max_train_samples", o.max_train_samples,
    "train on the first this many samples only, as the example scripts (0 = all)");
  v("max_eval_samples", o.max_eval_samples, "evaluate the first this many samples only (0 = all)");
  v("max_predict_samples", o.max_predict_samples,
    "predict the first this many samples only (0 = all)");
  v("router_z_loss_coef", o.router_z_loss_coef,
    "mixture of experts: add ST-MoE's router z-loss, this coef x the mean over the sparse layers "
    "and unmasked tokens of logsumexp(router logits)^2 (0: none, as Mixtral, Qwen2-MoE and OLMoE "
    "train)");
  v("moe_capacity_factor", o.moe_capacity_factor,
    "mixture of experts: each expert computes at most ceil(factor x tokens x top_k / experts) "
    "of a micro-batch's routed pairs (in token order), the rest dropped and counted in the log "
    "as expert_dropped (Switch Transformer's capacity; generation stays dropless); 0: dropless, "
    "as transformers computes these models");
  v("ignore_mismatched_sizes", o.ignore_mismatched_sizes,
    "initialize anew the model folder's tensors whose shapes differ from the model's (e.g. a "
    "classifier of another number of labels) instead of refusing the folder");
  v("validation_split_percentage", o.validation_split_percentage,
    "causal LM without --validation_file: the first this many percent of the training rows "
    "validate");
  v("output_dir", o.output_dir, "where checkpoints and the run summary go");
  v("per_device_train_batch_size", o.per_device_train_batch_size, "micro-batch size");
  v("gradient_accumulation_steps", o.gradient_accumulation_steps, "micro-batches per update");
  v("gradient_checkpointing", o.gradient_checkpointing, "recompute block internals in backward");
  v("use_peft", o.use_peft,
    "train LoRA adapters (PEFT's LoRA) on the linears named by lora_target_modules, the base "
    "weights frozen");
  v("lora_r", o.lora_r, "LoRA: the adapters' rank");
  v("lora_alpha", o.lora_alpha, "LoRA: the adapters' output scaled by lora_alpha / lora_r");
  v("lora_dropout", o.lora_dropout, "LoRA: dropout on the adapters' input");
  v("lora_target_modules", o.lora_target_modules,
    "LoRA: the linears to adapt, transformers' module names or their last parts, "
    "comma-separated (q_proj,v_proj), or all-linear (every linear but the output layer); "
    "empty: PEFT's default for the model type");
  v("lora_modules_to_save", o.lora_modules_to_save,
    "LoRA: modules trained in full and saved with the adapter (a classifier or score head), "
    "comma-separated; a name the model does not have is skipped, as PEFT does");
  v("lora_target_parameters", o.lora_target_parameters,
    "LoRA: a mixture's fused expert weights and router to adapt, comma-separated "
    "(mlp.experts.gate_up_proj,mlp.experts.down_proj,gate.weight), each expert its own A and B, "
    "as PEFT's target_parameters (needs --lora_dropout 0)");
  v("lora_rank_pattern", o.lora_rank_pattern,
    "LoRA: PEFT's rank_pattern, a JSON object of patterns and ranks ({\"q_proj\": 8}): a target "
    "whose name ends with a match takes that rank");
  v("lora_alpha_pattern", o.lora_alpha_pattern,
    "LoRA: PEFT's alpha_pattern, a JSON object of patterns and alphas, as lora_rank_pattern");
  v("use_rslora", o.use_rslora, "LoRA: scale the adapters by lora_alpha / sqrt(lora_r)");
  v("load_in_4bit", o.load_in_4bit,
    "QLoRA: keep the frozen base's block linears 4-bit as bitsandbytes does (with --use_peft), "
    "dequantized block by block as the passes need them");
  v("bnb_4bit_quant_type", o.bnb_4bit_quant_type, "QLoRA: the 4-bit type, nf4 or fp4");
  v("use_bnb_nested_quant", o.use_bnb_nested_quant,
    "QLoRA: store the 4-bit blocks' absmaxes 8-bit too (double quantization)");
  v("adapter_name_or_path", o.adapter_name_or_path,
    "a LoRA adapter folder (PEFT's files) loaded onto the model to train further, evaluate or "
    "predict with; its adapter_config.json sets the adapter");
  v("selective_recompute", o.selective_recompute,
    "keep each block's tensors but the attention core's statistics and recompute those in "
    "backward (exact; between no recomputation and gradient_checkpointing in memory)");
  v("auto_find_batch_size", o.auto_find_batch_size,
    "pick the largest per-device batch whose plan fits max_memory, keeping the global batch "
    "(per_device_train_batch_size x gradient_accumulation_steps) through the accumulation");
  v("max_memory", o.max_memory,
    "memory budget for auto_find_batch_size (e.g. 6GB, 6GiB, 512MiB; default: what is free)");
  v("fp16", o.fp16, "fp16 mixed precision with dynamic loss scaling");
  v("bf16", o.bf16, "bf16 mixed precision");
  v("tf32", o.tf32, "TF32 matrix products (GPU only)");
  v("learning_rate", o.learning_rate, "peak learning rate");
  v("weight_decay", o.weight_decay, "decoupled weight decay (not on biases and LayerNorm)");
  v("adam_beta1", o.adam_beta1, "AdamW beta1");
  v("adam_beta2", o.adam_beta2, "AdamW beta2");
  v("adam_epsilon", o.adam_epsilon, "AdamW epsilon");
  v("max_grad_norm", o.max_grad_norm, "clip the global gradient norm to this (0 = off)");
  v("warmup_steps", o.warmup_steps, "warm-up steps, or a fraction of all steps when below 1");
  v("warmup_ratio", o.warmup_ratio, "warm-up as a fraction of all steps");
  v("lr_scheduler_type", o.lr_scheduler_type, "linear, cosine, constant or constant_with_warmup");
  v("num_train_epochs", o.num_train_epochs, "epochs to train (may be fractional)");
  v("max_steps", o.max_steps, "optimizer steps; overrides num_train_epochs when > 0");
  v("seed", o.seed, "seed for initialization, shuffling and dropout");
  v("logging_strategy", o.logging_strategy,
    "steps (log every logging_steps), epoch (at each epoch's end) or no (only the final "
    "summary)");
  v("logging_steps", o.logging_steps, "log every this many optimizer steps");
  v("save_strategy", o.save_strategy,
    "no (never save), steps (every save_steps and at the end) or epoch (at each epoch's end)");
  v("save_steps", o.save_steps, "save a checkpoint every this many steps (0 = only at the end)");
  v("save_total_limit", o.save_total_limit, "keep at most this many checkpoints (0 = all)");
  v("resume_from_checkpoint", o.resume_from_checkpoint,
    "checkpoint folder to continue from, or 'last' (also 'true'): output_dir's newest complete "
    "checkpoint; any split of the global batch (batch, accumulation, processes) continues on the "
    "same samples");
  v("do_train", o.do_train, "train (false: only evaluate and/or predict with the given weights)");
  v("do_eval", o.do_eval, "evaluate on the evaluation data after training (or instead)");
  v("do_predict", o.do_predict, "predict the test data's labels into predict_results.txt");
  v("eval_strategy", o.eval_strategy,
    "no, steps (every eval_steps) or epoch: evaluate during training");
  v("eval_steps", o.eval_steps, "evaluate every this many steps (0 = logging_steps)");
  v("per_device_eval_batch_size", o.per_device_eval_batch_size,
    "evaluation batch of runs that do not train (while training, evaluation runs in the "
    "training batch's planned shape)");
  v("eval_dataset_size", o.eval_dataset_size,
    "synthetic evaluation samples (drawn with another seed than the training samples)");
  v("load_best_model_at_end", o.load_best_model_at_end,
    "end with the weights of the best evaluated checkpoint (save_strategy must equal "
    "eval_strategy)");
  v("metric_for_best_model", o.metric_for_best_model,
    "the evaluation metric that picks the best model: loss, accuracy, f1, perplexity; for "
    "regression mse, pearson, spearmanr");
  v("pad_to_max_length", o.pad_to_max_length,
    "pad every batch to max_seq_length (false: to the batch's longest sample rounded up to a "
    "multiple of 8, and compute only that length)");
  v("tokenized_cache_dir", o.tokenized_cache_dir,
    "where tokenized data files are cached and memory-mapped by later runs (default "
    "output_dir/tokenized_cache; none: no cache)");
  v("overwrite_cache", o.overwrite_cache, "tokenize the data files again even when cached");
  v("mlm", o.mlm,
    "masked language modeling as run_mlm: a BERT model (BertForMaskedLM) learns the text files' "
    "tokens, 15% of them chosen (80% masked, 10% random, 10% kept), new draws each epoch; "
    "without it, the head config.json's architectures names (labelled files: a classifier)");
  v("mlm_probability", o.mlm_probability, "masked LM: the share of tokens chosen");
  v("line_by_line", o.line_by_line,
    "each non-blank line is one sample instead of concatenated lines cut into blocks: a masked "
    "LM's truncated to max_seq_length; a causal LM's followed by the end-of-sequence token and "
    "truncated to block_size, as TRL's SFTTrainer prepares a text dataset");
  v("completion_only_loss", o.completion_only_loss,
    "causal LM on a file with prompt and completion columns: each row trains on prompt + "
    "completion + end-of-sequence token, the loss on the completion's tokens only (false: on "
    "all of them), as TRL's SFTTrainer");
  v("keep_linebreaks", o.keep_linebreaks,
    "causal LM on a .txt file: each line keeps its line break, as run_clm reads it (false: "
    "without)");
  v("padding_free", o.padding_free,
    "training batches without padding (TRL's padding_free): each batch's samples laid end to "
    "end, positions restarting and attention confined to each sample");
  v("packing", o.packing,
    "training rows of the full length (block_size, max_seq_length) filled with whole samples by "
    "best-fit decreasing (TRL's packing, \"bfd\"), each keeping its own positions and "
    "attention; per_device_train_batch_size counts packed rows. For rows of text: --line_by_line "
    "or prompt/completion files");
  v("group_by_length", o.group_by_length,
    "shuffle in mega-batches (of global batches) sorted by length, so batches hold samples of "
    "similar lengths");
  v("greater_is_better", o.greater_is_better,
    "true or false: whether a larger metric is better (default: false for loss and perplexity)");
  v("fp16_full_eval", o.fp16_full_eval,
    "evaluate in fp16 throughout, weights included (runs that do not train, as Trainer)");
  v("bf16_full_eval", o.bf16_full_eval,
    "evaluate in bf16 throughout, weights included (runs that do not train, as Trainer)");
  v("dataloader_num_workers", o.dataloader_num_workers,
    "0 = prepare batches inline; >= 1 = in a background thread");
  v("dataloader_pin_memory", o.dataloader_pin_memory,
    "stage batches in page-locked host memory (GPU runs; false: ordinary memory)");
  v("optim", o.optim,
    "optimizer: adamw_torch (= adamw_torch_fused), adafactor, adamw_8bit (= adamw_bnb_8bit), "
    "sgd");
  v("optim_args", o.optim_args,
    "optimizer settings as key=value,... (sgd: momentum, dampening, nesterov; adafactor: "
    "scale_parameter, relative_step, warmup_init, beta1, clip_threshold, decay_rate; "
    "adamw_8bit: min_8bit_size)");
  v("bf16_master_weights", o.bf16_master_weights,
    "with --bf16: keep fp32 master weights (true) or update the bf16 weights directly with "
    "stochastic rounding (false, 4 bytes less per parameter)");
  v("device", o.device, "cpu, cuda, or auto (cuda when a usable GPU is present)");
  v("use_cpu", o.use_cpu, "run on the CPU even when a GPU is present (= --device cpu)");
  v("ddp_bucket_cap_mb", o.ddp_bucket_cap_mb,
    "data parallel: MiB of gradients per all-reduce bucket; each bucket is summed across the "
    "ranks as soon as backward has finished it, while the earlier layers still compute (ZeRO "
    "stage 2: the most MiB summed at once)");
  v("zero_stage", o.zero_stage,
    "data parallel: 0 (every rank holds the whole optimizer state), 1 (ZeRO stage 1: each rank "
    "holds and updates the optimizer state and float32 master copy of its 1/N of the parameters), "
    "2 (also only its 1/N of the summed gradients, summed in pieces of ddp_bucket_cap_mb "
    "during backward) or 3 (also only its 1/N of the weights: each block's gathered from every "
    "rank just before it runs, forward and backward)");
  v("tp_size", o.tp_size,
    "tensor parallelism: ranks that split each block's attention heads and MLP width between "
    "them (Megatron-LM's layers; the embeddings and language-model head split by vocabulary); "
    "the world's ranks over tp_size are data-parallel replicas");
  v("tp_sequence_parallel", o.tp_sequence_parallel,
    "with tp_size: Megatron's sequence parallelism, each tensor rank holding 1/tp_size of the "
    "tokens between the split products (the residual stream, norms and dropouts: their "
    "activations fall with tp_size too), the products' inputs all-gathered and their outputs "
    "reduce-scattered; false: every rank holds every token there, the outputs all-reduced");
  v("sp_size", o.sp_size,
    "sequence parallelism (DeepSpeed-Ulysses): ranks that hold an equal run of every "
    "sequence's tokens each (the length a multiple of it), attention on every token of their "
    "share of the heads by all-to-all; the world's ranks over sp_size are data-parallel "
    "replicas");
  v("ep_size", o.ep_size,
    "expert parallelism (a mixture of experts): ranks that hold an equal share of every sparse "
    "layer's experts each, every rank routing its own tokens' rows to the experts' ranks and "
    "back by all-to-all; the experts' gradients are summed over the ranks that hold the same "
    "experts (world / ep_size of them), the rest over every rank");
  v("pp_size", o.pp_size,
    "pipeline parallelism: stages that hold an equal run of the blocks each, the step's "
    "gradient_accumulation_steps micro-batches passing through them in the 1F1B order (stages "
    "before the last keep their inputs and recompute their forward in backward); the world's "
    "ranks over pp_size are data-parallel replicas");
  v("parallelism_config", o.parallelism_config,
    "a JSON file of accelerate's ParallelismConfig keys: tp_size and sp_size set --tp_size and "
    "--sp_size, dp_shard_size above 1 shards as --zero_stage 3, dp_replicate_size x "
    "dp_shard_size x tp_size x sp_size must be the processes; cp_size above 1 is refused");
  v("stage3_prefetch_bucket_size", o.stage3_prefetch_bucket_size,
    "ZeRO stage 3: elements of weights gathered ahead, while the block before computes; below "
    "one block's weights none are (one block's slot less memory, no overlap); -1 = one block");
  v("offload_optimizer", o.offload_optimizer,
    "cpu: a GPU run keeps the optimizer's state and the float32 master copy in host memory and "
    "updates them on the CPU (the GPU keeps the weights and the gradients); none: on the GPU. "
    "A CPU run's state is in host memory either way");
  v("deepspeed", o.deepspeed,
    "a DeepSpeed config (ds_config.json): zero_optimization.stage, overlap_comm, "
    "reduce_bucket_size and stage3_prefetch_bucket_size set --zero_stage, the gradient buckets "
    "and the prefetch; optimizer Adam/AdamW runs as adamw_torch and scheduler WarmupLR, "
    "WarmupDecayLR or WarmupCosineLR as DeepSpeed runs it; batch sizes, clipping, fp16/bf16 and "
    "their parameters must be \"auto\" or agree with the options; a flag given another value "
    "than the config's, a key DeepSpeed does not have and tensor_parallel are refused");
  v("ddp_timeout", o.ddp_timeout,
    "data parallel: seconds a rank waits for the others in a collective before the run ends "
    "with a message (a rank stuck or gone); 0 = no limit");
  v("disable_tqdm", o.disable_tqdm, "no progress bar even on a terminal");
  v("report_to", o.report_to,
    "none, or tensorboard (also all): write the logs as TensorBoard event files");
  v("logging_dir", o.logging_dir,
    "where the TensorBoard event files go (default output_dir/runs/<date and time>_<host>)");
}

// Reads options from a JSON object with the same names, as a TrainingArguments file holds them
// (report_to as a list, older spellings, and the keys of train/trainer_keys.h at values that
// change nothing, noted in ignored_keys); other keys are refused by name.
void apply_options_json(TrainOptions& o, const nlohmann::json& j, const std::string& origin);
void load_options_file(TrainOptions& o, const std::string& path);
// A key of train/trainer_keys.h given with `value`: refused (an Error opening with `origin`)
// when the value would change the run, else noted once in o.ignored_keys (null: not given).
void accept_trainer_key(TrainOptions& o, const std::string& name, const nlohmann::json& value,
                        const std::string& origin);
nlohmann::json options_to_json(const TrainOptions& o);
// Refuses out-of-range and contradicting options with one message naming the problem.
void validate_options(const TrainOptions& o);
// The optimizer settings among the options.
OptimizerConfig optimizer_config(const TrainOptions& o);
// The TensorBoard folder: logging_dir, or output_dir/runs/<date and time>_<host> as transformers
// names it.
std::string logging_dir(const TrainOptions& o);
// report_to's names (a comma-separated list), and whether one of them is TensorBoard.
std::vector<std::string> report_targets(const TrainOptions& o);
bool reports_to_tensorboard(const TrainOptions& o);
// The device a run uses: auto becomes cuda when a usable GPU is present, else cpu; use_cpu
// makes it cpu.
Device resolve_device(const TrainOptions& o);
Device resolve_device(const std::string& device);
// How the user gave option `name`, as a message names it: the config key that set it, else
// "--name".
std::string option_source(const TrainOptions& o, const std::string& name);
// The run's layout over `world` ranks (0: the fewest its degrees take): the tensor, pipeline and
// sequence degrees must divide it, and the expert degree the data ranks they leave; a refusal
// names each degree as the user gave it (option_source).
ParallelLayout parallel_layout(const TrainOptions& o, int world);
// The heading an option is listed under in --help ("" for none: a test keeps every option
// under one).
const char* option_group(const std::string& name);
// The option or TrainingArguments key spelled most like `name` (a typo's likely meaning), or ""
// when none is close.
std::string closest_option(const std::string& name);
// The one of `names` spelled most like `name`, or "" when none is within a few typos.
std::string closest_name(const std::string& name, const std::vector<std::string>& names);

}  // namespace brisk
