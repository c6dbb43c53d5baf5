// Multi-head and grouped-query attention on the CPU, flash-style: per (batch, query head) and
// block of kRows query rows, the scores by a product on the packed qkv (the query head's key/value
// head shared by its group), the masked softmax in a per-task scratch block, dropout on the
// probabilities from the counter-based RNG, and the weighted sum of values. Only one log-sum-exp
// per query row is kept: backward recomputes the block's probabilities from it, so no [T, T]
// matrix is ever stored. Causal blocks stop at their last key (about half the products). The
// products by oneDNN (one instance per thread) where it multiplies the backend's type, else
// OpenBLAS; in bf16 mode the probabilities and their gradient are rounded to bf16 for the
// products that read them (on bf16 units: q, k, v and the output gradient copied to bf16 per task).
// On AVX512-BF16 units the bf16 products are brisk's own register tiles (cpu_tiles.h) instead
// of oneDNN's: q, k, v and the output gradient packed once per task into the layouts the tiles
// read, the probabilities and their gradient written into them by the block's own passes.
// Float32 products on AVX-512 are brisk's float32 tiles too (unless BRISK_CPU_PRODUCTS names a
// library), reading the operands where they lie but k and v, transposed once per task.
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "backend/cpu/cpu_avx512.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_dropout.h"
#include "backend/cpu/cpu_exp.h"
#include "backend/cpu/cpu_tiles.h"
#include "core/checked.h"
#include "core/mask_rows.h"

