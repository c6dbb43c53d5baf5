// The CUDA backend's checks of its arguments, shared by its source files: device tensors of the
// dtype an op reads, and the roundings a gradient may ask for. Each throws naming `what` or `op`.
#pragma once

#include <cstdint>

#include "backend/attention.h"
#include "core/error.h"
#include "core/tensor.h"

namespace brisk::cuda {

// A float32 tensor in device memory; `what` names it in errors.
inline float* dev(const Tensor& t, const char* what) {
  BRISK_CHECK(t.device() == Device::cuda, what, " is not in GPU memory");
  BRISK_CHECK(t.dtype() == DType::f32, what, " must be float32, got ", dtype_name(t.dtype()));
  return t.f32();
}
// The same for optional tensors: null when empty.
inline float* dev_or_null(const Tensor& t, const char* what) {
  return t.empty() ? nullptr : dev(t, what);
}
// Throws naming `op` unless `dtype` is one a gradient may be rounded to as it is read (f32: none).
inline void check_rounding(DType dtype, const char* op) {
  BRISK_CHECK(dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::f16, op,
              ": cannot round to ", dtype_name(dtype));
}
// An int32 tensor in device memory (ids, labels, experts).
inline int32_t* dev_i32(const Tensor& t, const char* what) {
  BRISK_CHECK(t.device() == Device::cuda && t.dtype() == DType::i32, what,
              " must be int32 in GPU memory");
  return t.i32();
}
inline const int32_t* ids_or_null(const Tensor& t, const char* what) {
  return t.empty() ? nullptr : dev_i32(t, what);
}
// Throws unless the key mask's tensors are in GPU memory.
inline void check_mask_on_device(const KeyMask& m) {
  ids_or_null(m.keep, "the attention's key mask");
  ids_or_null(m.lengths, "the attention's key lengths");
}
}  // namespace brisk::cuda
