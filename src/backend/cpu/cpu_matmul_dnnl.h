// Matrix products on the CPU through oneDNN, in float32 or in bf16 (AMX / AVX512-BF16 where the
// CPU has them), multiplied where they lie with float32 accumulation and written as float32; the
// caller packs float32 operands holding bf16 values to bf16 (bf16_operand) into planned buffers.
// A bf16 product may also store its result rounded to bf16.
// The CPU backend uses it for bf16 where the CPU has bf16 units, and for float32 on AVX-512 CPUs
// but Intel ones without AMX that OpenBLAS has AVX-512 kernels for (float32_rule_prefers_onednn).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/dtype.h"
#include "core/tensor.h"

namespace brisk {

// The float32 library rule (cpu_linear.cpp): whether float32 products go to oneDNN rather than
// OpenBLAS on a CPU with or without AVX-512 (`avx512f`), made by AMD or not, with or without AMX
// (`amx`), whose OpenBLAS runs the kernels named `core` (openblas_get_corename(), any case).
// Without an override (Switches::cpu_products) and where oneDNN has float32 kernels.
bool float32_rule_prefers_onednn(std::string core, bool avx512f, bool amd, bool amx);
// Whether bf16 products run on oneDNN's bf16 kernels (else their operands are rounded to bf16
// values and multiplied in float32): where oneDNN has them, unless `forced` is "openblas"
// (Switches::cpu_products).
bool cpu_has_bf16_products(const std::string& forced = "");

// The rows x cols operand at `src` (float32 or bf16, row stride ld) rounded to bf16 into `dst`
// at the same places: packed bf16 when dst is bf16 (oneDNN's bf16 products), float32 holding
// bf16 values when it is float32 (bf16 products without bf16 units). A bf16 source is already
// rounded: it is only widened (into float32; not copied into bf16).
void bf16_operand(const void* src, DType src_type, int64_t rows, int64_t cols, int64_t ld,
                  const Tensor& dst);
inline void bf16_operand(const float* src, int64_t rows, int64_t cols, int64_t ld,
                         const Tensor& dst) {
  bf16_operand(src, DType::f32, rows, cols, ld, dst);
}

// The K x N matrix B (b[k * ldb + n], or b[n * ldb + k] when trans_b; float32, rounded to bf16 as
// bf16_operand rounds, or bf16) into oneDNN's BA16a64b2a layout at `dst`: blocks of 32 rows by 64
// columns, column blocks outermost, each block 16 pairs of rows with a pair's two values side by
// side, column after column; rows and columns padded with zeros to whole blocks
// (ceil(K / 32) * ceil(N / 64) * 2048 values).
void pack_bf16_ba16a64b2a(bool trans_b, int64_t k, int64_t n, const void* b, DType b_type,
                          int64_t ldb, uint16_t* dst);

class DnnlMatmul {
 public:
  // dtype: the operands' type in the product, f32 or bf16.
  explicit DnnlMatmul(DType dtype);
  ~DnnlMatmul();
  // Whether this build and CPU multiply in `dtype` through oneDNN.
  static bool available(DType dtype);
  // Whether oneDNN runs its AMX kernels on this CPU (the float32 library rule asks).
  static bool has_amx();
  DType dtype() const { return dtype_; }
  // Products run so far by every instance (oneDNN allocates a few bookkeeping objects per call:
  // the allocation test bounds them per call).
  static uint64_t calls();
  // Row-major C[M,N] = op(A) op(B) (+ C when accumulate) (+ bias[N] on every row when bias is
  // not null, inside the kernel: C is written once, not first filled with the bias and then
  // added to), as cblas_sgemm with alpha 1 and beta 0 or 1. A is M x K (or K x M when trans_a),
  // B is K x N (or N x K when trans_b), both in this instance's dtype (bf16 operands packed by
  // the caller); the bias is float32, C float32 or, on bf16 instances and not accumulated, bf16
  // (`c_type`): the float32 result rounded to nearest even as it is stored.
  void run(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const void* a, int64_t lda,
           const void* b, int64_t ldb, bool accumulate, void* c, int64_t ldc,
           const float* bias = nullptr, DType c_type = DType::f32);

  // A product as run() takes it (`bias`: whether it adds one; `c_bf16`: C stored in bf16).
  struct Product {
    bool trans_a = false, trans_b = false;
    int64_t m = 0, n = 0, k = 0, lda = 0, ldb = 0, ldc = 0;
    bool accumulate = false, bias = false, c_bf16 = false;
  };
  // B in the blocked bf16 layout the bf16 kernel of product `p` reads it in (oneDNN's choice):
  // `layout` names it among this instance's layouts, `bytes` is its size. A float32 B read by
  // many products (a held weight, Backend::hold_weight) is rounded into it once
  // (round_blocked_b) instead of copied into it inside every product (run() reads B as it lies).
  // For the shapes of transformer weights the layout depends on N and K only, and pads N to a
  // multiple of 64 and K to a multiple of 32 (workspace.h's cpu_blocked_elements bounds it).
  struct BlockedB {
    int layout = -1;
    size_t bytes = 0;
    bool own_packer = false;  // brisk's packer writes it (pack_bf16_ba16a64b2a)
  };
  BlockedB blocked_b(const Product& p);
  // The name oneDNN gives the kernel run() multiplies p with (e.g. "brg:avx512_core",
  // "gemm:jit"), made now where p's shape is new.
  std::string kernel(const Product& p);
  // Rounds the B of `p` (K x N, or N x K when trans_b; row stride p.ldb) into `dst`, in
  // blocked_b(p)'s layout, to nearest even as bf16_operand does: by brisk's own packer where the
  // layout is BA16a64b2a (AVX-512 BF16 and AMX kernels at transformer shapes; B float32 or
  // bf16), else (or when `by_onednn`, to compare the two) by a oneDNN reorder, 3-4x slower (B
  // float32 only).
  void round_blocked_b(const Product& p, const void* b, DType b_type, void* dst,
                       bool by_onednn = false);
  // Product p (p.ldb unused) with B read from `b_blocked` as round_blocked_b left it, and the
  // bias where p.bias.
  void run_blocked_b(const Product& p, const void* a, const void* b_blocked, void* c,
                     const float* bias = nullptr);

 private:
  struct Impl;
  DType dtype_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace brisk
