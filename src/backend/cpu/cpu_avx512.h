// AVX-512 helpers shared by the CPU backend's bf16 packers (cpu_matmul_dnnl.cpp) and its
// attention tiles' packers (cpu_tiles.cpp): rounding float32 to bf16 as float_to_bf16 does, the
// fp16 conversions of the CPU's fp16 rows, and a 16 x 16 transpose of 32-bit words.
// BRISK_PACK_AVX512 is defined where the build targets AVX-512 (F and BW); without it the callers
// take their scalar paths.
#pragma once

#if defined(__AVX512F__) && defined(__AVX512BW__)
#include <immintrin.h>

#include <cstdint>
#define BRISK_PACK_AVX512 1

// GCC 12's intrinsics start results from a self-initialized "undefined" vector, which its
// -Wmaybe-uninitialized reports at every inlined use: a known false alarm. The warning stays off
// in the files that include this header.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace brisk::avx512 {

// 16 float32 rounded to bf16 as float_to_bf16 does (nearest even, NaNs kept quiet), in the low
// half of each 32-bit lane: integer arithmetic on the bits, for any AVX-512 CPU.
inline __m512i round16_bits(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i high = _mm512_srli_epi32(u, 16);
  const __m512i lsb = _mm512_and_si512(high, _mm512_set1_epi32(1));
  const __m512i rounded =
      _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                _mm512_set1_epi32(0x7f800000));
  return _mm512_mask_mov_epi32(rounded, nan, _mm512_or_si512(high, _mm512_set1_epi32(0x40)));
}

#ifdef __AVX512BF16__
// Where the build targets AVX512-BF16 the rounding is its conversion instruction (vcvtneps2bf16,
// vcvtne2ps2bf16): nearest even, a NaN quieted as float_to_bf16 quiets it, the same bits, except
// that it reads a float32 denormal as zero. Vectors holding a denormal (fpclass category 0x20)
// take the integer path instead, so the result is float_to_bf16's for every input.
inline bool any_denormal(__m512 v) {
  return _mm512_fpclass_ps_mask(v, 0x20) != 0;
}
#endif

// 16 float32 rounded to bf16, in the low half of each 32-bit lane.
inline __m512i round16(__m512 v) {
#ifdef __AVX512BF16__
  if (!any_denormal(v))
    return _mm512_cvtepu16_epi32(reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v)));
#endif
  return round16_bits(v);
}

inline __m512i round16(const float* p) {
  return round16(_mm512_loadu_ps(p));
}

// 16 float32 rounded to bf16, packed in order.
inline __m256i round16_packed(__m512 v) {
#ifdef __AVX512BF16__
  if (!any_denormal(v)) return reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v));
#endif
  return _mm512_cvtepi32_epi16(round16_bits(v));
}

// 32 float32 rounded to bf16 and packed in order: 16 32-bit words, word j = values 2j and 2j+1.
inline __m512i round32_pairs(const float* p) {
  const __m512 lo = _mm512_loadu_ps(p), hi = _mm512_loadu_ps(p + 16);
#ifdef __AVX512BF16__
  if (!any_denormal(lo) && !any_denormal(hi))
    return reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo));
#endif
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi32_epi16(round16_bits(lo))),
                            _mm512_cvtepi32_epi16(round16_bits(hi)), 1);
}

// The same for values already in bf16: 16 widened to 32-bit lanes, and 32 as they lie.
inline __m512i round16(const uint16_t* p) {
  return _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
inline __m512i round32_pairs(const uint16_t* p) {
  return _mm512_loadu_si512(p);
}

// 16 float32 rounded to fp16 as float_to_fp16 rounds (nearest even, overflow to infinity,
// subnormal results kept), packed in order: the conversion instruction (vcvtps2ph), except that a
// NaN becomes float_to_fp16's quiet NaN (sign kept, no payload) where the instruction keeps the
// top of the payload.
inline __m256i fp16_round16(__m512 v) {
  const __m256i h = _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  if (nan == 0) return h;
  const __m512i wide = _mm512_cvtepu16_epi32(h);
  const __m512i quiet =
      _mm512_or_si512(_mm512_and_si512(wide, _mm512_set1_epi32(0x8000)), _mm512_set1_epi32(0x7e00));
  return _mm512_cvtepi32_epi16(_mm512_mask_mov_epi32(wide, nan, quiet));
}

// 16 fp16 widened to float32 as fp16_to_float widens them (exactly): the conversion instruction
// (vcvtph2ps), except that a NaN's bits are fp16_to_float's (sign and payload moved up as they
// are) where the instruction quiets a signaling one.
inline __m512 fp16_widen16(__m256i h) {
  const __m512 f = _mm512_cvtph_ps(h);
  const __m512i wide = _mm512_cvtepu16_epi32(h);
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(wide, _mm512_set1_epi32(0x7fff)),
                                                _mm512_set1_epi32(0x7c00));
  if (nan == 0) return f;
  const __m512i bits = _mm512_or_si512(
      _mm512_or_si512(_mm512_slli_epi32(_mm512_and_si512(wide, _mm512_set1_epi32(0x8000)), 16),
                      _mm512_set1_epi32(0x7f800000)),
      _mm512_slli_epi32(_mm512_and_si512(wide, _mm512_set1_epi32(0x3ff)), 13));
  return _mm512_mask_mov_ps(f, nan, _mm512_castsi512_ps(bits));
}

