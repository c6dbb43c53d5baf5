// Linear layers on the CPU: oneDNN or OpenBLAS for the products, a blocked loop for bias
// gradients.
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cctype>
#include <string>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_tiles.h"

namespace brisk {

namespace {
struct LinearDims {
  int64_t m, k, n;
};

LinearDims linear_dims(const Tensor& x, const Tensor& w, WeightLayout layout, const char* op) {
  BRISK_CHECK(w.rank() == 2, op, ": weight must be 2-D, got ", w.shape().str());
  const int64_t k = cols_of(x);
  const int64_t n = layout == WeightLayout::out_in ? w.dim(0) : w.dim(1);
  const int64_t wk = layout == WeightLayout::out_in ? w.dim(1) : w.dim(0);
  BRISK_CHECK(wk == k, op, ": input has ", k, " features but the weight ", w.shape().str(),
              " expects ", wk);
  return {rows_of(x), k, n};
}

// A block of a transposed bf16 operand ([k x rows] at a, row stride ld: op(A) = its transpose)
// written plain, [rows x k], into dst; the threads take runs of 16 of its columns.
void plain_from_transposed(const uint16_t* a, int64_t k, int64_t rows, int64_t ld, uint16_t* dst) {
#pragma omp parallel
  {
    const int64_t threads = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t per = ((rows + 15) / 16 + threads - 1) / threads * 16;
    const int64_t c0 = std::min(rows, t * per), c1 = std::min(rows, c0 + per);
    bf16_transposed(a + c0, k, c1 - c0, ld, dst + c0 * k, k);
  }
}
}  // namespace

// float32 products go to oneDNN on AVX-512 CPUs except where OpenBLAS has its AVX-512 kernels on
// an Intel CPU without AMX. Debian's OpenBLAS 0.3.21 takes AMD Zen 5 for Haswell (AVX2) and
// multiplies at half of oneDNN's rate (250 against 474 GFLOP/s on 2 cores); it takes Zen 4 for
// Cooper Lake, whose kernel is slower there than oneDNN's as well (large products 209 against 223
// GFLOP/s, whole steps: BERT fp32 +6.6%, GPT-2 fp32 +10% on oneDNN, docs/benchmarks-history.md). On
// an Intel AMX CPU it takes Skylake-X: its large square products beat oneDNN's (402 against 364
// GFLOP/s) but whole steps are faster on oneDNN (BERT +9.9%, GPT-2 +9.1%, SmolLM2 +5.7%; an early
// oneDNN integration had lost there, BERT 39 against 44 samples/s). Intel AVX-512 CPUs without AMX
// have not been measured with both libraries and stay on OpenBLAS. A fixed rule, not a timing, so
// a machine always gets the same library and the same bits.
bool float32_rule_prefers_onednn(std::string core, bool avx512f, bool amd, bool amx) {
  for (char& c : core) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  const bool openblas_avx512 =
      core == "skylakex" || core == "cooperlake" || core == "sapphirerapids";
  return avx512f && (!openblas_avx512 || amd || amx);
}

namespace {
// float32_rule_prefers_onednn for this CPU and this OpenBLAS, unless `forced` names the library.
bool float32_products_by_onednn(const std::string& forced) {
  if (forced == "openblas" || !DnnlMatmul::available(DType::f32)) return false;
  if (forced == "onednn") return true;
  return float32_rule_prefers_onednn(openblas_get_corename(), __builtin_cpu_supports("avx512f"),
                                     __builtin_cpu_is("amd"), DnnlMatmul::has_amx());
}
}  // namespace

void CpuBackend::set_matmul_dtype(DType dtype) {
  BRISK_CHECK(dtype == DType::f32 || dtype == DType::bf16, "matrix products in ", dtype_name(dtype),
              " are not supported on the CPU");
  // bf16 operands on oneDNN's bf16 units, or without them rounded to bf16 values and multiplied
  // in float32 (by oneDNN or OpenBLAS, as float32 products are).
  bf16_operands_ = dtype == DType::bf16;
  f32_attention_tiles_ = cpu_f32_tiles_available() && products_.empty();
  const DType library =
      bf16_operands_ && cpu_has_bf16_products(products_) ? DType::bf16 : DType::f32;
  // Attention's per-thread instances follow dnnl_'s type (prepare_attention_products makes them).
  if (!dnnl_ || dnnl_->dtype() != library) attention_dnnl_.clear();
  if (library == DType::f32 && !float32_products_by_onednn(products_)) {
    dnnl_.reset();
    return;
  }
  if (!dnnl_ || dnnl_->dtype() != library) dnnl_ = std::make_unique<DnnlMatmul>(library);
}

void CpuBackend::plan_workspace(MemoryPlan& plan, BufferBinder& binder, MatmulOperands operands) {
  plan_backend_workspace(Device::cpu, bf16_operands_ ? DType::bf16 : DType::f32, operands, plan,
                         binder, ws_, products_);
}

void CpuBackend::hold_weight(const Tensor& w) {
  release_weight();
  const Tensor& held = ws_.held_weight;
  if (!bf16_operands_ || held.empty()) return;
  const int64_t copy_elements = held.rank() == 2 ? held.dim(1) : held.numel();
  if (w.numel() <= copy_elements) held_ = w.f32();
}

void CpuBackend::hold_weights(const Tensor& weights) {
  release_weights();
  const Tensor& copy = ws_.weights_copy;
  if (!bf16_operands_ || copy.empty() || weights.numel() > copy.numel()) return;
  cast(weights, element_range(copy, 0, weights.numel()));
  weights_copy_.hold(weights.f32(), weights.numel(), copy);
}

CpuBackend::Operand CpuBackend::weight_operand(const Tensor& w, int64_t stride) const {
  const float* p = w.f32();
  if (p != held_)
    if (const void* copy = weights_copy_.find(p, w.numel()))
      return Operand(copy, DType::bf16, stride);
  return Operand(p, stride);
}

void CpuBackend::release_weight() {
  held_ = nullptr;
  held_copy_[0] = held_copy_[1] = kNoCopy;
}

void CpuBackend::check_operand(const Tensor& x, const char* op) const {
  BRISK_CHECK(x.dtype() == DType::f32 || (x.dtype() == DType::bf16 && bf16_operands_), op, ": ",
              dtype_name(x.dtype()), " where ", bf16_operands_ ? "float32 or bf16" : "float32",
              " is expected");
}

void CpuBackend::check_output(const Tensor& y, const Tensor& x, const char* op) const {
  check_operand(y, op);
  check_same_numel(x, y, op);
}

namespace {
// Both libraries touch working memory in proportion to the rows of a transposed A (OpenBLAS
// 48 MiB more resident for GPT-2's LM-head weight gradient, 50257 rows), outside the plan:
// such products go in blocks of rows, which bounds it to a few MiB at the same speed.
constexpr int64_t kRowBlock = 4096;
}  // namespace

// In bf16 mode an operand passes through its packing buffer unless it already is bf16 and the
// library multiplies bf16: float32 operands are rounded, bf16 ones widened for float32 products.
bool CpuBackend::packs(const Operand& x) const {
  // The type the library multiplies in: bf16 on oneDNN's bf16 units; otherwise float32 (bf16
  // operands then rounded, or widened, to float32 holding bf16 values).
  const DType library = dnnl_ ? dnnl_->dtype() : DType::f32;
  return bf16_operands_ && !(x.dtype == DType::bf16 && library == DType::bf16);
}

// B (the held weight) as its bf16 copy in ws_.held_weight, made on first use: on bf16 units in
// the blocked layout the product's kernel reads (*blocked), so the kernel does not copy B again
// on every call.
const void* CpuBackend::held_b(const DnnlMatmul::Product& p, const Operand& b, bool* blocked) {
  const bool bf16_units = dnnl_ && dnnl_->dtype() == DType::bf16;
  const bool two = ws_.held_weight.rank() == 2;  // a copy per way of reading it
  const int which = two && !p.trans_b ? 1 : 0;
  const Tensor slot = two ? row_range(ws_.held_weight, which, 1) : ws_.held_weight;
  const DnnlMatmul::BlockedB layout =
      two && !p.trans_a && bf16_units ? dnnl_->blocked_b(p) : DnnlMatmul::BlockedB{};
  *blocked = layout.layout >= 0 && layout.bytes <= slot.bytes();
  const int holds = *blocked ? layout.layout : kPlainCopy;
  if (held_copy_[which] != holds) {
    if (*blocked)
      dnnl_->round_blocked_b(p, held_, DType::f32, slot.data());
    else
      bf16_operand(held_, p.trans_b ? p.n : p.k, p.trans_b ? p.k : p.n, b.ld, slot);
    held_copy_[which] = holds;
  }
  return slot.data();
}

// B other than the held weight, where the product reads it. On bf16 units B (a float32 weight,
// rounded, or bf16 activations or gradients as they lie) is written straight into the blocked
// layout the kernel reads (*blocked) where brisk's packer writes that layout and the packing
// buffer holds its padding; otherwise the kernel copies it into that layout inside the product
// (a float32 B rounded plainly first, into the packing buffer, by the first block of rows).
const void* CpuBackend::packed_b(const DnnlMatmul::Product& p, const Operand& b, bool* blocked) {
  const bool bf16_units = dnnl_ && dnnl_->dtype() == DType::bf16;
  const DnnlMatmul::BlockedB layout =
      bf16_units && (!p.trans_a || p.m <= kRowBlock) ? dnnl_->blocked_b(p) : DnnlMatmul::BlockedB{};
  *blocked = layout.own_packer && layout.bytes <= ws_.operand_b.bytes();
  if (*blocked) {
    dnnl_->round_blocked_b(p, b.data, b.dtype, ws_.operand_b.data());
    return ws_.operand_b.data();
  }
  if (packs(b)) {
    bf16_operand(b.data, b.dtype, p.trans_b ? p.n : p.k, p.trans_b ? p.k : p.n, b.ld,
                 ws_.operand_b);
    return ws_.operand_b.data();
  }
  return b.data;
}

// oneDNN 2.6 multiplies a transposed bf16 A on its AMX kernel only where A's columns lie
// together (lda = the product's rows); a block of rows of a wider one, such as the LM head's
// weight gradient's (4096 of the vocabulary's rows of a chunk's logits gradient), goes to its
// gemm kernel at under half the rate (2 Intel AMX cores: 510-534 GFLOP/s in the step, 678 alone,
// against 1356-1419 for the same product with A dense or plain).
// brisk writes such a block plain into the A buffer instead (true here), and the kernel reads it
// as rows.
bool CpuBackend::reads_a_plain(const DnnlMatmul::Product& p, const Operand& a, bool blocked,
                               int64_t block) const {
  const bool bf16_units = dnnl_ && dnnl_->dtype() == DType::bf16;
  // (As addresses: the buffer may be unplanned, its pointer null.)
  const auto at = reinterpret_cast<uintptr_t>(a.data);
  const auto buffer = reinterpret_cast<uintptr_t>(ws_.operand_a.data());
  const bool a_in_buffer = at >= buffer && at - buffer < ws_.operand_a.bytes();
  return p.trans_a && bf16_units && a.dtype == DType::bf16 && !a_in_buffer &&
         a.ld != std::min(block, p.m) && !blocked &&
         std::min(block, p.m) * p.k <= ws_.operand_a.numel();
}

// The product's rows [r0, r0 + rows) of C, with B read at b0: A plain or packed as it needs,
// then by oneDNN (B blocked or as it lies) or OpenBLAS.
void CpuBackend::product_rows(const DnnlMatmul::Product& p, const Operand& a, const void* b0,
                              int64_t r0, int64_t rows, bool blocked, bool plain_a, void* c,
                              const float* bias, DType c_type) {
  const bool trans_a = p.trans_a, trans_b = p.trans_b, accumulate = p.accumulate;
  const int64_t n = p.n, k = p.k, ldb = p.ldb, ldc = p.ldc;
  const size_t a_size = dtype_size(a.dtype);
  const void* a0 = static_cast<const char*>(a.data) + (trans_a ? r0 : r0 * a.ld) * a_size;
  if (plain_a) {
    plain_from_transposed(static_cast<const uint16_t*>(a0), k, rows, a.ld,
                          ws_.operand_a.as<uint16_t>());
    dnnl_->run(false, trans_b, rows, n, k, ws_.operand_a.data(), k, b0, ldb, accumulate,
               static_cast<char*>(c) + r0 * ldc * static_cast<int64_t>(dtype_size(c_type)), ldc,
               bias, c_type);
    return;
  }
  if (packs(a)) {
    bf16_operand(a0, a.dtype, trans_a ? k : rows, trans_a ? rows : k, a.ld, ws_.operand_a);
    a0 = ws_.operand_a.data();
  }
  void* c0 = static_cast<char*>(c) + r0 * ldc * static_cast<int64_t>(dtype_size(c_type));
  if (blocked)  // one block: a held or blocked B is never read with more than kRowBlock rows
    dnnl_->run_blocked_b(p, a0, b0, c, bias);
  else if (dnnl_)
    dnnl_->run(trans_a, trans_b, rows, n, k, a0, a.ld, b0, ldb, accumulate, c0, ldc, bias, c_type);
  else
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, rows, n, k, 1.0f,
                static_cast<const float*>(a0), a.ld, static_cast<const float*>(b0), ldb,
                accumulate ? 1.0f : 0.0f, static_cast<float*>(c0), ldc);
}

