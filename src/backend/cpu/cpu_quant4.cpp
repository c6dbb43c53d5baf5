// 4-bit weights on the CPU (QLoRA's frozen base): dequantization block by block, the blocks
// shared by the threads, a transposed output written at each value's transposed place; and the
// products of a 4-bit weight, which on bf16 units dequantize it straight into the blocked layout
// oneDNN's kernel reads B in (one weight at a time, never a float32 copy of it).
#include <algorithm>
#include <cstring>
#include <vector>

#include "backend/cpu/cpu_avx512.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_tiles.h"
#include "core/checked.h"
#include "core/dtype.h"

namespace brisk {

namespace {
// A 4-bit part's state in host memory, read value by value or run by run.
struct PartValues {
  const uint8_t* packed;
  const float *absmax, *absmax2, *code2;
  const uint8_t* qabsmax;
  float offset;
  int64_t blocksize;
  Quant4Type type;
  bool nested;
  DType dtype;

  PartValues(const Backend::Quant4Tensor& q, DType round)
      : packed(q.packed.as<uint8_t>()),
        absmax(q.layout.nested ? nullptr : q.absmax.f32()),
        absmax2(q.layout.nested ? q.absmax2.f32() : nullptr),
        code2(q.layout.nested ? q.code2.f32() : nullptr),
        qabsmax(q.layout.nested ? q.qabsmax.as<uint8_t>() : nullptr),
        offset(q.offset),
        blocksize(q.layout.blocksize),
        type(q.layout.type),
        nested(q.layout.nested),
        dtype(round) {}
  explicit PartValues(const Backend::Quant4Part& p) : PartValues(p.q, p.dtype) {}

  // As dequantize_4bit reads a block's absmax (each step rounded: no fused multiply-add here).
  float block_absmax(int64_t b) const {
    return nested ? code2[qabsmax[b]] * absmax2[b / Quant4Layout::kNestedBlock] + offset
                  : absmax[b];
  }
  float value(int64_t i) const {
    const uint8_t byte = packed[i / 2];
    return quant4_value(type, i % 2 ? byte & 15 : byte >> 4) * block_absmax(i / blocksize);
  }
  // Values [i, i + n) into out, rounded to dtype and then, where fp16, to fp16 values.
  void run(int64_t i, int64_t n, bool fp16, float* out) const;
};

void PartValues::run(int64_t i, int64_t n, bool fp16, float* out) const {
  int64_t j = 0;
#ifdef BRISK_PACK_AVX512
  // 16 values from 8 bytes where they start on a byte and share a block: their codes looked up
  // in the 16 values, times the block's absmax (the same float32 product as value()).
  alignas(64) float table[16];
  for (int c = 0; c < 16; ++c) table[c] = quant4_value(type, c);
  const __m512 values = _mm512_load_ps(table);
  const __m128i low4 = _mm_set1_epi8(0x0f);
  for (; i % 2 == 0 && j + 16 <= n; j += 16) {
    const int64_t at = i + j;
    if (at / blocksize != (at + 15) / blocksize) break;
    __m128i bytes;
    std::memcpy(&bytes, packed + at / 2, 8);
    const __m128i high = _mm_and_si128(_mm_srli_epi16(bytes, 4), low4);
    const __m128i codes = _mm_unpacklo_epi8(high, _mm_and_si128(bytes, low4));
    const __m512 v = _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(codes), values);
    _mm512_storeu_ps(out + j, _mm512_mul_ps(v, _mm512_set1_ps(block_absmax(at / blocksize))));
  }
#endif
  for (; j < n; ++j) out[j] = value(i + j);
  if (dtype == DType::bf16)
    for (j = 0; j < n; ++j) out[j] = bf16_to_float(float_to_bf16(out[j]));
  if (dtype == DType::f16) fp16_rounded_row(out, out, n);
  if (fp16) fp16_rounded_row(out, out, n);
}

// A 4-bit matrix's rows, each found in its part.
class MatrixValues {
 public:
  explicit MatrixValues(const Backend::Quant4Matrix& w) : cols_(w.cols), fp16_(w.fp16) {
    int64_t row = 0;
    for (const Backend::Quant4Part& p : w.parts) {
      parts_.emplace_back(p);
      first_row_.push_back(row);
      row += p.q.layout.numel / w.cols;
    }
    first_row_.push_back(row);
  }
  // Row r's values [c, c + n) into out.
  void run(int64_t r, int64_t c, int64_t n, float* out) const {
    size_t p = 0;
    while (first_row_[p + 1] <= r) ++p;
    parts_[p].run((r - first_row_[p]) * cols_ + c, n, fp16_, out);
  }

