// Clipping by the global L2 norm of all gradients, as torch.nn.utils.clip_grad_norm_. The
// trainer folds the clip coefficient (and fp16's unscaling) into the optimizer's gradient
// multiplier, so clipping costs one read of the gradients.
#pragma once

#include "core/tensor.h"

namespace brisk {
// The L2 norm of a flat float32 gradient buffer (inf or NaN when an element is).
double grad_l2_norm(const Tensor& grads);
// torch's factor: max_norm / (norm + 1e-6) when norm exceeds max_norm > 0, else 1.
double clip_coefficient(double norm, double max_norm);
}  // namespace brisk
