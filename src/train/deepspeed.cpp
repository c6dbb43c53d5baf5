#include "train/deepspeed.h"

#include <cmath>

#include "core/error.h"
#include "core/json_file.h"

namespace brisk {
namespace {

bool is_auto(const nlohmann::json& v) {
  return v.is_string() && v.get<std::string>() == "auto";
}

// The reader of one config: each check names the key and the file.
struct Reader {
  const std::string& origin;
  std::vector<std::string>* ignored;

  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    BRISK_FAIL(origin, ": ", key, " ", what);
  }
  const nlohmann::json& object(const nlohmann::json& v, const std::string& key) const {
    if (!v.is_object()) fail(key, "must be an object");
    return v;
  }
  // A number that must be a whole number in [lo, hi].
  int64_t whole(const nlohmann::json& v, const std::string& key, double lo, double hi) const {
    if (!v.is_number()) fail(key, "must be a number or \"auto\"");
    const double x = v.get<double>();
    if (!(x >= lo && x <= hi) || x != std::floor(x))
      fail(key, "must be a whole number in [" + std::to_string(static_cast<int64_t>(lo)) + ", " +
                    std::to_string(static_cast<int64_t>(hi)) + "], got " + v.dump());
    return static_cast<int64_t>(x);
  }
  bool flag(const nlohmann::json& v, const std::string& key) const {
    if (!v.is_boolean()) fail(key, "must be true or false");
    return v.get<bool>();
  }
  // "auto", or a value equal to the option's (as Trainer requires of explicit values).
  template <typename T>
  void agrees(const nlohmann::json& v, const std::string& key, T option,
              const std::string& option_name) const {
    if (is_auto(v)) return;
    if (!v.is_number() && !v.is_boolean()) fail(key, "must be \"auto\" or a value");
    const double x = v.is_boolean() ? (v.get<bool>() ? 1.0 : 0.0) : v.get<double>();
    if (std::abs(x - static_cast<double>(option)) > 1e-12 * std::max(1.0, std::abs(x)))
      fail(key, "is " + v.dump() + " but --" + option_name + " is " +
                    nlohmann::json(option).dump() + ": set it to \"auto\" or to the same value");
  }
  void ignore(const std::string& key) const {
    if (ignored) ignored->push_back(key);
  }
};

}  // namespace

TrainOptions apply_deepspeed_json(const TrainOptions& options, const nlohmann::json& ds,
                                  const std::string& origin, int ranks,
                                  std::vector<std::string>* ignored) {
  TrainOptions o = options;
  const Reader r{origin, ignored};
  if (!ds.is_object()) BRISK_FAIL(origin, ": a DeepSpeed config must be a JSON object");
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
    } else if (key == "optimizer" || key == "scheduler") {
      // Trainer's optimizer and schedule come from TrainingArguments; a config may only restate
      // them as "auto".
      for (const auto& [k, x] : r.object(v, key).items()) {
        if (k == "type") continue;
        if (k != "params") r.fail(key + "." + k, "is not a key brisk knows");
        for (const auto& [p, y] : r.object(x, key + ".params").items())
          if (!is_auto(y))
            r.fail(key + ".params." + p,
                   "must be \"auto\": brisk takes the " + key +
                       "'s settings from its options (--optim, --learning_rate, ...)");
      }
    } else if (key == "zero_optimization") {
      for (const auto& [k, x] : r.object(v, key).items()) {
        const std::string name = key + "." + k;
        if (k == "stage") {
          o.zero_stage = r.whole(x, name, 0, 3);
        } else if (k == "overlap_comm") {
          // Without overlap, every gradient in one bucket summed after backward.
          if (!is_auto(x) && !r.flag(x, name)) o.ddp_bucket_cap_mb = 1e6;
        } else if (k == "reduce_bucket_size") {
          // Elements; brisk sums float32 gradients.
          if (!is_auto(x))
            o.ddp_bucket_cap_mb =
                std::min(1e6, static_cast<double>(r.whole(x, name, 1, 1e15)) * 4 / (1 << 20));
        } else if (k == "stage3_prefetch_bucket_size") {
          if (!is_auto(x)) o.stage3_prefetch_bucket_size = r.whole(x, name, 0, 1e15);
        } else if (k == "offload_optimizer" || k == "offload_param") {
          for (const auto& [d, y] : r.object(x, name).items()) {
            if (d != "device") {
              r.ignore(name + "." + d);
              continue;
            }
            if (!y.is_string()) r.fail(name + ".device", "must be \"none\", \"cpu\" or \"nvme\"");
            const std::string device = y.get<std::string>();
            if (k == "offload_optimizer" && (device == "none" || device == "cpu")) {
              o.offload_optimizer = device;
              continue;
            }
            if (device == "none") continue;
            r.fail(name + ".device",
                   "\"" + excerpt(device) + "\" is not supported yet (brisk offloads the " +
                       "optimizer to \"cpu\", nothing to \"nvme\", and keeps the parameters " +
                       "on the device)");
          }
        } else {
          r.ignore(name);  // bucket sizes and thresholds of stages 2 and 3, contiguous_gradients...
        }
      }
    } else {
      r.ignore(key);
    }
  }
  return o;
}

TrainOptions apply_deepspeed_config(const TrainOptions& o, int ranks,
                                    std::vector<std::string>* ignored) {
  if (o.deepspeed.empty()) return o;
  const std::string origin = "--deepspeed '" + excerpt(o.deepspeed) + "'";
  return apply_deepspeed_json(o, read_json_file(o.deepspeed, origin), origin, ranks, ignored);
}

}  // namespace brisk
