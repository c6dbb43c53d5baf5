// The CUDA backend: brisk's own kernels (cuda_*.cu) and cuBLASLt matrix products on one stream
// of the current GPU. Every op only enqueues work; the host waits in download() and
// synchronize() alone.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <map>
#include <memory>
#include <optional>
#include <tuple>

#include "backend/backend.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/fused_attention.h"
#include "backend/workspace.h"

namespace brisk {

// cudaMalloc'd device memory and cudaMallocHost'd (page-locked) host memory, zeroed.
class CudaDeviceMemory final : public MemoryResource {
 public:
  Device device() const override { return Device::cuda; }
  void* allocate(size_t bytes) override;
  void deallocate(void* p) override;
};
class CudaPinnedMemory final : public MemoryResource {
 public:
  Device device() const override { return Device::cpu; }
  void* allocate(size_t bytes) override;
  void deallocate(void* p) override;
};

namespace cuda {
// A product's epilogue other than its bias: cuBLASLt's mode and its auxiliary matrix, laid out as
// the output (C's leading dimension, C's type).
struct Epilogue {
  cublasLtEpilogue_t mode = CUBLASLT_EPILOGUE_DEFAULT;
  const void* aux = nullptr;
};
}  // namespace cuda

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const Switches& switches);
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  Device device() const override { return Device::cuda; }
  std::string name() const override;
  void set_matmul_dtype(DType dtype) override;
  void set_tf32(bool enabled) override { tf32_ = enabled; }
  void plan_workspace(MemoryPlan& plan, BufferBinder& binder, MatmulOperands operands) override;
  Tensor dequantized_buffer() const override { return ws_.dequantized; }
  int64_t device_memory_used() const override;
  int64_t device_memory_free() const override;

  MemoryResource& device_memory() override { return device_memory_; }
  MemoryResource& staging_memory(bool pinned = true) override {
    return pinned ? static_cast<MemoryResource&>(pinned_memory_) : host_memory();
  }
  void upload(const Tensor& src, const Tensor& dst) override;
  void wait_for_uploads() override;
  void download(const Tensor& src, const Tensor& dst) override;
  void synchronize() override;
  void* device_stream() const override { return stream_; }
  bool records_work() const override { return true; }
  // A CUDA graph captured from the stream.
  std::unique_ptr<RecordedWork> record(const std::function<void()>& work) override;

  void linear_forward(const Tensor& x, const Tensor& w, const Tensor& b, WeightLayout layout,
                      const Tensor& y) override;
  // A 16-bit product's held weight is cast once into its planned buffer (ws_.held_weight), not
  // once per product: the LM head's weight, read by two products per chunk of rows.
  void hold_weight(const Tensor& w) override;
  Tensor hold_padded_weight(const Tensor& w, int64_t rows) override;
  void release_weight() override { held_ = nullptr; }
  // A 16-bit run's float32 weights cast once per hold into ws_.weights_copy, which the products
  // read (a bf16 run's weights, once per optimizer step).
  void hold_weights(const Tensor& weights) override;
  void release_weights() override { weights_copy_.release(); }
  // bf16 runs keep their saved activations in bf16 only: products, activations and attention
  // read them as they lie, norms and activations write them (no per-product casts).
  bool reads_product_input(DType dtype) const override { return bf16_activations(dtype); }
  // Products writing bf16 outputs, opted into with BRISK_BF16_PRODUCT_OUTPUT=1 (no float32
  // output, no rounding pass; measured slower on GPT-2 on an H200: docs/benchmarks.md).
  // cuBLASLt adds a bias of the output's type, so a bf16 output's bias is cast to bf16 first
  // (into the tail of its workspace), as autocast rounds it: the same bits as the CPU's sums only
  // where its values are bf16 ones (a bf16 run keeping a 16-bit compute copy, not one computing
  // with float32 weights).
  bool stores_product_output(DType dtype) const override {
    return switches_.bf16_product_output && bf16_activations(dtype);
  }
  void linear_backward(const Tensor& x, const Tensor& w, const Tensor& dy, WeightLayout layout,
                       const Tensor& dx, bool accumulate_dx, const Tensor& dw, const Tensor& db,
                       bool accumulate_dw) override;
  // In a bf16 run, the gradient written in bf16: a tanh GELU's in the product's epilogue
  // (cuBLASLt's DGELU, reading pre as its auxiliary matrix) where fuses_activation_gradient, else
  // after the product's bf16 dy W; else Backend's two calls.
  Tensor linear_activation_backward(const Tensor& x, const Tensor& w, const Tensor& dy,
                                    WeightLayout layout, Activation kind, const Tensor& pre,
                                    DType round, const Tensor& dx, const Tensor& dw,
                                    const Tensor& db, bool accumulate_dw) override;

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
  void norm_backward(const Tensor& dy, const Tensor& x, const Norm& n, const Tensor& dx,
                     bool accumulate_dx, const Tensor& dgamma, const Tensor& dbeta, DType round_dy,
                     const BranchDropout& branch) override;
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
                         const Tensor& stats, const Tensor& scratch, const Tensor& out) override;
  void attention_forward_stored(const Tensor& qkv, const KeyMask& key_mask, bool causal, int heads,
                                int kv_heads, float scale, float dropout_p, const RngKey& key,
                                const Tensor& stats, const Tensor& scratch, const Tensor& out,
                                const Tensor& stored) override;
  Tensor attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& out,
                            const Tensor& stats, const KeyMask& key_mask, bool causal, int heads,
                            int kv_heads, float scale, float dropout_p, const RngKey& key,
                            const Tensor& scratch, const Tensor& dqkv, DType round_dout,
                            DType round_dqkv) override;

  void packed_attention_forward(const Tensor& qkv, const PackedSamples& samples, bool causal,
                                int heads, int kv_heads, float scale, float dropout_p,
                                const RngKey& key, const Tensor& stats, const Tensor& scratch,
                                const Tensor& out) override;
  void add_packed_signature(const PackedSamples& samples, const AttentionDims& d, bool causal,
                            float scale, float dropout_p, std::vector<int64_t>& out) const override;
  Tensor packed_attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& out,
                                   const Tensor& stats, const PackedSamples& samples, bool causal,
                                   int heads, int kv_heads, float scale, float dropout_p,
                                   const RngKey& key, const Tensor& scratch, const Tensor& dqkv,
                                   DType round_dout, DType round_dqkv) override;
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
  void adamw_8bit_update(const AdamW8bitUpdate& u) override;

 private:
  using Epilogue = cuda::Epilogue;
  // Row-major C[m,n] = op(A) op(B) (+ C when accumulate) (+ bias[n] when given), C float32 or
  // (a bf16 product) bf16, the bias of C's type; the operands already in `dtype` (operand()).
  // With an `extra` epilogue it computes nothing and returns false where cuBLASLt has no
  // algorithm for it; otherwise it returns true (or throws).
  bool matmul(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const void* a,
              int64_t lda, const void* b, int64_t ldb, bool accumulate, cuda::Out c, int64_t ldc,
              const void* bias, DType dtype, const Epilogue& extra = {});
  // linear_backward's input gradient: into `f32` (added to where accumulate), or where bf16
  // written in bf16 into f32's memory, through the `extra` epilogue where cuBLASLt has one.
  struct DxProduct {
    Tensor f32;
    bool accumulate = false;
    bool bf16 = false;
    Epilogue extra{};
  };
  // linear_backward's products; returns whether dx's took its epilogue.
  bool backward_products(const Tensor& x, const Tensor& w, const Tensor& dy, WeightLayout layout,
                         const DxProduct& dx, const Tensor& dw, const Tensor& db,
                         bool accumulate_dw);
  // Whether linear_activation_backward writes its gradient in bf16 (a bf16 run, pre stored in
  // bf16, the gradient rounded to bf16): the product's dy W stored rounded, the activation's
  // gradient in place; BRISK_BF16_ACTIVATION_GRADIENT=0 keeps Backend's float32 calls.
  bool bf16_activation_gradient(const Tensor& x, const Tensor& pre, DType round,
                                const Tensor& dx) const;
  // Whether it then applies `kind`'s gradient in the product's epilogue: a tanh GELU (cuBLASLt's
  // formula), rows a multiple of 8 values (the auxiliary matrix's leading dimension);
  // BRISK_FUSED_ACTIVATION_GRADIENT=0 turns it off.
  bool fuses_activation_gradient(Activation kind, const Tensor& x) const;
  void weight_grad_rows(const Tensor& dw, int64_t k, int64_t m, const void* dy, int64_t ld,
                        const void* x, bool accumulate, DType t, bool padded);
  const void* bias_operand(const float* bias, int64_t n);
  // A bias gradient db (its first columns: a padded weight's) from dy [m, n].
  void bias_gradient(cuda::In dy, int64_t m, int64_t n, const Tensor& db, bool accumulate);
  // ws_.ones filled with 1.0, and ws_.ones16 with its 16-bit 1.0 where planned.
  void fill_ones();
  // A product's operand of n stored elements as a `dtype` product reads it: float32 as it lies;
  // for 16 bits the held weight's copy, an operand stored in bf16 as it lies, or float32 values
  // cast into `buffer` (a planned operand buffer).
  const void* operand(cuda::In x, int64_t n, DType dtype, const Tensor& buffer);
  // A linear layer's gradient dy [m, n] as operand A: where it is packed, rows whose 16-bit values
  // are not a multiple of 16 bytes (the LM head's 50257) go *ld = n rounded up to 8 apart, so that
  // the products run on Hopper's kernels (MatmulOperands::a_rows planned the room).
  const void* gradient_operand(cuda::In g, int64_t m, int64_t n, DType dtype, int64_t* ld);
  // cuBLASLt descriptors and the chosen algorithm for one product shape.
  struct MatmulPlan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
    MatmulPlan() = default;
    MatmulPlan(const MatmulPlan&) = delete;
    MatmulPlan& operator=(const MatmulPlan&) = delete;
    ~MatmulPlan();
  };
  // The ninth field is the epilogue (a cublasLtEpilogue_t: DEFAULT, BIAS, or an Epilogue's
  // mode). The last but one is the operands' common pointer alignment (bytes, at most 256):
  // cuBLASLt's heuristic otherwise assumes 256 and may pick a kernel that refuses less aligned
  // pointers. The last: whether the output is 16-bit.
  using PlanKey = std::tuple<bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int,
                             int, bool, int, bool>;
  // The key's plan, made on first use (aux: an epilogue's auxiliary matrix, whose address the
  // heuristic reads); null where cuBLASLt has no algorithm for an Epilogue's mode (remembered).
  MatmulPlan* plan_for(const PlanKey& key, const void* aux);
  // The fused (cuDNN, tensor-core) attention's problem for these arguments where it serves them:
  // products in 16 bits, the planned operand buffers and the scratch large enough to stage it,
  // and cuDNN builds both its graphs (cuda_fused_attention.cpp); otherwise nullopt, and the
  // float32 kernels run. A function of the arguments and the plan alone, so a backward takes the
  // path its forward took. A mask holding a packed batch's samples asks for the ragged graph.
  std::optional<cuda::FusedAttentionShape> fused_attention(const AttentionDims& d,
                                                           const KeyMask& mask, bool causal,
                                                           float scale, float dropout_p) const;
  // A packed batch's call checked (its samples, scale, statistics and scratch) and its ragged
  // fused attention's problem, where the fused attention serves it; nullopt otherwise.
  std::optional<cuda::FusedAttentionShape> ragged_attention(
      const Tensor& qkv, const PackedSamples& samples, bool causal, int heads, int kv_heads,
      float scale, float dropout_p, const Tensor& stats, const Tensor& scratch,
      const char* op) const;
  cuda::FusedAttentionArgs fused_attention_inputs(const cuda::FusedAttentionShape& s,
                                                  const KeyMask& key_mask, const RngKey& key,
                                                  const Tensor& scratch);
  // Both attention_forward calls: the output into out, or (stored given) rounded into *stored,
  // straight from the fused attention where it gives stored's dtype.
  void attention_forward_to(const Tensor& qkv, const KeyMask& key_mask, bool causal, int heads,
                            int kv_heads, float scale, float dropout_p, const RngKey& key,
                            const Tensor& stats, const Tensor& scratch, const Tensor& out,
                            const Tensor* stored);
  // Whether the fused attention's output goes straight into a stored copy of its dtype, and its
  // input gradient stays in it (attention_forward_stored, attention_backward): where products read
  // that dtype; BRISK_ATTENTION_BF16_IO=0 casts both through float32, to compare.
  bool keeps_attention_dtype(const cuda::FusedAttentionShape& s) const;
  // out: float32 (cast from the attention's own dtype), or in that dtype, written as it is.
  void fused_attention_forward(const cuda::FusedAttentionShape& s, const Tensor& qkv,
                               const KeyMask& key_mask, const RngKey& key, const Tensor& stats,
                               const Tensor& scratch, const Tensor& out);
  void fused_attention_backward(const cuda::FusedAttentionShape& s, const Tensor& dout,
                                const Tensor& qkv, const Tensor& out, const Tensor& stats,
                                const KeyMask& key_mask, const RngKey& key, const Tensor& scratch,
                                const Tensor& dqkv, bool keeps_dtype);

  cudaStream_t stream_ = nullptr;
  cudaEvent_t uploaded_ = nullptr;  // recorded after each upload
  cublasLtHandle_t lt_ = nullptr;
  int device_index_ = 0;
  cudaDeviceProp props_{};
  CudaDeviceMemory device_memory_;
  CudaPinnedMemory pinned_memory_;
  DType matmul_dtype_ = DType::f32;
  // Whether `dtype` is bf16 and the products are (BRISK_BF16_ACTIVATIONS=0 turns it off, to
  // compare with float32 containers).
  bool bf16_activations(DType dtype) const;
  // A tensor in GPU memory, float32 or, where bf16_activations, bf16.
  cuda::In dev_in(const Tensor& t, const char* what) const;
  cuda::Out dev_out(const Tensor& t, const char* what) const;
  cuda::Out loss_grad(const Tensor& logits, bool write_grad, const Tensor& grad) const;
  // cuBLASLt's workspace lent as float32 scratch between products (cuda_column_sums.cuh).
  cuda::ColumnScratch column_scratch();
  bool tf32_ = false;
  Switches switches_;    // the run's measurement switches (core/switches.h)
  BackendWorkspace ws_;  // cuBLASLt's workspace, 16-bit operands, ones, optimizer scratch
  bool ones_ready_ = false;
  const float* held_ = nullptr;  // the held weight (its copy: ws_.held_weight), or null
  WeightsCopy weights_copy_;     // the held weights (hold_weights)
  std::map<PlanKey, std::unique_ptr<MatmulPlan>> plans_;
};

// "GPU memory occupied" as nvidia-smi reports it for the current device (NVML, opened at run
// time); -1 when NVML cannot be loaded.
int64_t nvml_memory_used(int cuda_device);

}  // namespace brisk