 private:
  int64_t cols_;
  bool fp16_;
  std::vector<PartValues> parts_;
  std::vector<int64_t> first_row_;
};

// oneDNN's BA16a64b2a blocks (cpu_matmul_dnnl.h): 32 of B's rows by 64 of its columns.
constexpr int64_t kBlockK = 32, kBlockN = 64;
}  // namespace

void CpuBackend::dequantize_4bit(const Quant4Tensor& q, const Tensor& out) {
  check_dequantize_4bit(q, out);
  const PartValues values(q, DType::f32);
  const int64_t n = q.layout.numel, cols = q.transposed_cols, rows = cols ? n / cols : 0;
  const DType dtype = out.dtype();
  // Runs of up to kRun values (a block's or less: one absmax each), dequantized into float32 and
  // stored as out's type where they lie, or at their transposed places.
  constexpr int64_t kRun = 256;
  const int64_t run = std::min(kRun, q.layout.blocksize), runs = (n + run - 1) / run;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < runs; ++r) {
    const int64_t i0 = r * run, len = std::min(run, n - i0);
    float v[kRun];
    values.run(i0, len, false, v);
    if (cols) {
      for (int64_t j = 0; j < len; ++j) {
        const int64_t i = i0 + j, at = (i % cols) * rows + i / cols;
        if (dtype == DType::f32)
          out.f32()[at] = v[j];
        else
          out.as<uint16_t>()[at] = dtype == DType::bf16 ? float_to_bf16(v[j]) : float_to_fp16(v[j]);
      }
    } else if (dtype == DType::f32) {
      std::copy(v, v + len, out.f32() + i0);
    } else if (dtype == DType::bf16) {
      bf16_round_row(v, out.as<uint16_t>() + i0, len);
    } else {
      fp16_round_row(v, out.as<uint16_t>() + i0, len);
    }
  }
}

bool CpuBackend::dequantize_blocked(const DnnlMatmul::Product& p, const Quant4Matrix& w) {
  if (!blocked_4bit_ || !dnnl_ || dnnl_->dtype() != DType::bf16) return false;
  const DnnlMatmul::BlockedB layout = dnnl_->blocked_b(p);
  if (!layout.own_packer || layout.bytes > ws_.dequantized.bytes()) return false;
  const MatrixValues values(w);
  const int64_t k = p.k, n = p.n, kb_count = (k + kBlockK - 1) / kBlockK;
  const int64_t blocks = kb_count * ((n + kBlockN - 1) / kBlockN);
  uint16_t* dst = ws_.dequantized.as<uint16_t>();
  const bool trans = p.trans_b;  // B = W^T: B's column j is W's row j
  // Block by block in the layout's order (column blocks outermost): W's tile dequantized into a
  // float32 tile, then rounded into its place by the bf16 packer.
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < blocks; ++t) {
    const int64_t kb = t % kb_count, nb = t / kb_count;
    const int64_t k0 = kb * kBlockK, n0 = nb * kBlockN;
    const int64_t kk = std::min(kBlockK, k - k0), nn = std::min(kBlockN, n - n0);
    float tile[kBlockK * kBlockN];
    if (trans)  // W's rows n0.. (nn of them), values k0.. (kk each): tile [nn x kk]
      for (int64_t j = 0; j < nn; ++j) values.run(n0 + j, k0, kk, tile + j * kBlockK);
    else  // W's rows k0.., values n0..: tile [kk x nn]
      for (int64_t r = 0; r < kk; ++r) values.run(k0 + r, n0, nn, tile + r * kBlockN);
    pack_bf16_ba16a64b2a(trans, kk, nn, tile, DType::f32, trans ? kBlockK : kBlockN,
                         dst + t * kBlockK * kBlockN);
  }
  return true;
}

