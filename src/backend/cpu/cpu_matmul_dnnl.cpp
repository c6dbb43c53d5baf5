// oneDNN matmul primitives, cached per shape (made on the first step, reused after), and the
// packing of bf16 operands.
#include "backend/cpu/cpu_matmul_dnnl.h"

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "core/error.h"

#ifdef BRISK_HAVE_DNNL
#include <map>
#include <oneapi/dnnl/dnnl.hpp>
#include <tuple>
#include <unordered_map>

#endif

namespace brisk {

namespace {
std::atomic<uint64_t> g_calls{0};

bool products_env_is(const char* library) {
  const char* v = std::getenv("BRISK_CPU_PRODUCTS");
  return v != nullptr && std::strcmp(v, library) == 0;
}
}  // namespace

bool cpu_products_by_openblas() {
  return products_env_is("openblas");
}

bool cpu_products_by_onednn() {
  return products_env_is("onednn");
}

uint64_t DnnlMatmul::calls() {
  return g_calls.load(std::memory_order_relaxed);
}

bool cpu_has_bf16_products() {
  return !cpu_products_by_openblas() && DnnlMatmul::available(DType::bf16);
}

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
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) out[r * ld + c] = bf16_to_float(in[r * ld + c]);
    return;
  }
  const float* in = static_cast<const float*>(src);
  if (dst.dtype() == DType::bf16) {
    uint16_t* out = dst.as<uint16_t>();
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) out[r * ld + c] = float_to_bf16(in[r * ld + c]);
  } else {
    float* out = dst.f32();
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c)
        out[r * ld + c] = bf16_to_float(float_to_bf16(in[r * ld + c]));
  }
}

#ifdef BRISK_HAVE_DNNL
namespace {
using Key = std::tuple<bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, bool>;
}  // namespace

// A primitive with its memory objects and argument map, made once per shape so that a call
// only swaps data pointers.
struct Prepared {
  dnnl::matmul matmul;
  dnnl::memory a, b, c;
  std::unordered_map<int, dnnl::memory> args;
};

dnnl::memory::data_type dnnl_type(DType dtype) {
  BRISK_CHECK(dtype == DType::f32 || dtype == DType::bf16, "oneDNN products in ", dtype_name(dtype),
              " are not supported");
  return dtype == DType::bf16 ? dnnl::memory::data_type::bf16 : dnnl::memory::data_type::f32;
}

struct DnnlMatmul::Impl {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  std::map<Key, Prepared> cache;
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

void DnnlMatmul::run(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const void* a,
                     int64_t lda, const void* b, int64_t ldb, bool accumulate, float* c,
                     int64_t ldc) {
  using dt = dnnl::memory::data_type;
  using dims = dnnl::memory::dims;
  const dt type = dnnl_type(dtype_);
  const Key key{trans_a, trans_b, m, n, k, lda, ldb, ldc, accumulate};
  auto it = impl_->cache.find(key);
  if (it == impl_->cache.end()) {  // descriptors only for a new shape: they cost a call's time
    const dnnl::memory::desc ad({m, k}, type, trans_a ? dims{1, lda} : dims{lda, 1});
    const dnnl::memory::desc bd({k, n}, type, trans_b ? dims{1, ldb} : dims{ldb, 1});
    const dnnl::memory::desc cd({m, n}, dt::f32, dims{ldc, 1});
    dnnl::primitive_attr attr;
    if (accumulate) {
      dnnl::post_ops ops;
      ops.append_sum(1.0f);
      attr.set_post_ops(ops);
    }
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(ad, bd, cd), attr, impl_->engine);
    Prepared p{dnnl::matmul(pd),
               dnnl::memory(ad, impl_->engine, nullptr),
               dnnl::memory(bd, impl_->engine, nullptr),
               dnnl::memory(cd, impl_->engine, nullptr),
               {}};
    p.args = {{DNNL_ARG_SRC, p.a}, {DNNL_ARG_WEIGHTS, p.b}, {DNNL_ARG_DST, p.c}};
    it = impl_->cache.emplace(key, std::move(p)).first;
  }
  Prepared& p = it->second;
  p.a.set_data_handle(const_cast<void*>(a));
  p.b.set_data_handle(const_cast<void*>(b));
  p.c.set_data_handle(c);
  g_calls.fetch_add(1, std::memory_order_relaxed);
  p.matmul.execute(impl_->stream, p.args);
  impl_->stream.wait();
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
void DnnlMatmul::run(bool, bool, int64_t, int64_t, int64_t, const void*, int64_t, const void*,
                     int64_t, bool, float*, int64_t) {
  BRISK_FAIL("this build has no oneDNN: its matrix products are unavailable");
}
#endif

}  // namespace brisk
