// The buffers a backend plans for itself, as a pure function of the device and the run's
// settings: the same declarations serve a backend that is about to run and `brisk estimate`
// planning for a device that is not present.
#pragma once

#include <cstdint>

#include "core/memory_plan.h"
#include "core/tensor.h"

namespace brisk {

// cuBLASLt's workspace: what cuBLAS recommends for Hopper.
inline constexpr int64_t kCublasLtWorkspaceBytes = int64_t{32} << 20;
// Doubles of device memory for one tensor's reductions in the GPU's Adafactor.
inline constexpr int64_t kAdafactorScratch = 3;

// The most elements of a product's operands, for sizing the buffers they are copied into: A
// (activations and their gradients), B (weights, or activations in a weight gradient's product),
// and `held`, the one weight a caller holds (Backend::hold_weight; 0: none), not counted in B, with
// its row length `held_cols`: each backend keeps its rounded copies in a buffer of their own.
//
// `a_rows` is the most rows of an A operand or of a bias gradient's dy (summed against as many
// ones); a GPU pads a float32 A's packed rows to a multiple of 8 values (16 bytes), 7 more each.
//
// `attention` is what a GPU's fused 16-bit attention stages in each of A's and B's buffers between
// products (its 16-bit qkv and output in A, their gradients in B): B T ((H + 2K) D + H D).
// `attention_workspace` is bytes for the same attention's cuDNN workspace and key-mask bias
// (fused_attention_workspace_bound).
//
// `weights` is the elements of the weights a caller holds for a stretch of steps
// (Backend::hold_weights: the model's, resident, in a run that computes with float32 weights on a
// device whose traits ask for a copy), copied once per hold into a 16-bit buffer the products
// read; 0: none planned.
//
// `quantized` is the most values of a weight kept 4-bit (QLoRA's frozen base,
// Backend::quantized_linear_forward) and `quantized_blocked` the most cpu_blocked_elements of
// one: the buffer each such weight is dequantized into, one at a time; 0: none planned.
struct MatmulOperands {
  int64_t a = 0, b = 0, held = 0, held_cols = 0, a_rows = 0, attention = 0, attention_workspace = 0,
          weights = 0, quantized = 0, quantized_blocked = 0;
  MatmulOperands(int64_t both) : a(both), b(both) {}  // NOLINT: one size for both is common
  MatmulOperands(int64_t a_elements, int64_t b_elements, int64_t held_elements = 0,
                 int64_t held_columns = 0)
      : a(a_elements), b(b_elements), held(held_elements), held_cols(held_columns) {}
};

struct BackendWorkspace {
  Tensor matmul_workspace;      // cuBLASLt's (GPU)
  Tensor operand_a, operand_b;  // 16-bit copies of product operands (GPU; CPU: bf16 operands)
  Tensor held_weight;           // the held weight's 16-bit copies (CPU: bf16, per layout)
  Tensor ones;                  // a column of ones: bias gradients as a product (GPU)
  Tensor ones16;                // the same in the products' 16-bit type: of a 16-bit dy (GPU)
  Tensor optimizer_scratch;     // Adafactor's per-tensor reductions (GPU)
  Tensor attention_workspace;   // the fused attention's cuDNN workspace and mask bias (GPU)
  Tensor weights_copy;          // the held weights' 16-bit copy (MatmulOperands::weights)
  // One 4-bit weight's dequantized values (MatmulOperands::quantized): bytes, float32 [rows,
  // cols] or, on the CPU's bf16 units, bf16 in the blocked layout the product reads.
  Tensor dequantized;
};

// The weights a caller holds (Backend::hold_weights) and their 16-bit copy, laid out alike: a
// product operand of float32 values inside them is read from the copy instead.
class WeightsCopy {
 public:
  void hold(const float* weights, int64_t count, const Tensor& copy) {
    base_ = weights;
    count_ = count;
    copy_ = copy;
  }
  void release() { base_ = nullptr; }
  // The copy of the n float32 values at x, or null where they do not all lie in the held weights.
  const void* find(const void* x, int64_t n) const;

 private:
  const float* base_ = nullptr;
  int64_t count_ = 0;
  Tensor copy_;
};

// Bytes the GPU's fused attention over [B, T] with H query heads (sharing K key/value heads) of
// width D may need: its key-mask bias, one 16-bit value per (batch, query, key), and cuDNN's
// workspace. cuDNN 9.19's deterministic backward on an H100 asked for float32 dQ partials, one
// copy of the queries per 128 keys, plus one more copy where K < H, plus 4 bytes per query row
// (bench/gpu_anchors.py's shapes, exactly); the bound pads T to 128 and adds a copy and 1 MiB.
int64_t fused_attention_workspace_bound(int64_t B, int64_t T, int64_t H, int64_t K, int64_t D);

// The dtype the backend for `device` multiplies in for a run computing in `compute`: the GPU's
// tensor cores take bf16 and fp16; the CPU multiplies bf16 on its matrix units where oneDNN finds
// them and everything else in float32 (`cpu_products`: Switches::cpu_products).
DType product_dtype(Device device, DType compute, const std::string& cpu_products = "");

// Elements of a rows x cols matrix in the blocked bf16 layouts oneDNN's kernels read B in (CPU),
// at most: both sides padded by up to 64 (oneDNN 2.6 pads N to 64 and K to 32 on AVX-512 bf16
// and AMX; where a layout needs more the CPU rounds the weight plainly instead).
int64_t cpu_blocked_elements(int64_t rows, int64_t cols);

// Declares the workspace of the backend for `device` multiplying in `product` with operands of at
// most `operands` values (on the CPU, bf16 means operands rounded to bf16, on bf16 units or not,
// as `cpu_products` chooses: Switches::cpu_products).
void plan_backend_workspace(Device device, DType product, MatmulOperands operands, MemoryPlan& plan,
                            BufferBinder& binder, BackendWorkspace& ws,
                            const std::string& cpu_products = "");

}  // namespace brisk