namespace brisk {

namespace {
using AttnDims = AttentionDims;

// Query rows per block: a block's scores are [rows, keys] in the task's scratch (kRows at most).
// A causal block computes its keys up to its last row, so causal attention goes in blocks of
// kCausalRows: at T = 256 its products do 56% of the full [T, T] work instead of 62.5%
// (bench_attention, SmolLM2 bf16: 8% faster forward, 4% backward). Without causality smaller
// blocks save no work and only add calls (BERT fp32 in blocks of 32: -4.3% over 3 pairs, within
// this VM's noise).
constexpr int64_t kRows = 64, kCausalRows = 32;
constexpr float kInf = std::numeric_limits<float>::infinity();

// Index of probability (b, h, i, j) in the flat [B,H,T,T] layout of every head (RngKey's
// first_head, heads_total): the dropout element id.
inline uint64_t prob_index(const AttnDims& d, const RngKey& key, int64_t bh, int64_t i, int64_t j) {
  const auto head = static_cast<int64_t>(
      attention_head_id(key, static_cast<uint64_t>(bh), static_cast<uint64_t>(d.H)));
  return static_cast<uint64_t>((head * d.T + i) * d.T + j);
}

// Where a token's heads start in a row of packed qkv [.., (H + 2K) * D]: query head h, and the
// key and value head that query head h reads (each key/value head serves a group of H/K
// consecutive query heads, as transformers' repeat_kv repeats it).
struct PackedRow {
  int64_t ld, group;  // row stride; query heads per key/value head
  explicit PackedRow(const AttnDims& d) : ld((d.H + 2 * d.K) * d.D), group(d.H / d.K) {}
  int64_t q(const AttnDims& d, int64_t h) const { return h * d.D; }
  int64_t k(const AttnDims& d, int64_t h) const { return d.C + (h / group) * d.D; }
  int64_t v(const AttnDims& d, int64_t h) const { return d.C + (d.K + h / group) * d.D; }
};

// T rounded up to even: bf16 pairs hold two keys or query rows.
inline int64_t even(int64_t n) {
  return n + n % 2;
}

// One task's slot of the planned scratch (cpu_attention_scratch_floats): two float32 blocks of
// kRows x T (scores / probabilities, and the dropped-out probabilities or their gradient), then
// bf16 values. For the library's bf16 products a bf16 block of kRows x T and bf16 copies [T, D]
// of q, k, v and the output gradient (TaskScratch); for the bf16 tiles (TileScratch) two bf16
// blocks of kRows x even(T), the block's probabilities or their gradient as rows and in pairs of
// rows, and seven packed [even(T), D] operands.
// Float32 products reading a bf16 qkv take float32 copies [T, D] of q, k and v (qf, kf, vf) where
// the bf16 values lie otherwise; the float32 tiles (float32 qkv only) k and v transposed [D, T]
// (kt, vt) in the same place.
struct TaskScratch {
  float *s, *p;
  uint16_t *a16, *q16, *k16, *v16, *g16;
  float *qf, *kf, *vf, *kt, *vt;
  TaskScratch(float* base, int64_t T, int64_t D)
      : s(base), p(base + kRows * T), a16(reinterpret_cast<uint16_t*>(base + 2 * kRows * T)) {
    q16 = a16 + kRows * T;
    k16 = q16 + T * D;
    v16 = k16 + T * D;
    g16 = v16 + T * D;
    qf = base + 2 * kRows * T;
    kf = qf + T * D;
    vf = kf + T * D;
    kt = qf;
    vt = kf;
  }
};

// The bf16 tiles' slot (see TaskScratch): as words, the rows of a block (`rows16`, even(T) / 2
// words a row) and its pairs of rows (`pairs32`, T words a pair); q and the output gradient as
// rows (D / 2 words a row: the A of the scores and of dP); k and v transposed in pairs of columns
// (even(T) words a pair: the B of the scores and of dP); k, q, the output gradient (backward) or
// v (forward) in pairs of rows (D words a pair: the B of dQ, dK, dV and the output).
struct TileScratch {
  float *s, *p;
  uint32_t *rows16, *pairs32, *q16, *g16, *kt, *vt, *k2, *q2, *g2, *v2;
  TileScratch(float* base, int64_t T, int64_t D) : s(base), p(base + kRows * T) {
    const int64_t block = kRows * even(T) / 2, operand = even(T) * D / 2;
    rows16 = reinterpret_cast<uint32_t*>(base + 2 * kRows * T);
    pairs32 = rows16 + block;
    uint32_t* next = pairs32 + block;
    for (uint32_t** slot : {&q16, &g16, &kt, &vt, &k2, &q2, &g2}) {
      *slot = next;
      next += operand;
    }
    v2 = g2;  // the forward pass has no output gradient
  }
};

// An operand of attention's products where it lies: row stride ld, float32 or (for the bf16
// units) bf16 elements.
struct Mat {
  const void* data;
  int64_t ld;
  size_t elem;  // bytes per element
  Mat from(int64_t row) const {
    return {static_cast<const char*>(data) + static_cast<size_t>(row * ld) * elem, ld, elem};
  }
};

// The rows x cols matrix at src (row stride ld) as a product operand: on bf16 units copied to
// bf16 into `copy` (row stride cols), else as it lies.
Mat as_operand(const float* src, int64_t rows, int64_t cols, int64_t ld, bool units,
               uint16_t* copy) {
  if (!units) return {src, ld, sizeof(float)};
  for (int64_t r = 0; r < rows; ++r)
#pragma omp simd
    for (int64_t c = 0; c < cols; ++c) copy[r * cols + c] = float_to_bf16(src[r * ld + c]);
  return {copy, cols, sizeof(uint16_t)};
}

// A head's operand in packed qkv, float32 or (the CPU's bf16 runs store it so) bf16.
struct HeadSrc {
  const void* data;
  bool bf16;
  HeadSrc at(int64_t elements) const {
    return {static_cast<const char*>(data) + elements * (bf16 ? 2 : 4), bf16};
  }
};

// f(the source as a typed pointer): the packers have an overload for each type.
template <typename F>
void with_source(const HeadSrc& src, F f) {
  with_bf16_or_f32(src.data, src.bf16, f);
}

// as_operand for a head of qkv: a bf16 one copied as it is for bf16 units, else widened into
// `wide` (row stride cols) for float32 products.
Mat as_operand(const HeadSrc& src, int64_t rows, int64_t cols, int64_t ld, bool units,
               uint16_t* copy, float* wide) {
  if (!src.bf16)
    return as_operand(static_cast<const float*>(src.data), rows, cols, ld, units, copy);
  const auto* in = static_cast<const uint16_t*>(src.data);
  for (int64_t r = 0; r < rows; ++r) {
    if (units)
      std::copy(in + r * ld, in + r * ld + cols, copy + r * cols);
    else
      bf16_widen_row(in + r * ld, wide + r * cols, cols);
  }
  if (units) return {copy, cols, sizeof(uint16_t)};
  return {wide, cols, sizeof(float)};
}

// A block of probabilities (or of their gradient) as the operand of the products that read it:
// in bf16 mode rounded to bf16, in place when the products are float32.
Mat rounded_operand(float* block, int64_t rows, int64_t cols, int64_t ld, bool round, bool units,
                    uint16_t* copy) {
  if (round && !units)
    for (int64_t r = 0; r < rows; ++r)
#pragma omp simd
      for (int64_t c = 0; c < cols; ++c)
        block[r * ld + c] = bf16_to_float(float_to_bf16(block[r * ld + c]));
  return as_operand(block, rows, cols, ld, units, copy);
}

// Row-major C = op(A) op(B) (beta 0 or 1) for one attention task, on the calling thread: by the
// float32 tiles (`tiles`; they read B as it lies, so the callers pack a B^T first), by that
// thread's oneDNN instance (operands in its type) where there is one, else by OpenBLAS (float32).
struct Products {
  const std::vector<std::unique_ptr<DnnlMatmul>>& dnnl;
  bool tiles;
  void operator()(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const Mat& a,
                  const Mat& b, float beta, float* c, int64_t ldc) const {
    if (m == 0 || n == 0) return;
    if (tiles && !trans_b && a.elem == sizeof(float) && b.elem == sizeof(float)) {
      f32_product(m, n, k, static_cast<const float*>(a.data), trans_a ? 1 : a.ld,
                  trans_a ? a.ld : 1, static_cast<const float*>(b.data), b.ld, beta != 0.0f, c,
                  ldc);
      return;
    }
    const size_t thread = static_cast<size_t>(omp_get_thread_num());
    if (thread < dnnl.size() && k > 0) {
      dnnl[thread]->run(trans_a, trans_b, m, n, k, a.data, a.ld, b.data, b.ld, beta != 0.0f, c,
                        ldc);
      return;
    }
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, m, n, k, 1.0f,
                static_cast<const float*>(a.data), a.ld, static_cast<const float*>(b.data), b.ld,
                beta, c, ldc);
  }
};

#ifdef BRISK_PACK_AVX512
// The lanes of the 16 keys from j that are visible: before `visible` and kept by the mask.
inline __mmask16 visible_lanes(int64_t j, int64_t visible, const int32_t* mask) {
  const __mmask16 before = avx512::lanes_before(j, visible);
  if (mask == nullptr) return before;
  return _mm512_mask_cmpneq_epi32_mask(before, _mm512_maskz_loadu_epi32(before, mask + j),
                                       _mm512_setzero_si512());
}

// (GCC 12 reports _mm512_reduce_max_ps's "undefined" starting vector as -Wuninitialized, the
// false alarm cpu_avx512.h describes.)
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
// A row's softmax up to its normalization, 16 keys at a time: e^(x - max) in place over the
// scaled visible scores x (zero at a key the mask drops), their sum in *sum; returns the maximum,
// -inf when no key is visible (the row is left as it is then).
float exponentials(float* row, int64_t visible, const int32_t* mask, float scale, float* sum) {
  const __m512 vscale = _mm512_set1_ps(scale);
  __m512 vmax = _mm512_set1_ps(-kInf);
  for (int64_t j = 0; j < visible; j += 16) {
    const __mmask16 m = visible_lanes(j, visible, mask);
    vmax =
        _mm512_mask_max_ps(vmax, m, vmax, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, row + j), vscale));
  }
  const float mx = _mm512_reduce_max_ps(vmax);
  if (mx == -kInf) return mx;
  *sum = avx512::exp_sum(row, visible, scale, mx, row,
                         [&](int64_t j) { return visible_lanes(j, visible, mask); });
  return mx;
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif

