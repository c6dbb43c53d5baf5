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
// its row length `held_cols`: the CPU keeps its rounded copies in a buffer of their own, a backend
// that holds nothing sizes B for it.
struct MatmulOperands {
  int64_t a = 0, b = 0, held = 0, held_cols = 0;
  MatmulOperands(int64_t both) : a(both), b(both) {}  // NOLINT: one size for both is common
  MatmulOperands(int64_t a_elements, int64_t b_elements, int64_t held_elements = 0,
                 int64_t held_columns = 0)
      : a(a_elements), b(b_elements), held(held_elements), held_cols(held_columns) {}
};

struct BackendWorkspace {
  Tensor matmul_workspace;      // cuBLASLt's (GPU)
  Tensor operand_a, operand_b;  // 16-bit copies of product operands (GPU; CPU: bf16 operands)
  Tensor held_weight;           // the held weight's bf16 copies (CPU)
  Tensor ones;                  // a column of ones: bias gradients as a product (GPU)
  Tensor optimizer_scratch;     // Adafactor's per-tensor reductions (GPU)
};

// The dtype the backend for `device` multiplies in for a run computing in `compute`: the GPU's
// tensor cores take bf16 and fp16; the CPU multiplies bf16 on its matrix units where oneDNN finds
// them and everything else in float32.
DType product_dtype(Device device, DType compute);

// Elements of a rows x cols matrix in the blocked bf16 layouts oneDNN's kernels read B in (CPU),
// at most: both sides padded by up to 64 (oneDNN 2.6 pads N to 64 and K to 32 on AVX-512 bf16
// and AMX; where a layout needs more the CPU rounds the weight plainly instead).
int64_t cpu_blocked_elements(int64_t rows, int64_t cols);

// Declares the workspace of the backend for `device` multiplying in `product` with operands of at
// most `operands` values (on the CPU, bf16 means operands rounded to bf16, on bf16 units or not).
void plan_backend_workspace(Device device, DType product, MatmulOperands operands, MemoryPlan& plan,
                            BufferBinder& binder, BackendWorkspace& ws);

}  // namespace brisk
