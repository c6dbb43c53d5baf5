// Register tiles: small products on AVX-512 (float32) and AVX512-BF16 (bf16 pairs, vdpbf16ps),
// and the packers that write their operands. See cpu_tiles.h for the layouts.
#include "backend/cpu/cpu_tiles.h"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>

#include "backend/cpu/cpu_avx512.h"
#include "core/dtype.h"
#include "core/error.h"

#if defined(BRISK_PACK_AVX512) && defined(__AVX512BF16__)
#define BRISK_BF16_TILES 1
#endif

namespace brisk {

namespace {
#ifdef BRISK_PACK_AVX512
using namespace avx512;
#endif

template <typename T>
uint32_t pair_of(T lo, T hi) {
  return uint32_t{as_bf16(lo)} | uint32_t{as_bf16(hi)} << 16;
}

#ifdef BRISK_PACK_AVX512
// What a tile multiplies, step by step along k: bf16 pairs (a 32-bit word holding two values;
// vdpbf16ps adds both products) or float32 values (vfmadd).
#ifdef BRISK_BF16_TILES
struct Bf16Pairs {
  using Word = uint32_t;
  using Vec = __m512bh;
  static Vec load(const Word* b, __mmask16 m) { return (Vec)_mm512_maskz_loadu_epi32(m, b); }
  static Vec broadcast(Word a) { return (Vec)_mm512_set1_epi32(static_cast<int>(a)); }
  static __m512 madd(__m512 acc, Vec a, Vec b) { return _mm512_dpbf16_ps(acc, a, b); }
};
#endif
struct F32Values {
  using Word = float;
  using Vec = __m512;
  static Vec load(const Word* b, __mmask16 m) { return _mm512_maskz_loadu_ps(m, b); }
  static Vec broadcast(Word a) { return _mm512_set1_ps(a); }
  static __m512 madd(__m512 acc, Vec a, Vec b) { return _mm512_fmadd_ps(a, b, acc); }
};

// A tile of C is MR rows by NV vectors of 16 columns (at most 6 x 4: 24 accumulators, the B
// vectors and A's broadcast word within the 32 registers); `last` masks the last vector's columns.
constexpr int kTileRows = 6, kTileVectors = 4, kTileColumns = 16 * kTileVectors;

template <typename Kind, int MR, int NV>
void tile(int64_t steps, const typename Kind::Word* a, int64_t a_row, int64_t a_step,
          const typename Kind::Word* b, int64_t ldb, __mmask16 last, bool accumulate, float* c,
          int64_t ldc) {
  // The loops over rows and vectors unrolled whole, so that the accumulators live in registers.
  __m512 acc[MR][NV];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v)
      acc[r][v] = accumulate
                      ? _mm512_maskz_loadu_ps(v == NV - 1 ? last : 0xffff, c + r * ldc + 16 * v)
                      : _mm512_setzero_ps();
  for (int64_t p = 0; p < steps; ++p) {
    typename Kind::Vec bv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) bv[v] = Kind::load(b + 16 * v, v == NV - 1 ? last : 0xffff);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const typename Kind::Vec av = Kind::broadcast(a[r * a_row]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[r][v] = Kind::madd(acc[r][v], av, bv[v]);
    }
    a += a_step;
    b += ldb;
  }
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v)
      _mm512_mask_storeu_ps(c + r * ldc + 16 * v, v == NV - 1 ? last : 0xffff, acc[r][v]);
}

template <typename Kind>
using TileFn = void (*)(int64_t, const typename Kind::Word*, int64_t, int64_t,
                        const typename Kind::Word*, int64_t, __mmask16, bool, float*, int64_t);

template <typename Kind, int MR>
constexpr TileFn<Kind> tile_of(int nv) {
  return nv == 1   ? tile<Kind, MR, 1>
         : nv == 2 ? tile<Kind, MR, 2>
         : nv == 3 ? tile<Kind, MR, 3>
                   : tile<Kind, MR, 4>;
}

