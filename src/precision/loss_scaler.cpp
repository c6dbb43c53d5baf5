// Dynamic loss scale updates.
#include "precision/loss_scaler.h"

namespace brisk {

void DynamicLossScaler::update(bool found_inf) {
  if (found_inf) {
    scale_ *= options_.backoff_factor;
    growth_tracker_ = 0;
    return;
  }
  if (++growth_tracker_ == options_.growth_interval) {
    scale_ *= options_.growth_factor;
    growth_tracker_ = 0;
  }
}

}  // namespace brisk