// Row of scores (keys of them; key j visible when j < visible and the mask keeps it) to
// probabilities in place; returns the log-sum-exp of the scaled visible scores, +inf when none
// is visible (the row is then all zeros).
float softmax_row(float* row, int64_t keys, int64_t visible, const int32_t* mask, float scale) {
#ifdef BRISK_PACK_AVX512
  float sum = 0.0f;
  const float mx = exponentials(row, visible, mask, scale, &sum);
  std::fill(row + (mx == -kInf ? 0 : visible), row + keys, 0.0f);
  if (mx == -kInf) return kInf;
  const __m512 inv = _mm512_set1_ps(1.0f / sum);
  for (int64_t j = 0; j < visible; j += 16) {
    const __mmask16 m = avx512::lanes_before(j, visible);
    _mm512_mask_storeu_ps(row + j, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, row + j), inv));
  }
  return mx + std::log(sum);
#else
  if (mask != nullptr) {
#pragma omp simd
    for (int64_t j = 0; j < visible; ++j) row[j] = mask[j] != 0 ? row[j] * scale : -kInf;
  } else {
#pragma omp simd
    for (int64_t j = 0; j < visible; ++j) row[j] *= scale;
  }
  // The maximum in 16 lanes (a loop the compiler vectorizes), then across them.
  constexpr int64_t kLanes = 16;
  float lanes[kLanes];
  std::fill(lanes, lanes + kLanes, -kInf);
  int64_t j = 0;
  for (; j + kLanes <= visible; j += kLanes)
    for (int64_t l = 0; l < kLanes; ++l) lanes[l] = std::max(lanes[l], row[j + l]);
  for (; j < visible; ++j) lanes[0] = std::max(lanes[0], row[j]);
  float mx = -kInf;
  for (float x : lanes) mx = std::max(mx, x);
  std::fill(row + visible, row + keys, 0.0f);
  if (mx == -kInf) {
    std::fill(row, row + visible, 0.0f);
    return kInf;
  }
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < visible; ++j) {
    row[j] = vector_expf(row[j] - mx);
    sum += row[j];
  }
  const float inv = 1.0f / sum;
#pragma omp simd
  for (int64_t j = 0; j < visible; ++j) row[j] *= inv;
  return mx + std::log(sum);
#endif
}

// softmax_row for the bf16 tiles without dropout: the probabilities rounded to bf16 straight
// into `out` (keys values, and a zero after an odd keys, as bf16_rows writes a row), the row left
// holding the unnormalized exponentials; returns the log-sum-exp.
float softmax_row_bf16(float* row, int64_t keys, int64_t visible, const int32_t* mask, float scale,
                       uint16_t* out) {
  if (keys % 2 != 0) out[keys] = 0;
#ifdef BRISK_PACK_AVX512
  float sum = 0.0f;
  const float mx = exponentials(row, visible, mask, scale, &sum);
  if (mx == -kInf) {
    std::fill(out, out + keys, uint16_t{0});
    return kInf;
  }
  const __m512 inv = _mm512_set1_ps(1.0f / sum);
  for (int64_t j = 0; j < keys; j += 16) {
    const __m512 p =
        _mm512_mul_ps(_mm512_maskz_loadu_ps(avx512::lanes_before(j, visible), row + j), inv);
    _mm256_mask_storeu_epi16(out + j, avx512::lanes_before(j, keys), avx512::round16_packed(p));
  }
  return mx + std::log(sum);
#else
  const float lse = softmax_row(row, keys, visible, mask, scale);
  bf16_rows(row, 1, keys, keys, out, keys + 1);
  return lse;
#endif
}

// The probabilities of a row of scores again, from the forward pass's log-sum-exp.
void recompute_row(float* row, int64_t keys, int64_t visible, const int32_t* mask, float scale,
                   float lse) {
#ifdef BRISK_PACK_AVX512
  const __m512 vscale = _mm512_set1_ps(scale), vlse = _mm512_set1_ps(lse);
  for (int64_t j = 0; j < keys; j += 16) {
    const __mmask16 m = visible_lanes(j, visible, mask);
    const __m512 x = _mm512_fmsub_ps(_mm512_maskz_loadu_ps(m, row + j), vscale, vlse);
    _mm512_mask_storeu_ps(row + j, avx512::lanes_before(j, keys),
                          _mm512_maskz_mov_ps(m, avx512::exp16(x)));
  }
#else
  if (mask != nullptr) {
#pragma omp simd
    for (int64_t j = 0; j < visible; ++j)
      row[j] = mask[j] != 0 ? vector_expf(row[j] * scale - lse) : 0.0f;
  } else {
#pragma omp simd
    for (int64_t j = 0; j < visible; ++j) row[j] = vector_expf(row[j] * scale - lse);
  }
  std::fill(row + visible, row + keys, 0.0f);
#endif
}
// The bf16 tiles' dS = P * (dP - dot) * scale of a block (P and dP float32 rows of stride ld, dot
// one value per row), written only in bf16: as rows (row stride rows_ld, a zero past an odd
// keys: the A of dQ = dS K) and in pairs of rows (pair stride pairs_ld: dK = dS^T Q reads it).
void score_gradient_bf16(const float* P, const float* dP, const float* dot, int64_t rows,
                         int64_t keys, int64_t ld, float scale, uint16_t* rows16, int64_t rows_ld,
                         uint32_t* pairs, int64_t pairs_ld) {
  for (int64_t r = 0; r < rows; r += 2) {
    const bool two = r + 1 < rows;
    const float *p0 = P + r * ld, *d0 = dP + r * ld;
    const float *p1 = two ? p0 + ld : p0, *d1 = two ? d0 + ld : d0;
    const float dot0 = dot[r], dot1 = two ? dot[r + 1] : 0.0f;
    uint16_t* o0 = rows16 + r * rows_ld;
    uint16_t* o1 = two ? o0 + rows_ld : nullptr;
    uint32_t* w = pairs + r / 2 * pairs_ld;
    int64_t j = 0;
#ifdef BRISK_PACK_AVX512
    const __m512 vscale = _mm512_set1_ps(scale), vdot0 = _mm512_set1_ps(dot0),
                 vdot1 = _mm512_set1_ps(dot1);
    for (; j + 16 <= keys; j += 16) {
      const __m512i lo = avx512::round16(_mm512_mul_ps(
          _mm512_mul_ps(_mm512_loadu_ps(p0 + j), _mm512_sub_ps(_mm512_loadu_ps(d0 + j), vdot0)),
          vscale));
      const __m512i hi = two ? avx512::round16(_mm512_mul_ps(
                                   _mm512_mul_ps(_mm512_loadu_ps(p1 + j),
                                                 _mm512_sub_ps(_mm512_loadu_ps(d1 + j), vdot1)),
                                   vscale))
                             : _mm512_setzero_si512();
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(o0 + j), _mm512_cvtepi32_epi16(lo));
      if (two) _mm256_storeu_si256(reinterpret_cast<__m256i*>(o1 + j), _mm512_cvtepi32_epi16(hi));
      _mm512_storeu_si512(w + j, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
    }
#endif
    for (; j < keys; ++j) {
      const uint16_t lo = float_to_bf16(p0[j] * (d0[j] - dot0) * scale);
      const uint16_t hi = two ? float_to_bf16(p1[j] * (d1[j] - dot1) * scale) : 0;
      o0[j] = lo;
      if (two) o1[j] = hi;
      w[j] = uint32_t{lo} | uint32_t{hi} << 16;
    }
    if (keys % 2 != 0) {
      o0[keys] = 0;
      if (two) o1[keys] = 0;
    }
  }
}
}  // namespace

