// oneDNN matmul primitives, cached per shape (made on the first step, reused after), and the
// packing of bf16 operands.
#include "backend/cpu/cpu_matmul_dnnl.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>

#include "backend/cpu/cpu_avx512.h"
#include "backend/cpu/cpu_tiles.h"
#include "core/error.h"

#ifdef BRISK_HAVE_DNNL
#include <map>
#include <oneapi/dnnl/dnnl.hpp>
#include <tuple>
#include <unordered_map>
#include <vector>

#endif

namespace brisk {

namespace {
std::atomic<uint64_t> g_calls{0};
}  // namespace

uint64_t DnnlMatmul::calls() {
  return g_calls.load(std::memory_order_relaxed);
}

bool cpu_has_bf16_products(const std::string& forced) {
  return forced != "openblas" && DnnlMatmul::available(DType::bf16);
}

namespace {
#ifdef BRISK_PACK_AVX512
using namespace avx512;
#endif
constexpr int64_t kBlockK = 32, kBlockN = 64, kBlockElements = kBlockK * kBlockN;

// oneDNN's BA16a64b2a layout of B[k x n] (B = b[k][n], or b[n][k] when transposed; float32
// rounded, or bf16): blocks of 32 x 64, column of blocks by column of blocks, each as 16 lines of
// 64 32-bit words: word (k1, n1) = B(k0 + 2 k1, n0 + n1) | B(k0 + 2 k1 + 1, n0 + n1) << 16.

// One line of a block from two of B's rows, 64 values each at r0 and r1.
template <typename T>
void pack_row_pair(const T* r0, const T* r1, uint32_t* line) {
#ifdef BRISK_PACK_AVX512
  for (int64_t j = 0; j < kBlockN; j += 16)
    _mm512_storeu_si512(line + j,
                        _mm512_or_si512(round16(r0 + j), _mm512_slli_epi32(round16(r1 + j), 16)));
#else
  for (int64_t j = 0; j < kBlockN; ++j)
    line[j] = uint32_t{as_bf16(r0[j])} | uint32_t{as_bf16(r1[j])} << 16;
#endif
}

// (GCC 12 reports the intrinsics' "undefined" starting vectors here as -Wuninitialized, the
// false alarm cpu_avx512.h describes.)
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
// 16 columns of a block from a transposed B: 32 values of each of 16 rows of b (row stride ldb,
// from `col`), transposed into words 0-15 of the block's 16 lines at `out` (line stride 64).
template <typename T>
void pack_column_group(const T* col, int64_t ldb, uint32_t* out) {
#ifdef BRISK_PACK_AVX512
  __m512i r[16];
  for (int i = 0; i < 16; ++i) r[i] = round32_pairs(col + i * ldb);
  transpose16(r);
  for (int k1 = 0; k1 < 16; ++k1) _mm512_storeu_si512(out + k1 * kBlockN, r[k1]);
#else
  for (int i = 0; i < 16; ++i)
    for (int k1 = 0; k1 < kBlockK / 2; ++k1)
      out[k1 * kBlockN + i] = uint32_t{as_bf16(col[i * ldb + 2 * k1])} |
                              uint32_t{as_bf16(col[i * ldb + 2 * k1 + 1])} << 16;
#endif
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

// A block at B's edge, zeros past it.
template <typename T>
void pack_edge_block(const T* b, int64_t ldb, bool trans, int64_t k, int64_t n, int64_t k0,
                     int64_t n0, uint16_t* out) {
  for (int64_t kk = 0; kk < kBlockK; ++kk)
    for (int64_t j = 0; j < kBlockN; ++j) {
      const int64_t row = k0 + kk, col = n0 + j;
      out[kk / 2 * (2 * kBlockN) + j * 2 + kk % 2] =
          row < k && col < n ? as_bf16(trans ? b[col * ldb + row] : b[row * ldb + col]) : 0;
    }
}

// The whole blocks in an order that reads b's rows from start to end, a few at a time: reading
// each block's 32 or 64 rows of b at once left the memory idle between the short reads (the
// packer ran 10-35% slower, bench_packing).
template <typename T>
void pack_ba16a64b2a(bool trans_b, int64_t k, int64_t n, const T* b, int64_t ldb, uint16_t* dst) {
  const int64_t kb_count = (k + kBlockK - 1) / kBlockK, nb_count = (n + kBlockN - 1) / kBlockN;
  auto block_at = [&](int64_t kb, int64_t nb) {
    return dst + (nb * kb_count + kb) * kBlockElements;
  };
  auto line_at = [&](int64_t kb, int64_t nb, int64_t k1) {
    return reinterpret_cast<uint32_t*>(block_at(kb, nb)) + k1 * kBlockN;
  };
  if (!trans_b) {
    // A strip of 32 of B's rows at a time: a pair of rows across all its whole blocks.
#pragma omp parallel for schedule(static)
    for (int64_t kb = 0; kb < kb_count; ++kb) {
      const int64_t k0 = kb * kBlockK, whole_n = k0 + kBlockK <= k ? n / kBlockN : 0;
      for (int64_t k1 = 0; whole_n > 0 && k1 < kBlockK / 2; ++k1) {
        const T* r0 = b + (k0 + 2 * k1) * ldb;
        for (int64_t nb = 0; nb < whole_n; ++nb)
          pack_row_pair(r0 + nb * kBlockN, r0 + ldb + nb * kBlockN, line_at(kb, nb, k1));
      }
      for (int64_t nb = whole_n; nb < nb_count; ++nb)
        pack_edge_block(b, ldb, false, k, n, k0, nb * kBlockN, block_at(kb, nb));
    }
    return;
  }
  // Transposed, B's columns are b's rows: 16 of them across all their whole blocks per task (four
  // tasks to a column of blocks, so that few columns still share out evenly).
  constexpr int64_t kGroups = kBlockN / 16;
#pragma omp parallel for schedule(static)
  for (int64_t task = 0; task < nb_count * kGroups; ++task) {
    const int64_t nb = task / kGroups, g = task % kGroups * 16;
    const int64_t n0 = nb * kBlockN, whole_k = n0 + kBlockN <= n ? k / kBlockK : 0;
    for (int64_t kb = 0; kb < whole_k; ++kb)
      pack_column_group(b + (n0 + g) * ldb + kb * kBlockK, ldb, line_at(kb, nb, 0) + g);
    for (int64_t kb = whole_k; g == 0 && kb < kb_count; ++kb)  // the column's edge blocks
      pack_edge_block(b, ldb, true, k, n, kb * kBlockK, n0, block_at(kb, nb));
  }
}
}  // namespace

void bf16_operand(const void* src, DType src_type, int64_t rows, int64_t cols, int64_t ld,
                  const Tensor& dst) {
  BRISK_CHECK(dst.dtype() == DType::bf16 || dst.dtype() == DType::f32,
              "internal error: a bf16 operand written as ", dtype_name(dst.dtype()));
  BRISK_CHECK(src_type == DType::f32 || (src_type == DType::bf16 && dst.dtype() == DType::f32),
              "internal error: a ", dtype_name(src_type), " operand packed as ",
              dtype_name(dst.dtype()));
  BRISK_CHECK(dst.numel() >= rows * ld, "bf16 operand buffer of ", dst.numel(),
              " elements is too small for a ", rows, " x ", ld, " operand");
  if (src_type == DType::bf16) {
    const uint16_t* in = static_cast<const uint16_t*>(src);
    float* out = dst.f32();
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) bf16_widen_row(in + r * ld, out + r * ld, cols);
    return;
  }
  const float* in = static_cast<const float*>(src);
  if (dst.dtype() == DType::bf16) {
    uint16_t* out = dst.as<uint16_t>();
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) bf16_round_row(in + r * ld, out + r * ld, cols);
  } else {
    float* out = dst.f32();
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c)
        out[r * ld + c] = bf16_to_float(float_to_bf16(in[r * ld + c]));
  }
}