bool CpuBackend::dequantize_plain(const Quant4Matrix& w) {
  if (!dnnl_ || dnnl_->dtype() != DType::bf16) return false;
  const int64_t rows = w.rows(), cols = w.cols;
  if (checked_mul(rows * cols, int64_t{2}, "a 4-bit weight") >
      static_cast<int64_t>(ws_.dequantized.bytes()))
    return false;
  const MatrixValues values(w);
  uint16_t* dst = ws_.dequantized.as<uint16_t>();
  // Row by row, in runs of a block's length (a whole block each where rows start on one).
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    float run[kBlockN];
    for (int64_t c = 0; c < cols; c += kBlockN) {
      const int64_t n = std::min(kBlockN, cols - c);
      values.run(r, c, n, run);
      bf16_round_row(run, dst + r * cols + c, n);
    }
  }
  return true;
}

bool CpuBackend::quantized_product(const DnnlMatmul::Product& p, const Operand& a,
                                   const Quant4Matrix& w, void* c, const float* bias,
                                   DType c_type) {
  const bool blocked = p.m > 0 && dequantize_blocked(p, w);
  if (!blocked && !dequantize_plain(w)) return false;
  if (p.m > 0) product_rows(p, a, ws_.dequantized.data(), 0, p.m, blocked, false, c, bias, c_type);
  return true;
}

void CpuBackend::quantized_linear_forward(const Tensor& x, const Quant4Matrix& w, const Tensor& b,
                                          const Tensor& y) {
  const char* op = "quantized_linear_forward";
  check_quant4_matrix(w, op);
  check_operand(x, op);
  const int64_t m = rows_of(x), k = w.cols, n = w.rows();
  BRISK_CHECK(cols_of(x) == k && rows_of(y) == m && cols_of(y) == n, op, ": x ", x.shape().str(),
              " and y ", y.shape().str(), " for a [", n, ", ", k, "] weight");
  BRISK_CHECK(y.dtype() == DType::f32 || stores_product_output(y.dtype()), op, ": a ",
              dtype_name(y.dtype()), " output");
  BRISK_CHECK(b.empty() || b.numel() == n, op, ": bias has ", b.numel(), " values, expected ", n);
  const DnnlMatmul::Product p{
      false, true, m, n, k, k, k, n, false, !b.empty(), y.dtype() == DType::bf16};
  if (!quantized_product(p, Operand(x, k), w, y.data(), b.empty() ? nullptr : b.f32(), y.dtype()))
    Backend::quantized_linear_forward(x, w, b, y);
}

void CpuBackend::quantized_linear_backward(const Tensor& dy, const Quant4Matrix& w,
                                           const Tensor& dx, bool accumulate_dx) {
  const char* op = "quantized_linear_backward";
  check_quant4_matrix(w, op);
  check_operand(dy, op);
  const int64_t m = rows_of(dy), k = w.cols, n = w.rows();
  BRISK_CHECK(cols_of(dy) == n && rows_of(dx) == m && cols_of(dx) == k && dx.dtype() == DType::f32,
              op, ": dy ", dy.shape().str(), " and dx ", dx.shape().str(), " for a [", n, ", ", k,
              "] weight");
  // dx[m, k] = dy[m, n] W[n, k]: B is W as it lies.
  const DnnlMatmul::Product p{false, false, m, k, n, n, k, k, accumulate_dx, false, false};
  if (!quantized_product(p, Operand(dy, n), w, dx.data(), nullptr, DType::f32))
    Backend::quantized_linear_backward(dy, w, dx, accumulate_dx);
}

}  // namespace brisk
