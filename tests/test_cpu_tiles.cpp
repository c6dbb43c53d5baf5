// The CPU's 16-bit rows and tiles: widening and rounding rows against the scalar conversions for
// every bit pattern, the packers' layouts, and the bf16 and float32 tile products and transposes
// against fp64 references.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "backend/cpu/cpu_tiles.h"
#include "test_support.h"

namespace brisk::testing {
namespace {

// A 16-bit format's widening row against its scalar widening, bit for bit, for every one of the
// 65536 patterns (NaNs, infinities and subnormals among them), through the AVX-512 path (16 at a
// time) and the scalar tail (from an odd start).
void expect_widen_row_gives_every_pattern(void (*row)(const uint16_t*, float*, int64_t),
                                          float (*scalar)(uint16_t), const char* format) {
  std::vector<uint16_t> all(65536 + 7);
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<uint16_t>(i);
  std::vector<float> got(all.size(), -1.0f);
  row(all.data() + 1, got.data() + 1, static_cast<int64_t>(all.size()) - 1);
  EXPECT_EQ(got[0], -1.0f) << "nothing written before the row";
  for (size_t i = 1; i < all.size(); ++i) {
    const float want = scalar(all[i]);
    ASSERT_EQ(std::memcmp(&got[i], &want, sizeof(float)), 0) << format << " pattern " << all[i];
  }
}

// bf16_widen_row, the packers' counterpart, gives bf16_to_float's float32 for every pattern.
TEST(CpuBf16Tiles, WidenRowGivesEveryPatternsFloat32) {
  expect_widen_row_gives_every_pattern(brisk::bf16_widen_row, brisk::bf16_to_float, "bf16");
}

// bf16_round_row, which every CPU op storing bf16 rows calls: float_to_bf16's bits for float32
// values of every class (both signs, every exponent, denormals among them; mantissas at and
// around the ties of rounding to nearest even; infinities; quiet and signaling NaNs with
// payloads), 16 at a time and in the scalar tail. Vectors of normal values only and vectors
// holding one denormal among normal ones both occur: where the build rounds by the AVX512-BF16
// conversion, which reads a denormal as zero, the second kind must take the integer path.
TEST(CpuBf16Tiles, RoundRowGivesFloatToBf16ForEveryClass) {
  std::vector<uint32_t> bits;
  const uint32_t mantissas[] = {0,       1,        0x7fff,   0x8000,   0x8001,   0x17fff, 0x18000,
                                0x18001, 0x7f7fff, 0x7f8000, 0x7fffff, 0x400000, 0x12345, 0x3fffff};
  for (uint32_t sign : {0u, 0x80000000u})
    for (uint32_t exponent = 0; exponent < 256; ++exponent)
      for (uint32_t m : mantissas) bits.push_back(sign | exponent << 23 | m);
  // One denormal in every third vector of normal values, at a different lane each time.
  std::mt19937 gen(9);
  std::uniform_int_distribution<uint32_t> exponent(1, 254), mantissa(0, 0x7fffff);
  for (int v = 0; v < 96; ++v)
    for (int lane = 0; lane < 16; ++lane)
      bits.push_back(v % 3 == 0 && lane == v % 16 ? 0x00000abcu + static_cast<uint32_t>(v)
                                                  : exponent(gen) << 23 | mantissa(gen));
  std::vector<float> in(bits.size() + 1, 0.0f);
  std::memcpy(in.data() + 1, bits.data(), bits.size() * sizeof(float));
  for (const int64_t start : {int64_t{1}, int64_t{0}}) {  // 16 at a time from both alignments
    const int64_t n = static_cast<int64_t>(in.size()) - start;
    std::vector<uint16_t> got(in.size() + 1, 0xdead);
    brisk::bf16_round_row(in.data() + start, got.data(), n);
    for (int64_t i = 0; i < n; ++i)
      ASSERT_EQ(got[static_cast<size_t>(i)], float_to_bf16(in[static_cast<size_t>(start + i)]))
          << "float32 bits 0x" << std::hex << float_bits(in[static_cast<size_t>(start + i)])
          << std::dec << " at " << i;
    EXPECT_EQ(got[static_cast<size_t>(n)], 0xdead) << "nothing written past the row";
  }
}

// The fp16 rows of the CPU's casts and round_to (cpu_tiles.h), against the scalar conversions
// bit for bit: every one of the 65536 fp16 patterns widened; and float32 values rounded (to fp16,
// and to fp16 values held in float32, in place too) for every sign, exponent and top 11 mantissa
// bits, with the low 12 bits at and around the tie of rounding a normal fp16 (the ties of
// subnormal results, higher up, are among the top bits) — so overflow at 65520, subnormal and
// zero results, infinities, and quiet and signaling NaNs with payloads all occur, 16 at a time and
// in the scalar tail.
TEST(CpuFp16Rows, ConversionsGiveTheScalarBitsForEveryClass) {
  expect_widen_row_gives_every_pattern(brisk::fp16_widen_row, brisk::fp16_to_float, "fp16");

  std::vector<float> in;
  for (uint32_t top = 0; top < (1u << 20); ++top)
    for (uint32_t low : {0u, 1u, 0x7ffu, 0x800u, 0x801u, 0xfffu})
      in.push_back(bits_float(top << 12 | low));
  const int64_t n = static_cast<int64_t>(in.size()) - 3;  // from in[1]: a tail of 15
  std::vector<uint16_t> half(in.size(), 0xdead);
  std::vector<float> rounded(in.size(), -1.0f), in_place(in.begin(), in.end());
  brisk::fp16_round_row(in.data() + 1, half.data() + 1, n);
  brisk::fp16_rounded_row(in.data() + 1, rounded.data() + 1, n);
  brisk::fp16_rounded_row(in_place.data() + 1, in_place.data() + 1, n);
  EXPECT_EQ(half[0], 0xdead) << "nothing written before the row";
  EXPECT_EQ(half[static_cast<size_t>(n) + 1], 0xdead) << "nothing written past the row";
  EXPECT_EQ(rounded[static_cast<size_t>(n) + 1], -1.0f) << "nothing written past the row";
  for (int64_t i = 1; i <= n; ++i) {
    const size_t k = static_cast<size_t>(i);
    const uint16_t want = float_to_fp16(in[k]);
    ASSERT_EQ(half[k], want) << "float32 bits 0x" << std::hex << float_bits(in[k]);
    const uint32_t back = float_bits(fp16_to_float(want));
    ASSERT_EQ(float_bits(rounded[k]), back) << "float32 bits 0x" << std::hex << float_bits(in[k]);
    ASSERT_EQ(float_bits(in_place[k]), back) << "float32 bits 0x" << std::hex << float_bits(in[k]);
  }
}

// The bf16 tiles' packers (cpu_tiles.h): every value where its layout puts it, rounded as
// float_to_bf16 rounds, a missing last row or column as zeros, through the AVX-512 paths (16 rows
// by 32 columns at a time) and the scalar edges alike; from float32 and from bf16 values.
TEST(CpuBf16Tiles, PackersWriteTheirLayouts) {
  std::mt19937 gen(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (const auto& [rows, cols] :
       {std::pair<int64_t, int64_t>{16, 32}, {35, 64}, {7, 5}, {33, 70}, {64, 130}}) {
    const int64_t ld = cols + 3;
    std::vector<float> src(rows * ld);
    for (auto& v : src) v = normal(gen);
    src[1] = 1.0f + 0x1p-8f;  // a tie, to even
    auto bf = [&](int64_t r, int64_t c) -> uint32_t {
      return r < rows && c < cols ? float_to_bf16(src[r * ld + c]) : 0;
    };
    const int64_t even_cols = cols + cols % 2, row_pairs = (rows + 1) / 2,
                  col_pairs = even_cols / 2;
    std::vector<uint16_t> r16(rows * (even_cols + 2), 0xdead), want16(r16);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < even_cols; ++c) want16[r * (even_cols + 2) + c] = bf(r, c);
    bf16_rows(src.data(), rows, cols, ld, r16.data(), even_cols + 2);
    EXPECT_EQ(r16, want16) << rows << " x " << cols << " rows";
    std::vector<uint32_t> pairs(row_pairs * (cols + 1), 0xdeadbeef), want_pairs(pairs);
    for (int64_t p = 0; p < row_pairs; ++p)
      for (int64_t c = 0; c < cols; ++c)
        want_pairs[p * (cols + 1) + c] = bf(2 * p, c) | bf(2 * p + 1, c) << 16;
    bf16_row_pairs(src.data(), rows, cols, ld, pairs.data(), cols + 1);
    EXPECT_EQ(pairs, want_pairs) << rows << " x " << cols << " pairs of rows";
    std::vector<uint32_t> tr(col_pairs * (rows + 2), 0xdeadbeef), want_tr(tr);
    for (int64_t p = 0; p < col_pairs; ++p)
      for (int64_t r = 0; r < rows; ++r)
        want_tr[p * (rows + 2) + r] = bf(r, 2 * p) | bf(r, 2 * p + 1) << 16;
    bf16_column_pairs_transposed(src.data(), rows, cols, ld, tr.data(), rows + 2);
    EXPECT_EQ(tr, want_tr) << rows << " x " << cols << " transposed pairs of columns";
    // The same layouts from the values already in bf16 (a CPU bf16 run's stored qkv), as they lie.
    std::vector<uint16_t> src16(src.size());
    for (size_t i = 0; i < src.size(); ++i) src16[i] = float_to_bf16(src[i]);
    std::fill(r16.begin(), r16.end(), 0xdead);
    std::fill(pairs.begin(), pairs.end(), 0xdeadbeef);
    std::fill(tr.begin(), tr.end(), 0xdeadbeef);
    bf16_rows(src16.data(), rows, cols, ld, r16.data(), even_cols + 2);
    bf16_row_pairs(src16.data(), rows, cols, ld, pairs.data(), cols + 1);
    bf16_column_pairs_transposed(src16.data(), rows, cols, ld, tr.data(), rows + 2);
    EXPECT_EQ(r16, want16) << rows << " x " << cols << " rows from bf16";
    EXPECT_EQ(pairs, want_pairs) << rows << " x " << cols << " pairs of rows from bf16";
    EXPECT_EQ(tr, want_tr) << rows << " x " << cols << " transposed pairs of columns from bf16";
  }
}

// The worst error, relative to the sum of the terms' sizes, of a tile product's C[m x n] (row
// stride ldc = n + 5; c0 the values before it) against the fp64 product of A[m x k] and B[k x n]
// (row-major float32, each value first passed through `value`); the columns past n must be
// untouched.
template <typename Value>
double tile_product_error(int64_t m, int64_t n, int64_t k, const std::vector<float>& a,
                          const std::vector<float>& b, const std::vector<float>& c0,
                          const std::vector<float>& c, bool accumulate, Value value) {
  const int64_t ldc = n + 5;
  double worst = 0.0;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < ldc; ++j) {
      const double got = c[i * ldc + j];
      if (j >= n) {  // past the product's columns: untouched
        EXPECT_EQ(got, c0[i * ldc + j]) << "row " << i << ", column " << j;
        continue;
      }
      double want = accumulate ? c0[i * ldc + j] : 0.0, size = std::fabs(want);
      for (int64_t p = 0; p < k; ++p) {
        const double term = static_cast<double>(value(a[i * k + p])) * value(b[p * n + j]);
        want += term;
        size += std::fabs(term);
      }
      worst = std::max(worst, std::fabs(got - want) / (size + 1e-30));
    }
  return worst;
}

// Tile products' shapes: tiles of every height (1-6 rows) and width (1-4 vectors, the last one
// part-masked), several column panels, and an empty k.
const std::tuple<int64_t, int64_t, int64_t> kTileShapes[] = {
    {1, 1, 2}, {6, 64, 64}, {13, 70, 31}, {64, 256, 64}, {65, 49, 128}, {5, 17, 0}};

// A tile product's operands as float32, standard normal: A [m x k], B [k x n], and C's values
// before it [m x (n + 5)]; `at`: A stored transposed ([k x m]), to be read as A^T.
struct TileOperands {
  std::vector<float> a, b, c0, at;
  TileOperands(int64_t m, int64_t n, int64_t k, std::mt19937& gen)
      : a(m * k), b(k * n), c0(m * (n + 5)), at(k * m) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (auto* v : {&a, &b, &c0})
      for (auto& e : *v) e = normal(gen);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t p = 0; p < k; ++p) at[p * m + i] = a[i * k + p];
  }
};

