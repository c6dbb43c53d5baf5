// oneDNN matmul primitives, cached per shape (made on the first step, reused after); operands are
// packed to bf16 into buffers from the memory plan.
#include "backend/cpu/cpu_matmul_bf16.h"

#include "core/error.h"

#ifdef BRISK_HAVE_DNNL
#include <map>
#include <oneapi/dnnl/dnnl.hpp>
#include <tuple>
#include <unordered_map>

#include "core/dtype.h"
#endif

namespace brisk {

#ifdef BRISK_HAVE_DNNL
namespace {
using Key = std::tuple<bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, bool>;

void pack(const float* src, int64_t rows, int64_t cols, int64_t ld, const Tensor& dst) {
  BRISK_CHECK(dst.numel() >= rows * ld, "bf16 packing buffer of ", dst.numel(),
              " elements is too small for a ", rows, " x ", ld, " operand");
  uint16_t* out = dst.as<uint16_t>();
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) out[r * ld + c] = float_to_bf16(src[r * ld + c]);
}
}  // namespace

// A primitive with its memory objects and argument map, made once per shape so that a call
// only swaps data pointers.
struct Prepared {
  dnnl::matmul matmul;
  dnnl::memory a, b, c;
  std::unordered_map<int, dnnl::memory> args;
};

struct Bf16Matmul::Impl {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  std::map<Key, Prepared> cache;
};

Bf16Matmul::Bf16Matmul() : impl_(std::make_unique<Impl>()) {}
Bf16Matmul::~Bf16Matmul() = default;

bool Bf16Matmul::available() {
  try {
    using dt = dnnl::memory::data_type;
    dnnl::engine eng(dnnl::engine::kind::cpu, 0);
    dnnl::memory::desc a({16, 16}, dt::bf16, dnnl::memory::format_tag::ab);
    dnnl::memory::desc c({16, 16}, dt::f32, dnnl::memory::format_tag::ab);
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, a, c), eng);
    return true;
  } catch (const dnnl::error&) {
    return false;
  }
}

void Bf16Matmul::run(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float* a,
                     int64_t lda, const float* b, int64_t ldb, bool accumulate, float* c,
                     int64_t ldc, const Tensor& a16, const Tensor& b16) {
  using dt = dnnl::memory::data_type;
  using dims = dnnl::memory::dims;
  // Operands keep their layout; only the element type changes.
  pack(a, trans_a ? k : m, trans_a ? m : k, lda, a16);
  pack(b, trans_b ? n : k, trans_b ? k : n, ldb, b16);
  const dnnl::memory::desc ad({m, k}, dt::bf16, trans_a ? dims{1, lda} : dims{lda, 1});
  const dnnl::memory::desc bd({k, n}, dt::bf16, trans_b ? dims{1, ldb} : dims{ldb, 1});
  const dnnl::memory::desc cd({m, n}, dt::f32, dims{ldc, 1});
  const Key key{trans_a, trans_b, m, n, k, lda, ldb, ldc, accumulate};
  auto it = impl_->cache.find(key);
  if (it == impl_->cache.end()) {
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
  p.a.set_data_handle(a16.data());
  p.b.set_data_handle(b16.data());
  p.c.set_data_handle(c);
  p.matmul.execute(impl_->stream, p.args);
  impl_->stream.wait();
}

#else
struct Bf16Matmul::Impl {};
Bf16Matmul::Bf16Matmul() = default;
Bf16Matmul::~Bf16Matmul() = default;
bool Bf16Matmul::available() {
  return false;
}
void Bf16Matmul::run(bool, bool, int64_t, int64_t, int64_t, const float*, int64_t, const float*,
                     int64_t, bool, float*, int64_t, const Tensor&, const Tensor&) {
  BRISK_FAIL("this build has no oneDNN: bf16 matrix products are unavailable");
}
#endif

}  // namespace brisk