void CpuBackend::matmul(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, Operand a,
                        Operand b, bool accumulate, void* c, int64_t ldc, const float* bias,
                        DType c_type) {
  BRISK_CHECK(bias == nullptr || (dnnl_ && !trans_a),
              "internal error: a bias added inside a product oneDNN does not run");
  const bool c_bf16 = c_type == DType::bf16;
  BRISK_CHECK(c_type == DType::f32 || (c_bf16 && stores_product_output(c_type) && !accumulate),
              "internal error: a product stored in ", dtype_name(c_type),
              " outside written bf16 products");
  BRISK_CHECK(!bf16_operands_ || !ws_.operand_a.empty(),
              "bf16 matrix products need the backend workspace in the plan");
  BRISK_CHECK(
      (a.dtype == DType::f32 || bf16_operands_) && (b.dtype == DType::f32 || bf16_operands_),
      "internal error: a 16-bit operand outside bf16 products");
  // B rounded to bf16 where it is read from: the held weight's copy, else the packing buffer,
  // filled by the first block of rows and read by the others.
  const DnnlMatmul::Product product{trans_a,    trans_b,         m,     n, k, a.ld, b.ld, ldc,
                                    accumulate, bias != nullptr, c_bf16};
  bool blocked = false;
  const void* b0 = held_ != nullptr && b.data == held_ ? held_b(product, b, &blocked)
                                                       : packed_b(product, b, &blocked);
  const int64_t block = trans_a ? kRowBlock : m;
  const bool plain_a = reads_a_plain(product, a, blocked, block);
  for (int64_t r0 = 0; r0 < m; r0 += block)
    product_rows(product, a, b0, r0, std::min(block, m - r0), blocked, plain_a, c, bias, c_type);
}