template <typename Kind>
constexpr TileFn<Kind> tile_of(int mr, int nv) {
  return mr == 1   ? tile_of<Kind, 1>(nv)
         : mr == 2 ? tile_of<Kind, 2>(nv)
         : mr == 3 ? tile_of<Kind, 3>(nv)
         : mr == 4 ? tile_of<Kind, 4>(nv)
         : mr == 5 ? tile_of<Kind, 5>(nv)
                   : tile_of<Kind, 6>(nv);
}

// C[m x n] (+)= the product over `steps` of A's and B's words, in tiles.
template <typename Kind>
void tiled_product(int64_t m, int64_t n, int64_t steps, const typename Kind::Word* a, int64_t a_row,
                   int64_t a_step, const typename Kind::Word* b, int64_t ldb, bool accumulate,
                   float* c, int64_t ldc) {
  // Column panels outermost: a panel of B (steps x 64 words) stays in the L1 cache while the
  // tiles of rows pass over it.
  for (int64_t n0 = 0; n0 < n; n0 += kTileColumns) {
    const int64_t cols = std::min<int64_t>(kTileColumns, n - n0);
    const int nv = static_cast<int>((cols + 15) / 16);
    const __mmask16 last =
        cols % 16 == 0 ? __mmask16{0xffff} : static_cast<__mmask16>((1u << (cols % 16)) - 1);
    for (int64_t r0 = 0; r0 < m; r0 += kTileRows) {
      const int mr = static_cast<int>(std::min<int64_t>(kTileRows, m - r0));
      tile_of<Kind>(mr, nv)(steps, a + r0 * a_row, a_row, a_step, b + n0, ldb, last, accumulate,
                            c + r0 * ldc + n0, ldc);
    }
  }
}
#endif

#ifdef BRISK_BF16_TILES
// AMX's tile configuration (palette 1): tiles 0-3 hold a 32 x 32 block of C as four 16 x 16
// float32 tiles, 4-5 A's 32 rows by 16 pairs, 6-7 B's 16 pairs by 32 columns; 64 bytes a row.
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t bytes_per_row[16] = {64, 64, 64, 64, 64, 64, 64, 64};
  uint8_t rows[16] = {16, 16, 16, 16, 16, 16, 16, 16};
};

// Whether the CPU has AMX-TILE and AMX-BF16 (CPUID leaf 7, EDX bits 24 and 22) and Linux lets
// this process use the tile data (arch_prctl ARCH_REQ_XCOMP_PERM for XTILEDATA, feature 18).
bool amx_usable() {
  static const bool usable = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) == 0) return false;
    if ((edx & (1u << 24)) == 0 || (edx & (1u << 22)) == 0) return false;
    constexpr long kRequestPermission = 0x1023, kTileData = 18;
    return syscall(SYS_arch_prctl, kRequestPermission, kTileData) == 0;
  }();
  return usable;
}

// C[m x n] (+)= A B over `pairs` pairs, m and n multiples of 32 and pairs of 16, A in rows. The
// configuration is loaded per call and the tiles released after it: oneDNN's AMX kernels load
// their own on the same threads between calls.
__attribute__((target("amx-tile,amx-bf16"))) void amx_product(int64_t m, int64_t n, int64_t pairs,
                                                              const uint32_t* a, int64_t a_row,
                                                              const uint32_t* b, int64_t ldb,
                                                              bool accumulate, float* c,
                                                              int64_t ldc) {
  static const TileConfig config;
  _tile_loadconfig(&config);
  const int64_t sa = a_row * 4, sb = ldb * 4, sc = ldc * 4;  // row strides in bytes
  for (int64_t n0 = 0; n0 < n; n0 += 32)
    for (int64_t m0 = 0; m0 < m; m0 += 32) {
      float* c0 = c + m0 * ldc + n0;
      float* c1 = c0 + 16 * ldc;
      if (accumulate) {
        _tile_loadd(0, c0, sc);
        _tile_loadd(1, c0 + 16, sc);
        _tile_loadd(2, c1, sc);
        _tile_loadd(3, c1 + 16, sc);
      } else {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
      }
      for (int64_t p = 0; p < pairs; p += 16) {
        _tile_loadd(4, a + m0 * a_row + p, sa);
        _tile_loadd(5, a + (m0 + 16) * a_row + p, sa);
        _tile_loadd(6, b + p * ldb + n0, sb);
        _tile_loadd(7, b + p * ldb + n0 + 16, sb);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
      }
      _tile_stored(0, c0, sc);
      _tile_stored(1, c0 + 16, sc);
      _tile_stored(2, c1, sc);
      _tile_stored(3, c1 + 16, sc);
    }
  _tile_release();
}
#endif
}  // namespace

