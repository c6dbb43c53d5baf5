// The CPU backend: OpenBLAS or oneDNN for matrix products (bf16 on oneDNN's bf16 units; float32
// by oneDNN where OpenBLAS's kernel is narrower than the CPU), OpenMP for loops, fp32 compute. It
// is also the reference the CUDA backend is tested against.
#pragma once

#include <cmath>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_matmul_dnnl.h"
#include "backend/workspace.h"
#include "core/step_control.h"

namespace brisk {

class CpuBackend : public Backend {
 public:
  // `products`: the library every product goes to, "openblas" (float32 even where oneDNN has
  // kernels, bf16 operands rounded first) or "onednn" (float32 products wherever it has kernels)
  // to compare the two or override the default choice; "" chooses (Switches::cpu_products).
  // `blocked_4bit`: 4-bit weights dequantized into the kernel's blocked layout where brisk's
  // packer writes it (Switches::blocked_4bit_weights; off: plain bf16 rows).
  explicit CpuBackend(std::string products = "", bool blocked_4bit = true)
      : products_(std::move(products)), blocked_4bit_(blocked_4bit) {
    set_matmul_dtype(DType::f32);
  }
  Device device() const override { return Device::cpu; }
  std::string name() const override { return "cpu"; }
  void set_matmul_dtype(DType dtype) override;
  bool reads_product_input(DType dtype) const override {
    return bf16_operands_ && dtype == DType::bf16;
  }
  bool stores_product_output(DType dtype) const override {
    return bf16_operands_ && dtype == DType::bf16 && dnnl_ && dnnl_->dtype() == DType::bf16;
  }
  void hold_weight(const Tensor& w) override;
  void release_weight() override;
  // Where planned (tests: TrainOptions::weights_copy_on_cpu), the weights rounded to bf16 once
  // per hold into ws_.weights_copy, which the products read as their bf16 B.
  void hold_weights(const Tensor& weights) override;
  void release_weights() override { weights_copy_.release(); }
  void plan_workspace(MemoryPlan& plan, BufferBinder& binder, MatmulOperands operands) override;
  Tensor dequantized_buffer() const override { return ws_.dequantized; }

  MemoryResource& device_memory() override { return host_memory(); }
  MemoryResource& staging_memory(bool /*pinned*/ = true) override { return host_memory(); }
  void upload(const Tensor& src, const Tensor& dst) override;
  void download(const Tensor& src, const Tensor& dst) override;
  void synchronize() override {}

  void linear_forward(const Tensor& x, const Tensor& w, const Tensor& b, WeightLayout layout,
                      const Tensor& y) override;
  void linear_backward(const Tensor& x, const Tensor& w, const Tensor& dy, WeightLayout layout,
                       const Tensor& dx, bool accumulate_dx, const Tensor& dw, const Tensor& db,
                       bool accumulate_dw) override;
  void quantized_linear_forward(const Tensor& x, const Quant4Matrix& w, const Tensor& b,
                                const Tensor& y) override;
  void quantized_linear_backward(const Tensor& dy, const Quant4Matrix& w, const Tensor& dx,
                                 bool accumulate_dx) override;

