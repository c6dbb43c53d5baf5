// Backend workspaces by device (see workspace.h).
#include "backend/workspace.h"

#include <algorithm>
#include <cstdint>

#include "backend/cpu/cpu_matmul_dnnl.h"
#include "core/checked.h"

namespace brisk {

DType product_dtype(Device device, DType compute, const std::string& cpu_products) {
  if (device == Device::cuda) return compute;
  return compute == DType::bf16 && cpu_has_bf16_products(cpu_products) ? DType::bf16 : DType::f32;
}

int64_t cpu_blocked_elements(int64_t rows, int64_t cols) {
  constexpr int64_t kPad = 64;
  const char* what = "a blocked product operand";
  return checked_mul(checked_add(rows, kPad, what), checked_add(cols, kPad, what), what);
}

int64_t fused_attention_workspace_bound(int64_t B, int64_t T, int64_t H, int64_t K, int64_t D) {
  const char* what = "the fused attention's workspace";
  const int64_t tiles = (T + 127) / 128, padded = checked_mul(tiles, int64_t{128}, what);
  const int64_t bias = checked_mul(checked_mul(B, checked_mul(T, T, what), what), int64_t{2}, what);
  const int64_t rows = checked_mul(checked_mul(B, H, what), padded, what);
  const int64_t queries = checked_mul(checked_mul(rows, D, what), int64_t{4}, what);
  const int64_t copies = tiles + 1 + (K < H ? 1 : 0);
  const int64_t cudnn =
      checked_add(checked_mul(queries, copies, what), checked_mul(rows, int64_t{4}, what), what);
  return checked_add(checked_add(bias, int64_t{256}, what),
                     checked_add(cudnn, int64_t{1} << 20, what), what);
}

const void* WeightsCopy::find(const void* x, int64_t n) const {
  if (!base_) return nullptr;
  // Compared as addresses: x may lie anywhere, inside the weights or not.
  const auto at = reinterpret_cast<uintptr_t>(x), begin = reinterpret_cast<uintptr_t>(base_);
  const uintptr_t end = begin + static_cast<uintptr_t>(count_) * sizeof(float);
  if (at < begin || at >= end || (at - begin) % sizeof(float) != 0 || n < 0 ||
      static_cast<uintptr_t>(n) > (end - at) / sizeof(float))
    return nullptr;
  const auto index = static_cast<int64_t>((at - begin) / sizeof(float));
  return static_cast<const char*>(copy_.data()) +
         index * static_cast<int64_t>(dtype_size(copy_.dtype()));
}

namespace {
// The held weights' copy: the model's weights, so counted among them.
void plan_weights_copy(DType dtype, const MatmulOperands& operands, MemoryPlan& plan,
                       BufferBinder& binder, BackendWorkspace& ws) {
  if (operands.weights > 0)
    binder.declare(plan, &ws.weights_copy, "backend.weights_copy", Category::weights, dtype,
                   Shape{operands.weights});
}

// One 4-bit weight's values: float32, or on the CPU's bf16 units bf16, in the blocked layout
// or plain.
void plan_dequantized(Device device, DType product, const MatmulOperands& operands,
                      MemoryPlan& plan, BufferBinder& binder, BackendWorkspace& ws,
                      const std::string& cpu_products) {
  if (operands.quantized <= 0) return;
  const char* what = "the dequantized weight's buffer";
  const bool bf16 =
      device == Device::cpu && product == DType::bf16 && cpu_has_bf16_products(cpu_products);
  const int64_t bytes =
      bf16 ? checked_mul(std::max(operands.quantized, operands.quantized_blocked), int64_t{2}, what)
           : checked_mul(operands.quantized, int64_t{4}, what);
  binder.declare(plan, &ws.dequantized, "backend.dequantized_weight", Category::temporaries,
                 DType::u8, Shape{bytes});
}
}  // namespace

void plan_backend_workspace(Device device, DType product, MatmulOperands operands, MemoryPlan& plan,
                            BufferBinder& binder, BackendWorkspace& ws,
                            const std::string& cpu_products) {
  const Category tmp = Category::temporaries;
  plan_dequantized(device, product, operands, plan, binder, ws, cpu_products);
  if (device == Device::cpu) {
    // bf16 operands: packed to bf16 for oneDNN's bf16 units, or without them rounded to bf16
    // values in float32 for a float32 product.
    if (product == DType::bf16) {
      const DType packed = cpu_has_bf16_products(cpu_products) ? DType::bf16 : DType::f32;
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
      plan_weights_copy(DType::bf16, operands, plan, binder, ws);
    }
    return;
  }
  binder.declare(plan, &ws.matmul_workspace, "backend.cublaslt_workspace", tmp, DType::u8,
                 Shape{kCublasLtWorkspaceBytes});
  if (product != DType::f32) {
    // The fused attention stages in the same buffers (CudaBackend::attention_forward).
    const int64_t padded = checked_add(
        operands.a, checked_mul(operands.a_rows, int64_t{7}, "operand padding"), "operand A");
    binder.declare(plan, &ws.operand_a, "backend.operand_a", tmp, product,
                   Shape{std::max(padded, operands.attention)});
    binder.declare(plan, &ws.operand_b, "backend.operand_b", tmp, product,
                   Shape{std::max(operands.b, operands.attention)});
    // The held weight's copy, cast once while it is held (the LM head's, for all its chunks).
    if (operands.held > 0)
      binder.declare(plan, &ws.held_weight, "backend.held_weight", tmp, product,
                     Shape{operands.held});
    plan_weights_copy(product, operands, plan, binder, ws);
  }
  if (product != DType::f32 && operands.attention_workspace > 0)
    binder.declare(plan, &ws.attention_workspace, "backend.attention_workspace", tmp, DType::u8,
                   Shape{operands.attention_workspace});
  // Bias gradients are column sums: ones[1,M] x dy[M,N]; M is at most the products' rows (where
  // they are not given, the largest A operand's elements).
  const Shape ones{operands.a_rows > 0 ? operands.a_rows : operands.a};
  binder.declare(plan, &ws.ones, "backend.ones", tmp, DType::f32, ones);
  if (product != DType::f32) binder.declare(plan, &ws.ones16, "backend.ones16", tmp, product, ones);
  // Not a product buffer, but the GPU backend's only other one: planned here so that no
  // optimizer step allocates. Adafactor reuses it tensor after tensor, in stream order.
  binder.declare(plan, &ws.optimizer_scratch, "backend.optimizer_scratch", tmp, DType::f64,
                 Shape{kAdafactorScratch});
}

}  // namespace brisk
