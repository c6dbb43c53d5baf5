// Reads a DeepSpeed config as Trainer and DeepSpeed's engine read it.
#include "train/deepspeed.h"

#include <algorithm>
#include <cctype>
#include <cmath>

#include "core/error.h"
#include "core/json_file.h"
#include "train/deepspeed_keys.h"

namespace brisk {
namespace {

using nlohmann::json;

bool is_auto(const json& v) {
  return v.is_string() && v.get<std::string>() == "auto";
}

// Numbers within rounding, arrays element by element, anything else exactly.
bool same(const json& a, const json& b) {
  if (a.is_number() && b.is_number()) {
    const double x = a.get<double>(), y = b.get<double>();
    return std::abs(x - y) <= 1e-12 * std::max(1.0, std::abs(x));
  }
  if (a.is_array() && b.is_array()) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i)
      if (!same(a[i], b[i])) return false;
    return true;
  }
  return a == b;
}

// The reader of one config: each check names the key and the file.
struct Reader {
  const std::string& origin;
  std::vector<std::string>* ignored;
  const TrainOptions& given;  // the options before the config

  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    BRISK_FAIL(origin, ": ", key, " ", what);
  }
  const json& object(const json& v, const std::string& key) const {
    if (!v.is_object()) fail(key, "must be an object");
    return v;
  }
  // A whole number in [lo, hi] (where "auto" is allowed the caller takes it first). The value is
  // shown cut short, whatever its type.
  int64_t whole(const json& v, const std::string& key, double lo, double hi) const {
    const bool ok = v.is_number() && v.get<double>() >= lo && v.get<double>() <= hi &&
                    v.get<double>() == std::floor(v.get<double>());
    if (!ok)
      fail(key, "must be a whole number in [" + std::to_string(static_cast<int64_t>(lo)) + ", " +
                    std::to_string(static_cast<int64_t>(hi)) + "], got " + excerpt(v.dump()));
    return static_cast<int64_t>(v.get<double>());
  }
  // A number in [lo, hi] (not "auto": Trainer fills in none of these).
  double ratio(const json& v, const std::string& key, double lo, double hi) const {
    if (!v.is_number() || !(v.get<double>() >= lo && v.get<double>() <= hi))
      fail(key, "must be a number in [" + json(lo).dump() + ", " + json(hi).dump() + "], got " +
                    v.dump());
    return v.get<double>();
  }
  bool flag(const json& v, const std::string& key) const {
    if (!v.is_boolean()) fail(key, "must be true or false");
    return v.get<bool>();
  }
  // "auto", or a value equal to the option's (as Trainer requires of explicit values).
  void agrees(const json& v, const std::string& key, const json& option,
              const std::string& option_name) const {
    if (is_auto(v)) return;
    if (!v.is_number() && !v.is_boolean() && !v.is_array())
      fail(key, "must be \"auto\" or a value");
    if (!same(v, option))
      fail(key, "is " + v.dump() + " but --" + option_name + " is " + option.dump() +
                    ": set it to \"auto\" or to the same value");
  }
  // params[key] as agrees(); absent, DeepSpeed runs with its default `fallback` (none: the
  // option's value), which Trainer leaves unchecked and brisk checks.
  void agrees_in(const json& params, const std::string& prefix, const std::string& key,
                 const json& fallback, const json& option, const std::string& option_name) const {
    if (params.contains(key)) return agrees(params[key], prefix + key, option, option_name);
    if (!fallback.is_null() && !same(fallback, option))
      fail(prefix + key, "is absent, so DeepSpeed takes its default " + fallback.dump() +
                             ", but --" + option_name + " is " + option.dump() +
                             ": set it to \"auto\"");
  }
  void ignore(const std::string& key) const {
    if (ignored) ignored->push_back(key);
  }
};

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// An option a config key sets as well: a flag left at its default yields to the config, a flag
// given another value contradicts it and is refused naming both.
// `config_value` is the key's value as the config holds it (the option's value by default).
template <typename T>
void set_option(const Reader& r, TrainOptions& o, T TrainOptions::*field, const T& value,
                const std::string& key, const std::string& flag,
                const std::string& config_value = "") {
  static const TrainOptions defaults;
  const T& given = r.given.*field;
  if (!same(json(given), json(defaults.*field)) && !same(json(given), json(value)))
    r.fail(key, "is " + (config_value.empty() ? json(value).dump() : config_value) + " but --" +
                    flag + " is " + json(given).dump() +
                    ": give one of the two, or the same value in both");
  o.*field = value;
  o.set_by[flag] = r.origin + ": " + key;
}

