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

// rng_block for groups [first, first + kLanes), written as four words per group: the same
// numbers as rng_block, laid out so the compiler can run the lanes in SIMD registers.
constexpr int kPhiloxLanes = 16;
inline void rng_blocks(const RngKey& key, uint64_t first, uint32_t* out) {
  uint32_t c0[kPhiloxLanes], c1[kPhiloxLanes], c2[kPhiloxLanes], c3[kPhiloxLanes];
  for (int l = 0; l < kPhiloxLanes; ++l) {
    const uint64_t g = first + static_cast<uint64_t>(l);
    c0[l] = static_cast<uint32_t>(g);
    c1[l] = static_cast<uint32_t>(g >> 32);
    c2[l] = key.site;
    c3[l] = static_cast<uint32_t>(key.step);
  }
  uint32_t k0 = static_cast<uint32_t>(key.seed) ^ static_cast<uint32_t>(key.step >> 32);
  uint32_t k1 = static_cast<uint32_t>(key.seed >> 32);
  for (int r = 0; r < 10; ++r) {
#pragma omp simd
    for (int l = 0; l < kPhiloxLanes; ++l) {
      const uint64_t p0 = static_cast<uint64_t>(0xD2511F53u) * c0[l];
      const uint64_t p1 = static_cast<uint64_t>(0xCD9E8D57u) * c2[l];
      const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1[l] ^ k0;
      const uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3[l] ^ k1;
      c1[l] = static_cast<uint32_t>(p1);
      c3[l] = static_cast<uint32_t>(p0);
      c0[l] = n0;
      c2[l] = n2;
    }
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  for (int l = 0; l < kPhiloxLanes; ++l) {
    out[4 * l] = c0[l];
    out[4 * l + 1] = c1[l];
    out[4 * l + 2] = c2[l];
    out[4 * l + 3] = c3[l];
  }
}

}  // namespace brisk
