// Learning-rate schedules as transformers' get_scheduler builds them: the multiplier of the peak
// rate at optimizer step `step` (0-based, the value used by that step's update).
#pragma once

#include <cstdint>
#include <string>

namespace brisk {

struct Schedule {
  std::string type = "linear";  // linear, cosine, constant, constant_with_warmup
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;

  double factor(int64_t step) const;
};

// warmup_steps as TrainingArguments reads it: whole steps, or below 1 a fraction of the total
// (rounded up, as transformers' get_warmup_steps does); warmup_ratio likewise.
int64_t resolve_warmup_steps(double warmup_steps, double warmup_ratio, int64_t total_steps);

}  // namespace brisk