  void layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps,
                         const Tensor& y, const Tensor& mean, const Tensor& rstd) override;
  void layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma,
                          const Tensor& mean, const Tensor& rstd, const Tensor& dx,
                          bool accumulate_dx, const Tensor& dgamma, const Tensor& dbeta) override;
  void rmsnorm_forward(const Tensor& x, const Tensor& gamma, float eps, const Tensor& y,
                       const Tensor& rstd) override;
  void rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& rstd,
                        const Tensor& dx, bool accumulate_dx, const Tensor& dgamma) override;

  void rotary_forward(const Tensor& qkv, int heads, int kv_heads, const Tensor& cos,
                      const Tensor& sin, int64_t first_position, const Tensor& positions) override;
  void rotary_backward(const Tensor& dqkv, int heads, int kv_heads, const Tensor& cos,
                       const Tensor& sin, int64_t first_position, const Tensor& positions) override;

  void activation_forward(Activation kind, const Tensor& x, const Tensor& y) override;
  void activation_backward(Activation kind, const Tensor& x, const Tensor& dy, const Tensor& dx,
                           DType round_dy) override;
  void swiglu_forward(const Tensor& gate_up, const Tensor& out) override;
  void swiglu_backward(const Tensor& gate_up, const Tensor& dout, const Tensor& dgate_up,
                       DType round_dout) override;
  void tanh_forward(const Tensor& x, const Tensor& y) override;
  void tanh_backward(const Tensor& y, const Tensor& dy, const Tensor& dx) override;
  void dropout_forward(const Tensor& x, float p, const RngKey& key, const Tensor& y) override;
  void dropout_backward(const Tensor& dy, float p, const RngKey& key, const Tensor& dx) override;
  void dropout_add(const Tensor& x, const Tensor& r, float p, const RngKey& key,
                   const Tensor& y) override;
  void dropout_add_norm(const Tensor& x, const Tensor& r, float p, const RngKey& key,
                        const Tensor& sum, const Norm& norm, const Tensor& y) override;
  void add_inplace(const Tensor& y, const Tensor& x) override;
  void fill(const Tensor& t, float value) override;
  void copy(const Tensor& src, const Tensor& dst) override;
  void copy_rows(const Tensor& src, const Tensor& dst, const RowCopy& c) override;
  void cast(const Tensor& src, const Tensor& dst) override;
  void round_to(DType dtype, const Tensor& src, const Tensor& dst) override;
  using Backend::round_to;
  void stochastic_round(DType dtype, const Tensor& t, const RngKey& key) override;

  void embedding_forward(const Tensor& ids, const Tensor& word, const Tensor& pos,
                         const Tensor& type_ids, const Tensor& type_table, const Tensor& out,
                         const VocabShard& shard, const Tensor& positions) override;
  void embedding_backward(const Tensor& dout, const Tensor& ids, int64_t padding_idx,
                          const Tensor& type_ids, const Tensor& dword, const Tensor& dpos,
                          const Tensor& dtype_table, const VocabShard& shard,
                          const Tensor& positions) override;

  void attention_forward(const Tensor& qkv, const KeyMask& key_mask, bool causal, int heads,
                         int kv_heads, float scale, float dropout_p, const RngKey& key,
                         const Tensor& probs, const Tensor& scratch, const Tensor& out) override;
  Tensor attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& out,
                            const Tensor& probs, const KeyMask& key_mask, bool causal, int heads,
                            int kv_heads, float scale, float dropout_p, const RngKey& key,
                            const Tensor& scratch, const Tensor& dqkv, DType round_dout,
                            DType round_dqkv) override;

  void attention_decode(const Tensor& qkv, const Tensor& k_cache, const Tensor& v_cache,
                        int64_t past, int heads, int kv_heads, float scale,
                        const Tensor& out) override;
  void first_token(const Tensor& x, const Tensor& out, const Tensor& starts) override;
  void first_token_backward(const Tensor& dout, const Tensor& dx, const Tensor& starts) override;
  void softmax_cross_entropy(const Tensor& logits, const Tensor& labels, bool write_grad,
                             const GradScale& grad_scale, const Tensor& loss_sum,
                             const Tensor& grad) override;
  void cross_entropy_stats(const Tensor& logits, const Tensor& labels, const VocabShard& shard,
                           const Tensor& stats) override;
  void cross_entropy_from_stats(const Tensor& logits, const Tensor& labels, const VocabShard& shard,
                                const Tensor& stats, bool write_grad, const GradScale& grad_scale,
                                const Tensor& loss_sum, const Tensor& grad) override;
  void mse_loss(const Tensor& predictions, const Tensor& targets, bool write_grad,
                const GradScale& grad_scale, const Tensor& loss_sum) override;
  void moe_route_forward(const Tensor& logits, bool normalize, const Tensor& probs,
                         const Tensor& weights, const Tensor& experts) override;
  void moe_route_backward(const Tensor& probs, const Tensor& weights, const Tensor& experts,
                          const Tensor& dweights, const Tensor& dprobs, bool normalize,
                          const Tensor& dlogits) override;
  void moe_balance_stats(const Tensor& probs, const Tensor& experts, const Tensor& mask,
                         const Tensor& stats) override;
  void moe_balance_backward(const Tensor& mask, const Tensor& scale, const Tensor& dprobs) override;
  void moe_z_stats(const Tensor& logits, const Tensor& mask, const Tensor& z,
                   const Tensor& sum) override;
  void moe_z_backward(const Tensor& probs, const Tensor& z, float scale,
                      const Tensor& dlogits) override;
  void dequantize_4bit(const Quant4Tensor& q, const Tensor& out) override;
  void lora_forward(const Tensor& x, const Tensor& a, const Tensor& b, float scale, const Tensor& u,
                    const Tensor& y, int64_t at) override;
  void lora_backward(const Tensor& x, const Tensor& a, const Tensor& b, float scale,
                     const Tensor& u, const Tensor& dy, int64_t at, const Tensor& v,
                     const Tensor& da, const Tensor& db, const Tensor& dx,
                     bool accumulate) override;
  void moe_dispatch(const Tensor& experts, int64_t num_experts, const Tensor& counts,
                    const Tensor& positions) override;
  void moe_gather(const Tensor& x, const Tensor& positions, const Tensor& rows) override;
  void moe_combine(const Tensor& rows, const Tensor& positions, const Tensor& weights,
                   const Tensor& y, bool accumulate) override;
  void moe_combine_backward(const Tensor& dy, const Tensor& rows, const Tensor& positions,
                            const Tensor& weights, const Tensor& drows,
                            const Tensor& dweights) override;

  void sum_squares(const Tensor& x, const Tensor& acc) override;
  void decide_step(const Tensor& stats, double loss_scale, double max_norm,
                   const Tensor& control) override;
  void adamw_update(const AdamWUpdate& u) override;
  void sgd_update(const SgdUpdate& u) override;
  void adafactor_update(const AdafactorUpdate& u) override;
  bool sums_split_statistics() const override { return true; }
  void adamw_8bit_update(const AdamW8bitUpdate& u) override;

 private:
  // A product operand where it lies: float32, or (in bf16 mode) bf16, with its row stride.
  struct Operand {
    const void* data;
    DType dtype;
    int64_t ld;
    Operand(const float* p, int64_t stride) : data(p), dtype(DType::f32), ld(stride) {}
    Operand(const Tensor& t, int64_t stride) : data(t.data()), dtype(t.dtype()), ld(stride) {}
    Operand(const void* p, DType type, int64_t stride) : data(p), dtype(type), ld(stride) {}
  };
  // A linear layer's weight as B: its copy where the weights holding it are held (hold_weights),
  // unless it is the held weight (hold_weight, with copies of its own); else itself.
  Operand weight_operand(const Tensor& w, int64_t stride) const;
  // W dequantized into ws_.dequantized in the blocked layout product p's kernel reads its B in
  // (B = W^T where p.trans_b, else W); false (nothing written) off bf16 units, where that layout
  // is not brisk's packer's, or where the buffer is too small for it.
  bool dequantize_blocked(const DnnlMatmul::Product& p, const Quant4Matrix& w);
  // W dequantized into ws_.dequantized as bf16 rows where it lies ([rows, cols], B of either
  // product, read plain), where the blocked layout is not brisk's packer's; false (nothing
  // written) off bf16 units or where the buffer is too small.
  bool dequantize_plain(const Quant4Matrix& w);
  // The product p of A and W dequantized by dequantize_blocked or dequantize_plain into C; false
  // (nothing done) where neither applies.
  bool quantized_product(const DnnlMatmul::Product& p, const Operand& a, const Quant4Matrix& w,
                         void* c, const float* bias, DType c_type);
  // Row-major C = op(A) op(B) (+ C when accumulate), by oneDNN (float32 or, in bf16 mode, bf16)
  // or OpenBLAS. In bf16 mode float32 operands are rounded to bf16 on the way (bf16 ones are
  // read where they lie when the library multiplies bf16). C is float32, or bf16 (`c_type`)
  // where stores_product_output(bf16) and the product is not accumulated.
  void matmul(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, Operand a, Operand b,
              bool accumulate, void* c, int64_t ldc, const float* bias = nullptr,
              DType c_type = DType::f32);
  // matmul's pieces: whether operand x passes through its packing buffer; B where the product
  // reads it, the held weight's copy or B packed (*blocked: in the kernel's blocked layout);
  // whether a transposed bf16 A goes plain through the A buffer; the rows [r0, r0 + rows) of C.
  bool packs(const Operand& x) const;
  const void* held_b(const DnnlMatmul::Product& p, const Operand& b, bool* blocked);
  const void* packed_b(const DnnlMatmul::Product& p, const Operand& b, bool* blocked);
  bool reads_a_plain(const DnnlMatmul::Product& p, const Operand& a, bool blocked,
                     int64_t block) const;
  void product_rows(const DnnlMatmul::Product& p, const Operand& a, const void* b0, int64_t r0,
                    int64_t rows, bool blocked, bool plain_a, void* c, const float* bias,
                    DType c_type);
  // Throws naming `op` unless x may be a product's operand (or a saved activation read or written
  // in its dtype): float32, or bf16 in bf16 mode.
  void check_operand(const Tensor& x, const char* op) const;
  // check_operand for an output y, which must also hold as many elements as x.
  void check_output(const Tensor& y, const Tensor& x, const char* op) const;
  // Throws naming `op` unless r, a residual branch for x, fits it and p is a dropout probability.
  void check_residual_branch(const Tensor& x, const Tensor& r, float p, const char* op) const;
  std::unique_ptr<DnnlMatmul> dnnl_;  // oneDNN's products (bf16 or float32); null: OpenBLAS
  // Attention's products, one instance per OpenMP thread in dnnl_'s type; empty: OpenBLAS.
  std::vector<std::unique_ptr<DnnlMatmul>> attention_dnnl_;
  // Whether attention's products run on bf16 units (bf16 mode on a CPU that has them), with an
  // instance for every thread of the next parallel region.
  bool prepare_attention_products();
  std::string products_;        // the library forced for the products, or "" (the constructor)
  bool blocked_4bit_ = true;    // 4-bit weights dequantized blocked where they can be
  bool bf16_operands_ = false;  // the matmul dtype is bf16: operands rounded to it
  // Attention's float32 products on brisk's float32 tiles (an AVX-512 build where
  // BRISK_CPU_PRODUCTS names no library when the products' type is set), else on the library.
  bool f32_attention_tiles_ = false;
  BackendWorkspace ws_;  // its planned bf16 operand buffers
  // The held weight (hold_weight) and what each copy of it in ws_.held_weight holds (one copy
  // per way products read it, [2, n] on bf16 units; one plain copy otherwise): the blocked layout
  // it was rounded into (DnnlMatmul::BlockedB::layout), kPlainCopy, or kNoCopy until the first
  // product that reads it rounds it.
  static constexpr int kNoCopy = -2, kPlainCopy = -1;
  const float* held_ = nullptr;
  int held_copy_[2] = {kNoCopy, kNoCopy};
  WeightsCopy weights_copy_;  // the held weights (hold_weights)
};

