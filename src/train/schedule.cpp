// Schedule multipliers.
#include "train/schedule.h"

#include <algorithm>
#include <cmath>

namespace brisk {

double Schedule::factor(int64_t step) const {
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
