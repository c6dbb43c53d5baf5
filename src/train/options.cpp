// Option files and validation.
#include "train/options.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <type_traits>

#include "adapters/lora.h"
#include "backend/backend.h"
#include "backend/device_traits.h"
#include "core/error.h"
#include "core/json_file.h"
#include "precision/mixed_precision.h"
#include "train/fit.h"
#include "train/trainer_keys.h"

namespace brisk {

namespace {
// A bad value as messages show it: at most 40 characters of its JSON text.
std::string excerpt(const nlohmann::json& v) {
  return brisk::excerpt(v.dump());
}

// Reads one option's value strictly: whole numbers for counts (no 7.9 -> 7, nothing beyond
// 2^53), non-negative ones for unsigned options, finite numbers for real-valued options, true or
// false for switches, text for text.
template <typename T>
void read_option(const nlohmann::json& v, T& field, const std::string& origin, const char* name) {
  auto fail = [&](const char* expected) {
    BRISK_FAIL(origin, ": option \"", name, "\" must be ", expected, ", got ", excerpt(v));
  };
  constexpr double kMaxWhole = 9007199254740992.0;  // 2^53: every whole number below is exact
  if constexpr (std::is_same_v<T, bool>) {
    if (!v.is_boolean()) fail("true or false");
    field = v.get<bool>();
  } else if constexpr (std::is_same_v<T, std::string>) {
    if (!v.is_string()) fail("a string");
    field = v.get<std::string>();
  } else if constexpr (std::is_floating_point_v<T>) {
    if (!v.is_number() || !std::isfinite(v.get<double>())) fail("a finite number");
    field = v.get<T>();
  } else {
    const bool whole =
        v.is_number_integer() ||
        (v.is_number_float() && std::isfinite(v.get<double>()) &&
         std::floor(v.get<double>()) == v.get<double>() && std::abs(v.get<double>()) < kMaxWhole);
    if (!whole) fail("a whole number");
    if (std::is_unsigned_v<T> &&
        (v.is_number_float() ? v.get<double>() < 0 : !v.is_number_unsigned()))
      fail("a whole number >= 0");
    field = v.is_number_float() ? static_cast<T>(v.get<double>()) : v.get<T>();
  }
}
}  // namespace

void apply_options_json(TrainOptions& o, const nlohmann::json& j, const std::string& origin) {
  BRISK_CHECK(j.is_object(), origin, ": training options must be a JSON object");
  std::set<std::string> known;
  visit_options(o, [&](const char* name, auto&, const char*) { known.insert(name); });
  // brisk's own keys, older spellings renamed (the newer spelling wins when both are given).
  nlohmann::json own = nlohmann::json::object();
  for (const auto& [key, value] : j.items()) {
    const std::string renamed = renamed_option(key);
    const std::string name = renamed.empty() ? key : renamed;
    if (known.count(name)) {
      if (renamed.empty() || !j.contains(name)) own[name] = trainer_value_as_option(name, value);
      continue;
    }
    if (!is_trainer_key(key)) {
      const std::string near = closest_option(key);
      BRISK_FAIL(origin, ": unknown option \"", excerpt(key), "\"",
                 near.empty() ? "" : " (did you mean \"" + near + "\"?)");
    }
    accept_trainer_key(o, key, value, origin);
  }
  visit_options(o, [&](const char* name, auto& field, const char*) {
    if (own.contains(name) && !own[name].is_null()) read_option(own[name], field, origin, name);
  });
}

void accept_trainer_key(TrainOptions& o, const std::string& name, const nlohmann::json& value,
                        const std::string& origin) {
  check_trainer_key(name, value, origin);
  const std::vector<std::string>& seen = o.ignored_keys;
  if (!value.is_null() && std::find(seen.begin(), seen.end(), name) == seen.end())
    o.ignored_keys.push_back(name);
}

void load_options_file(TrainOptions& o, const std::string& path) {
  apply_options_json(o, read_json_file(path, "options file"), "options file '" + path + "'");
}

nlohmann::json options_to_json(const TrainOptions& o) {
  nlohmann::json j = nlohmann::json::object();
  visit_options(o, [&](const char* name, const auto& field, const char*) { j[name] = field; });
  return j;
}

namespace {

// (brisk::excerpt: this file's own excerpt, of JSON, would quote the text once more.)
void check_positive(const char* name, auto v) {
  BRISK_CHECK(v > 0, name, " must be positive, got ", v);
}

// Sizes, finite numbers and bounded text.
void check_sizes(const TrainOptions& o) {
  check_positive("per_device_train_batch_size", o.per_device_train_batch_size);
  check_positive("gradient_accumulation_steps", o.gradient_accumulation_steps);
  check_positive("seq_len", o.seq_len);
  check_positive("logging_steps", o.logging_steps);
  check_positive("adam_epsilon", o.adam_epsilon);
  // Real-valued options are finite (flags can say inf or nan), and finite where float32
  // computes with them; counts and fractions bounded so that step arithmetic stays exact.
  // Text options (paths, names) are at most 4096 bytes, the longest path Linux takes, so no
  // message quoting one can grow without bound.
  visit_options(o, [](const char* name, const auto& field, const char*) {
    using Field = std::decay_t<decltype(field)>;
    if constexpr (std::is_floating_point_v<Field>)
      BRISK_CHECK(std::isfinite(field), name, " must be a finite number, got ", field);
    if constexpr (std::is_same_v<Field, std::string>)
      BRISK_CHECK(field.size() <= 4096, name, " is ", field.size(),
                  " characters long (at most 4096): \"", brisk::excerpt(field), "\"");
  });
  constexpr double kMaxCount = 1e12;
  BRISK_CHECK(o.num_train_epochs <= kMaxCount, "num_train_epochs must be at most 1e12, got ",
              o.num_train_epochs);
  BRISK_CHECK(o.warmup_steps <= kMaxCount, "warmup_steps must be at most 1e12, got ",
              o.warmup_steps);
  // The rest are read by float32 arithmetic (the learning rate, the optimizer's numbers).
  visit_options(o, [](const char* name, const auto& field, const char*) {
    if constexpr (std::is_floating_point_v<std::decay_t<decltype(field)>>)
      BRISK_CHECK(std::abs(field) <= std::numeric_limits<float>::max(), name,
                  " must be a number float32 holds (at most 3.4e38 in size), got ", field);
  });
}

// The first LoRA number the user changed from its default (nullptr: none).
const char* lora_option_given(const TrainOptions& o) {
  const TrainOptions d;
  return o.lora_r != d.lora_r                                   ? "--lora_r"
         : o.lora_alpha != d.lora_alpha                         ? "--lora_alpha"
         : o.lora_dropout != d.lora_dropout                     ? "--lora_dropout"
         : o.lora_target_modules != d.lora_target_modules       ? "--lora_target_modules"
         : o.lora_modules_to_save != d.lora_modules_to_save     ? "--lora_modules_to_save"
         : o.lora_target_parameters != d.lora_target_parameters ? "--lora_target_parameters"
         : !o.lora_rank_pattern.empty()                         ? "--lora_rank_pattern"
         : !o.lora_alpha_pattern.empty()                        ? "--lora_alpha_pattern"
         : o.use_rslora                                         ? "--use_rslora"
                                                                : nullptr;
}

// QLoRA's: a 4-bit base is frozen, so it carries adapters; its type is nf4 or fp4; its options
// without --load_in_4bit are a forgotten flag.
void check_4bit(const TrainOptions& o) {
  if (!o.load_in_4bit) {
    const char* given = o.bnb_4bit_quant_type != "nf4" ? "--bnb_4bit_quant_type"
                        : o.use_bnb_nested_quant       ? "--use_bnb_nested_quant"
                                                       : nullptr;
    BRISK_CHECK(given == nullptr, given, " is set but --load_in_4bit is not: add --load_in_4bit ",
                "to keep the base 4-bit, or drop ", given);
    return;
  }
  BRISK_CHECK(o.bnb_4bit_quant_type == "nf4" || o.bnb_4bit_quant_type == "fp4",
              "bnb_4bit_quant_type must be nf4 or fp4, got \"", excerpt(o.bnb_4bit_quant_type),
              "\"");
  BRISK_CHECK(o.use_peft || !o.adapter_name_or_path.empty(),
              "--load_in_4bit keeps the base frozen in 4 bits: train LoRA adapters on it "
              "(--use_peft) or load one (--adapter_name_or_path)");
}

// LoRA's numbers; its options without --use_peft are a forgotten flag, and beside
// --adapter_name_or_path a contradiction (the adapter's config sets them).
void check_adapters(const TrainOptions& o) {
  check_4bit(o);
  const char* given = lora_option_given(o);
  if (!o.adapter_name_or_path.empty()) {
    BRISK_CHECK(given == nullptr, given,
                " is set beside --adapter_name_or_path, whose "
                "adapter_config.json sets the adapter: drop ",
                given);
    return;
  }
  if (!o.use_peft) {
    BRISK_CHECK(given == nullptr, given,
                " is set but --use_peft is not: add --use_peft to "
                "train LoRA adapters, or drop ",
                given);
    return;
  }
  BRISK_CHECK(o.lora_r >= 1 && o.lora_r <= 65536, "lora_r must lie in [1, 65536], got ", o.lora_r);
  BRISK_CHECK(o.lora_alpha > 0, "lora_alpha must be positive, got ", o.lora_alpha);
  BRISK_CHECK(o.lora_dropout >= 0 && o.lora_dropout < 1, "lora_dropout must lie in [0, 1), got ",
              o.lora_dropout);
  BRISK_CHECK(o.lora_target_parameters.empty() || o.lora_dropout == 0,
              "--lora_target_parameters needs --lora_dropout 0 (PEFT's parameter adapters take no "
              "dropout), got ",
              o.lora_dropout);
  const auto ranks = pattern_option(o.lora_rank_pattern, "--lora_rank_pattern", true);
  const auto alphas = pattern_option(o.lora_alpha_pattern, "--lora_alpha_pattern", false);
  BRISK_CHECK(!o.use_rslora || (ranks.empty() && alphas.empty()),
              "--use_rslora with --lora_rank_pattern or --lora_alpha_pattern is refused (PEFT "
              "refuses them together)");
}

// Precision, recomputation, the optimizer's numbers and the learning-rate schedule.
void check_precision_and_schedule(const TrainOptions& o) {
  BRISK_CHECK(!(o.fp16 && o.bf16), "--fp16 and --bf16 contradict each other: choose one");
  BRISK_CHECK(!(o.fp16_full_eval && o.bf16_full_eval),
              "--fp16_full_eval and --bf16_full_eval contradict each other: choose one");
  BRISK_CHECK(!(o.selective_recompute && o.gradient_checkpointing),
              "--selective_recompute and --gradient_checkpointing contradict each other: "
              "choose one");
  BRISK_CHECK(o.max_steps > 0 || o.num_train_epochs > 0,
              "num_train_epochs must be positive when max_steps is not set");
  BRISK_CHECK(o.learning_rate >= 0, "learning_rate must not be negative, got ", o.learning_rate);
  BRISK_CHECK(o.weight_decay >= 0, "weight_decay must not be negative, got ", o.weight_decay);
  BRISK_CHECK(o.adam_beta1 >= 0 && o.adam_beta1 < 1, "adam_beta1 must lie in [0, 1), got ",
              o.adam_beta1);
  BRISK_CHECK(o.adam_beta2 >= 0 && o.adam_beta2 < 1, "adam_beta2 must lie in [0, 1), got ",
              o.adam_beta2);
  BRISK_CHECK(o.max_grad_norm >= 0, "max_grad_norm must not be negative, got ", o.max_grad_norm);
  BRISK_CHECK(o.warmup_steps >= 0, "warmup_steps must not be negative, got ", o.warmup_steps);
  BRISK_CHECK(o.warmup_steps < 1 || o.warmup_steps == static_cast<int64_t>(o.warmup_steps),
              "warmup_steps must be a whole number of steps, or a fraction below 1; got ",
              o.warmup_steps);
  BRISK_CHECK(o.warmup_ratio >= 0 && o.warmup_ratio < 1, "warmup_ratio must lie in [0, 1), got ",
              o.warmup_ratio);
  BRISK_CHECK(!(o.warmup_ratio > 0 && o.warmup_steps > 0),
              "warmup_steps and warmup_ratio contradict each other: give one");
  const std::set<std::string> schedules{"linear", "cosine", "constant", "constant_with_warmup"};
  BRISK_CHECK(schedules.count(o.lr_scheduler_type), "unknown lr_scheduler_type \"",
              brisk::excerpt(o.lr_scheduler_type),
              "\" (valid: linear, cosine, constant, constant_with_warmup)");
}

// Saving, data parallelism, the optimizer and the device.
void check_saving_and_parallelism(const TrainOptions& o) {
  BRISK_CHECK(o.save_strategy == "no" || o.save_strategy == "steps" || o.save_strategy == "epoch",
              "unknown save_strategy \"", brisk::excerpt(o.save_strategy),
              "\" (valid: no, steps, epoch)");
  BRISK_CHECK(o.save_steps >= 0, "save_steps must not be negative, got ", o.save_steps);
  BRISK_CHECK(o.save_total_limit >= 0, "save_total_limit must not be negative, got ",
              o.save_total_limit);
  BRISK_CHECK(o.ddp_bucket_cap_mb > 0 && o.ddp_bucket_cap_mb <= 1e6,
              "ddp_bucket_cap_mb must lie in (0, 1e6] MiB, got ", o.ddp_bucket_cap_mb);
  BRISK_CHECK(o.zero_stage >= 0 && o.zero_stage <= 3, "zero_stage must be 0, 1, 2 or 3, got ",
              o.zero_stage);
  BRISK_CHECK(o.tp_size >= 0 && o.tp_size <= 4096, "tp_size must lie in [0, 4096], got ",
              o.tp_size);
  BRISK_CHECK(o.pp_size >= 0 && o.pp_size <= 4096, "pp_size must lie in [0, 4096], got ",
              o.pp_size);
  BRISK_CHECK(o.sp_size >= 0 && o.sp_size <= 4096, "sp_size must lie in [0, 4096], got ",
              o.sp_size);
  BRISK_CHECK(o.ep_size >= 0 && o.ep_size <= 4096, "ep_size must lie in [0, 4096], got ",
              o.ep_size);
  BRISK_CHECK(o.ep_size <= 1 || (o.tp_size <= 1 && o.pp_size <= 1 && o.sp_size <= 1),
              "--ep_size with tensor, pipeline or sequence parallelism is not supported yet");
  BRISK_CHECK(o.stage3_prefetch_bucket_size >= -1,
              "stage3_prefetch_bucket_size must be -1 (one block) or at least 0, got ",
              o.stage3_prefetch_bucket_size);
  BRISK_CHECK(o.offload_optimizer == "none" || o.offload_optimizer == "cpu",
              "unknown offload_optimizer \"", brisk::excerpt(o.offload_optimizer),
              "\" (valid: none, cpu)");
  BRISK_CHECK(o.offload_optimizer == "none" || !o.bf16 || o.bf16_master_weights,
              "offload_optimizer cpu with --bf16 needs the float32 master copy (leave "
              "--bf16_master_weights on)");
  BRISK_CHECK(o.zero_stage < 3 || !o.bf16 || o.bf16_master_weights,
              "--zero_stage 3 with --bf16 needs the float32 master copy (leave "
              "--bf16_master_weights on)");
  BRISK_CHECK(o.ddp_timeout >= 0 && o.ddp_timeout <= 100'000'000,
              "ddp_timeout must lie in [0, 1e8] seconds, got ", o.ddp_timeout);
  BRISK_CHECK(o.dataloader_num_workers >= 0, "dataloader_num_workers must not be negative, got ",
              o.dataloader_num_workers);
  if (!o.max_memory.empty()) parse_memory_size(o.max_memory);  // refuses what is not a size
  make_optimizer(optimizer_config(o));  // refuses unknown names and bad optim_args
  MixedPrecision(o.bf16 ? DType::bf16 : DType::f32, o.bf16_master_weights);  // its rules
  BRISK_CHECK(o.device == "cpu" || o.device == "cuda" || o.device == "auto", "unknown device \"",
              brisk::excerpt(o.device), "\" (valid: cpu, cuda, auto)");
}

// Evaluation, the metric for the best model, and what the run does.
void check_evaluation(const TrainOptions& o) {
  BRISK_CHECK(o.eval_strategy == "no" || o.eval_strategy == "steps" || o.eval_strategy == "epoch",
              "unknown eval_strategy \"", brisk::excerpt(o.eval_strategy),
              "\" (valid: no, steps, epoch)");
  BRISK_CHECK(o.eval_steps >= 0, "eval_steps must not be negative, got ", o.eval_steps);
  check_positive("per_device_eval_batch_size", o.per_device_eval_batch_size);
  check_positive("eval_dataset_size", o.eval_dataset_size);
  // Synthetic data sizes: far beyond any use, inside every per-sample array's byte count.
  constexpr int64_t kMaxSamples = int64_t{1} << 40;
  BRISK_CHECK(o.dataset_size <= kMaxSamples && o.eval_dataset_size <= kMaxSamples,
              "dataset_size and eval_dataset_size must be at most 2^40 samples, got ",
              std::max(o.dataset_size, o.eval_dataset_size));
  const std::string metric = o.metric_for_best_model.rfind("eval_", 0) == 0
                                 ? o.metric_for_best_model.substr(5)
                                 : o.metric_for_best_model;
  static const std::set<std::string> kMetrics = {"loss",    "accuracy",  "f1",        "mse",
                                                 "pearson", "spearmanr", "perplexity"};
  BRISK_CHECK(o.caller_metrics || kMetrics.count(metric), "metric_for_best_model \"",
              brisk::excerpt(o.metric_for_best_model),
              "\" is none of brisk's metrics (loss, accuracy, f1, mse, pearson, spearmanr, "
              "perplexity)");
  BRISK_CHECK(o.greater_is_better.empty() || o.greater_is_better == "true" ||
                  o.greater_is_better == "false",
              "greater_is_better must be true or false, got \"",
              brisk::excerpt(o.greater_is_better), "\"");
  BRISK_CHECK(o.do_train || o.do_eval || o.do_predict,
              "nothing to do: do_train, do_eval and do_predict are all false (a TrainingArguments "
              "file sets do_train false unless the script was given --do_train: add --do_train)");
  BRISK_CHECK(
      o.logging_strategy == "steps" || o.logging_strategy == "epoch" || o.logging_strategy == "no",
      "unknown logging_strategy \"", brisk::excerpt(o.logging_strategy),
      "\" (valid: no, steps, epoch)");
  BRISK_CHECK(!(o.use_cpu && o.device == "cuda"),
              "--use_cpu and --device cuda contradict each other: choose one");
  for (const auto& [name, count] : {std::pair{"max_train_samples", o.max_train_samples},
                                    {"max_eval_samples", o.max_eval_samples},
                                    {"max_predict_samples", o.max_predict_samples}})
    BRISK_CHECK(count >= 0, name, " must not be negative, got ", count);
  if (o.load_best_model_at_end) {
    BRISK_CHECK(o.eval_strategy != "no" && o.eval_strategy == o.save_strategy,
                "load_best_model_at_end needs eval_strategy and save_strategy to be equal and not "
                "\"no\" (they are \"",
                o.eval_strategy, "\" and \"", o.save_strategy, "\")");
    const int64_t every = o.eval_steps > 0 ? o.eval_steps : o.logging_steps;
    BRISK_CHECK(o.eval_strategy != "steps" || (o.save_steps > 0 && o.save_steps % every == 0),
                "load_best_model_at_end: save_steps (", o.save_steps,
                ") must be a multiple of eval_steps (", every, ")");
  }
}

// Sample-separated batches (`flag`: --padding_free, --packing) are not built with sequence or
// pipeline parallelism.
void check_samples_layout(const TrainOptions& o, const char* flag) {
  BRISK_CHECK(o.sp_size == 1, flag, " with sequence parallelism (--sp_size ", o.sp_size,
              ") is not built yet");
  BRISK_CHECK(o.pp_size == 1, flag, " with pipeline parallelism (--pp_size ", o.pp_size,
              ") is not built yet");
}

// --padding_free: what it contradicts, and the layouts it is not built for.
void check_padding_free(const TrainOptions& o) {
  if (!o.padding_free) return;
  BRISK_CHECK(!o.pad_to_max_length,
              "--padding_free and --pad_to_max_length contradict each other: padding-free batches "
              "hold no padding");
  BRISK_CHECK(!o.group_by_length,
              "--group_by_length is meaningless with --padding_free: its batches hold no padding "
              "to save");
  check_samples_layout(o, "--padding_free");
}

// --packing: what it makes meaningless, and the layouts it is not built for.
void check_packing(const TrainOptions& o) {
  if (!o.packing) return;
  BRISK_CHECK(!o.group_by_length,
              "--group_by_length is meaningless with --packing: its rows are all full");
  check_samples_layout(o, "--packing");
}

// The data: text files or a dataset, their preparation, and the reports.
void check_data(const TrainOptions& o) {
  const bool files = !o.train_file.empty() || !o.validation_file.empty() || !o.test_file.empty();
  BRISK_CHECK(!files || o.dataset == "synthetic",
              "--dataset and --train_file/--validation_file/--test_file contradict each other: "
              "give one");
  BRISK_CHECK(!files || !o.do_train || !o.train_file.empty(),
              "do_train with text files needs --train_file");
  check_positive("max_seq_length", o.max_seq_length);
  BRISK_CHECK(o.block_size >= 0, "block_size must not be negative, got ", o.block_size);
  BRISK_CHECK(o.mlm_probability > 0 && o.mlm_probability < 1,
              "mlm_probability must lie in (0, 1), got ", o.mlm_probability);
  check_padding_free(o);
  check_packing(o);
  BRISK_CHECK(o.validation_split_percentage >= 0 && o.validation_split_percentage < 100,
              "validation_split_percentage must lie in [0, 100), got ",
              o.validation_split_percentage);
  for (const std::string& name : report_targets(o))
    BRISK_CHECK(name == "none" || name == "tensorboard" || name == "all", "unknown report_to \"",
                brisk::excerpt(name),
                "\" (valid: none, tensorboard, all; brisk reports to no other)");
  BRISK_CHECK(!o.output_dir.empty(), "output_dir must not be empty");
  BRISK_CHECK(o.dataset != "synthetic" || o.dataset_size > 0, "dataset_size must be positive");
  BRISK_CHECK(o.synthetic_task == "random" || o.synthetic_task == "learnable",
              "unknown synthetic_task \"", brisk::excerpt(o.synthetic_task),
              "\" (valid: random, learnable)");
}

}  // namespace

// In the order the checks ran when they were one function: the first problem found is the one
// reported.
void validate_options(const TrainOptions& o) {
  check_sizes(o);
  check_precision_and_schedule(o);
  check_adapters(o);
  check_saving_and_parallelism(o);
  check_evaluation(o);
  check_data(o);
}

OptimizerConfig optimizer_config(const TrainOptions& o) {
  OptimizerConfig c;
  c.name = o.optim;
  c.args = o.optim_args;
  c.beta1 = o.adam_beta1;
  c.beta2 = o.adam_beta2;
  c.epsilon = o.adam_epsilon;
  c.weight_decay = o.weight_decay;
  return c;
}

std::string logging_dir(const TrainOptions& o) {
  if (!o.logging_dir.empty()) return o.logging_dir;
  char stamp[64] = "run";
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  if (localtime_r(&now, &local)) std::strftime(stamp, sizeof stamp, "%b%d_%H-%M-%S", &local);
  char host[256] = "localhost";
  ::gethostname(host, sizeof host - 1);
  return (std::filesystem::path(o.output_dir) / "runs" / (std::string(stamp) + "_" + host))
      .string();
}

std::vector<std::string> report_targets(const TrainOptions& o) {
  std::vector<std::string> names;
  size_t start = 0;
  while (start <= o.report_to.size()) {
    const size_t comma = std::min(o.report_to.find(',', start), o.report_to.size());
    names.push_back(o.report_to.substr(start, comma - start));
    start = comma + 1;
  }
  return names;
}

bool reports_to_tensorboard(const TrainOptions& o) {
  const std::vector<std::string> names = report_targets(o);
  return std::any_of(names.begin(), names.end(),
                     [](const std::string& n) { return n == "tensorboard" || n == "all"; });
}

Device resolve_device(const TrainOptions& o) {
  return resolve_device(o.use_cpu ? std::string("cpu") : o.device);
}

Device resolve_device(const std::string& device) {
  return device_named(device);
}

}  // namespace brisk