// Checks shared by the CPU kernels.
void check_same_numel(const Tensor& a, const Tensor& b, const char* op);
// The gradient multiplier of the step decision (core/step_control.h) in *multiplier; false when
// the step is skipped.
inline bool read_step_control(const Tensor& control, const char* op, float* multiplier) {
  expect(control, DType::f32, Shape{kControlSize}, op);
  *multiplier = control.f32()[kControlMultiplier];
  return control.f32()[kControlSkip] == 0.0f;
}

// One AdamW step's constants (torch's bias corrections, computed in double) and its update of
// one element: shared by adamw_update and the 32-bit and dequantized state of adamw_8bit_update.
struct AdamWStep {
  float b1, b2, eps, step_size, bc2_sqrt;
  AdamWStep(float lr, float beta1, float beta2, float epsilon, int64_t step)
      : b1(beta1), b2(beta2), eps(epsilon) {
    const double bc1 = 1.0 - std::pow(static_cast<double>(beta1), static_cast<double>(step));
    const double bc2 = 1.0 - std::pow(static_cast<double>(beta2), static_cast<double>(step));
    step_size = static_cast<float>(lr / bc1);
    bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  }
  // Moves the moments m, v by gradient g; returns the updated weight (decay: 1 - lr * wd, or 1).
  float update(float w, float g, float decay, float& m, float& v) const {
    m = b1 * m + (1.0f - b1) * g;
    v = b2 * v + (1.0f - b2) * g * g;
    return w * decay - step_size * m / (std::sqrt(v) / bc2_sqrt + eps);
  }
};