// bf16_pair_product against an fp64 product of the same bf16 values, for A as rows and in pairs
// of rows (read transposed), with and without accumulation: float32 accumulation only. On the
// AVX512-BF16 tiles alone and, where the CPU has AMX, on its tiles with the vector tiles taking
// what AMX's 32 x 32 blocks over 16 pairs leave (the last three shapes: whole blocks; rows,
// columns and pairs left over; blocks and an odd k).
TEST(CpuBf16Tiles, PairProductMatchesTheFp64Reference) {
  if (!cpu_bf16_tiles_available())
    GTEST_SKIP() << "this build does not target AVX512-BF16: attention's bf16 products run on "
                    "oneDNN or OpenBLAS instead of the tiles";
  std::vector<std::tuple<int64_t, int64_t, int64_t>> shapes(std::begin(kTileShapes),
                                                            std::end(kTileShapes));
  shapes.insert(shapes.end(), {{64, 96, 64}, {70, 100, 72}, {32, 64, 99}});
  std::mt19937 gen(9);
  for (const bool amx : {false, true})
    for (const auto& [m, n, k] : shapes)
      for (const bool a_transposed : {false, true})
        for (const bool accumulate : {false, true}) {
          const TileOperands t(m, n, k, gen);
          const std::vector<float>&a = t.a, &b = t.b, &c0 = t.c0;
          const int64_t pairs = (k + 1) / 2;
          std::vector<uint32_t> ap, bp(pairs * (n + 1));
          int64_t a_row = 0, a_pair = 0;
          if (a_transposed) {  // stored [k x m]: its pairs of rows, read as A^T's pairs
            ap.resize(pairs * m + 1);
            bf16_row_pairs(t.at.data(), k, m, m, ap.data(), m);
            a_row = 1, a_pair = m;
          } else {
            std::vector<uint16_t> a16(m * (2 * pairs) + 2);
            bf16_rows(a.data(), m, k, k, a16.data(), 2 * pairs);
            ap.assign(a16.size() / 2, 0);
            std::memcpy(ap.data(), a16.data(), ap.size() * 4);
            a_row = pairs, a_pair = 1;
          }
          bf16_row_pairs(b.data(), k, n, n, bp.data(), n + 1);
          std::vector<float> c = c0;
          bf16_pair_product(m, n, pairs, ap.data(), a_row, a_pair, bp.data(), n + 1, accumulate,
                            c.data(), n + 5, amx);
          const double worst = tile_product_error(m, n, k, a, b, c0, c, accumulate, [](float v) {
            return bf16_to_float(float_to_bf16(v));
          });
          EXPECT_LE(worst, 1e-5) << m << " x " << n << " x " << k
                                 << (a_transposed ? " A transposed" : "")
                                 << (accumulate ? " accumulated" : "")
                                 << (amx && cpu_amx_tiles_available() ? " on AMX" : "");
        }
}

