// Box-Muller over Philox words, 64 values at a time. Compiled with -ffast-math (CMakeLists.txt) so
// that the logarithms, square roots and sines vectorize through glibc's libmvec.
#include "core/random_init.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "core/rng.h"

namespace brisk {
namespace {

constexpr int64_t kBlock = 4 * kPhiloxLanes;  // values per rng_blocks call
constexpr float kTwoPow32Inv = 2.3283064365386963e-10f;

// A pair's two uniforms: u1 in [2^-32, 1] (never 0, so the logarithm is finite), u2 in [0, 1).
inline float uniform_open(uint32_t w) {
  return static_cast<float>(w | 1u) * kTwoPow32Inv;
}
inline float uniform(uint32_t w) {
  return static_cast<float>(w) * kTwoPow32Inv;
}

// The cosine is taken as the sine a quarter turn on. GCC 12 merges a sine and a cosine of one
// angle into one sincosf, which has no 16-lane version, and the loop then calls logf and sincosf
// a value at a time; as two sines it calls libmvec's 16-lane logf and sinf.
[[gnu::noinline]] void box_muller(const float* u1, const float* u2, float stddev, float* zc,
                                  float* zs, int64_t n) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) {
    const float r = stddev * std::sqrt(-2.0f * std::log(u1[j]));
    const float theta = 6.2831853071795865f * u2[j];
    zc[j] = r * std::sin(theta + 1.5707963267948966f);
    zs[j] = r * std::sin(theta);
  }
}

}  // namespace

void fill_normal(uint64_t seed, uint32_t stream, int64_t first, int64_t n, float stddev,
                 float* out) {
  if (n <= 0) return;
  const RngKey key{seed, kInitRngStep, stream};
  const int64_t b0 = first / kBlock, b1 = (first + n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (n > (int64_t{1} << 16))
  for (int64_t b = b0; b < b1; ++b) {
    alignas(64) uint32_t w[kBlock];
    alignas(64) float u1[kBlock / 2], u2[kBlock / 2], zc[kBlock / 2], zs[kBlock / 2], z[kBlock];
    rng_blocks(key, static_cast<uint64_t>(b) * kPhiloxLanes, w);
    for (int j = 0; j < kBlock / 2; ++j) {
      u1[j] = uniform_open(w[2 * j]);
      u2[j] = uniform(w[2 * j + 1]);
    }
    box_muller(u1, u2, stddev, zc, zs, kBlock / 2);
    for (int j = 0; j < kBlock / 2; ++j) {
      z[2 * j] = zc[j];
      z[2 * j + 1] = zs[j];
    }
    const int64_t lo = std::max(first, b * kBlock), hi = std::min(first + n, (b + 1) * kBlock);
    std::copy(z + (lo - b * kBlock), z + (hi - b * kBlock), out + (lo - first));
  }
}

}  // namespace brisk

namespace brisk {

void fill_uniform(uint64_t seed, uint32_t stream, int64_t first, int64_t n, float bound,
                  float* out) {
  if (n <= 0) return;
  const RngKey key{seed, kInitRngStep, stream};
  const int64_t b0 = first / kBlock, b1 = (first + n + kBlock - 1) / kBlock;
  for (int64_t b = b0; b < b1; ++b) {
    alignas(64) uint32_t w[kBlock];
    rng_blocks(key, static_cast<uint64_t>(b) * kPhiloxLanes, w);
    const int64_t lo = std::max(first, b * kBlock), hi = std::min(first + n, (b + 1) * kBlock);
    for (int64_t e = lo; e < hi; ++e)
      out[e - first] = bound * (2.0f * uniform(w[e - b * kBlock]) - 1.0f);
  }
}

}  // namespace brisk