int64_t cpu_attention_scratch_floats(int64_t seq, int64_t head_dim) {
  // Two float32 blocks, then bf16 values (two to a float): the tiles' two blocks and seven
  // [even(T), D] operands, which also hold the library's block and four [T, D] copies, or the
  // three float32 [T, D] copies of a bf16 qkv's heads for float32 products (TaskScratch).
  const char* what = "attention scratch";
  const int64_t block = checked_mul(kRows, seq, what);
  const int64_t padded = checked_add(seq, seq % 2, what);
  const int64_t halves =
      checked_add(checked_mul(2 * kRows, padded, what),
                  checked_mul(7, checked_mul(padded, head_dim, what), what), what) /
          2 +
      1;
  return checked_add(checked_mul(2, block, what), halves, what);
}

namespace {
// Whether attention's bf16 products run on the bf16 tiles: on bf16 units (`units`) where this
// build has the tiles and heads have an even size (pairs of a head's values).
bool use_tiles(bool units, int64_t head_dim) {
  return units && head_dim % 2 == 0 && cpu_bf16_tiles_available();
}

// Whether the float32 products run on the float32 tiles (`f32_tiles`: the backend's choice, see
// CpuBackend): float32 products (not on bf16 units) of float32 values (scratch holds k and v
// transposed only where it holds no widened copies).
bool use_f32_tiles(bool units, const HeadSrc& qkv, bool f32_tiles) {
  return f32_tiles && !units && !qkv.bf16;
}

// An operand [rows, cols] transposed into dst ([cols, rows]): the B of a float32 tiles' product
// that reads it transposed.
Mat transposed(const Mat& m, int64_t rows, int64_t cols, float* dst) {
  f32_transposed(static_cast<const float*>(m.data), rows, cols, m.ld, dst, rows);
  return {dst, rows, sizeof(float)};
}
}  // namespace

bool CpuBackend::prepare_attention_products() {
  if (!dnnl_) return false;  // OpenBLAS, float32
  // One instance per thread of the coming parallel region, in the linear layers' type (made in
  // the first step; a thread without one would hand bf16 operands to OpenBLAS).
  while (static_cast<int>(attention_dnnl_.size()) < omp_get_max_threads())
    attention_dnnl_.push_back(std::make_unique<DnnlMatmul>(dnnl_->dtype()));
  return dnnl_->dtype() == DType::bf16;
}

