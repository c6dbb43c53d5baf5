// The table of TrainingArguments and example-script keys brisk has no option for (see
// trainer_keys.h).
#include "train/trainer_keys.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>

#include "core/error.h"
#include "core/json_file.h"

namespace brisk {

namespace {

// A key, the JSON list of its values that change nothing in brisk ("*": any value; null, the
// key left unset, always does), and what brisk does instead: why the key changes nothing, or
// what to use when its value would.
struct TrainerKey {
  const char* name;
  const char* inert;
  const char* instead;
};

constexpr const char* kNoHub =
    "brisk reads no dataset hub: give the data as files (--train_file, --validation_file, "
    "--test_file)";
constexpr const char* kLogs = "brisk writes its logs as JSON lines and TensorBoard events only";
constexpr const char* kHubPush = "brisk pushes nothing to a hub";
constexpr const char* kCompiled = "brisk is native code, compiled ahead of time";
constexpr const char* kLoader = "brisk's data loader is a thread of its own";
constexpr const char* kDdp = "brisk's data parallelism has no such setting";

// Transformers 4.x and 5.x TrainingArguments, then the example scripts' arguments.
constexpr std::array kTable = {
    // Settings of tools brisk does not use: any value changes nothing.
    TrainerKey{"run_name", "*", "the run's name is for experiment trackers"},
    TrainerKey{"overwrite_output_dir", "*", "brisk writes into output_dir whatever it holds"},
    TrainerKey{"log_level", "*", kLogs},
    TrainerKey{"log_level_replica", "*", kLogs},
    TrainerKey{"log_on_each_node", "*", "rank 0 writes the logs"},
    TrainerKey{"logging_nan_inf_filter", "*", "a non-finite loss ends a brisk run"},
    TrainerKey{"project", "*", kLogs},
    TrainerKey{"trackio_space_id", "*", kLogs},
    TrainerKey{"trackio_bucket_id", "*", kLogs},
    TrainerKey{"trackio_static_space_id", "*", kLogs},
    TrainerKey{"hub_token", "*", kHubPush},
    TrainerKey{"hub_private_repo", "*", kHubPush},
    TrainerKey{"hub_model_id", "*", kHubPush},
    TrainerKey{"hub_strategy", "*", kHubPush},
    TrainerKey{"hub_always_push", "*", kHubPush},
    TrainerKey{"hub_revision", "*", kHubPush},
    TrainerKey{"push_to_hub_model_id", "*", kHubPush},
    TrainerKey{"push_to_hub_organization", "*", kHubPush},
    TrainerKey{"push_to_hub_token", "*", kHubPush},
    TrainerKey{"torch_compile", "*", kCompiled},
    TrainerKey{"torch_compile_backend", "*", kCompiled},
    TrainerKey{"torch_compile_mode", "*", kCompiled},
    TrainerKey{"torchdynamo", "*", kCompiled},
    TrainerKey{"use_liger_kernel", "*", "brisk runs fused kernels of its own"},
    TrainerKey{"liger_kernel_config", "*", "brisk runs fused kernels of its own"},
    TrainerKey{"use_cache", "*", "training keeps no key/value cache"},
    TrainerKey{"torch_empty_cache_steps", "*", "brisk's memory is planned: no cache to empty"},
    TrainerKey{"eval_do_concat_batches", "*", "brisk's evaluation streams its metrics"},
    TrainerKey{"eval_use_gather_object", "*", "brisk's evaluation streams its metrics"},
    TrainerKey{"eval_accumulation_steps", "*", "brisk's evaluation streams its metrics"},
    TrainerKey{"batch_eval_metrics", "*", "brisk's evaluation streams its metrics"},
    TrainerKey{"include_tokens_per_second", "*", kLogs},
    TrainerKey{"include_num_input_tokens_seen", "*", kLogs},
    TrainerKey{"restore_callback_states_from_checkpoint", "*", "brisk has no callbacks"},
    TrainerKey{"full_determinism", "*", "brisk's runs are deterministic"},
    TrainerKey{"dataloader_persistent_workers", "*", kLoader},
    TrainerKey{"dataloader_prefetch_factor", "*", kLoader},
    TrainerKey{"dataloader_multiprocessing_context", "*", kLoader},
    TrainerKey{"dataloader_in_order", "*", kLoader},
    TrainerKey{"remove_unused_columns", "*", "brisk reads only the columns it uses"},
    TrainerKey{"length_column_name", "*", "group_by_length measures the tokenized samples"},
    TrainerKey{"ddp_find_unused_parameters", "*", kDdp},
    TrainerKey{"ddp_broadcast_buffers", "*", kDdp},
    TrainerKey{"ddp_static_graph", "*", kDdp},
    TrainerKey{"ddp_backend", "*", "brisk chooses MPI or NCCL itself"},
    TrainerKey{"local_rank", "*", "the rank comes from the launcher's environment"},
    TrainerKey{"skip_memory_metrics", "*", "brisk always reports its memory"},
    TrainerKey{"half_precision_backend", "*", "brisk's mixed precision is its own"},
    TrainerKey{"fp16_backend", "*", "brisk's mixed precision is its own"},
    TrainerKey{"fp16_opt_level", "*", "brisk's mixed precision is its own"},
    TrainerKey{"xpu_backend", "*", kDdp},
    TrainerKey{"ray_scope", "*", "brisk has no hyperparameter search"},
    TrainerKey{"use_legacy_prediction_loop", "*", "brisk has one prediction loop"},
    TrainerKey{"cache_dir", "*", "brisk downloads nothing"},
    TrainerKey{"token", "*", "brisk downloads nothing"},
    TrainerKey{"use_auth_token", "*", "brisk downloads nothing"},
    TrainerKey{"use_fast_tokenizer", "*", "brisk's tokenizers are its own"},
    TrainerKey{"low_cpu_mem_usage", "*", "brisk streams the weights in by pieces"},
    TrainerKey{"preprocessing_num_workers", "*", "brisk tokenizes in its own threads"},
    // Settings brisk does not implement: accepted only at values that change nothing.
    TrainerKey{"save_safetensors", "[true]", "brisk saves safetensors only"},
    TrainerKey{"model_revision", R"(["main"])", "brisk reads the model folder it is given"},
    TrainerKey{"trust_remote_code", "[false]", "brisk runs its own model code only"},
    TrainerKey{"torch_dtype", R"(["auto", "float32"])", "use --bf16 or --fp16 for 16-bit training"},
    TrainerKey{"dtype", R"(["auto", "float32"])", "use --bf16 or --fp16 for 16-bit training"},
    TrainerKey{"lr_scheduler_kwargs", "[{}]", "brisk's schedules take no settings"},
    TrainerKey{"optim_target_modules", "[]", "brisk's optimizers update every parameter"},
    // 4.x's default false averages each rank's mean loss: the same as true for one process, and
    // within a step's token counts of it otherwise.
    TrainerKey{"average_tokens_across_devices", "*",
               "brisk averages the loss over every rank's tokens"},
    TrainerKey{"label_smoothing_factor", "[0]", "brisk has no label smoothing"},
    TrainerKey{"activation_checkpointing_kwargs",
               R"([{}, {"use_reentrant": false}, {"use_reentrant": true}])",
               "brisk's recomputation takes no settings"},
    TrainerKey{"gradient_checkpointing_kwargs",
               R"([{}, {"use_reentrant": false}, {"use_reentrant": true}])",
               "brisk's recomputation takes no settings"},
    TrainerKey{"neftune_noise_alpha", "[]", "brisk adds no NEFTune noise"},
    TrainerKey{"logging_first_step", "[false]", "brisk logs every logging_steps"},
    TrainerKey{"eval_delay", "[0]", "brisk evaluates as eval_strategy says from the start"},
    TrainerKey{"prediction_loss_only", "[false]", "brisk's evaluation reports every metric"},
    TrainerKey{"eval_on_start", "[false]", "brisk evaluates after steps, not before"},
    TrainerKey{"include_for_metrics", "[[]]", "brisk computes its metrics itself"},
    TrainerKey{"include_inputs_for_metrics", "[false]", "brisk computes its metrics itself"},
    TrainerKey{"save_only_model", "[false]", "brisk's checkpoints hold the optimizer state"},
    TrainerKey{"save_on_each_node", "[false]", "rank 0 saves"},
    TrainerKey{"enable_jit_checkpoint", "[false]", "brisk saves as save_strategy says"},
    TrainerKey{"push_to_hub", "[false]",
               "brisk cannot reach a hub: upload output_dir with your own tools"},
    TrainerKey{"ignore_data_skip", "[false]", "a resumed brisk run continues at its data position"},
    TrainerKey{"data_seed", "[]", "brisk shuffles with --seed"},
    // A dict of settings: each of its keys checked as a key of its own (kAcceleratorConfig).
    TrainerKey{"accelerator_config", "{}", "brisk has no Accelerate settings"},
    TrainerKey{"dataloader_drop_last", "[false]", "brisk's last batch of an epoch may be short"},
    TrainerKey{"label_names", "[]", "brisk's labels are the data's label column"},
    TrainerKey{"train_sampling_strategy", R"(["random"])",
               "brisk shuffles at random; use --group_by_length for group_by_length"},
    TrainerKey{"fsdp", R"(["", [], false])",
               "use --zero_stage 3: ZeRO stage 3 shards the weights, gradients and optimizer "
               "state as FSDP's full_shard does"},
    // FSDP's settings act only with fsdp, refused above unless off.
    TrainerKey{"fsdp_config", "*", "FSDP is off"},
    TrainerKey{"fsdp_min_num_params", "*", "FSDP is off"},
    TrainerKey{"fsdp_transformer_layer_cls_to_wrap", "*", "FSDP is off"},
    TrainerKey{"sharded_ddp", R"(["", []])", "use --zero_stage"},
    TrainerKey{"debug", R"(["", []])", "brisk has no debug modes"},
    TrainerKey{"per_gpu_train_batch_size", "[]", "use --per_device_train_batch_size"},
    TrainerKey{"per_gpu_eval_batch_size", "[]", "use --per_device_eval_batch_size"},
    TrainerKey{"adafactor", "[false]", "use --optim adafactor"},
    TrainerKey{"dispatch_batches", "[false]", "each brisk rank reads its own share"},
    TrainerKey{"split_batches", "[false]", "each brisk rank reads its own share"},
    TrainerKey{"tpu_num_cores", "[]", "brisk runs on CPUs and CUDA GPUs"},
    TrainerKey{"tpu_metrics_debug", "[false]", "brisk runs on CPUs and CUDA GPUs"},
    TrainerKey{"use_mps_device", "[false]", "brisk runs on CPUs and CUDA GPUs"},
    TrainerKey{"use_ipex", "[false]", "brisk runs its own CPU kernels"},
    TrainerKey{"jit_mode_eval", "[false]", kCompiled},
    TrainerKey{"mp_parameters", R"([""])", "brisk has no SageMaker settings"},
    TrainerKey{"past_index", "[-1]", "brisk's models keep no past state in training"},
    TrainerKey{"task_name", "[]", kNoHub},
    TrainerKey{"dataset_name", "[]", kNoHub},
    TrainerKey{"dataset_config_name", "[]", kNoHub},
    TrainerKey{"streaming", "[false]", kNoHub},
    TrainerKey{"config_name", "[]", "give --model_name_or_path the folder holding config.json"},
    TrainerKey{"model_type", "[]",
               "training from scratch takes a built-in name or a config.json as "
               "--model_name_or_path"},
    TrainerKey{"config_overrides", "[]", "edit config.json instead"},
};

// The keys of transformers' AcceleratorConfig (4.46 through 5.x; to_json_string writes its
// defaults when accelerate is installed), each checked as a key of the table is.
constexpr const char* kOwnShare = "each brisk rank reads its own share of every batch";
constexpr std::array kAcceleratorConfig = {
    TrainerKey{"split_batches", "[false]", kOwnShare},
    TrainerKey{"dispatch_batches", "[false]", kOwnShare},
    TrainerKey{"even_batches", "[true]", kOwnShare},
    TrainerKey{"use_seedable_sampler", "*", "brisk shuffles with --seed"},
    TrainerKey{"non_blocking", "*", "brisk's loader stages its own copies"},
    TrainerKey{"gradient_accumulation_kwargs", "[{}]",
               "brisk accumulates gradient_accumulation_steps micro-batches"},
    TrainerKey{"use_configured_state", "[false]", "brisk has no Accelerate state"},
};

template <typename Table>
const TrainerKey* find_in(const Table& table, const std::string& name) {
  const auto it =
      std::find_if(table.begin(), table.end(), [&](const TrainerKey& k) { return name == k.name; });
  return it == table.end() ? nullptr : &*it;
}

const TrainerKey* find_key(const std::string& name) {
  return find_in(kTable, name);
}

// Whether two values are the same setting: numbers by value (0 and 0.0), lists item by item,
// dicts key by key, the rest as JSON.
bool same_value(const nlohmann::json& a, const nlohmann::json& b) {
  if (a.is_number() && b.is_number()) return a.get<double>() == b.get<double>();
  if (a.type() != b.type() || a.size() != b.size()) return false;
  if (a.is_array())
    return std::equal(
        a.begin(), a.end(), b.begin(),
        [](const nlohmann::json& x, const nlohmann::json& y) { return same_value(x, y); });
  if (a.is_object()) {
    for (const auto& [key, value] : a.items())
      if (!b.contains(key) || !same_value(value, b.at(key))) return false;
    return true;
  }
  return a == b;
}

// Accepts `value` of `key` (named `shown` in messages) when it is null, the key takes any value,
// or it is one of the key's inert values.
void check_value(const TrainerKey& key, const std::string& shown, const nlohmann::json& value,
                 const std::string& origin) {
  if (value.is_null() || std::string(key.inert) == "*") return;
  const nlohmann::json inert = nlohmann::json::parse(key.inert);
  const bool accepted = std::any_of(inert.begin(), inert.end(),
                                    [&](const nlohmann::json& v) { return same_value(v, value); });
  BRISK_CHECK(accepted, origin, ": ", shown, " = ", excerpt(value.dump()),
              " is not implemented in brisk (", key.instead, ")");
}

// accelerator_config: a dict whose every key is accepted by kAcceleratorConfig.
void check_accelerator_config(const nlohmann::json& value, const std::string& origin) {
  BRISK_CHECK(value.is_object(), origin,
              ": accelerator_config must be a JSON object of "
              "AcceleratorConfig's keys, got ",
              excerpt(value.dump()));
  for (const auto& [name, v] : value.items()) {
    const TrainerKey* key = find_in(kAcceleratorConfig, name);
    BRISK_CHECK(key, origin, ": accelerator_config holds the unknown key \"", excerpt(name), "\"");
    check_value(*key, "accelerator_config." + name, v, origin);
  }
}

// 1 or 0 when `text` is one of HfArgumentParser's spellings of a switch (in any case), else -1.
int switch_value(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  for (const char* yes : {"true", "yes", "t", "y"})
    if (text == yes) return 1;
  for (const char* no : {"false", "no", "f", "n"})
    if (text == no) return 0;
  return -1;
}
}  // namespace

bool is_trainer_key(const std::string& name) {
  return find_key(name) != nullptr;
}

std::vector<std::string> trainer_key_names() {
  std::vector<std::string> names;
  for (const TrainerKey& k : kTable) names.emplace_back(k.name);
  return names;
}

void check_trainer_key(const std::string& name, const nlohmann::json& value,
                       const std::string& origin) {
  const TrainerKey* key = find_key(name);
  BRISK_CHECK(key, origin, ": unknown option \"", excerpt(name), "\"");
  if (std::string(key->inert) == "{}" && !value.is_null())
    return check_accelerator_config(value, origin);
  check_value(*key, name, value, origin);
}

const std::vector<std::pair<std::string, std::string>>& other_spellings() {
  static const std::vector<std::pair<std::string, std::string>> spellings = {
      {"evaluation_strategy", "eval_strategy"},
      {"no_cuda", "use_cpu"},
      {"activation_checkpointing", "gradient_checkpointing"}};  // transformers 5's name
  return spellings;
}

std::string renamed_option(const std::string& name) {
  for (const auto& [other, own] : other_spellings())
    if (name == other) return own;
  return "";
}

// A JSON list of strings comma-joined (`if_empty` for an empty one); the value itself when an
// element is not a string (then refused as one).
static nlohmann::json comma_joined(const nlohmann::json& value, const char* if_empty) {
  std::string joined;
  for (const nlohmann::json& v : value) {
    if (!v.is_string()) return value;
    if (!joined.empty()) joined += ',';
    joined += v.get<std::string>();
  }
  return joined.empty() ? if_empty : joined;
}

nlohmann::json trainer_value_as_option(const std::string& name, const nlohmann::json& value) {
  if (name == "report_to" && value.is_array()) return comma_joined(value, "none");
  // PEFT's and TRL's lists of module names (an empty list: none given).
  if ((name == "lora_target_modules" || name == "lora_modules_to_save" ||
       name == "lora_target_parameters") &&
      value.is_array())
    return comma_joined(value, "");
  // PEFT's patterns, an object: the option's JSON text.
  if ((name == "lora_rank_pattern" || name == "lora_alpha_pattern") && value.is_object())
    return value.empty() ? nlohmann::json("") : nlohmann::json(value.dump());
  if (name == "greater_is_better" && value.is_boolean())
    return value.get<bool>() ? "true" : "false";
  return value;
}

nlohmann::json flag_value(const std::string& text) {
  if (text.empty()) return true;
  double number = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, number);
  if (ec == std::errc() && ptr == end) return number;
  const int on = switch_value(text);
  if (on >= 0) return on == 1;
  if (text == "None" || text == "null") return nullptr;
  if (text.front() == '[' || text.front() == '{') {
    try {  // bounded in depth, as every JSON brisk reads; what does not parse stays text
      return parse_json_bounded(text.data(), text.data() + text.size(), "a flag's value");
    } catch (const Error&) {
    }
  }
  return text;
}

}  // namespace brisk
