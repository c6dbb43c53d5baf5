// Weights held by a backend for a scope.
#pragma once

#include "backend/backend.h"

namespace brisk {

// Holds `weights` for a scope (Backend::hold_weights); empty: nothing is held.
class HeldWeights {
 public:
  HeldWeights(Backend& be, const Tensor& weights) : be_(be) {
    if (!weights.empty()) be_.hold_weights(weights);
  }
  ~HeldWeights() { be_.release_weights(); }
  HeldWeights(const HeldWeights&) = delete;
  HeldWeights& operator=(const HeldWeights&) = delete;

 private:
  Backend& be_;
};

}  // namespace brisk