// f32_product against an fp64 product of the same values, for A row-major and read transposed
// from a row-major [k x m] (as attention reads the probabilities for dV and dK), B with a row
// stride past its columns, with and without accumulation.
TEST(CpuF32Tiles, ProductMatchesTheFp64Reference) {
  if (!cpu_f32_tiles_available())
    GTEST_SKIP() << "this build does not target AVX-512: attention's float32 products run on "
                    "oneDNN or OpenBLAS instead of the tiles";
  std::mt19937 gen(10);
  for (const auto& [m, n, k] : kTileShapes)
    for (const bool a_transposed : {false, true})
      for (const bool accumulate : {false, true}) {
        const TileOperands t(m, n, k, gen);
        const std::vector<float>&a = t.a, &b = t.b, &c0 = t.c0;
        const std::vector<float>& stored = a_transposed ? t.at : a;  // at: read as A^T
        std::vector<float> bs(k * (n + 3) + 1);
        for (int64_t p = 0; p < k; ++p)
          std::copy(b.begin() + p * n, b.begin() + (p + 1) * n, bs.begin() + p * (n + 3));
        std::vector<float> c = c0;
        f32_product(m, n, k, stored.data(), a_transposed ? 1 : k, a_transposed ? m : 1, bs.data(),
                    n + 3, accumulate, c.data(), n + 5);
        const double worst =
            tile_product_error(m, n, k, a, b, c0, c, accumulate, [](float v) { return v; });
        EXPECT_LE(worst, 1e-6) << m << " x " << n << " x " << k
                               << (a_transposed ? " A transposed" : "")
                               << (accumulate ? " accumulated" : "");
      }
}