void pack_bf16_ba16a64b2a(bool trans_b, int64_t k, int64_t n, const void* b, DType b_type,
                          int64_t ldb, uint16_t* dst) {
  BRISK_CHECK(b_type == DType::f32 || b_type == DType::bf16, "internal error: a ",
              dtype_name(b_type), " operand packed as bf16");
  if (b_type == DType::f32)
    pack_ba16a64b2a(trans_b, k, n, static_cast<const float*>(b), ldb, dst);
  else
    pack_ba16a64b2a(trans_b, k, n, static_cast<const uint16_t*>(b), ldb, dst);
}

#ifdef BRISK_HAVE_DNNL
namespace {
using Key =
    std::tuple<bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, bool, bool, bool>;
}  // namespace

// A primitive with its memory objects and argument map, made once per shape so that a call
// only swaps data pointers.
struct Prepared {
  dnnl::matmul matmul;
  dnnl::memory a, b, c, bias;  // bias: empty unless the product adds one
  std::unordered_map<int, dnnl::memory> args;
  std::string kernel;  // oneDNN's name of the kernel it chose
};

dnnl::memory::data_type dnnl_type(DType dtype) {
  BRISK_CHECK(dtype == DType::f32 || dtype == DType::bf16, "oneDNN products in ", dtype_name(dtype),
              " are not supported");
  return dtype == DType::bf16 ? dnnl::memory::data_type::bf16 : dnnl::memory::data_type::f32;
}

