// Normally distributed initial weights from counter-based random numbers (core/rng.h): element e
// of stream s (a parameter) depends only on (seed, s, e), so pieces of any size, filled on any
// number of threads, give the values the whole tensor would.
#pragma once

#include <cstdint>

namespace brisk {

// The init streams' RngKey step: never a micro-step counter, so no dropout word is reused here.
constexpr uint64_t kInitRngStep = ~uint64_t{0};

// out[i] = stddev * z(first + i) for i in [0, n), z standard normal: element e is Box-Muller
// over words 2p and 2p + 1 of rng_block({seed, kInitRngStep, stream}, e / 4), p = (e % 4) / 2,
// u1 = (word | 1) / 2^32 and u2 = word / 2^32, the cosine for even e and the sine for odd e.
// Threads share the work where n is large.
void fill_normal(uint64_t seed, uint32_t stream, int64_t first, int64_t n, float stddev,
                 float* out);

// out[i] = bound * (2 u(first + i) - 1), u uniform in [0, 1): word e % kBlock of the same
// stream's blocks (kaiming_uniform's draws: a LoRA's A).
void fill_uniform(uint64_t seed, uint32_t stream, int64_t first, int64_t n, float bound,
                  float* out);

}  // namespace brisk
