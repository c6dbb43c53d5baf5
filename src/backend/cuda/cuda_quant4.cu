// 4-bit dequantization on CUDA (QLoRA's frozen base): one thread per packed byte (two values),
// the absmax read per value's block; a nested absmax is a product, then a sum, each rounded
// (__fmul_rn, __fadd_rn: never fused), so the bits are the CPU's and bitsandbytes'.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_launch.h"
#include "core/quant4.h"

namespace brisk::cuda {

namespace {

__device__ __forceinline__ float block_absmax(const Quant4Args& q, int64_t b) {
  if (!q.nested) return q.absmax[b];
  return __fadd_rn(__fmul_rn(q.code2[q.qabsmax[b]], q.absmax2[b / Quant4Layout::kNestedBlock]),
                   q.offset);
}

__device__ __forceinline__ void store(void* out, int dtype, int64_t i, float v) {
  if (dtype == 0)
    static_cast<float*>(out)[i] = v;
  else if (dtype == 1)
    static_cast<__nv_bfloat16*>(out)[i] = __float2bfloat16_rn(v);
  else
    static_cast<__half*>(out)[i] = __float2half_rn(v);
}

__global__ void dequantize_4bit_kernel(Quant4Args q, void* out, int dtype) {
  const int64_t bytes = (q.numel + 1) / 2;
  for (int64_t k = global_thread(); k < bytes; k += grid_threads()) {
    const uint8_t byte = q.packed[k];
    for (int h = 0; h < 2; ++h) {
      const int64_t i = 2 * k + h;
      if (i >= q.numel) break;
      const int code = h ? byte & 15 : byte >> 4;
      const float v = __fmul_rn(quant4_value(q.type, code), block_absmax(q, i / q.blocksize));
      const int64_t cols = q.transposed_cols;
      store(out, dtype, cols ? (i % cols) * (q.numel / cols) + i / cols : i, v);
    }
  }
}

}  // namespace

void dequantize_4bit(cudaStream_t s, const Quant4Args& q, void* out, int dtype) {
  if (q.numel == 0) return;
  dequantize_4bit_kernel<<<grid_for((q.numel + 1) / 2), kThreads, 0, s>>>(q, out, dtype);
  check_launch("dequantize_4bit");
}

}  // namespace brisk::cuda
