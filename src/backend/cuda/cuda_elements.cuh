// Device helpers for kernels whose tensors are float32 or bf16 (cuda_kernels.h's In and Out): a
// bf16 run's saved activations, read widened to float and written rounded to nearest even.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "core/dtype.h"

namespace brisk::cuda {

__device__ __forceinline__ float widen(float v) {
  return v;
}
__device__ __forceinline__ float widen(__nv_bfloat16 v) {
  return __bfloat162float(v);
}
__device__ __forceinline__ void put(float* p, float v) {
  *p = v;
}
__device__ __forceinline__ void put(__nv_bfloat16* p, float v) {
  *p = __float2bfloat16_rn(v);
}

// v rounded to nearest even in `dtype` (bf16 or f16: the round_bf16 and round_f16 kernels' bits)
// and kept as float; any other dtype: v.
__device__ __forceinline__ float rounded(float v, DType dtype) {
  if (dtype == DType::bf16) return __bfloat162float(__float2bfloat16_rn(v));
  if (dtype == DType::f16) return __half2float(__float2half_rn(v));
  return v;
}

// f(T{}) with T = __nv_bfloat16 where `bf16`, else float: picks a kernel's element type.
template <typename F>
void with_elements(bool bf16, F f) {
  if (bf16)
    f(__nv_bfloat16{});
  else
    f(float{});
}

}  // namespace brisk::cuda