namespace {
// One call's constants, shared by the tasks of its parallel region.
struct AttnCall {
  AttnDims d;
  PackedRow row_of;
  HeadSrc base;                  // packed qkv
  const int32_t* mask;           // [B, T] or null
  const int32_t* lengths;        // [B]: a right-padded mask's keys per row, or null
  float* scratch;                // the tasks' slots, per_task floats each
  int64_t ld, per_task;          // qkv's row stride; floats per slot
  int64_t half, Te, block_rows;  // D / 2 (bf16 pairs); even(T); query rows per block
  // Causal masking; bf16 mode (probabilities rounded for their products); bf16 units; the bf16
  // tiles; the float32 tiles (use_tiles, use_f32_tiles).
  bool causal, round, units, tiles, f32_tiles;
  bool amx;  // backward: dV's and dK's A transposed for AMX
  float scale, dropout_p;
  const RngKey& key;
  Products product;
};

// Throws naming `op` unless each row's key length is in [1, T] and its mask row keeps exactly its
// first that many keys: the CPU reads the lengths to skip a right-padded row's padding.
void check_key_lengths(const KeyMask& m, int64_t T, const char* op) {
  if (m.lengths.empty()) return;
  for (int64_t b = 0; b < m.lengths.numel(); ++b) {
    const int32_t n = m.lengths.i32()[b];
    BRISK_CHECK(n >= 1 && n <= T, op, ": key length ", n, " of row ", b, " is outside [1, ", T,
                "]");
    BRISK_CHECK(keeps_first_keys(m.keep.i32() + b * T, T, n), op, ": row ", b,
                " of the key mask does not keep exactly its first ", n, " keys");
  }
}

// The call's constants from its checked arguments (`units`: prepare_attention_products's answer;
// `round`: bf16 mode, the probabilities rounded to bf16 for the products that read them).
AttnCall make_call(const AttnDims& d, const HeadSrc& base, const KeyMask& key_mask,
                   const Tensor& scratch, int64_t per_task, bool causal, float scale,
                   float dropout_p, const RngKey& key, bool round, bool units, bool f32_choice,
                   const std::vector<std::unique_ptr<DnnlMatmul>>& dnnl) {
  const PackedRow row_of(d);
  const bool tiles = use_tiles(units, d.D), f32_tiles = use_f32_tiles(units, base, f32_choice);
  return AttnCall{.d = d,
                  .row_of = row_of,
                  .base = base,
                  .mask = key_mask.empty() ? nullptr : key_mask.keep.i32(),
                  .lengths = key_mask.lengths.empty() ? nullptr : key_mask.lengths.i32(),
                  .scratch = scratch.f32(),
                  .ld = row_of.ld,
                  .per_task = per_task,
                  .half = d.D / 2,
                  .Te = even(d.T),
                  .block_rows = causal ? kCausalRows : kRows,
                  .causal = causal,
                  .round = round,
                  .units = units,
                  .tiles = tiles,
                  .f32_tiles = f32_tiles,
                  .amx = false,
                  .scale = scale,
                  .dropout_p = dropout_p,
                  .key = key,
                  .product = Products{dnnl, f32_tiles}};
}

// The keys batch row b's queries read: every key, or a right-padded row's kept keys (the rest
// skipped; an odd count is as a causal block's, the bf16 tiles' rows zeroed after it).
int64_t key_span(const AttnCall& c, int64_t b) {
  return c.lengths ? std::min<int64_t>(c.d.T, c.lengths[b]) : c.d.T;
}

// A forward task's operands: the scratch slot and, for the library products, q, k and v.
struct ForwardOperands {
  TaskScratch ts;
  TileScratch tt;
  Mat Q, K, V;
};

// Packs (or points at) query head h's q and its key/value head's k and v for task bh's products.
ForwardOperands forward_operands(const AttnCall& c, int64_t bh) {
  const AttnDims& d = c.d;
  const int64_t b = bh / d.H, h = bh % d.H, ld = c.ld;
  const HeadSrc token0 = c.base.at(b * d.T * ld);
  const HeadSrc q = token0.at(c.row_of.q(d, h)), k = token0.at(c.row_of.k(d, h)),
                v = token0.at(c.row_of.v(d, h));
  ForwardOperands op{TaskScratch(c.scratch + bh * c.per_task, d.T, d.D),
                     TileScratch(c.scratch + bh * c.per_task, d.T, d.D), Mat{}, Mat{}, Mat{}};
  const TaskScratch& ts = op.ts;
  const TileScratch& tt = op.tt;
  if (c.tiles) {
    with_source(
        q, [&](auto p) { bf16_rows(p, d.T, d.D, ld, reinterpret_cast<uint16_t*>(tt.q16), d.D); });
    with_source(k, [&](auto p) { bf16_column_pairs_transposed(p, d.T, d.D, ld, tt.kt, c.Te); });
    with_source(v, [&](auto p) { bf16_row_pairs(p, d.T, d.D, ld, tt.v2, d.D); });
  } else {
    op.Q = as_operand(q, d.T, d.D, ld, c.units, ts.q16, ts.qf);
    op.K = as_operand(k, d.T, d.D, ld, c.units, ts.k16, ts.kf);
    op.V = as_operand(v, d.T, d.D, ld, c.units, ts.v16, ts.vf);
    if (c.f32_tiles) op.K = transposed(op.K, d.T, d.D, ts.kt);  // the B of the scores: K^T
  }
  return op;
}

// One block of rows query rows from i0 of task bh: scores, softmax (log-sum-exp into lse),
// dropout, and the block's output rows ob + i0 * C = P' V.
void forward_block(const AttnCall& c, const ForwardOperands& op, int64_t bh, int64_t i0, float* lse,
                   float* ob) {
  const AttnDims& d = c.d;
  const TaskScratch& ts = op.ts;
  const TileScratch& tt = op.tt;
  const int32_t* mask_b = c.mask ? c.mask + bh / d.H * d.T : nullptr;
  const int64_t rows = std::min(c.block_rows, d.T - i0);
  const int64_t keys = std::min(c.causal ? i0 + rows : d.T, key_span(c, bh / d.H));
  if (c.tiles)
    bf16_pair_product(rows, keys, c.half, tt.q16 + i0 * c.half, c.half, 1, tt.kt, c.Te, false, ts.s,
                      d.T);
  else
    c.product(false, !c.f32_tiles, rows, keys, d.D, op.Q.from(i0), op.K, 0.0f, ts.s, d.T);
  // The tiles without dropout: the probabilities straight into their bf16 rows.
  const bool direct = c.tiles && c.dropout_p == 0.0f;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t i = i0 + r, visible = c.causal ? std::min(i + 1, keys) : keys;
    float* row = ts.s + r * d.T;
    if (direct) {
      lse[bh * d.T + i] = softmax_row_bf16(row, keys, visible, mask_b, c.scale,
                                           reinterpret_cast<uint16_t*>(tt.rows16) + r * c.Te);
      continue;
    }
    lse[bh * d.T + i] = softmax_row(row, keys, visible, mask_b, c.scale);
    if (c.dropout_p > 0.0f)
      dropout_range(c.key, c.dropout_p, prob_index(d, c.key, bh, i, 0), keys, row, nullptr, row);
  }
  if (c.tiles) {
    if (!direct) bf16_rows(ts.s, rows, keys, d.T, reinterpret_cast<uint16_t*>(tt.rows16), c.Te);
    bf16_pair_product(rows, d.D, (keys + 1) / 2, tt.rows16, c.Te / 2, 1, tt.v2, d.D, false,
                      ob + i0 * d.C, d.C);
    return;
  }
  const Mat P = rounded_operand(ts.s, rows, keys, d.T, c.round, c.units, ts.a16);
  c.product(false, false, rows, d.D, keys, P, op.V, 0.0f, ob + i0 * d.C, d.C);
}

// Task bh = (batch, query head) of the forward pass: its operands, then its blocks of rows.
void forward_task(const AttnCall& c, int64_t bh, float* lse, float* o) {
  const AttnDims& d = c.d;
  const ForwardOperands op = forward_operands(c, bh);
  float* ob = o + bh / d.H * d.T * d.C + bh % d.H * d.D;
  for (int64_t i0 = 0; i0 < d.T; i0 += c.block_rows) forward_block(c, op, bh, i0, lse, ob);
}
}  // namespace

