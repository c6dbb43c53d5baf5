// Counter-based random numbers (Philox-4x32-10): the value for an element depends only on
// (seed, step, site, element), so a recomputation or another backend reproduces it exactly.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define BRISK_HD __host__ __device__ __forceinline__
#else
#define BRISK_HD inline
#endif

namespace brisk {

struct Philox4 {
  uint32_t v[4];
};

BRISK_HD uint32_t mulhilo(uint32_t a, uint32_t b, uint32_t* hi) {
  uint64_t p = static_cast<uint64_t>(a) * b;
  *hi = static_cast<uint32_t>(p >> 32);
  return static_cast<uint32_t>(p);
}

BRISK_HD Philox4 philox4x32_10(Philox4 ctr, uint32_t k0, uint32_t k1) {
  for (int r = 0; r < 10; ++r) {
    uint32_t hi0, hi1;
    uint32_t lo0 = mulhilo(0xD2511F53u, ctr.v[0], &hi0);
    uint32_t lo1 = mulhilo(0xCD9E8D57u, ctr.v[2], &hi1);
    ctr = Philox4{{hi1 ^ ctr.v[1] ^ k0, lo1, hi0 ^ ctr.v[3] ^ k1, lo0}};
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return ctr;
}

// Identifies one use of randomness: a dropout site in a given step of a given run.
struct RngKey {
  uint64_t seed = 0;
  uint64_t step = 0;  // the micro-step counter
  uint32_t site = 0;  // which dropout (layer and position in the layer)
};

// Four random words for elements [4*group, 4*group + 4) of the site.
BRISK_HD Philox4 rng_block(const RngKey& key, uint64_t group) {
  Philox4 ctr{{static_cast<uint32_t>(group), static_cast<uint32_t>(group >> 32), key.site,
               static_cast<uint32_t>(key.step)}};
  uint32_t k0 = static_cast<uint32_t>(key.seed) ^ static_cast<uint32_t>(key.step >> 32);
  return philox4x32_10(ctr, k0, static_cast<uint32_t>(key.seed >> 32));
}

// Dropout keeps an element when its word is at or above this threshold (p in [0, 1)).
BRISK_HD uint32_t dropout_threshold(float p) {
  double t = static_cast<double>(p) * 4294967296.0;
  return t >= 4294967295.0 ? 0xFFFFFFFFu : static_cast<uint32_t>(t);
}

BRISK_HD bool dropout_keep(const RngKey& key, uint64_t element, uint32_t threshold) {
  return rng_block(key, element >> 2).v[element & 3] >= threshold;
}

}  // namespace brisk
