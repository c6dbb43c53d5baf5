// The factor a loss's gradient is scaled by (d(loss)/d(summed loss): the loss scale over the
// batch's targets), given on the host or read from backend memory where a recorded step replays.
#pragma once

#include "core/rng.h"  // BRISK_HD

namespace brisk {

struct GradScale {
  GradScale(float v = 1) : value(v) {}  // NOLINT(google-explicit-constructor): a float is one
  float value;
  // Where set, a float in the backend's memory the value is multiplied by as the gradient is
  // written: a recorded step (Backend::record) replays with the factor written there.
  const float* held = nullptr;
};

// The factor a gradient is written with.
BRISK_HD float applied(const GradScale& s) {
  return s.held ? s.value * *s.held : s.value;
}

}  // namespace brisk
