// The decision after an optimizer step's micro-batches, shared by the CPU and the CUDA backends
// (host and device code): from the summed loss and the sum of squared (scaled) gradients, whether
// to skip the update (fp16 overflow) and the factor the optimizer multiplies gradients by
// (clipping and loss unscaling folded in).
#pragma once

#include <cmath>

#include "core/rng.h"  // BRISK_HD

namespace brisk {

// Indices into the float control buffer the decision writes and optimizers read.
enum StepControl : int { kControlMultiplier = 0, kControlSkip = 1, kControlSize = 2 };
// Indices into the double statistics buffer: the summed loss of the step, and the sum of squares
// of its gradients.
enum StepStats : int { kStatLoss = 0, kStatGradSumSq = 1, kStatsSize = 2 };

// torch's clip_grad_norm_ factor: max_norm / (norm + 1e-6) when norm exceeds max_norm > 0.
BRISK_HD double clip_coefficient(double norm, double max_norm) {
  return max_norm > 0 && norm > max_norm ? max_norm / (norm + 1e-6) : 1.0;
}

// control[kControlSkip] = 1 when the loss or a gradient is not finite (with fp16 loss scaling an
// overflow to skip; otherwise the trainer then stops the run, so the weights stay as they were);
// control[kControlMultiplier] = clip_coefficient(norm / loss_scale) / loss_scale.
BRISK_HD void decide_step(const double* stats, double loss_scale, double max_norm, float* control) {
  const double loss = stats[kStatLoss], sumsq = stats[kStatGradSumSq];
  const bool skip = !(std::isfinite(loss) && std::isfinite(sumsq));
  const double norm = std::sqrt(sumsq) / loss_scale;
  control[kControlSkip] = skip ? 1.0f : 0.0f;
  control[kControlMultiplier] =
      skip ? 0.0f : static_cast<float>(clip_coefficient(norm, max_norm) / loss_scale);
}

}  // namespace brisk
