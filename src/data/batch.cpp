#include "data/batch.h"

#include <algorithm>
#include <limits>

namespace brisk {

void reset_label_values(const Batch& batch) {
  const Tensor& t = batch.label_values;
  if (!t.empty()) std::fill(t.f32(), t.f32() + t.numel(), std::numeric_limits<float>::quiet_NaN());
}

}  // namespace brisk