// codes[j] = quantize_nearest(map, x[j] * scale) for j < n, the same codes 16 at a time where
// the build targets AVX-512 (8-bit AdamW's requantization; cpu_optim_lowmem.cpp).
void quantize_row(const float* map, const float* x, float scale, int64_t n, uint8_t* codes);

// Calls fn(begin, end, decayed) for the consecutive element ranges [0, n) splits into by the
// sorted decay ranges (int64 [R,2], see AdamWUpdate), alternating undecayed gaps and ranges.
// A template, so that the loop allocates nothing.
template <typename Fn>
void for_each_decay_range(const Tensor& ranges, int64_t n, Fn&& fn) {
  BRISK_CHECK(ranges.dtype() == DType::i64 && ranges.rank() == 2 && ranges.dim(1) == 2,
              "decay ranges must be int64 [R,2]");
  const int64_t* r = ranges.as<int64_t>();
  int64_t at = 0;
  for (int64_t i = 0; i < ranges.dim(0); ++i) {
    const int64_t begin = r[2 * i], end = r[2 * i + 1];
    BRISK_CHECK(begin >= at && end >= begin && end <= n, "decay ranges are unsorted");
    fn(at, begin, false);
    fn(begin, end, true);
    at = end;
  }
  fn(at, n, false);
}
// Rows and columns of a tensor seen as a matrix over its last dimension.
inline int64_t cols_of(const Tensor& t) {
  return t.rank() ? t.dim(-1) : 1;
}
inline int64_t rows_of(const Tensor& t) {
  return cols_of(t) ? t.numel() / cols_of(t) : 0;
}

}  // namespace brisk
