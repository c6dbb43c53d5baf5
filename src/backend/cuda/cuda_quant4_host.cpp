// 4-bit dequantization on the GPU: the tensors' device pointers for cuda_quant4.cu's kernel.
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_kernels.h"

namespace brisk {

void CudaBackend::dequantize_4bit(const Quant4Tensor& q, const Tensor& out) {
  check_dequantize_4bit(q, out);
  for (const Tensor* t : {&q.packed, &q.absmax, &q.qabsmax, &q.absmax2, &q.code2, &out})
    BRISK_CHECK(t->empty() || t->device() == Device::cuda,
                "dequantize_4bit: its tensors must be in GPU memory");
  cuda::Quant4Args a;
  a.packed = q.packed.as<uint8_t>();
  if (q.layout.nested) {
    a.qabsmax = q.qabsmax.as<uint8_t>();
    a.absmax2 = q.absmax2.f32();
    a.code2 = q.code2.f32();
  } else {
    a.absmax = q.absmax.f32();
  }
  a.offset = q.offset;
  a.numel = q.layout.numel;
  a.blocksize = q.layout.blocksize;
  a.type = q.layout.type;
  a.nested = q.layout.nested;
  a.transposed_cols = q.transposed_cols;
  const int dtype = out.dtype() == DType::f32 ? 0 : out.dtype() == DType::bf16 ? 1 : 2;
  cuda::dequantize_4bit(stream_, a, out.data(), dtype);
}

}  // namespace brisk
