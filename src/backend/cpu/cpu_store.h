// Results written where the output is float32, or bf16 (a CPU bf16 run's saved activations,
// stored only in bf16: Backend::reads_product_input), rounded to nearest even as they are stored.
#pragma once

#include <algorithm>
#include <cstdint>

#include "backend/cpu/cpu_tiles.h"

namespace brisk {

// Runs kernel(dst, begin, count), which writes the float32 results of elements [begin, begin +
// count) of a row of n at dst: straight into a float32 row, or into a buffer, a chunk at a time,
// rounded into a bf16 row. The same kernel computes both, so the bf16 values are the float32
// ones rounded, bit for bit.
template <typename Kernel>
void store_row(void* row, bool bf16, int64_t n, Kernel kernel) {
  if (!bf16) {
    kernel(static_cast<float*>(row), int64_t{0}, n);
    return;
  }
  constexpr int64_t kChunk = 256;
  float buf[kChunk];
  auto* out = static_cast<uint16_t*>(row);
  for (int64_t c = 0; c < n; c += kChunk) {
    const int64_t m = std::min(kChunk, n - c);
    kernel(buf, c, m);
    bf16_round_row(buf, out + c, m);
  }
}

}  // namespace brisk
