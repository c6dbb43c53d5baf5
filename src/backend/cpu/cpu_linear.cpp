// Linear layers on the CPU: OpenBLAS sgemm for the products, a blocked loop for bias gradients.
#include <cblas.h>

#include <algorithm>

#include "backend/cpu/cpu_backend.h"

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
}  // namespace

void CpuBackend::linear_forward(const Tensor& x, const Tensor& w, const Tensor& b,
                                WeightLayout layout, const Tensor& y) {
  const auto [m, k, n] = linear_dims(x, w, layout, "linear_forward");
  BRISK_CHECK(rows_of(y) == m && cols_of(y) == n, "linear_forward: output ", y.shape().str(),
              " does not hold ", m, " x ", n);
  float* out = y.f32();
  float beta = 0.0f;
  if (!b.empty()) {
    BRISK_CHECK(b.numel() == n, "linear_forward: bias has ", b.numel(), " values, expected ", n);
    const float* bias = b.f32();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < m; ++i) std::copy(bias, bias + n, out + i * n);
    beta = 1.0f;
  }
  if (m == 0) return;
  if (layout == WeightLayout::out_in)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, x.f32(), k, w.f32(), k,
                beta, out, n);
  else
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0f, x.f32(), k, w.f32(), n,
                beta, out, n);
}

void CpuBackend::linear_backward(const Tensor& x, const Tensor& w, const Tensor& dy,
                                 WeightLayout layout, const Tensor& dx, bool accumulate_dx,
                                 const Tensor& dw, const Tensor& db) {
  const auto [m, k, n] = linear_dims(x, w, layout, "linear_backward");
  BRISK_CHECK(rows_of(dy) == m && cols_of(dy) == n, "linear_backward: gradient ", dy.shape().str(),
              " does not hold ", m, " x ", n);
  if (m == 0) return;
  const float* g = dy.f32();
  if (!dx.empty()) {
    check_same_numel(dx, x, "linear_backward dx");
    const float beta = accumulate_dx ? 1.0f : 0.0f;
    if (layout == WeightLayout::out_in)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, k, n, 1.0f, g, n, w.f32(), k, beta,
                  dx.f32(), k);
    else
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, k, n, 1.0f, g, n, w.f32(), n, beta,
                  dx.f32(), k);
  }
  if (!dw.empty()) {
    BRISK_CHECK(dw.shape() == w.shape(), "linear_backward: weight gradient shape ",
                dw.shape().str(), " differs from the weight's ", w.shape().str());
    if (layout == WeightLayout::out_in)
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, k, m, 1.0f, g, n, x.f32(), k, 1.0f,
                  dw.f32(), k);
    else
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, k, n, m, 1.0f, x.f32(), k, g, n, 1.0f,
                  dw.f32(), n);
  }
  if (!db.empty()) {
    BRISK_CHECK(db.numel() == n, "linear_backward: bias gradient has ", db.numel(),
                " values, expected ", n);
    float* out = db.f32();
    constexpr int64_t kBlock = 64;
#pragma omp parallel for schedule(static)
    for (int64_t j0 = 0; j0 < n; j0 += kBlock) {
      const int64_t j1 = std::min(n, j0 + kBlock);
      float acc[kBlock] = {};
      for (int64_t i = 0; i < m; ++i) {
        const float* row = g + i * n;
        for (int64_t j = j0; j < j1; ++j) acc[j - j0] += row[j];
      }
      for (int64_t j = j0; j < j1; ++j) out[j] += acc[j - j0];
    }
  }
}

}  // namespace brisk