bool cpu_amx_tiles_available() {
#ifdef BRISK_BF16_TILES
  return amx_usable();
#else
  return false;
#endif
}

bool cpu_bf16_tiles_available() {
#ifdef BRISK_BF16_TILES
  return true;
#else
  return false;
#endif
}

void bf16_pair_product(int64_t m, int64_t n, int64_t pairs, const uint32_t* a, int64_t a_row,
                       int64_t a_pair, const uint32_t* b, int64_t ldb, bool accumulate, float* c,
                       int64_t ldc, bool amx) {
#ifdef BRISK_BF16_TILES
  // On AMX: the blocks of 32 x 32 over whole runs of 16 pairs; then on the vector tiles the
  // pairs after those runs (added), the columns right of the blocks and the rows below them.
  const int64_t m2 = m / 32 * 32, n2 = n / 32 * 32, p2 = pairs / 16 * 16;
  if (amx && a_pair == 1 && m2 > 0 && n2 > 0 && p2 > 0 && amx_usable()) {
    amx_product(m2, n2, p2, a, a_row, b, ldb, accumulate, c, ldc);
    if (p2 < pairs)
      tiled_product<Bf16Pairs>(m2, n2, pairs - p2, a + p2, a_row, 1, b + p2 * ldb, ldb, true, c,
                               ldc);
    if (n2 < n)
      tiled_product<Bf16Pairs>(m2, n - n2, pairs, a, a_row, 1, b + n2, ldb, accumulate, c + n2,
                               ldc);
    if (m2 < m)
      tiled_product<Bf16Pairs>(m - m2, n, pairs, a + m2 * a_row, a_row, 1, b, ldb, accumulate,
                               c + m2 * ldc, ldc);
    return;
  }
  tiled_product<Bf16Pairs>(m, n, pairs, a, a_row, a_pair, b, ldb, accumulate, c, ldc);
#else
  (void)m, (void)n, (void)pairs, (void)a, (void)a_row, (void)a_pair, (void)b, (void)ldb,
      (void)accumulate, (void)c, (void)ldc, (void)amx;
  BRISK_FAIL("internal error: this build has no bf16 tiles (it does not target AVX512-BF16)");
#endif
}

bool cpu_f32_tiles_available() {
#ifdef BRISK_PACK_AVX512
  return true;
#else
  return false;
#endif
}

void f32_product(int64_t m, int64_t n, int64_t k, const float* a, int64_t a_row, int64_t a_col,
                 const float* b, int64_t ldb, bool accumulate, float* c, int64_t ldc) {
#ifdef BRISK_PACK_AVX512
  tiled_product<F32Values>(m, n, k, a, a_row, a_col, b, ldb, accumulate, c, ldc);
#else
  (void)m, (void)n, (void)k, (void)a, (void)a_row, (void)a_col, (void)b, (void)ldb,
      (void)accumulate, (void)c, (void)ldc;
  BRISK_FAIL("internal error: this build has no float32 tiles (it does not target AVX-512)");
#endif
}

void bf16_round_row(const float* in, uint16_t* out, int64_t n) {
  int64_t j = 0;
#ifdef BRISK_PACK_AVX512
  for (; j + 16 <= n; j += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + j),
                        round16_packed(_mm512_loadu_ps(in + j)));
#endif
  for (; j < n; ++j) out[j] = float_to_bf16(in[j]);
}

void bf16_widen_row(const uint16_t* in, float* out, int64_t n) {
  int64_t j = 0;
#ifdef BRISK_PACK_AVX512
  for (; j + 16 <= n; j += 16) _mm512_storeu_si512(out + j, _mm512_slli_epi32(round16(in + j), 16));
#endif
  for (; j < n; ++j) out[j] = bf16_to_float(in[j]);
}

