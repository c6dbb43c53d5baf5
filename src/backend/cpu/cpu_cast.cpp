// Conversions between float32 and the 16-bit formats on the CPU, in-place rounding (the CPU's
// emulation of 16-bit storage).
#include <algorithm>
#include <cmath>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_tiles.h"

namespace brisk {

namespace {
bool is_float16(DType t) {
  return t == DType::bf16 || t == DType::f16;
}

constexpr int64_t kChunk = 4096;  // 16-bit casts and fp16 rounding go in rows of this many values

// row(in + b, out + b, count) over [0, n) in rows of kChunk, the rows shared by the threads.
template <typename In, typename Out>
void by_rows(const In* in, Out* out, int64_t n, void (*row)(const In*, Out*, int64_t)) {
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < n; b += kChunk) row(in + b, out + b, std::min(kChunk, n - b));
}
}  // namespace

void CpuBackend::cast(const Tensor& src, const Tensor& dst) {
  check_same_numel(src, dst, "cast");
  const int64_t n = src.numel();
  if (src.dtype() == dst.dtype()) return copy(src, dst);
  if (src.dtype() == DType::f32 && is_float16(dst.dtype()))
    return by_rows(src.f32(), dst.as<uint16_t>(), n,
                   dst.dtype() == DType::bf16 ? bf16_round_row : fp16_round_row);
  if (is_float16(src.dtype()) && dst.dtype() == DType::f32)
    return by_rows(src.as<uint16_t>(), dst.f32(), n,
                   src.dtype() == DType::bf16 ? bf16_widen_row : fp16_widen_row);
  BRISK_FAIL("cast from ", dtype_name(src.dtype()), " to ", dtype_name(dst.dtype()),
             " is not supported");
}

void CpuBackend::round_to(DType dtype, const Tensor& src, const Tensor& dst) {
  check_same_numel(src, dst, "round_to");
  if (dtype == DType::f32) return copy(src, dst);
  BRISK_CHECK(is_float16(dtype), "round_to: ", dtype_name(dtype), " is not a 16-bit float");
  const float* in = src.f32();
  float* out = dst.f32();
  const int64_t n = src.numel();
  if (dtype == DType::bf16) {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_float(float_to_bf16(in[i]));
  } else {
    by_rows(in, out, n, fp16_rounded_row);
  }
}

}  // namespace brisk
