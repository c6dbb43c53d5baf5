// LoRA's low-rank products on the GPU: float32 cuBLASLt products whose leading dimensions
// address the adapted columns of a wider output; the scale applied to the rank-r intermediate.
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_kernels.h"

namespace brisk {

namespace {
float* on_device(const Tensor& t, const char* what) {
  BRISK_CHECK(t.device() == Device::cuda, "lora: ", what, " must be in GPU memory");
  return t.f32();
}
}  // namespace

void CudaBackend::lora_forward(const Tensor& x, const Tensor& a, const Tensor& b, float scale,
                               const Tensor& u, const Tensor& y, int64_t at) {
  const LoraDims d = check_lora_forward(x, a, b, u, y, at);
  BRISK_CHECK(!ws_.matmul_workspace.empty(), "lora_forward: plan_workspace was not called");
  float* pu = on_device(u, "u");
  matmul(false, true, d.N, d.r, d.in, on_device(x, "x"), d.in, on_device(a, "a"), d.in, false,
         cuda::f32_out(pu), d.r, nullptr, DType::f32);
  cuda::scale(stream_, pu, scale, d.N * d.r);
  matmul(false, true, d.N, d.out, d.r, pu, d.r, on_device(b, "b"), d.r, true,
         cuda::f32_out(on_device(y, "y") + at), d.width, nullptr, DType::f32);
}

void CudaBackend::lora_backward(const Tensor& x, const Tensor& a, const Tensor& b, float scale,
                                const Tensor& u, const Tensor& dy, int64_t at, const Tensor& v,
                                const Tensor& da, const Tensor& db, const Tensor& dx,
                                bool accumulate) {
  const LoraDims d = check_lora_backward(x, a, b, u, dy, at, v, da, db, dx);
  BRISK_CHECK(!ws_.matmul_workspace.empty(), "lora_backward: plan_workspace was not called");
  const float* g = on_device(dy, "dy") + at;
  float* pv = on_device(v, "v");
  matmul(true, false, d.out, d.r, d.N, g, d.width, on_device(u, "u"), d.r, accumulate,
         cuda::f32_out(on_device(db, "db")), d.r, nullptr, DType::f32);
  matmul(false, false, d.N, d.r, d.out, g, d.width, on_device(b, "b"), d.r, false,
         cuda::f32_out(pv), d.r, nullptr, DType::f32);
  cuda::scale(stream_, pv, scale, d.N * d.r);
  matmul(true, false, d.r, d.in, d.N, pv, d.r, on_device(x, "x"), d.in, accumulate,
         cuda::f32_out(on_device(da, "da")), d.in, nullptr, DType::f32);
  if (!dx.empty())
    matmul(false, false, d.N, d.in, d.r, pv, d.r, on_device(a, "a"), d.in, true,
           cuda::f32_out(on_device(dx, "dx")), d.in, nullptr, DType::f32);
}

}  // namespace brisk
