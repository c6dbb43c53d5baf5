// Schedule multipliers.
#include "train/schedule.h"

#include <algorithm>
#include <cmath>

namespace brisk {

double DeepSpeedCurve::at(int64_t i, int64_t warmup_steps, int64_t total_steps) const {
  if (i < 0) return type == "WarmupCosineLR" ? 0.0 : warmup_min_ratio;
  const double s = static_cast<double>(i);
  const double w = static_cast<double>(std::max<int64_t>(2, warmup_steps));
  if (s < w) {
    const double rise = log_warmup ? std::log(s + 1) / std::log(w) : s / w;
    return warmup_min_ratio + (1 - warmup_min_ratio) * rise;
  }
  if (type == "WarmupLR") return 1.0;
  const double t = static_cast<double>(total_steps);
  const double rest = std::max(1.0, t - w);
  if (type == "WarmupDecayLR")
    return warmup_min_ratio + (1 - warmup_min_ratio) * std::max(0.0, (t - s) / rest);
  const double progress = std::min(1.0, (s - w + 1) / rest);
  return std::max(0.0, cos_min_ratio + (1 - cos_min_ratio) * 0.5 * (1 + std::cos(M_PI * progress)));
}

double Schedule::factor(int64_t step) const {
  // DeepSpeed's engine steps its scheduler after each update, from iteration -1: the update
  // `step` uses iteration step - 1.
  if (!deepspeed.type.empty()) return deepspeed.at(step - 1, warmup_steps, total_steps);
  const double s = static_cast<double>(step);
  const double w = static_cast<double>(warmup_steps);
  if (type == "constant") return 1.0;
  if (step < warmup_steps) return s / std::max(1.0, w);
  if (type == "constant_with_warmup") return 1.0;
  const double rest = std::max(1.0, static_cast<double>(total_steps - warmup_steps));
  const double progress = (s - w) / rest;
  if (type == "cosine") return std::max(0.0, 0.5 * (1.0 + std::cos(M_PI * progress)));
  return std::max(0.0, (static_cast<double>(total_steps) - s) / rest);  // linear
}

int64_t resolve_warmup_steps(double warmup_steps, double warmup_ratio, int64_t total_steps) {
  if (warmup_steps >= 1) return static_cast<int64_t>(warmup_steps);
  const double ratio = warmup_steps > 0 ? warmup_steps : warmup_ratio;
  return static_cast<int64_t>(std::ceil(ratio * static_cast<double>(total_steps)));
}

}  // namespace brisk
