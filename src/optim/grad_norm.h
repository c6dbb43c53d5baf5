// Clipping by the global L2 norm of all gradients, as torch.nn.utils.clip_grad_norm_.
#pragma once

#include "core/tensor.h"

namespace brisk {
// Scales grads by max_norm / (norm + 1e-6) when the norm exceeds max_norm (> 0); returns the
// norm before clipping.
double clip_grad_norm(const Tensor& grads, double max_norm);
// grads *= factor (unscaling after fp16 loss scaling).
void scale_grads(const Tensor& grads, float factor);
}  // namespace brisk