// r[i] word j <- r[j] word i, for 16 vectors of 16 32-bit words.
inline void transpose16(__m512i r[16]) {
  __m512i t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  // u[4g + c], 128-bit lane L: word 4L + c of rows 4g .. 4g + 3.
  __m512i u[16];
  for (int g = 0; g < 4; ++g) {
    u[4 * g] = _mm512_unpacklo_epi64(t[4 * g], t[4 * g + 2]);
    u[4 * g + 1] = _mm512_unpackhi_epi64(t[4 * g], t[4 * g + 2]);
    u[4 * g + 2] = _mm512_unpacklo_epi64(t[4 * g + 1], t[4 * g + 3]);
    u[4 * g + 3] = _mm512_unpackhi_epi64(t[4 * g + 1], t[4 * g + 3]);
  }
  // Word 4L + c of every row: lane L of u[c], u[4 + c], u[8 + c], u[12 + c].
  for (int c = 0; c < 4; ++c) {
    const __m512i v0 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0x44);
    const __m512i v1 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0xee);
    const __m512i v2 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0x44);
    const __m512i v3 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0xee);
    r[c] = _mm512_shuffle_i32x4(v0, v2, 0x88);
    r[4 + c] = _mm512_shuffle_i32x4(v0, v2, 0xdd);
    r[8 + c] = _mm512_shuffle_i32x4(v1, v3, 0x88);
    r[12 + c] = _mm512_shuffle_i32x4(v1, v3, 0xdd);
  }
}

// vector_expf (cpu_exp.h) on 16 lanes: the same range reduction and polynomial, with the fused
// multiply-adds written out (the compiler contracts the scalar one's where it vectorizes it).
// 0 below -87.3, inf above 88.7, a NaN stays NaN.
inline __m512 exp16(__m512 x) {
  const __m512 low = _mm512_set1_ps(-87.3365f), high = _mm512_set1_ps(88.7228f);
  const __mmask16 under = _mm512_cmp_ps_mask(x, low, _CMP_LT_OQ);
  const __mmask16 over = _mm512_cmp_ps_mask(x, high, _CMP_GT_OQ);
  // max/min return their second operand where one is NaN: x, and then the NaN.
  const __m512 c = _mm512_min_ps(high, _mm512_max_ps(low, x));
  const __m512 magic = _mm512_set1_ps(12582912.0f);  // 1.5 * 2^23: adding it rounds
  const __m512 t = _mm512_fmadd_ps(c, _mm512_set1_ps(1.44269504088896341f), magic);
  const __m512 n = _mm512_sub_ps(t, magic);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), c);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  const __m512 e = _mm512_add_ps(_mm512_fmadd_ps(_mm512_mul_ps(p, r), r, r), _mm512_set1_ps(1.0f));
  // 2^k from t's low mantissa bits, k in [-126, 128]: 2^(k-1) * 2 where k > 0.
  const __m512i k = _mm512_sub_epi32(_mm512_castps_si512(t), _mm512_set1_epi32(0x4B400000));
  const __mmask16 positive = _mm512_cmpgt_epi32_mask(k, _mm512_setzero_si512());
  const __m512i biased = _mm512_add_epi32(
      _mm512_mask_sub_epi32(k, positive, k, _mm512_set1_epi32(1)), _mm512_set1_epi32(127));
  __m512 y = _mm512_mul_ps(e, _mm512_castsi512_ps(_mm512_slli_epi32(biased, 23)));
  y = _mm512_mask_mul_ps(y, positive, y, _mm512_set1_ps(2.0f));
  y = _mm512_mask_mov_ps(y, under, _mm512_setzero_ps());
  return _mm512_mask_mov_ps(y, over, _mm512_set1_ps(__builtin_inff()));
}

// The lanes of the 16 values from j that lie before `end`.
inline __mmask16 lanes_before(int64_t j, int64_t end) {
  const int64_t n = end - j;
  return n >= 16  ? static_cast<__mmask16>(0xffff)
         : n <= 0 ? static_cast<__mmask16>(0)
                  : static_cast<__mmask16>((1u << n) - 1);
}

// out[j] = e^(in[j] * scale - mx) for j < n where kept(j) (a lane mask of the 16 values from j)
// keeps j, 0 where it does not (in place where out is in); returns their sum. The softmax passes
// of attention (scaled scores, a key mask) and of the cross-entropy (scale 1, every value).
template <typename Kept>
float exp_sum(const float* in, int64_t n, float scale, float mx, float* out, Kept kept) {
  const __m512 vscale = _mm512_set1_ps(scale), vmx = _mm512_set1_ps(mx);
  __m512 sum = _mm512_setzero_ps();
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 m = kept(j);
    const __m512 e = _mm512_maskz_mov_ps(
        m, exp16(_mm512_fmsub_ps(_mm512_maskz_loadu_ps(m, in + j), vscale, vmx)));
    _mm512_mask_storeu_ps(out + j, lanes_before(j, n), e);
    sum = _mm512_add_ps(sum, e);
  }
  return _mm512_reduce_add_ps(sum);
}

}  // namespace brisk::avx512
#endif