namespace brisk {

namespace {
// The edits (insertions, deletions, substitutions) that turn a into b.
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] != b[j - 1] ? 1 : 0)});
      diagonal = above;
    }
  }
  return row[b.size()];
}
}  // namespace

const char* option_group(const std::string& name) {
  static const std::vector<std::pair<const char*, std::vector<std::string>>> groups = {
      {"Model",
       {"model_name_or_path", "tokenizer_name", "ignore_mismatched_sizes", "mlm",
        "router_z_loss_coef", "moe_capacity_factor"}},
      {"Data",
       {"train_file",
        "validation_file",
        "test_file",
        "max_seq_length",
        "block_size",
        "text_column_name",
        "validation_split_percentage",
        "max_train_samples",
        "max_eval_samples",
        "max_predict_samples",
        "mlm_probability",
        "line_by_line",
        "completion_only_loss",
        "keep_linebreaks",
        "pad_to_max_length",
        "padding_free",
        "packing",
        "group_by_length",
        "tokenized_cache_dir",
        "overwrite_cache",
        "dataloader_num_workers",
        "dataloader_pin_memory",
        "dataset",
        "seq_len",
        "dataset_size",
        "synthetic_task"}},
      {"Training",
       {"output_dir", "do_train", "per_device_train_batch_size", "gradient_accumulation_steps",
        "num_train_epochs", "max_steps", "learning_rate", "lr_scheduler_type", "warmup_steps",
        "warmup_ratio", "weight_decay", "max_grad_norm", "optim", "optim_args", "adam_beta1",
        "adam_beta2", "adam_epsilon", "seed"}},
      {"Precision",
       {"bf16", "fp16", "tf32", "bf16_master_weights", "bf16_full_eval", "fp16_full_eval"}},
      {"LoRA adapters",
       {"use_peft", "lora_r", "lora_alpha", "lora_dropout", "lora_target_modules",
        "lora_modules_to_save", "lora_target_parameters", "lora_rank_pattern", "lora_alpha_pattern",
        "use_rslora", "adapter_name_or_path", "load_in_4bit", "bnb_4bit_quant_type",
        "use_bnb_nested_quant"}},
      {"Memory and device",
       {"gradient_checkpointing", "selective_recompute", "auto_find_batch_size", "max_memory",
        "offload_optimizer", "device", "use_cpu"}},
      {"Evaluation and prediction",
       {"do_eval", "do_predict", "eval_strategy", "eval_steps", "per_device_eval_batch_size",
        "eval_dataset_size", "load_best_model_at_end", "metric_for_best_model",
        "greater_is_better"}},
      {"Checkpoints",
       {"save_strategy", "save_steps", "save_total_limit", "resume_from_checkpoint"}},
      {"Logging",
       {"logging_strategy", "logging_steps", "report_to", "logging_dir", "disable_tqdm"}},
      {"Several processes",
       {"zero_stage", "tp_size", "tp_sequence_parallel", "pp_size", "sp_size", "ep_size",
        "parallelism_config", "deepspeed", "ddp_bucket_cap_mb", "ddp_timeout",
        "stage3_prefetch_bucket_size"}}};
  for (const auto& [group, names] : groups)
    if (std::find(names.begin(), names.end(), name) != names.end()) return group;
  return "";
}