// A product that reads B in its kernel's blocked layout, and the reorder that rounds a float32
// B into that layout.
struct PreparedBlocked {
  Prepared product;
  dnnl::reorder round;
  dnnl::memory from, to;  // the reorder's float32 source and blocked destination
  std::unordered_map<int, dnnl::memory> round_args;
  DnnlMatmul::BlockedB blocked;
};

struct DnnlMatmul::Impl {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  std::map<Key, Prepared> cache;
  std::map<Key, PreparedBlocked> blocked;   // keyed with ldb 0: B's own stride is the layout's
  std::vector<dnnl::memory::desc> layouts;  // BlockedB::layout indexes it
  PreparedBlocked& prepared_blocked(DType dtype, const Product& p);
  Prepared& prepared(DType dtype, const Product& p);  // run()'s, made on a shape's first call
};

DnnlMatmul::DnnlMatmul(DType dtype) : dtype_(dtype), impl_(std::make_unique<Impl>()) {
  BRISK_CHECK(available(dtype), "this CPU has no oneDNN ", dtype_name(dtype), " matrix products");
}
DnnlMatmul::~DnnlMatmul() = default;

namespace {
bool probe(DType dtype) {
  try {
    using dt = dnnl::memory::data_type;
    dnnl::engine eng(dnnl::engine::kind::cpu, 0);
    dnnl::memory::desc a({16, 16}, dnnl_type(dtype), dnnl::memory::format_tag::ab);
    dnnl::memory::desc c({16, 16}, dt::f32, dnnl::memory::format_tag::ab);
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, a, c), eng);
    return true;
  } catch (const dnnl::error&) {
    return false;
  }
}
}  // namespace

// Probed once per type: the CPU does not change while the process runs.
bool DnnlMatmul::available(DType dtype) {
  static const bool f32 = probe(DType::f32), bf16 = probe(DType::bf16);
  return dtype == DType::f32 ? f32 : dtype == DType::bf16 ? bf16 : false;
}

bool DnnlMatmul::has_amx() {
  return dnnl::get_effective_cpu_isa() == dnnl::cpu_isa::avx512_core_amx;
}

