// Dropout over a contiguous range of elements on the CPU, drawing the counter-based random words
// a SIMD batch at a time. Shared by the elementwise and attention kernels.
#pragma once

#include <algorithm>
#include <cstdint>

#include "backend/cpu/cpu_tiles.h"
#include "core/rng.h"

namespace brisk {

// out[i] = (add ? add[i] : 0) + (kept(first + i) ? in[i] / (1 - p) : 0) for i in [0, n).
// out may alias in or add.
inline void dropout_range(const RngKey& key, float p, uint64_t first, int64_t n, const float* in,
                          const float* add, float* out) {
  constexpr int64_t kSpan = 4 * kPhiloxLanes;  // elements per batch of random words
  const uint32_t threshold = dropout_threshold(p);
  const float scale = 1.0f / (1.0f - p);
  uint32_t words[kSpan];
  for (int64_t i = 0; i < n;) {
    const uint64_t e = first + static_cast<uint64_t>(i);
    const uint64_t base = e & ~static_cast<uint64_t>(kSpan - 1);
    rng_blocks(key, base >> 2, words);
    const int64_t off = static_cast<int64_t>(e - base);
    const int64_t count = std::min(kSpan - off, n - i);
    const uint32_t* w = words + off;
    if (add) {
      for (int64_t j = 0; j < count; ++j)
        out[i + j] = add[i + j] + (w[j] >= threshold ? in[i + j] * scale : 0.0f);
    } else {
      for (int64_t j = 0; j < count; ++j) out[i + j] = w[j] >= threshold ? in[i + j] * scale : 0.0f;
    }
    i += count;
  }
}

// out[i] = x[i] + dropout(r)[i] over elements first.. first + n of the whole: dropout_add's sum,
// r float32 or bf16 (a product's output as it stored it), widened a piece at a time - the same
// values, and the same mask (keyed by the element's index), as the float32 branch holding them.
// out may alias x.
inline void dropout_add_span(const RngKey& key, float p, uint64_t first, int64_t n, const float* x,
                             const void* r, bool r_bf16, float* out) {
  constexpr int64_t kPiece = 1024;
  float buf[kPiece];
  for (int64_t i = 0; i < n; i += kPiece) {
    const int64_t m = std::min(kPiece, n - i);
    if (r_bf16) bf16_widen_row(static_cast<const uint16_t*>(r) + i, buf, m);
    const float* b = r_bf16 ? buf : static_cast<const float*>(r) + i;
    if (p != 0.0f) {
      dropout_range(key, p, first + static_cast<uint64_t>(i), m, b, x + i, out + i);
      continue;
    }
#pragma omp simd
    for (int64_t j = 0; j < m; ++j) out[i + j] = x[i + j] + b[j];
  }
}

}  // namespace brisk