// optimizer: DeepSpeed's Adam and AdamW are brisk's adamw_torch (DeepSpeed's Adam decouples the
// weight decay unless adam_w_mode is false); its settings must agree with the options.
void read_optimizer(const Reader& r, const json& v, TrainOptions& o) {
  const json& section = r.object(v, "optimizer");
  for (const auto& [k, x] : section.items())
    if (k != "type" && k != "params") r.fail("optimizer." + k, "is not a key brisk knows");
  if (!section.contains("type") || !section["type"].is_string())
    r.fail("optimizer.type", "must name the optimizer, as \"AdamW\"");
  const std::string type = section["type"].get<std::string>();
  if (lower(type) != "adam" && lower(type) != "adamw")
    r.fail("optimizer.type",
           "\"" + excerpt(type) + "\" is not in brisk (it runs DeepSpeed's Adam and AdamW as " +
               "adamw_torch): remove the optimizer section to train with --optim");
  if (canonical_optimizer_name(o.optim) != "adamw_torch")
    r.fail("optimizer.type", "is " + type + " but --optim is " + o.optim +
                                 ": DeepSpeed's optimizer replaces it; remove one of the two");
  const json params =
      section.contains("params") ? r.object(section["params"], "optimizer.params") : json::object();
  const std::string p = "optimizer.params.";
  bool torch_adam = false;
  for (const auto& [k, x] : params.items()) {
    if (k == "torch_adam") {
      torch_adam = r.flag(x, p + k);  // which implementation: the same update
    } else if (k == "adam_w_mode") {
      if (!r.flag(x, p + k) && lower(type) == "adam")
        r.fail(p + k,
               "false makes Adam add the weight decay to the gradient (L2), which brisk "
               "does not have: use AdamW or adam_w_mode true");
    } else if (k == "bias_correction" || k == "amsgrad") {
      if (r.flag(x, p + k) != (k == "bias_correction"))
        r.fail(p + k, "is " + x.dump() + ": brisk's AdamW has it " +
                          (k == "bias_correction" ? "true" : "false"));
    } else if (k != "lr" && k != "betas" && k != "eps" && k != "weight_decay") {
      r.fail(p + k, "is not a parameter of brisk's AdamW");
    }
  }
  // Absent, DeepSpeed's defaults: its fused and CPU Adam's, or torch.optim.AdamW's decay.
  const double decay = torch_adam && lower(type) == "adamw" ? 0.01 : 0.0;
  r.agrees_in(params, p, "lr", 1e-3, o.learning_rate, "learning_rate");
  r.agrees_in(params, p, "betas", json::array({0.9, 0.999}),
              json::array({o.adam_beta1, o.adam_beta2}), "adam_beta1/--adam_beta2");
  r.agrees_in(params, p, "eps", 1e-8, o.adam_epsilon, "adam_epsilon");
  r.agrees_in(params, p, "weight_decay", decay, o.weight_decay, "weight_decay");
}

