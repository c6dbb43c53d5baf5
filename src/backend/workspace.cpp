// Backend workspaces by device (see workspace.h).
#include "backend/workspace.h"

#include <algorithm>

#include "backend/cpu/cpu_matmul_dnnl.h"
#include "core/checked.h"

namespace brisk {

DType product_dtype(Device device, DType compute) {
  if (device == Device::cuda) return compute;
  return compute == DType::bf16 && cpu_has_bf16_products() ? DType::bf16 : DType::f32;
}

int64_t cpu_blocked_elements(int64_t rows, int64_t cols) {
  constexpr int64_t kPad = 64;
  const char* what = "a blocked product operand";
  return checked_mul(checked_add(rows, kPad, what), checked_add(cols, kPad, what), what);
}

void plan_backend_workspace(Device device, DType product, MatmulOperands operands, MemoryPlan& plan,
                            BufferBinder& binder, BackendWorkspace& ws) {
  const Category tmp = Category::temporaries;
  if (device == Device::cpu) {
    // bf16 operands: packed to bf16 for oneDNN's bf16 units, or without them rounded to bf16
    // values in float32 for a float32 product.
    if (product == DType::bf16) {
      const DType packed = cpu_has_bf16_products() ? DType::bf16 : DType::f32;
      binder.declare(plan, &ws.operand_a, "backend.bf16_pack_a", tmp, packed, Shape{operands.a});
      binder.declare(plan, &ws.operand_b, "backend.bf16_pack_b", tmp, packed, Shape{operands.b});
      // The held weight: on bf16 units one copy per way products read it (B of x W^T and of
      // dy W), each in the blocked layout its kernel reads; otherwise one plain copy.
      if (operands.held > 0) {
        const bool blocked = packed == DType::bf16 && operands.held_cols > 0;
        const Shape held = blocked
                               ? Shape{2, cpu_blocked_elements(operands.held / operands.held_cols,
                                                               operands.held_cols)}
                               : Shape{operands.held};
        binder.declare(plan, &ws.held_weight, "backend.bf16_held_weight", tmp, packed, held);
      }
    }
    return;
  }
  binder.declare(plan, &ws.matmul_workspace, "backend.cublaslt_workspace", tmp, DType::u8,
                 Shape{kCublasLtWorkspaceBytes});
  if (product != DType::f32) {
    binder.declare(plan, &ws.operand_a, "backend.operand_a", tmp, product, Shape{operands.a});
    // The GPU holds no weight (hold_weight does nothing): B holds the held one too.
    binder.declare(plan, &ws.operand_b, "backend.operand_b", tmp, product,
                   Shape{std::max(operands.b, operands.held)});
  }
  // Bias gradients are column sums: ones[1,M] x dy[M,N]; M is at most the largest A operand.
  binder.declare(plan, &ws.ones, "backend.ones", tmp, DType::f32, Shape{operands.a});
  // Not a product buffer, but the GPU backend's only other one: planned here so that no
  // optimizer step allocates. Adafactor reuses it tensor after tensor, in stream order.
  binder.declare(plan, &ws.optimizer_scratch, "backend.optimizer_scratch", tmp, DType::f64,
                 Shape{kAdafactorScratch});
}

}  // namespace brisk