std::string closest_name(const std::string& name, const std::vector<std::string>& names) {
  std::string best;
  size_t best_distance = std::max<size_t>(2, name.size() / 4) + 1;  // a few typos at most
  for (const std::string& candidate : names) {
    // The lengths' difference bounds the distance from below, and the distance allowed grows
    // with name's length by a quarter of it: only names within 4/3 of a candidate's length are
    // compared, so the work stays a few candidates' lengths squared whatever `name` holds.
    const size_t apart = name.size() > candidate.size() ? name.size() - candidate.size()
                                                        : candidate.size() - name.size();
    if (apart >= best_distance) continue;
    const size_t d = edit_distance(name, candidate);
    if (d < best_distance) best_distance = d, best = candidate;
  }
  return best;
}

std::string option_source(const TrainOptions& o, const std::string& name) {
  const auto it = o.set_by.find(name);
  return it == o.set_by.end() ? "--" + name : it->second;
}

ParallelLayout parallel_layout(const TrainOptions& o, int world) {
  ParallelDegrees d;
  d.tp_size = o.tp_size;
  d.pp_size = o.pp_size;
  d.sp_size = o.sp_size;
  d.ep_size = o.ep_size;
  d.zero_stage = o.zero_stage;
  d.tp_sequence_parallel = o.tp_sequence_parallel;
  d.source = [&o](const std::string& name) { return option_source(o, name); };
  return ParallelLayout(world > 0 ? world : d.fewest_ranks(), d);
}

std::string closest_option(const std::string& name) {
  std::vector<std::string> names = trainer_key_names();
  TrainOptions o;
  visit_options(o, [&](const char* n, auto&, const char*) { names.emplace_back(n); });
  return closest_name(name, names);
}

}  // namespace brisk