void CpuBackend::attention_forward(const Tensor& qkv, const KeyMask& key_mask, bool causal,
                                   int heads, int kv_heads, float scale, float dropout_p,
                                   const RngKey& key, const Tensor& stats, const Tensor& scratch,
                                   const Tensor& out) {
  const AttnDims d = attention_dims(qkv, heads, kv_heads, "attention_forward");
  check_attention_scale(scale, "attention_forward");
  const AttentionBuffers want = attention_buffers(Device::cpu, d.B, d.H, d.T, d.D);
  expect(stats, DType::f32, want.stats, "attention_forward statistics");
  expect(scratch, DType::f32, want.scratch, "attention_forward scratch");
  expect(out, DType::f32, Shape{d.B, d.T, d.C}, "attention_forward output");
  check_key_mask(key_mask, d.B, d.T, "attention_forward");
  check_key_lengths(key_mask, d.T, "attention_forward");
  BRISK_CHECK(dropout_p >= 0.0f && dropout_p < 1.0f, "attention dropout ", dropout_p,
              " is outside [0, 1)");
  const int64_t per_task = cpu_attention_scratch_floats(d.T, d.D);
  check_operand(qkv, "attention_forward qkv");  // float32, or bf16 in bf16 mode
  const HeadSrc base{qkv.data(), qkv.dtype() == DType::bf16};
  // On bf16 units the scores' and the output's products read bf16 copies.
  const bool units = prepare_attention_products();
  const AttnCall c = make_call(d, base, key_mask, scratch, per_task, causal, scale, dropout_p, key,
                               bf16_operands_, units, f32_attention_tiles_, attention_dnnl_);
  float* lse = stats.f32();
  float* o = out.f32();

  // Static: a thread takes the same tasks every step, so its oneDNN instance has made the
  // primitives for their shapes in the first step (with dynamic scheduling a thread that got no
  // task then would make them later, on a step that must not allocate).
#pragma omp parallel for schedule(static)
  for (int64_t bh = 0; bh < d.B * d.H; ++bh) forward_task(c, bh, lse, o);
}