void fp16_round_row(const float* in, uint16_t* out, int64_t n) {
  int64_t j = 0;
#ifdef BRISK_PACK_AVX512
  for (; j + 16 <= n; j += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + j), fp16_round16(_mm512_loadu_ps(in + j)));
#endif
  for (; j < n; ++j) out[j] = float_to_fp16(in[j]);
}

void fp16_widen_row(const uint16_t* in, float* out, int64_t n) {
  int64_t j = 0;
#ifdef BRISK_PACK_AVX512
  for (; j + 16 <= n; j += 16)
    _mm512_storeu_ps(out + j,
                     fp16_widen16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + j))));
#endif
  for (; j < n; ++j) out[j] = fp16_to_float(in[j]);
}

void fp16_rounded_row(const float* in, float* out, int64_t n) {
  int64_t j = 0;
#ifdef BRISK_PACK_AVX512
  for (; j + 16 <= n; j += 16)
    _mm512_storeu_ps(out + j, fp16_widen16(fp16_round16(_mm512_loadu_ps(in + j))));
#endif
  for (; j < n; ++j) out[j] = fp16_to_float(float_to_fp16(in[j]));
}

namespace {
// A row of float32 (rounded) or bf16 (as it lies) values as bf16.
void row_as_bf16(const float* in, uint16_t* out, int64_t n) {
  bf16_round_row(in, out, n);
}
void row_as_bf16(const uint16_t* in, uint16_t* out, int64_t n) {
  std::copy(in, in + n, out);
}
}  // namespace

template <typename T>
void bf16_rows(const T* src, int64_t rows, int64_t cols, int64_t ld, uint16_t* dst,
               int64_t dst_ld) {
  for (int64_t r = 0; r < rows; ++r) {
    row_as_bf16(src + r * ld, dst + r * dst_ld, cols);
    if (cols % 2 != 0) dst[r * dst_ld + cols] = 0;
  }
}

template <typename T>
void bf16_row_pairs(const T* src, int64_t rows, int64_t cols, int64_t ld, uint32_t* dst,
                    int64_t dst_ld) {
  for (int64_t p = 0; p < (rows + 1) / 2; ++p) {
    const T* r0 = src + 2 * p * ld;
    const T* r1 = 2 * p + 1 < rows ? r0 + ld : nullptr;
    uint32_t* out = dst + p * dst_ld;
    int64_t j = 0;
#ifdef BRISK_PACK_AVX512
    for (; j + 16 <= cols; j += 16) {
      const __m512i lo = round16(r0 + j);
      _mm512_storeu_si512(out + j,
                          r1 ? _mm512_or_si512(lo, _mm512_slli_epi32(round16(r1 + j), 16)) : lo);
    }
#endif
    for (; j < cols; ++j) out[j] = pair_of(r0[j], r1 ? r1[j] : T{0});
  }
}

template <typename T>
void bf16_column_pairs_transposed(const T* src, int64_t rows, int64_t cols, int64_t ld,
                                  uint32_t* dst, int64_t dst_ld) {
  const int64_t pairs = (cols + 1) / 2;
  int64_t r0 = 0;
#ifdef BRISK_PACK_AVX512
  // 16 rows by 16 pairs (32 columns) at a time: each row's pairs a vector, then transposed.
  for (; r0 + 16 <= rows; r0 += 16)
    for (int64_t p0 = 0; p0 + 16 <= cols / 2; p0 += 16) {
      __m512i r[16];
      for (int i = 0; i < 16; ++i) r[i] = round32_pairs(src + (r0 + i) * ld + 2 * p0);
      transpose16(r);
      for (int k = 0; k < 16; ++k) _mm512_storeu_si512(dst + (p0 + k) * dst_ld + r0, r[k]);
    }
  // What the vectors left: pairs past the last 16 of whole rows' blocks, then the last rows.
  const int64_t vector_pairs = r0 > 0 ? cols / 2 / 16 * 16 : 0;
  for (int64_t r = 0; r < r0; ++r)
    for (int64_t p = vector_pairs; p < pairs; ++p) {
      const T* in = src + r * ld + 2 * p;
      dst[p * dst_ld + r] = pair_of(in[0], 2 * p + 1 < cols ? in[1] : T{0});
    }
#endif
  for (int64_t r = r0; r < rows; ++r)
    for (int64_t p = 0; p < pairs; ++p) {
      const T* in = src + r * ld + 2 * p;
      dst[p * dst_ld + r] = pair_of(in[0], 2 * p + 1 < cols ? in[1] : T{0});
    }
}