// scheduler: DeepSpeed's warm-up schedulers, run as DeepSpeed runs them (train/schedule.h).
void read_scheduler(const Reader& r, const json& v, TrainOptions& o) {
  const json& section = r.object(v, "scheduler");
  for (const auto& [k, x] : section.items())
    if (k != "type" && k != "params") r.fail("scheduler." + k, "is not a key brisk knows");
  if (!section.contains("type") || !section["type"].is_string())
    r.fail("scheduler.type", "must name the scheduler, as \"WarmupLR\"");
  DeepSpeedCurve c;
  c.type = section["type"].get<std::string>();
  const std::string nearest = c.type == "WarmupLR"         ? "constant_with_warmup"
                              : c.type == "WarmupDecayLR"  ? "linear"
                              : c.type == "WarmupCosineLR" ? "cosine"
                                                           : "";
  if (nearest.empty())
    r.fail("scheduler.type", "\"" + excerpt(c.type) + "\" is not in brisk (it runs WarmupLR, " +
                                 "WarmupDecayLR and WarmupCosineLR): remove the scheduler " +
                                 "section to use --lr_scheduler_type");
  if (o.lr_scheduler_type != "linear" && o.lr_scheduler_type != nearest)
    r.fail("scheduler.type", "is " + c.type + " but --lr_scheduler_type is " + o.lr_scheduler_type +
                                 ": DeepSpeed's scheduler replaces it; remove one of the two");
  const json params =
      section.contains("params") ? r.object(section["params"], "scheduler.params") : json::object();
  const std::string p = "scheduler.params.";
  const bool cosine = c.type == "WarmupCosineLR", decays = c.type != "WarmupLR";
  c.cos_min_ratio = cosine ? 1e-4 : 0.0;  // DeepSpeed's default
  for (const auto& [k, x] : params.items()) {
    if (k == "warmup_type") {
      if (x != "log" && x != "linear")
        r.fail(p + k, "must be \"log\" or \"linear\", got " + x.dump());
      c.log_warmup = x == "log";
    } else if (k == "warmup_num_steps") {
      if (!is_auto(x)) c.warmup_num_steps = r.whole(x, p + k, 0, 1e15);
    } else if (k == "total_num_steps" && decays) {
      if (!is_auto(x)) c.total_num_steps = r.whole(x, p + k, 0, 1e15);
    } else if (k == "warmup_min_lr" && !cosine) {
      // Trainer fills "auto" with 0 and checks no explicit value: a ratio of the peak here.
      if (!is_auto(x)) c.warmup_min_ratio = r.ratio(x, p + k, 0, o.learning_rate) / o.learning_rate;
    } else if (k == "warmup_max_lr" && !cosine) {
      r.agrees(x, p + k, o.learning_rate, "learning_rate");
    } else if ((k == "warmup_min_ratio" || k == "cos_min_ratio") && cosine) {
      (k == "cos_min_ratio" ? c.cos_min_ratio : c.warmup_min_ratio) = r.ratio(x, p + k, 0, 1);
    } else {
      r.fail(p + k, "is not a parameter of " + c.type);
    }
  }
  if (decays && !params.contains("total_num_steps"))
    r.fail(p + "total_num_steps", "is required by " + c.type + ": set it to \"auto\"");
  if (c.type == "WarmupDecayLR")
    r.agrees_in(params, p, "warmup_max_lr", 1e-3, o.learning_rate, "learning_rate");
  if (!params.contains("warmup_num_steps")) {
    c.warmup_num_steps = 1000;  // DeepSpeed's default
    c.warmup_num_steps_absent = true;
  }
  o.lr_scheduler_type = nearest;
  o.deepspeed_scheduler = c;
}