// f32_transposed writes every value where its transpose goes (whole 16 x 16 blocks, the columns
// and rows past them) and nothing past the transposed matrix's columns.
TEST(CpuF32Tiles, TransposedPutsEveryValueInPlace) {
  for (const auto& [rows, cols] :
       {std::pair<int64_t, int64_t>{1, 1}, {16, 16}, {37, 70}, {256, 64}, {15, 33}, {48, 17}}) {
    const int64_t ld = cols + 3, dst_ld = rows + 2;
    std::vector<float> src(rows * ld), dst(cols * dst_ld, -1.0f);
    for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<float>(i);
    f32_transposed(src.data(), rows, cols, ld, dst.data(), dst_ld);
    for (int64_t c = 0; c < cols; ++c)
      for (int64_t r = 0; r < dst_ld; ++r)
        ASSERT_EQ(dst[c * dst_ld + r], r < rows ? src[r * ld + c] : -1.0f)
            << rows << " x " << cols << ": row " << r << ", column " << c;
  }
}

// pairs_transposed (the same 32-bit transpose over bf16 pairs, which AMX's dV and dK read): every
// word in its place, NaN patterns among them, and nothing written outside the transposed rows.
TEST(CpuBf16Tiles, PairsTransposedPutsEveryWordInPlace) {
  for (const auto& [rows, cols] :
       {std::pair<int64_t, int64_t>{1, 1}, {16, 16}, {16, 256}, {32, 70}, {15, 33}}) {
    const int64_t ld = cols + 3, dst_ld = rows + 2;
    std::vector<uint32_t> src(rows * ld), dst(cols * dst_ld, 0xdeadbeefu);
    for (size_t i = 0; i < src.size(); ++i) src[i] = 0x7fc00001u + static_cast<uint32_t>(i) * 77u;
    pairs_transposed(src.data(), rows, cols, ld, dst.data(), dst_ld);
    for (int64_t c = 0; c < cols; ++c)
      for (int64_t r = 0; r < dst_ld; ++r)
        ASSERT_EQ(dst[c * dst_ld + r], r < rows ? src[r * ld + c] : 0xdeadbeefu)
            << rows << " x " << cols << ": row " << r << ", column " << c;
  }
}

// bf16_transposed: every 16-bit value in its place, through the 32 x 16 register blocks and the
// edges they leave, and nothing written outside the transposed rows.
TEST(CpuBf16Tiles, TransposedPutsEveryValueInPlace) {
  for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{1, 1},
                                   {32, 16},
                                   {37, 70},
                                   {256, 64},
                                   {31, 33},
                                   {64, 17},
                                   {5, 4100}}) {
    const int64_t ld = cols + 3, dst_ld = rows + 2;
    std::vector<uint16_t> src(rows * ld), dst(cols * dst_ld, 0xffff);
    for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint16_t>(i * 7 + 1);
    bf16_transposed(src.data(), rows, cols, ld, dst.data(), dst_ld);
    for (int64_t c = 0; c < cols; ++c)
      for (int64_t r = 0; r < dst_ld; ++r)
        ASSERT_EQ(dst[c * dst_ld + r], r < rows ? src[r * ld + c] : 0xffff)
            << rows << " x " << cols << ": row " << r << ", column " << c;
  }
}

}  // namespace
}  // namespace brisk::testing