namespace {
#ifdef BRISK_PACK_AVX512
// 16 columns from p as 16 32-bit words: one row's values (32-bit values), or two rows' side by
// side, the first in each word's low half (16-bit values; the second row ld further on).
inline __m512i transpose_line(const uint32_t* p, int64_t) {
  return _mm512_loadu_si512(p);
}
inline __m512i transpose_line(const float* p, int64_t) {
  return _mm512_loadu_si512(p);
}
inline __m512i transpose_line(const uint16_t* p, int64_t ld) {
  const __m512i lo = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p));
  const __m512i hi = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)(p + ld)));
  return _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16));
}
#endif

// src[rows x cols] of 32- or 16-bit values transposed into dst (see f32_transposed).
template <typename T>
void values_transposed(const T* src, int64_t rows, int64_t cols, int64_t ld, T* dst,
                       int64_t dst_ld) {
  int64_t r0 = 0, vector_cols = 0;
#ifdef BRISK_PACK_AVX512
  // Blocks of 16 columns by as many rows as fill 64 bytes (16 or 32) through a 16 x 16 transpose
  // of 32-bit words (for 16-bit values, each word two rows' values: the transpose puts a
  // column's 32 values in order), then what they leave (columns past the last whole block of
  // 16, and the last rows) one value at a time.
  constexpr int64_t kRowsPerWord = 4 / sizeof(T), kBlockRows = 16 * kRowsPerWord;
  for (; r0 + kBlockRows <= rows; r0 += kBlockRows)
    for (int64_t c0 = 0; c0 + 16 <= cols; c0 += 16) {
      __m512i r[16];
      for (int i = 0; i < 16; ++i)
        r[i] = transpose_line(src + (r0 + kRowsPerWord * i) * ld + c0, ld);
      transpose16(r);
      for (int j = 0; j < 16; ++j) _mm512_storeu_si512(dst + (c0 + j) * dst_ld + r0, r[j]);
    }
  vector_cols = r0 > 0 ? cols / 16 * 16 : 0;
#endif
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = r < r0 ? vector_cols : 0; c < cols; ++c) dst[c * dst_ld + r] = src[r * ld + c];
}
}  // namespace

void f32_transposed(const float* src, int64_t rows, int64_t cols, int64_t ld, float* dst,
                    int64_t dst_ld) {
  values_transposed(src, rows, cols, ld, dst, dst_ld);
}

void pairs_transposed(const uint32_t* src, int64_t rows, int64_t cols, int64_t ld, uint32_t* dst,
                      int64_t dst_ld) {
  values_transposed(src, rows, cols, ld, dst, dst_ld);
}

void bf16_transposed(const uint16_t* src, int64_t rows, int64_t cols, int64_t ld, uint16_t* dst,
                     int64_t dst_ld) {
  values_transposed(src, rows, cols, ld, dst, dst_ld);
}

template void bf16_rows(const float*, int64_t, int64_t, int64_t, uint16_t*, int64_t);
template void bf16_rows(const uint16_t*, int64_t, int64_t, int64_t, uint16_t*, int64_t);
template void bf16_row_pairs(const float*, int64_t, int64_t, int64_t, uint32_t*, int64_t);
template void bf16_row_pairs(const uint16_t*, int64_t, int64_t, int64_t, uint32_t*, int64_t);
template void bf16_column_pairs_transposed(const float*, int64_t, int64_t, int64_t, uint32_t*,
                                           int64_t);
template void bf16_column_pairs_transposed(const uint16_t*, int64_t, int64_t, int64_t, uint32_t*,
                                           int64_t);

}  // namespace brisk