namespace {
using dims = dnnl::memory::dims;

dnnl::memory::desc operand_a(const DnnlMatmul::Product& p, dnnl::memory::data_type type) {
  return {{p.m, p.k}, type, p.trans_a ? dims{1, p.lda} : dims{p.lda, 1}};
}

dnnl::memory::desc operand_b(const DnnlMatmul::Product& p, dnnl::memory::data_type type) {
  return {{p.k, p.n}, type, p.trans_b ? dims{1, p.ldb} : dims{p.ldb, 1}};
}

// oneDNN 2.6 picks its brgemm kernel for every float32 product on AVX-512 CPUs, but for a B read
// as it lies (not transposed) larger than a few MiB its gemm kernel is faster: on Zen 5, the input
// gradients' 1024 x 3072 x 768 at 508-517 GFLOP/s against brgemm's 406-433, the LM head's
// 256 x 50257 x 768 at 492 against 360, the weight gradient 768 x 1024 x 3072 (A transposed) at
// 467-511 against 425-470; equal below 4 MiB, slower for a transposed B (`bench_matmul
// --f32-kernels`, docs/benchmarks-history.md's tenth increment). A fixed rule, not a timing: the
// same kernel, and bits, on every run.
bool prefers_gemm_kernel(const DnnlMatmul::Product& p, dnnl::memory::data_type type) {
  constexpr int64_t kLargeB = int64_t{4} << 20;
  return type == dnnl::memory::data_type::f32 && !p.trans_b &&
         p.k * p.n * static_cast<int64_t>(sizeof(float)) > kLargeB;
}

// The primitive for p with B described by `bd` (a layout, or format_tag::any for the kernel's).
Prepared prepare(const dnnl::engine& engine, const DnnlMatmul::Product& p,
                 dnnl::memory::data_type type, const dnnl::memory::desc& bd) {
  const dnnl::memory::desc ad = operand_a(p, type);
  BRISK_CHECK(!p.c_bf16 || (type == dnnl::memory::data_type::bf16 && !p.accumulate),
              "internal error: a bf16 result outside a written bf16 product");
  const dnnl::memory::desc cd(
      {p.m, p.n}, p.c_bf16 ? dnnl::memory::data_type::bf16 : dnnl::memory::data_type::f32,
      dims{p.ldc, 1});
  dnnl::primitive_attr attr;
  if (p.accumulate) {
    dnnl::post_ops ops;
    ops.append_sum(1.0f);
    attr.set_post_ops(ops);
  }
  const dnnl::memory::desc biasd({1, p.n}, dnnl::memory::data_type::f32, dims{p.n, 1});
  const dnnl::matmul::desc desc =
      p.bias ? dnnl::matmul::desc(ad, bd, biasd, cd) : dnnl::matmul::desc(ad, bd, cd);
  dnnl::matmul::primitive_desc pd(desc, attr, engine);
  if (prefers_gemm_kernel(p, type)) {
    while (std::strcmp(pd.impl_info_str(), "gemm:jit") != 0)
      if (!pd.next_impl()) {  // not offered: oneDNN's first choice
        pd = dnnl::matmul::primitive_desc(desc, attr, engine);
        break;
      }
  }
  Prepared prepared{dnnl::matmul(pd),
                    dnnl::memory(ad, engine, nullptr),
                    dnnl::memory(pd.weights_desc(), engine, nullptr),
                    dnnl::memory(cd, engine, nullptr),
                    p.bias ? dnnl::memory(biasd, engine, nullptr) : dnnl::memory(),
                    {},
                    pd.impl_info_str()};
  prepared.args = {
      {DNNL_ARG_SRC, prepared.a}, {DNNL_ARG_WEIGHTS, prepared.b}, {DNNL_ARG_DST, prepared.c}};
  if (p.bias) prepared.args.emplace(DNNL_ARG_BIAS, prepared.bias);
  return prepared;
}

Key key_of(const DnnlMatmul::Product& p) {
  return {p.trans_a, p.trans_b, p.m, p.n, p.k, p.lda, p.ldb, p.ldc, p.accumulate, p.bias, p.c_bf16};
}

// Runs a prepared product on these operands and waits for it.
void execute(Prepared& p, dnnl::stream& stream, const void* a, const void* b, void* c,
             const float* bias) {
  BRISK_CHECK((bias != nullptr) == static_cast<bool>(p.bias),
              "internal error: a product's bias given against its plan");
  p.a.set_data_handle(const_cast<void*>(a));
  p.b.set_data_handle(const_cast<void*>(b));
  p.c.set_data_handle(c);
  if (bias) p.bias.set_data_handle(const_cast<float*>(bias));
  g_calls.fetch_add(1, std::memory_order_relaxed);
  p.matmul.execute(stream, p.args);
  stream.wait();
}
}  // namespace

void DnnlMatmul::run(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const void* a,
                     int64_t lda, const void* b, int64_t ldb, bool accumulate, void* c, int64_t ldc,
                     const float* bias, DType c_type) {
  const Product product{
      trans_a, trans_b, m, n, k, lda, ldb, ldc, accumulate, bias != nullptr, c_type == DType::bf16};
  execute(impl_->prepared(dtype_, product), impl_->stream, a, b, c, bias);
}

Prepared& DnnlMatmul::Impl::prepared(DType dtype, const Product& p) {
  const Key key = key_of(p);
  auto it = cache.find(key);
  if (it == cache.end()) {  // descriptors only for a new shape: they cost a call's time
    const dnnl::memory::data_type type = dnnl_type(dtype);
    it = cache.emplace(key, prepare(engine, p, type, operand_b(p, type))).first;
  }
  return it->second;
}

std::string DnnlMatmul::kernel(const Product& p) {
  return impl_->prepared(dtype_, p).kernel;
}