void CpuBackend::linear_forward(const Tensor& x, const Tensor& w, const Tensor& b,
                                WeightLayout layout, const Tensor& y) {
  // Plain locals, not structured bindings: OpenMP regions capture them (clang 14 cannot capture
  // bindings, and the fuzz build uses clang).
  const LinearDims dims = linear_dims(x, w, layout, "linear_forward");
  check_operand(x, "linear_forward");
  const int64_t m = dims.m, k = dims.k, n = dims.n;
  BRISK_CHECK(rows_of(y) == m && cols_of(y) == n, "linear_forward: output ", y.shape().str(),
              " does not hold ", m, " x ", n);
  BRISK_CHECK(y.dtype() == DType::f32 || stores_product_output(y.dtype()), "linear_forward: a ",
              dtype_name(y.dtype()), " output where float32",
              stores_product_output(DType::bf16) ? " or bf16" : "", " is expected");
  const float* bias = nullptr;
  if (!b.empty()) {
    BRISK_CHECK(b.numel() == n, "linear_forward: bias has ", b.numel(), " values, expected ", n);
    bias = b.f32();
  }
  if (m == 0) return;
  // oneDNN adds the bias inside the product; OpenBLAS adds the product to rows holding it.
  const bool bias_first = bias != nullptr && !dnnl_;
  if (bias_first) {
    float* out = y.f32();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < m; ++i) std::copy(bias, bias + n, out + i * n);
  }
  const bool out_in = layout == WeightLayout::out_in;
  matmul(false, out_in, m, n, k, Operand(x, k), weight_operand(w, out_in ? k : n), bias_first,
         y.data(), n, bias_first ? nullptr : bias, y.dtype());
}