namespace {
// A backward task's scratch slot and its operands for the library products: K and V (KT, VT:
// the B of the scores and of dP, K^T and V^T), and the current query head's Q and output
// gradient G.
struct BackwardOperands {
  TaskScratch ts;
  TileScratch tt;
  Mat K, V, KT, VT, Q, G;
};

// Zeroes task bk's key and value gradient rows (dk, dv) and packs its k and v.
BackwardOperands key_value_operands(const AttnCall& c, int64_t bk, float* dk, float* dv) {
  const AttnDims& d = c.d;
  const int64_t ld = c.ld, token0 = bk / d.K * d.T * ld, first_head = (bk % d.K) * c.row_of.group;
  const HeadSrc k = c.base.at(token0 + c.row_of.k(d, first_head)),
                v = c.base.at(token0 + c.row_of.v(d, first_head));
  for (int64_t t = 0; t < d.T; ++t) {
    std::fill(dk + t * ld, dk + t * ld + d.D, 0.0f);
    std::fill(dv + t * ld, dv + t * ld + d.D, 0.0f);
  }
  BackwardOperands op{TaskScratch(c.scratch + bk * c.per_task, d.T, d.D),
                      TileScratch(c.scratch + bk * c.per_task, d.T, d.D),
                      Mat{},
                      Mat{},
                      Mat{},
                      Mat{},
                      Mat{},
                      Mat{}};
  const TaskScratch& ts = op.ts;
  const TileScratch& tt = op.tt;
  if (c.tiles) {
    with_source(k, [&](auto p) { bf16_column_pairs_transposed(p, d.T, d.D, ld, tt.kt, c.Te); });
    with_source(v, [&](auto p) { bf16_column_pairs_transposed(p, d.T, d.D, ld, tt.vt, c.Te); });
    with_source(k, [&](auto p) { bf16_row_pairs(p, d.T, d.D, ld, tt.k2, d.D); });
  } else {
    op.K = op.KT = as_operand(k, d.T, d.D, ld, c.units, ts.k16, ts.kf);
    op.V = op.VT = as_operand(v, d.T, d.D, ld, c.units, ts.v16, ts.vf);
    if (c.f32_tiles) {  // the libraries read K and V transposed; the tiles read them packed so
      op.KT = transposed(op.K, d.T, d.D, ts.kt);
      op.VT = transposed(op.V, d.T, d.D, ts.vt);
    }
  }
  return op;
}

// Packs query head q and its output gradient gh (row stride C) into op.
void query_operands(const AttnCall& c, const HeadSrc& q, const float* gh, BackwardOperands& op) {
  const AttnDims& d = c.d;
  const int64_t ld = c.ld;
  const TileScratch& tt = op.tt;
  if (c.tiles) {
    with_source(q, [&](auto p) {
      bf16_rows(p, d.T, d.D, ld, reinterpret_cast<uint16_t*>(tt.q16), d.D);
      bf16_row_pairs(p, d.T, d.D, ld, tt.q2, d.D);
    });
    bf16_rows(gh, d.T, d.D, d.C, reinterpret_cast<uint16_t*>(tt.g16), d.D);
    bf16_row_pairs(gh, d.T, d.D, d.C, tt.g2, d.D);
  } else {
    op.Q = as_operand(q, d.T, d.D, ld, c.units, op.ts.q16, op.ts.qf);
    op.G = as_operand(gh, d.T, d.D, d.C, c.units, op.ts.g16);
  }
}

// A block of backward: rows query rows from i0 of query head bh, reading keys keys.
struct BackwardBlock {
  int64_t bh, i0, rows, keys;
};

// The block's probabilities P, recomputed in ts.s from the scores and the log-sum-exp.
void recompute_block(const AttnCall& c, const BackwardOperands& op, const BackwardBlock& blk,
                     const float* lse) {
  const AttnDims& d = c.d;
  const int32_t* mask_b = c.mask ? c.mask + blk.bh / d.H * d.T : nullptr;
  if (c.tiles)
    bf16_pair_product(blk.rows, blk.keys, c.half, op.tt.q16 + blk.i0 * c.half, c.half, 1, op.tt.kt,
                      c.Te, false, op.ts.s, d.T);
  else
    c.product(false, !c.f32_tiles, blk.rows, blk.keys, d.D, op.Q.from(blk.i0), op.KT, 0.0f, op.ts.s,
              d.T);
  for (int64_t r = 0; r < blk.rows; ++r) {
    const int64_t i = blk.i0 + r;
    recompute_row(op.ts.s + r * d.T, blk.keys, c.causal ? std::min(i + 1, blk.keys) : blk.keys,
                  mask_b, c.scale, lse[blk.bh * d.T + i]);
  }
}

// out += (the block's pairs of rows in pairs32)^T b; on AMX, whose tiles read A in rows, those
// pairs transposed first into rows16 (free until dS is written there, and again once dQ has read
// it).
void add_transposed_product(const AttnCall& c, const TileScratch& tt, const BackwardBlock& blk,
                            const uint32_t* b, float* out) {
  const AttnDims& d = c.d;
  const int64_t row_pairs = (blk.rows + 1) / 2;
  if (c.amx) {
    pairs_transposed(tt.pairs32, row_pairs, blk.keys, d.T, tt.rows16, row_pairs);
    bf16_pair_product(blk.keys, d.D, row_pairs, tt.rows16, row_pairs, 1, b, d.D, true, out, c.ld);
  } else {
    bf16_pair_product(blk.keys, d.D, row_pairs, tt.pairs32, 1, d.T, b, d.D, true, out, c.ld);
  }
}

// dV += P'^T dO: P' dropped out into p (or copied there, to be rounded without touching P),
// rounded in bf16 mode; then dP' = dO V^T into p.
void value_gradient(const AttnCall& c, const BackwardOperands& op, const BackwardBlock& blk,
                    float* dv) {
  const AttnDims& d = c.d;
  const TaskScratch& ts = op.ts;
  const TileScratch& tt = op.tt;
  const int64_t rows = blk.rows, keys = blk.keys, i0 = blk.i0;
  float* weights = ts.s;
  if (c.dropout_p > 0.0f || (c.round && !c.units)) {
    for (int64_t r = 0; r < rows; ++r) {
      if (c.dropout_p > 0.0f)
        dropout_range(c.key, c.dropout_p, prob_index(d, c.key, blk.bh, i0 + r, 0), keys,
                      ts.s + r * d.T, nullptr, ts.p + r * d.T);
      else
        std::copy(ts.s + r * d.T, ts.s + r * d.T + keys, ts.p + r * d.T);
    }
    weights = ts.p;
  }
  // (The tiles read P'^T as A from P' in pairs of rows, and the block's pairs of dO rows.)
  if (c.tiles) {
    bf16_row_pairs(weights, rows, keys, d.T, tt.pairs32, d.T);
    add_transposed_product(c, tt, blk, tt.g2 + i0 / 2 * d.D, dv);
    bf16_pair_product(rows, keys, c.half, tt.g16 + i0 * c.half, c.half, 1, tt.vt, c.Te, false, ts.p,
                      d.T);
  } else {
    const Mat Pd = rounded_operand(weights, rows, keys, d.T, c.round, c.units, ts.a16);
    c.product(true, false, keys, d.D, rows, Pd, op.G.from(i0), 1.0f, dv, c.ld);
    // dP' = dO V^T into p, then dS over it.
    c.product(false, !c.f32_tiles, rows, keys, d.D, op.G.from(i0), op.VT, 0.0f, ts.p, d.T);
  }
}

// dP = dropout'(dP') in p, each row's sum_j P dP into dots; without the tiles also
// dS = P * (dP - dot) * scale over it.
void score_gradient(const AttnCall& c, const TaskScratch& ts, const BackwardBlock& blk,
                    float* dots) {
  const AttnDims& d = c.d;
  const int64_t keys = blk.keys;
  const float scale = c.scale;
  for (int64_t r = 0; r < blk.rows; ++r) {
    const float* pr = ts.s + r * d.T;
    float* dr = ts.p + r * d.T;
    if (c.dropout_p > 0.0f)
      dropout_range(c.key, c.dropout_p, prob_index(d, c.key, blk.bh, blk.i0 + r, 0), keys, dr,
                    nullptr, dr);
    float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
    for (int64_t j = 0; j < keys; ++j) dot += pr[j] * dr[j];
    dots[r] = dot;
    if (c.tiles) continue;  // dS goes straight into the tiles' bf16 layouts below
#pragma omp simd
    for (int64_t j = 0; j < keys; ++j) dr[j] = pr[j] * (dr[j] - dot) * scale;
  }
}

// One block of backward: P recomputed, dV, dS, then dQ = dS K and dK += dS^T Q (the tiles: dS
// as rows, and in pairs of rows for dS^T).
void backward_block(const AttnCall& c, const BackwardOperands& op, const BackwardBlock& blk,
                    const float* lse, float* dq, float* dk, float* dv) {
  const AttnDims& d = c.d;
  const TaskScratch& ts = op.ts;
  const TileScratch& tt = op.tt;
  const int64_t rows = blk.rows, keys = blk.keys, i0 = blk.i0;
  recompute_block(c, op, blk, lse);
  value_gradient(c, op, blk, dv);
  float dots[kRows];
  score_gradient(c, ts, blk, dots);
  if (c.tiles) {
    score_gradient_bf16(ts.s, ts.p, dots, rows, keys, d.T, c.scale,
                        reinterpret_cast<uint16_t*>(tt.rows16), c.Te, tt.pairs32, d.T);
    bf16_pair_product(rows, d.D, (keys + 1) / 2, tt.rows16, c.Te / 2, 1, tt.k2, d.D, false,
                      dq + i0 * c.ld, c.ld);
    add_transposed_product(c, tt, blk, tt.q2 + i0 / 2 * d.D, dk);
    return;
  }
  const Mat dS = rounded_operand(ts.p, rows, keys, d.T, c.round, c.units, ts.a16);
  c.product(false, false, rows, d.D, keys, dS, op.K, 0.0f, dq + i0 * c.ld, c.ld);
  c.product(true, false, keys, d.D, rows, dS, op.Q.from(i0), 1.0f, dk, c.ld);
}

// Task bk = (batch, key/value head) of backward: its key and value gradients zeroed, then the
// query heads of its group in turn, block by block.
void backward_task(const AttnCall& c, int64_t bk, const float* g, const float* lse, float* dbase) {
  const AttnDims& d = c.d;
  const int64_t b = bk / d.K, token0 = b * d.T * c.ld, first_head = (bk % d.K) * c.row_of.group;
  float* dk = dbase + token0 + c.row_of.k(d, first_head);
  float* dv = dbase + token0 + c.row_of.v(d, first_head);
  BackwardOperands op = key_value_operands(c, bk, dk, dv);
  for (int64_t h = first_head; h < first_head + c.row_of.group; ++h) {
    float* dq = dbase + token0 + c.row_of.q(d, h);
    query_operands(c, c.base.at(token0 + c.row_of.q(d, h)), g + b * d.T * d.C + h * d.D, op);
    for (int64_t i0 = 0; i0 < d.T; i0 += c.block_rows) {
      const int64_t rows = std::min(c.block_rows, d.T - i0);
      const int64_t keys = std::min(c.causal ? i0 + rows : d.T, key_span(c, b));
      backward_block(c, op, BackwardBlock{b * d.H + h, i0, rows, keys}, lse, dq, dk, dv);
    }
  }
}
}  // namespace

