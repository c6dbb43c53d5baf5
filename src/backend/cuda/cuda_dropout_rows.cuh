// Dropout over one row on one warp, for kernels that take a row at a time (the residual add before
// a norm, a norm's backward with its residual branch): the dropout kernel's words and arithmetic,
// element e's word rng_block(key, e / 4).v[e % 4], the scaling its own rounding (__fmul_rn).
#pragma once

#include "backend/cuda/cuda_elements.cuh"
#include "core/rng.h"

namespace brisk::cuda {

// Keep elements whose word is >= threshold, scaled; `drop` false: every element kept unscaled
// (p = 0, no words drawn).
struct RowDropout {
  RngKey key;
  uint32_t threshold = 0;
  float scale = 1.0f;
  bool drop = false;
};

inline RowDropout row_dropout(float p, const RngKey& key) {
  return {key, dropout_threshold(p), 1.0f / (1.0f - p), p != 0.0f};
}

// out[c] = (add ? add[c] : 0) + dropout(in)[c] for the C elements of a row whose first element is
// element e0 of the whole. A lane takes four adjacent columns at a time: one Philox block per
// group where the row's groups line up with the generator's. Each element is read and written by
// one thread, so out may alias in or add.
template <typename T>
__device__ __forceinline__ void dropout_row(const float* add, const T* in, const RowDropout& d,
                                            uint64_t e0, float* out, int64_t C) {
  const int lane = threadIdx.x & 31;
  const bool lined_up = e0 % 4 == 0;
  for (int64_t c0 = 4 * static_cast<int64_t>(lane); c0 < C; c0 += 128) {
    Philox4 words{};
    if (d.drop && lined_up) words = rng_block(d.key, (e0 + static_cast<uint64_t>(c0)) / 4);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t c = c0 + j;
      if (c >= C) break;
      float v = widen(in[c]);
      if (d.drop) {
        const uint64_t e = e0 + static_cast<uint64_t>(c);
        const uint32_t w = lined_up ? words.v[j] : rng_block(d.key, e / 4).v[e % 4];
        v = w >= d.threshold ? __fmul_rn(v, d.scale) : 0.0f;
      }
      out[c] = add != nullptr ? add[c] + v : v;
    }
  }
}

}  // namespace brisk::cuda
