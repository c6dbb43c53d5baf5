// Learning-rate schedules as transformers' get_scheduler builds them: the multiplier of the peak
// rate at optimizer step `step` (0-based, the value used by that step's update).
#pragma once

#include <cstdint>
#include <string>

namespace brisk {

// A DeepSpeed scheduler (a --deepspeed config's scheduler.type) as DeepSpeed's engine runs it:
// a warm-up of max(2, warmup steps) from warmup_min_ratio of the peak, logarithmic or linear, then
// WarmupLR holds the peak, WarmupDecayLR falls linearly back to warmup_min_ratio at the last step
// and WarmupCosineLR falls on a cosine to cos_min_ratio.
struct DeepSpeedCurve {
  std::string type;        // "": none; WarmupLR, WarmupDecayLR or WarmupCosineLR
  bool log_warmup = true;  // warmup_type "log" (DeepSpeed's default) or "linear"
  double warmup_min_ratio = 0;
  double cos_min_ratio = 0;
  // The config's own step counts (train/deepspeed.h checks them against the run's); -1: "auto".
  int64_t warmup_num_steps = -1, total_num_steps = -1;
  bool warmup_num_steps_absent = false;  // warmup_num_steps is DeepSpeed's default

  // The multiplier at DeepSpeed's iteration `i` (-1 before the first scheduler step).
  double at(int64_t i, int64_t warmup_steps, int64_t total_steps) const;
};

struct Schedule {
  std::string type = "linear";  // linear, cosine, constant, constant_with_warmup
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;
  DeepSpeedCurve deepspeed;  // with a type, the curve replaces `type`'s

  double factor(int64_t step) const;
};

// warmup_steps as TrainingArguments reads it: whole steps, or below 1 a fraction of the total
// (rounded up, as transformers' get_warmup_steps does); warmup_ratio likewise.
int64_t resolve_warmup_steps(double warmup_steps, double warmup_ratio, int64_t total_steps);

}  // namespace brisk