// The parallel degrees: tensor_parallel.autotp_size sets --tp_size (AutoTP splits the heads and
// MLP width as brisk's tensor parallelism does), sequence_parallel_size (DeepSpeed-Ulysses)
// --sp_size; the section's other settings have no effect in brisk.
bool read_parallelism(const Reader& r, const std::string& key, const json& v, TrainOptions& o) {
  if (key == "tensor_parallel") {
    for (const auto& [k, x] : r.object(v, key).items()) {
      const std::string name = key + "." + k;
      if (k != "autotp_size") {
        r.ignore(name);
        continue;
      }
      const int64_t size = r.whole(x, name, 0, 4096);
      if (size > 1) set_option(r, o, &TrainOptions::tp_size, size, name, "tp_size");
    }
    return true;
  }
  if (key == "sequence_parallel_size") {
    const int64_t size = r.whole(v, key, 1, 4096);
    if (size > 1) set_option(r, o, &TrainOptions::sp_size, size, key, "sp_size");
    return true;
  }
  if (key == "amp") {
    for (const auto& [k, x] : r.object(v, key).items()) {
      if (k == "enabled" && !is_auto(x) && r.flag(x, key + "." + k))
        r.fail(key + "." + k, "is true: apex's amp is not in brisk (use fp16 or bf16)");
      if (k != "enabled") r.ignore(key + "." + k);
    }
    return true;
  }
  return false;
}

void read_offload(const Reader& r, const std::string& k, const std::string& name, const json& x,
                  TrainOptions& o) {
  for (const auto& [d, y] : r.object(x, name).items()) {
    if (d != "device") {
      r.ignore(name + "." + d);
      continue;
    }
    if (!y.is_string()) r.fail(name + ".device", "must be \"none\", \"cpu\" or \"nvme\"");
    const std::string device = y.get<std::string>();
    if (k == "offload_optimizer" && (device == "none" || device == "cpu")) {
      set_option(r, o, &TrainOptions::offload_optimizer, device, name + ".device",
                 "offload_optimizer");
      continue;
    }
    if (device == "none") continue;
    r.fail(name + ".device", "\"" + excerpt(device) +
                                 "\" is not supported yet (brisk offloads the " +
                                 "optimizer to \"cpu\", nothing to \"nvme\", and keeps the " +
                                 "parameters on the device)");
  }
}

void read_zero(const Reader& r, const std::string& key, const json& v, TrainOptions& o) {
  for (const auto& [k, x] : r.object(v, key).items()) {
    const std::string name = key + "." + k;
    if (k == "stage") {
      set_option(r, o, &TrainOptions::zero_stage, r.whole(x, name, 0, 3), name, "zero_stage");
    } else if (k == "overlap_comm") {
      // Without overlap, every gradient in one bucket summed after backward.
      if (!is_auto(x) && !r.flag(x, name))
        set_option(r, o, &TrainOptions::ddp_bucket_cap_mb, 1e6, name, "ddp_bucket_cap_mb",
                   "false (one bucket after backward)");
    } else if (k == "reduce_bucket_size") {
      // Elements; brisk sums float32 gradients.
      if (!is_auto(x)) {
        const double mib =
            std::min(1e6, static_cast<double>(r.whole(x, name, 1, 1e15)) * 4 / (1 << 20));
        set_option(r, o, &TrainOptions::ddp_bucket_cap_mb, mib, name, "ddp_bucket_cap_mb",
                   x.dump() + " float32 elements (" + json(mib).dump() + " MiB)");
      }
    } else if (k == "stage3_prefetch_bucket_size" || k == "prefetch_bucket_size") {
      if (!is_auto(x))
        set_option(r, o, &TrainOptions::stage3_prefetch_bucket_size, r.whole(x, name, 0, 1e15),
                   name, "stage3_prefetch_bucket_size");
    } else if (k == "offload_optimizer" || k == "offload_param") {
      read_offload(r, k, name, x, o);
    } else if (k == "zenflow") {
      r.fail(name, "is not in brisk: ZenFlow updates only some of the gradients each step");
    } else if ((k == "zero_quantized_weights" || k == "zero_quantized_gradients") &&
               r.flag(x, name)) {
      r.fail(name, "is true: ZeRO++'s quantized communication is not in brisk (it sends " +
                       std::string("weights and gradients at full precision)"));
    } else {
      r.ignore(name);  // bucket sizes and thresholds of stages 2 and 3, contiguous_gradients...
    }
  }
}

}  // namespace