void CpuBackend::linear_backward(const Tensor& x, const Tensor& w, const Tensor& dy,
                                 WeightLayout layout, const Tensor& dx, bool accumulate_dx,
                                 const Tensor& dw, const Tensor& db, bool accumulate_dw) {
  const LinearDims dims = linear_dims(x, w, layout, "linear_backward");
  check_operand(x, "linear_backward");
  const int64_t m = dims.m, k = dims.k, n = dims.n;
  BRISK_CHECK(rows_of(dy) == m && cols_of(dy) == n, "linear_backward: gradient ", dy.shape().str(),
              " does not hold ", m, " x ", n);
  check_operand(dy, "linear_backward gradient");
  if (m == 0) {  // no rows: written gradients are zeros, added ones unchanged
    for (const Tensor* t : {&dw, &db})
      if (!accumulate_dw && !t->empty()) fill(*t, 0.0f);
    return;
  }
  // Both products read dy: on bf16 units with x already bf16 (so neither product packs an A
  // operand) a float32 dy is packed once, into the A buffer, instead of once per product.
  Operand gy(dy, n);
  if (!dx.empty() && !dw.empty() && x.dtype() == DType::bf16 && dy.dtype() == DType::f32 && dnnl_ &&
      dnnl_->dtype() == DType::bf16) {
    bf16_operand(dy.f32(), m, n, n, ws_.operand_a);
    gy = Operand(ws_.operand_a, n);
  }
  if (!dx.empty()) {
    check_same_numel(dx, x, "linear_backward dx");
    if (layout == WeightLayout::out_in)
      matmul(false, false, m, k, n, gy, weight_operand(w, k), accumulate_dx, dx.f32(), k);
    else
      matmul(false, true, m, k, n, gy, weight_operand(w, n), accumulate_dx, dx.f32(), k);
  }
  if (!dw.empty()) {
    BRISK_CHECK(dw.shape() == w.shape(), "linear_backward: weight gradient shape ",
                dw.shape().str(), " differs from the weight's ", w.shape().str());
    if (layout == WeightLayout::out_in)
      matmul(true, false, n, k, m, gy, Operand(x, k), accumulate_dw, dw.f32(), k);
    else
      matmul(true, false, k, n, m, Operand(x, k), gy, accumulate_dw, dw.f32(), n);
  }
  if (!db.empty()) {
    BRISK_CHECK(db.numel() == n, "linear_backward: bias gradient has ", db.numel(),
                " values, expected ", n);
    float* out = db.f32();
    const bool wide = dy.dtype() == DType::f32;
    const float* g = wide ? dy.f32() : nullptr;
    const uint16_t* g16 = wide ? nullptr : dy.as<uint16_t>();
    constexpr int64_t kBlock = 64;
#pragma omp parallel for schedule(static)
    for (int64_t j0 = 0; j0 < n; j0 += kBlock) {
      const int64_t j1 = std::min(n, j0 + kBlock);
      float acc[kBlock] = {};
      for (int64_t i = 0; i < m; ++i) {
        if (wide) {
          const float* row = g + i * n;
          for (int64_t j = j0; j < j1; ++j) acc[j - j0] += row[j];
        } else {
          const uint16_t* row = g16 + i * n;
          for (int64_t j = j0; j < j1; ++j) acc[j - j0] += bf16_to_float(row[j]);
        }
      }
      for (int64_t j = j0; j < j1; ++j) out[j] = accumulate_dw ? out[j] + acc[j - j0] : acc[j - j0];
    }
  }
}

}  // namespace brisk
