// Counter-based random numbers (Philox-4x32-10): the value for an element depends only on
// (seed, step, site, element), so a recomputation or another backend reproduces it exactly.
#pragma once

#include <cstdint>

#if defined(__AVX512F__) && !defined(__CUDACC__)
#include <immintrin.h>
#define BRISK_PHILOX_AVX512 1
#endif

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
  // Attention dropout over a slice of the heads (tensor parallelism): this call's heads are
  // first_head.. of heads_total, and draw the masks those heads draw in one process holding them
  // all. heads_total 0: the call holds every head.
  uint32_t first_head = 0, heads_total = 0;
  // Element-wise dropout over part of a tensor (sequence parallelism: one sequence's tokens of
  // this rank): the id of the call's first element in the whole tensor; the call's element i is
  // element first_element + i of the whole.
  uint64_t first_element = 0;
  // Where set, a word in the backend's memory added to `step` as the numbers are drawn: a
  // recorded step (Backend::record) replays with the step written there, its key held fixed.
  const uint64_t* step_offset = nullptr;
};

// The micro-step counter a key draws with.
BRISK_HD uint64_t drawn_step(const RngKey& key) {
  return key.step + (key.step_offset ? *key.step_offset : 0);
}

// The head index, in the dropout's element ids, of attention head bh = b * heads + h of a call
// with `heads` heads (attention_head_id(key, bh, heads) * T * T is where its probabilities start).
BRISK_HD uint64_t attention_head_id(const RngKey& key, uint64_t bh, uint64_t heads) {
  if (key.heads_total == 0) return bh;
  return (bh / heads) * key.heads_total + key.first_head + bh % heads;
}

// Four random words for elements [4*group, 4*group + 4) of the site.
BRISK_HD Philox4 rng_block(const RngKey& key, uint64_t group) {
  const uint64_t step = drawn_step(key);
  Philox4 ctr{{static_cast<uint32_t>(group), static_cast<uint32_t>(group >> 32), key.site,
               static_cast<uint32_t>(step)}};
  uint32_t k0 = static_cast<uint32_t>(key.seed) ^ static_cast<uint32_t>(step >> 32);
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
#ifdef BRISK_PHILOX_AVX512
// (GCC 12 reports the intrinsics' "undefined" starting vectors as maybe uninitialized: the false
// alarm backend/cpu/cpu_avx512.h describes. Off from here to the end of rng_blocks.)
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
namespace philox_avx512 {
// The low and high 32 bits of m * c for 16 lanes, by vpmuludq on the even and the odd lanes
// (GCC wrote the scalar loop's 64-bit products as vpmullq, several times slower).
inline void mulhilo16(__m512i c, __m512i m, __m512i* lo, __m512i* hi) {
  const __m512i even = _mm512_mul_epu32(c, m);
  const __m512i odd = _mm512_mul_epu32(_mm512_srli_epi64(c, 32), m);
  *lo = _mm512_mask_blend_epi32(0xAAAA, even, _mm512_slli_epi64(odd, 32));
  *hi = _mm512_mask_blend_epi32(0xAAAA, _mm512_srli_epi64(even, 32), odd);
}
}  // namespace philox_avx512
#endif

inline void rng_blocks(const RngKey& key, uint64_t first, uint32_t* out) {
  uint32_t c0[kPhiloxLanes], c1[kPhiloxLanes], c2[kPhiloxLanes], c3[kPhiloxLanes];
  const uint64_t step = drawn_step(key);
  for (int l = 0; l < kPhiloxLanes; ++l) {
    const uint64_t g = first + static_cast<uint64_t>(l);
    c0[l] = static_cast<uint32_t>(g);
    c1[l] = static_cast<uint32_t>(g >> 32);
    c2[l] = key.site;
    c3[l] = static_cast<uint32_t>(step);
  }
  uint32_t k0 = static_cast<uint32_t>(key.seed) ^ static_cast<uint32_t>(step >> 32);
  uint32_t k1 = static_cast<uint32_t>(key.seed >> 32);
#ifdef BRISK_PHILOX_AVX512
  {
    using philox_avx512::mulhilo16;
    __m512i a = _mm512_loadu_si512(c0), b = _mm512_loadu_si512(c1);
    __m512i c = _mm512_loadu_si512(c2), d = _mm512_loadu_si512(c3);
    const __m512i m0 = _mm512_set1_epi32(static_cast<int>(0xD2511F53u));
    const __m512i m1 = _mm512_set1_epi32(static_cast<int>(0xCD9E8D57u));
    for (int r = 0; r < 10; ++r) {
      __m512i lo0, hi0, lo1, hi1;
      mulhilo16(a, m0, &lo0, &hi0);
      mulhilo16(c, m1, &lo1, &hi1);
      a = _mm512_xor_si512(_mm512_xor_si512(hi1, b), _mm512_set1_epi32(static_cast<int>(k0)));
      c = _mm512_xor_si512(_mm512_xor_si512(hi0, d), _mm512_set1_epi32(static_cast<int>(k1)));
      b = lo1;
      d = lo0;
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
    // Lane l's four words to out[4 l .. 4 l + 3]: a 4 x 16 transpose.
    const __m512i t0 = _mm512_unpacklo_epi32(a, b), t1 = _mm512_unpackhi_epi32(a, b);
    const __m512i t2 = _mm512_unpacklo_epi32(c, d), t3 = _mm512_unpackhi_epi32(c, d);
    // u_j, 128-bit lane k: the four words of lane 4 k + j.
    const __m512i u0 = _mm512_unpacklo_epi64(t0, t2), u1 = _mm512_unpackhi_epi64(t0, t2);
    const __m512i u2 = _mm512_unpacklo_epi64(t1, t3), u3 = _mm512_unpackhi_epi64(t1, t3);
    const __m512i s0 = _mm512_shuffle_i32x4(u0, u1, 0x44), s1 = _mm512_shuffle_i32x4(u2, u3, 0x44);
    const __m512i s2 = _mm512_shuffle_i32x4(u0, u1, 0xee), s3 = _mm512_shuffle_i32x4(u2, u3, 0xee);
    _mm512_storeu_si512(out, _mm512_shuffle_i32x4(s0, s1, 0x88));
    _mm512_storeu_si512(out + 16, _mm512_shuffle_i32x4(s0, s1, 0xdd));
    _mm512_storeu_si512(out + 32, _mm512_shuffle_i32x4(s2, s3, 0x88));
    _mm512_storeu_si512(out + 48, _mm512_shuffle_i32x4(s2, s3, 0xdd));
  }
#else
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
#endif
}
#if defined(BRISK_PHILOX_AVX512) && defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

}  // namespace brisk
