// bf16 matrix products on the CPU through oneDNN (AMX / AVX512-BF16 where the CPU has them):
// float32 operands holding bf16 values are packed to bf16, multiplied with float32 accumulation,
// and written as float32. Used by the CPU backend when mixed precision is bf16.
#pragma once

#include <cstdint>
#include <memory>

#include "core/tensor.h"

namespace brisk {

class Bf16Matmul {
 public:
  Bf16Matmul();
  ~Bf16Matmul();
  // Whether this build and CPU can run it.
  static bool available();
  // Row-major C[M,N] = op(A) op(B) (+ C when accumulate), as cblas_sgemm with alpha 1 and beta
  // 0 or 1. A is M x K (or K x M when trans_a), B is K x N (or N x K when trans_b).
  // a16 and b16 are the planned bf16 packing buffers, each large enough for its operand.
  void run(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
           const float* b, int64_t ldb, bool accumulate, float* c, int64_t ldc, const Tensor& a16,
           const Tensor& b16);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace brisk