PreparedBlocked& DnnlMatmul::Impl::prepared_blocked(DType dtype, const Product& p) {
  BRISK_CHECK(dtype == DType::bf16, "internal error: a blocked B outside bf16 products");
  Product shape = p;
  shape.ldb = 0;  // the blocked B's layout does not depend on the float32 B's stride
  const Key key = key_of(shape);
  auto it = blocked.find(key);
  if (it != blocked.end()) return it->second;
  using dt = dnnl::memory::data_type;
  Prepared product =
      prepare(engine, p, dt::bf16, {{p.k, p.n}, dt::bf16, dnnl::memory::format_tag::any});
  const dnnl::memory::desc kernel_b = product.b.get_desc();
  const dnnl::memory from(operand_b(p, dt::f32), engine, nullptr);
  const dnnl::memory to(kernel_b, engine, nullptr);
  int layout = 0;
  while (layout < static_cast<int>(layouts.size()) && layouts[layout] != kernel_b) ++layout;
  if (layout == static_cast<int>(layouts.size())) layouts.push_back(kernel_b);
  const bool own =
      kernel_b == dnnl::memory::desc({p.k, p.n}, dt::bf16, dnnl::memory::format_tag::BA16a64b2a);
  PreparedBlocked prepared{std::move(product),
                           dnnl::reorder(from, to),
                           from,
                           to,
                           {},
                           {layout, kernel_b.get_size(), own}};
  prepared.round_args = {{DNNL_ARG_FROM, prepared.from}, {DNNL_ARG_TO, prepared.to}};
  return blocked.emplace(key, std::move(prepared)).first->second;
}

DnnlMatmul::BlockedB DnnlMatmul::blocked_b(const Product& p) {
  if (dtype_ != DType::bf16) return {};
  return impl_->prepared_blocked(dtype_, p).blocked;
}

void DnnlMatmul::round_blocked_b(const Product& p, const void* b, DType b_type, void* dst,
                                 bool by_onednn) {
  PreparedBlocked& prepared = impl_->prepared_blocked(dtype_, p);
  if (prepared.blocked.own_packer && !by_onednn) {
    pack_bf16_ba16a64b2a(p.trans_b, p.k, p.n, b, b_type, p.ldb, static_cast<uint16_t*>(dst));
    return;
  }
  BRISK_CHECK(b_type == DType::f32, "internal error: oneDNN's reorder given a ", dtype_name(b_type),
              " B");
  // The float32 B's stride may differ from the one the reorder was made for: its descriptor is
  // remade then (a held weight is rounded once per pass over it).
  if (prepared.from.get_desc() != operand_b(p, dnnl::memory::data_type::f32)) {
    prepared.from =
        dnnl::memory(operand_b(p, dnnl::memory::data_type::f32), impl_->engine, nullptr);
    prepared.round = dnnl::reorder(prepared.from, prepared.to);
    prepared.round_args[DNNL_ARG_FROM] = prepared.from;
  }
  prepared.from.set_data_handle(const_cast<void*>(b));
  prepared.to.set_data_handle(dst);
  prepared.round.execute(impl_->stream, prepared.round_args);
  impl_->stream.wait();
}

void DnnlMatmul::run_blocked_b(const Product& p, const void* a, const void* b_blocked, void* c,
                               const float* bias) {
  execute(impl_->prepared_blocked(dtype_, p).product, impl_->stream, a, b_blocked, c, bias);
}

#else
struct DnnlMatmul::Impl {};
DnnlMatmul::DnnlMatmul(DType dtype) : dtype_(dtype) {
  BRISK_FAIL("this build has no oneDNN: its matrix products are unavailable");
}
DnnlMatmul::~DnnlMatmul() = default;
bool DnnlMatmul::available(DType) {
  return false;
}
bool DnnlMatmul::has_amx() {
  return false;
}
void DnnlMatmul::run(bool, bool, int64_t, int64_t, int64_t, const void*, int64_t, const void*,
                     int64_t, bool, void*, int64_t, const float*, DType) {
  BRISK_FAIL("this build has no oneDNN: its matrix products are unavailable");
}
DnnlMatmul::BlockedB DnnlMatmul::blocked_b(const Product&) {
  return {};
}
std::string DnnlMatmul::kernel(const Product&) {
  BRISK_FAIL("this build has no oneDNN: its matrix products are unavailable");
}
void DnnlMatmul::round_blocked_b(const Product&, const void*, DType, void*, bool) {
  BRISK_FAIL("this build has no oneDNN: its matrix products are unavailable");
}
void DnnlMatmul::run_blocked_b(const Product&, const void*, const void*, void*, const float*) {
  BRISK_FAIL("this build has no oneDNN: its matrix products are unavailable");
}
#endif

}  // namespace brisk
