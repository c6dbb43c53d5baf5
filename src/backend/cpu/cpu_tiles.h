// Small products on the CPU's vector units without a library call: attention's per-block
// products (cpu_attention.cpp), whose operands are a few dozen rows and where oneDNN's per-call
// cost and its copies of the operands into its own layouts were half the time. Float32 products
// with FMA on AVX-512; bf16 products on AVX512-BF16.
//
// Float32: C[m x n] (+)= A[m x k] B[k x n] with A's value (r, p) at a[r * a_row + p * a_col] (any
// strides: a row-major A, or a row-major matrix read transposed) and B row-major (row stride ldb).
//
// bf16: operands are bf16 pairs: two bf16 values in a 32-bit word, the lower-indexed one in the
// low half, multiplied and added into float32 as the vdpbf16ps instruction does. A product
// C[m x n] (+)= A[m x k] B[k x n] reads k / 2 pairs: A's pair p of row r is the word
// a[r * a_row + p * a_pair] (a_row = k / 2, a_pair = 1 for a row-major bf16 A; a_row = 1, a_pair =
// the row length for the pairs-of-rows layout below, which reads A transposed), and B's pair p of
// column j is b[p * ldb + j] (B in pairs of rows). The packers write these layouts from float32
// (values rounded to nearest even as float_to_bf16 rounds), padding an odd k with zeros.
//
// On a CPU with AMX (Intel's tile registers) a bf16 product whose A lies in rows (a_pair = 1)
// runs its blocks of 32 rows x 32 columns over 16 pairs at a time on the tiles (TDPBF16PS reads
// B's pairs-of-rows layout as it is), and the rows, columns and pairs those blocks leave on the
// AVX512-BF16 tiles.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace brisk {

// Whether this build has the bf16 tiles (compiled for AVX512-BF16); without them
// bf16_pair_product fails (the packers work on any CPU).
bool cpu_bf16_tiles_available();

// Whether this build has the float32 tiles (compiled for AVX-512); without them f32_product fails.
bool cpu_f32_tiles_available();

// C[m x n] = (accumulate ? C : 0) + A B (see above), float32 accumulation in k's order.
void f32_product(int64_t m, int64_t n, int64_t k, const float* a, int64_t a_row, int64_t a_col,
                 const float* b, int64_t ldb, bool accumulate, float* c, int64_t ldc);

// src[rows x cols] (row stride ld) transposed: dst[c * dst_ld + r] = src[r * ld + c] (the B of a
// float32 product that reads src transposed).
void f32_transposed(const float* src, int64_t rows, int64_t cols, int64_t ld, float* dst,
                    int64_t dst_ld);

// The same for bf16 pairs: A in pairs of rows ([pairs x m], read transposed) written as rows of
// pairs ([m x pairs], a_pair = 1), the layout AMX's tiles read A in.
void pairs_transposed(const uint32_t* src, int64_t rows, int64_t cols, int64_t ld, uint32_t* dst,
                      int64_t dst_ld);

// The same for 16-bit values (a bf16 A that oneDNN would read transposed, written plain).
void bf16_transposed(const uint16_t* src, int64_t rows, int64_t cols, int64_t ld, uint16_t* dst,
                     int64_t dst_ld);

// Whether bf16 products whose A lies in rows run on AMX tiles here: a build with the bf16 tiles,
// a CPU with AMX-BF16, and a kernel that lets this process use the tile registers (asked once).
bool cpu_amx_tiles_available();

// C[m x n] = (accumulate ? C : 0) + sum over p < pairs of A's pair p . B's pair p (see above), on
// AMX where cpu_amx_tiles_available() and `amx` (false: the AVX512-BF16 tiles alone, which the
// tests hold to the same reference).
void bf16_pair_product(int64_t m, int64_t n, int64_t pairs, const uint32_t* a, int64_t a_row,
                       int64_t a_pair, const uint32_t* b, int64_t ldb, bool accumulate, float* c,
                       int64_t ldc, bool amx = true);

// n float32 rounded to bf16 as float_to_bf16 rounds (AVX-512 where the build targets it; also
// the matmul packers' row rounding).
void bf16_round_row(const float* in, uint16_t* out, int64_t n);
// n bf16 widened to float32, exactly (AVX-512 where the build targets it).
void bf16_widen_row(const uint16_t* in, float* out, int64_t n);
// The same for fp16: n float32 rounded as float_to_fp16 rounds, n fp16 widened as fp16_to_float
// widens, and n float32 rounded to fp16 values held in float32 (in place where out is in), bit for
// bit (the conversion instructions where the build targets AVX-512; the CPU's fp16 casts and
// round_to).
void fp16_round_row(const float* in, uint16_t* out, int64_t n);
void fp16_widen_row(const uint16_t* in, float* out, int64_t n);
void fp16_rounded_row(const float* in, float* out, int64_t n);

// A value as bf16: a float32 one rounded (float_to_bf16), a bf16 one as it is. For the packers
// over either source type.
inline uint16_t as_bf16(float v) {
  return float_to_bf16(v);
}
inline uint16_t as_bf16(uint16_t v) {
  return v;
}

// f(the values at `data` as a typed pointer): const uint16_t* where `bf16` (a CPU bf16 run's
// saved activations), else const float*.
template <typename F>
void with_bf16_or_f32(const void* data, bool bf16, F f) {
  if (bf16)
    f(static_cast<const uint16_t*>(data));
  else
    f(static_cast<const float*>(data));
}

// The packers read float32 (T = float: rounded) or bf16 (T = uint16_t: copied as it is) values;
// cpu_tiles.cpp instantiates both.
// src[rows x cols] (row stride ld) as bf16 rows at dst (row stride dst_ld >= cols rounded up to
// even, in bf16 values): row r's words are its pairs of columns, the last padded with zero when
// cols is odd.
template <typename T>
void bf16_rows(const T* src, int64_t rows, int64_t cols, int64_t ld, uint16_t* dst, int64_t dst_ld);

// src[rows x cols] in pairs of rows: word dst[p * dst_ld + j] = (src[2p][j], src[2p + 1][j]), for
// p < (rows + 1) / 2 (a missing last row as zeros) and j < cols.
template <typename T>
void bf16_row_pairs(const T* src, int64_t rows, int64_t cols, int64_t ld, uint32_t* dst,
                    int64_t dst_ld);

// src[rows x cols] transposed, in pairs of columns: word dst[p * dst_ld + r] = (src[r][2p],
// src[r][2p + 1]), for p < (cols + 1) / 2 (a missing last column as zeros) and r < rows. As B, it
// reads src transposed: B = src^T.
template <typename T>
void bf16_column_pairs_transposed(const T* src, int64_t rows, int64_t cols, int64_t ld,
                                  uint32_t* dst, int64_t dst_ld);

}  // namespace brisk
