// LoRA's low-rank products on the CPU: float32 products through OpenBLAS, whose leading
// dimensions address the adapted columns of a wider output and whose alpha carries the scale.
#include <cblas.h>

#include "backend/cpu/cpu_backend.h"

namespace brisk {

namespace {
// Row-major C[m, n] = alpha op(A) op(B) + beta C.
void sgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
           int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              static_cast<blasint>(m), static_cast<blasint>(n), static_cast<blasint>(k), alpha, a,
              static_cast<blasint>(lda), b, static_cast<blasint>(ldb), beta, c,
              static_cast<blasint>(ldc));
}
}  // namespace

void CpuBackend::lora_forward(const Tensor& x, const Tensor& a, const Tensor& b, float scale,
                              const Tensor& u, const Tensor& y, int64_t at) {
  const LoraDims d = check_lora_forward(x, a, b, u, y, at);
  sgemm(false, true, d.N, d.r, d.in, scale, x.f32(), d.in, a.f32(), d.in, 0.0f, u.f32(), d.r);
  sgemm(false, true, d.N, d.out, d.r, 1.0f, u.f32(), d.r, b.f32(), d.r, 1.0f, y.f32() + at,
        d.width);
}

void CpuBackend::lora_backward(const Tensor& x, const Tensor& a, const Tensor& b, float scale,
                               const Tensor& u, const Tensor& dy, int64_t at, const Tensor& v,
                               const Tensor& da, const Tensor& db, const Tensor& dx,
                               bool accumulate) {
  const LoraDims d = check_lora_backward(x, a, b, u, dy, at, v, da, db, dx);
  const float keep = accumulate ? 1.0f : 0.0f;
  const float* g = dy.f32() + at;
  sgemm(true, false, d.out, d.r, d.N, 1.0f, g, d.width, u.f32(), d.r, keep, db.f32(), d.r);
  sgemm(false, false, d.N, d.r, d.out, scale, g, d.width, b.f32(), d.r, 0.0f, v.f32(), d.r);
  sgemm(true, false, d.r, d.in, d.N, 1.0f, v.f32(), d.r, x.f32(), d.in, keep, da.f32(), d.in);
  if (!dx.empty())
    sgemm(false, false, d.N, d.in, d.r, 1.0f, v.f32(), d.r, a.f32(), d.in, 1.0f, dx.f32(), d.in);
}

}  // namespace brisk