TrainOptions apply_deepspeed_json(const TrainOptions& options, const json& ds,
                                  const std::string& origin, int ranks,
                                  std::vector<std::string>* ignored) {
  TrainOptions o = options;
  const Reader r{origin, ignored, options};
  if (!ds.is_object()) BRISK_FAIL(origin, ": a DeepSpeed config must be a JSON object");
  check_deepspeed_keys(ds, origin);
  const int64_t micro = o.per_device_train_batch_size, accum = o.gradient_accumulation_steps;
  for (const auto& [key, v] : ds.items()) {
    if (key == "train_micro_batch_size_per_gpu") {
      r.agrees(v, key, micro, "per_device_train_batch_size");
    } else if (key == "gradient_accumulation_steps") {
      r.agrees(v, key, accum, "gradient_accumulation_steps");
    } else if (key == "train_batch_size") {
      r.agrees(v, key, micro * accum * ranks,
               "per_device_train_batch_size x gradient_accumulation_steps x ranks");
    } else if (key == "gradient_clipping") {
      r.agrees(v, key, o.max_grad_norm, "max_grad_norm");
    } else if (key == "fp16" || key == "bf16") {
      for (const auto& [k, x] : r.object(v, key).items()) {
        if (k == "enabled")
          r.agrees(x, key + ".enabled", key == "fp16" ? o.fp16 : o.bf16, key);
        else
          r.ignore(key + "." + k);  // loss-scale settings: brisk's scaler is Trainer's default
      }
    } else if (key == "optimizer") {
      read_optimizer(r, v, o);
    } else if (key == "scheduler") {
      read_scheduler(r, v, o);
    } else if (key == "zero_optimization") {
      read_zero(r, key, v, o);
    } else if (!read_parallelism(r, key, v, o)) {
      r.ignore(key);
    }
  }
  // With --max_steps the step counts are known now: a mismatch is refused before the run starts.
  if (o.max_steps > 0) learning_rate_schedule(o, o.max_steps);
  return o;
}

TrainOptions apply_deepspeed_config(const TrainOptions& o, int ranks,
                                    std::vector<std::string>* ignored) {
  if (o.deepspeed.empty()) return o;
  const std::string origin = "--deepspeed '" + excerpt(o.deepspeed) + "'";
  return apply_deepspeed_json(o, read_json_file(o.deepspeed, origin), origin, ranks, ignored);
}

Schedule learning_rate_schedule(const TrainOptions& o, int64_t total_steps) {
  const Schedule s{o.lr_scheduler_type,
                   resolve_warmup_steps(o.warmup_steps, o.warmup_ratio, total_steps), total_steps,
                   o.deepspeed_scheduler};
  const DeepSpeedCurve& c = o.deepspeed_scheduler;
  if (c.type.empty()) return s;
  // As Trainer checks them once the run's steps are known.
  const std::string origin = "--deepspeed '" + excerpt(o.deepspeed) + "': scheduler.params.";
  BRISK_CHECK(c.warmup_num_steps < 0 || c.warmup_num_steps == s.warmup_steps, origin,
              "warmup_num_steps is ",
              c.warmup_num_steps_absent ? "absent (DeepSpeed's default 1000)"
                                        : std::to_string(c.warmup_num_steps),
              " but the run warms up ", s.warmup_steps,
              " steps (--warmup_steps, --warmup_ratio): set it to \"auto\" or to the same value");
  BRISK_CHECK(c.total_num_steps < 0 || c.total_num_steps == total_steps, origin,
              "total_num_steps is ", c.total_num_steps, " but the run has ", total_steps,
              " steps (--max_steps, or --num_train_epochs x steps per epoch): set it to \"auto\" "
              "or to the same value");
  return s;
}

}  // namespace brisk