// One task per (batch, key/value head): the query heads of its group add their key and value
// gradients in turn into rows zeroed first, so no two threads write the same rows and the sums
// have a fixed order. Per block of query rows the probabilities are recomputed from the scores
// and the log-sum-exp (with the forward pass's mask and causality), then dV += P'^T dO (P' the
// dropped-out probabilities), dP = dropout'(dO V^T), dS = P * (dP - sum_j P dP) * scale,
// dQ = dS K and dK += dS^T Q.
Tensor CpuBackend::attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& /*out*/,
                                      const Tensor& stats, const KeyMask& key_mask, bool causal,
                                      int heads, int kv_heads, float scale, float dropout_p,
                                      const RngKey& key, const Tensor& scratch, const Tensor& dqkv,
                                      DType round_dout, DType round_dqkv) {
  const AttnDims d = attention_dims(qkv, heads, kv_heads, "attention_backward");
  check_attention_scale(scale, "attention_backward");
  const AttentionBuffers want = attention_buffers(Device::cpu, d.B, d.H, d.T, d.D);
  expect(dout, DType::f32, Shape{d.B, d.T, d.C}, "attention_backward gradient");
  expect(stats, DType::f32, want.stats, "attention_backward statistics");
  expect(scratch, DType::f32, want.scratch, "attention_backward scratch");
  expect(dqkv, DType::f32, qkv.shape(), "attention_backward dqkv");
  check_key_mask(key_mask, d.B, d.T, "attention_backward");
  check_key_lengths(key_mask, d.T, "attention_backward");
  const int64_t per_task = cpu_attention_scratch_floats(d.T, d.D);
  check_operand(qkv, "attention_backward qkv");  // float32, or bf16 in bf16 mode
  const HeadSrc base{qkv.data(), qkv.dtype() == DType::bf16};
  const float* g = dout.f32();
  const float* lse = stats.f32();
  float* dbase = dqkv.f32();
  const bool units = prepare_attention_products();
  AttnCall call = make_call(d, base, key_mask, scratch, per_task, causal, scale, dropout_p, key,
                            bf16_operands_, units, f32_attention_tiles_, attention_dnnl_);
  call.amx = call.tiles && cpu_amx_tiles_available();
  const AttnCall& c = call;
  // The roundings as passes of their own, before and after.
  if (round_dout != DType::f32) round_to(round_dout, dout);
#pragma omp parallel for schedule(static)  // the same tasks per thread every step (see forward)
  for (int64_t bk = 0; bk < d.B * d.K; ++bk) backward_task(c, bk, g, lse, dbase);
  if (round_dqkv != DType::f32) round_to(round_dqkv, dqkv);
  return dqkv;
}

void CpuBackend::attention_decode(const Tensor& qkv, const Tensor& k_cache, const Tensor& v_cache,
                                  int64_t past, int heads, int kv_heads, float scale,
                                  const Tensor& out) {
  AttnDims d{};
  check_attention_decode(qkv, k_cache, v_cache, past, heads, kv_heads, out, &d);
  check_attention_scale(scale, "attention_decode");
  const PackedRow row_of(d);
  // The caches hold the K key/value heads of each position: rows of KD = K * D.
  const int64_t S = k_cache.dim(1), ld = row_of.ld, KD = d.K * d.D;
  const float* base = qkv.f32();
  float* kc = k_cache.f32();
  float* vc = v_cache.f32();
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t t = 0; t < d.T; ++t) {
      const float* row = base + (b * d.T + t) * ld;
      std::memcpy(kc + (b * S + past + t) * KD, row + row_of.k(d, 0), sizeof(float) * KD);
      std::memcpy(vc + (b * S + past + t) * KD, row + row_of.v(d, 0), sizeof(float) * KD);
    }
  float* o = out.f32();
#pragma omp parallel
  {
    std::vector<float> p(static_cast<size_t>(past + d.T));
#pragma omp for schedule(static) collapse(3)
    for (int64_t b = 0; b < d.B; ++b)
      for (int64_t h = 0; h < d.H; ++h)
        for (int64_t t = 0; t < d.T; ++t) {
          const float* q = base + (b * d.T + t) * ld + h * d.D;
          const int64_t keys = past + t + 1;
          float mx = -std::numeric_limits<float>::infinity();
          for (int64_t j = 0; j < keys; ++j) {
            const float* k = kc + (b * S + j) * KD + (h / row_of.group) * d.D;
            float s = 0.0f;
            for (int64_t i = 0; i < d.D; ++i) s += q[i] * k[i];
            p[j] = s * scale;
            mx = std::max(mx, p[j]);
          }
          double sum = 0.0;
          for (int64_t j = 0; j < keys; ++j) {
            p[j] = std::exp(p[j] - mx);
            sum += p[j];
          }
          const float inv = static_cast<float>(1.0 / sum);
          float* y = o + (b * d.T + t) * d.C + h * d.D;
          std::fill(y, y + d.D, 0.0f);
          for (int64_t j = 0; j < keys; ++j) {
            const float* v = vc + (b * S + j) * KD + (h / row_of.group) * d.D;
            const float w = p[j] * inv;
            for (int64_t i = 0; i < d.D; ++i) y[i] += w * v[i];
          }
        }
  }
}

}  // namespace brisk
