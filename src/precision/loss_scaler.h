// The dynamic loss scaler of fp16 training, with torch.cuda.amp.GradScaler's defaults: start at
// 2^16, halve and skip the optimizer step when a gradient overflows, double after 2000 steps in a
// row without overflow.
#pragma once

#include <cstdint>

namespace brisk {

struct LossScalerOptions {
  double init_scale = 65536.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
};

class DynamicLossScaler {
 public:
  explicit DynamicLossScaler(LossScalerOptions options = {})
      : options_(options), scale_(options.init_scale) {}
  double scale() const { return scale_; }
  int64_t growth_tracker() const { return growth_tracker_; }
  // After each optimizer step's backward: found_inf means the step is skipped.
  void update(bool found_inf);
  // For checkpoints.
  void restore(double scale, int64_t growth_tracker) {
    scale_ = scale;
    growth_tracker_ = growth_tracker;
  }

 private:
  LossScalerOptions options_;
  double scale_;
  int64_t growth_tracker_ = 0;
};

}  // namespace brisk
