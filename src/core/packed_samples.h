// The samples of a padding-free or packed batch: what the data loader lays end to end, the
// model's blocks and heads read, and the backends' packed attention takes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace brisk {

// The samples of a padding-free or packed batch, laid end to end along its rows: sample s is
// tokens [starts[s], starts[s + 1]) of the batch's B * T tokens taken row after row, within one
// row; starts[0] = 0 and the last entry is B * T, so every token belongs to one sample (a packed
// row's padding is a sample of its own, whose loss is ignored). Attention never crosses samples,
// and positions restart at each. `starts` are host values: the calls that read them loop over the
// samples. Where the model lays them in the backend's memory too (PlanOptions::packed_samples),
// `at` holds the starts (int32 [count + 1]) and `positions` each token's place in its sample (int32
// [B * T]): the calls that read those launch the same work for any layout of as many samples.
struct PackedSamples {
  std::vector<int64_t> starts;
  Tensor at, positions;
  int64_t count() const { return starts.empty() ? 0 : static_cast<int64_t>(starts.size()) - 1; }
  int64_t length(int64_t s) const {
    return starts[static_cast<size_t>(s + 1)] - starts[static_cast<size_t>(s)];
  }
  bool empty() const { return count() == 0; }
};

}  // namespace brisk
