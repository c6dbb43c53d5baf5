// 4-bit dequantization on the CPU (QLoRA's frozen base): block by block, the blocks shared by
// the threads; a transposed output written at each value's transposed place.
#include "backend/cpu/cpu_backend.h"
#include "core/dtype.h"

namespace brisk {

void CpuBackend::dequantize_4bit(const Quant4Tensor& q, const Tensor& out) {
  check_dequantize_4bit(q, out);
  const Quant4Layout& l = q.layout;
  const uint8_t* packed = q.packed.as<uint8_t>();
  const int64_t B = l.blocksize, n = l.numel;
  const DType dtype = out.dtype();
  const int64_t cols = q.transposed_cols, rows = cols ? n / cols : 0;
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < l.blocks(); ++b) {
    // A nested absmax: its code's value times its nested block's absmax, then the offset, each
    // rounded (this file is compiled without fused multiply-adds).
    const float absmax = l.nested ? q.code2.f32()[q.qabsmax.as<uint8_t>()[b]] *
                                            q.absmax2.f32()[b / Quant4Layout::kNestedBlock] +
                                        q.offset
                                  : q.absmax.f32()[b];
    const int64_t end = std::min(n, (b + 1) * B);
    for (int64_t i = b * B; i < end; ++i) {
      const uint8_t byte = packed[i / 2];
      const float v = quant4_value(l.type, i % 2 ? byte & 15 : byte >> 4) * absmax;
      const int64_t at = cols ? (i % cols) * rows + i / cols : i;
      if (dtype == DType::f32)
        out.f32()[at] = v;
      else
        out.as<uint16_t>()[at] = dtype == DType::bf16 ? float_to_bf16(v) : float_to_fp16(v);
    }
  }
}

}  // namespace brisk
