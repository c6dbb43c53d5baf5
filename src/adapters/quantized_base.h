// QLoRA's frozen base (--load_in_4bit), applied to a model from outside: the blocks' linear
// weights kept 4-bit as bitsandbytes stores them (core/quant4.h: every linear of the blocks, as
// transformers' BitsAndBytesConfig quantizes every linear but the head) and the blocks' other
// parameters (norms, biases) float32, all outside the model's weight buffer. That buffer stages
// the blocks' weights in two slots (Model::weight_layout()); a block's are dequantized into its
// slot when a pass needs them, forward and again backward. Loading quantizes each block's weights
// as it is written, so the full-precision model never sits in memory whole; a weight the
// checkpoint holds 4-bit in the store's layout keeps the checkpoint's codes (adopt). A linear the
// blocks store transposed (GPT-2's Conv1D, [in, out]) is quantized as bitsandbytes quantizes it,
// in nn.Linear's layout [out, in], and dequantized back into its place. The embeddings, the
// head and the adapters stay in the weight buffer. A block product whose weights are all kept
// 4-bit is multiplied where they are kept (Backend::quantized_linear_forward, WeightSlots::matrix):
// its parameters are no slot's (PlanOptions::slot_holes), and loading writes each at the backend's
// dequantization buffer, where it is quantized before the next (filled_param). With `half` the
// linears are kept in that 16-bit type instead (a bf16 or fp16 LoRA run's frozen base: its products
// round the weights to it anyway, so the results are the float32 base's, at half its bytes).
#pragma once

#include <memory>
#include <vector>

#include "backend/backend.h"
#include "core/memory_plan.h"
#include "core/quant4.h"
#include "core/weight_files.h"
#include "models/model.h"

namespace brisk {

struct Quant4Options {
  Quant4Type type = Quant4Type::nf4;  // bnb_4bit_quant_type
  bool nested = false;                // use_bnb_nested_quant (bnb_4bit_use_double_quant)
  int64_t blocksize = 64;
  // The linears in this 16-bit type (bf16 or f16), not 4-bit; f32: 4-bit.
  DType half = DType::f32;
  bool kept_16bit() const { return half != DType::f32; }
  // The run's fp16: 4-bit weights are dequantized into fp16 values, as bitsandbytes dequantizes
  // into its compute dtype (a bf16 run's products round their operands to bf16 themselves).
  bool round_to_fp16 = false;
};

class QuantizedBase final : public WeightSlots {
 public:
  // Before the model's plan: the model must stage its weights (PlanOptions::weight_slots).
  QuantizedBase(const Model& model, Quant4Options options);
  static constexpr int kSlots = 2;
  // The store's buffers (category weights) into the plan.
  void declare(MemoryPlan& plan, BufferBinder& binder);
  // After the arena is bound: the nested absmaxes' map uploaded, the model told to ask here.
  void attach(Backend& be, Model& model);

  // The ranges of every block that no slot holds (the products multiplied where they are
  // kept), for the model's plan; and the most values and blocked elements of one such product's
  // weight (MatmulOperands::quantized, quantized_blocked).
  const std::vector<ElementRange>& slot_holes() const { return holes_; }
  int64_t largest_product() const { return largest_; }
  int64_t largest_product_blocked() const { return largest_blocked_; }
  const Backend::Quant4Matrix* matrix(int layer, int site) const override;
  void filled_param(int param) override;

  void need(int segment) override;
  void prefetch(int /*segment*/) override {}
  // Quantizes the block's weights just written into its slot (full precision, loaded or
  // initialized): what later passes dequantize.
  void filled(int segment) override;
  // While set (the weights loading from `file`), a linear `file` holds 4-bit keeps its codes and
  // state; one saved in another layout than the store's is refused naming the options.
  void adopt(const WeightFiles* file) { source_ = file; }

  // The parameters kept apart in the store (4-bit or bf16).
  int64_t quantized_params() const;
  // Their values: what each pass widens into a slot.
  int64_t quantized_elements() const;

 private:
  // One parameter of a block: 4-bit at its offsets in the store, or float32 in `kept_`.
  struct Entry {
    int param = -1;
    bool quantized = false;
    bool direct = false;  // its product reads it where it is kept, not from the slot
    Quant4Layout layout;
    int64_t packed_at = 0, blocks_at = 0, nested_at = 0, half_at = 0, kept_at = 0;
    float offset = 0;             // nested: the absmaxes' mean (set by filled)
    int64_t transposed_cols = 0;  // stored [in, out]: quantized as [out, in], in columns
    // The values' type before quantization, which dequantization rounds to (bitsandbytes'
    // quant_state dtype: a checkpoint's own; the run's float32 values otherwise).
    DType dtype = DType::f32;
  };
  // e's state: the checkpoint's own (adopted), or the slot's values quantized; either uploaded
  // into the store.
  bool adopted(Entry& e);
  void quantize(Entry& e, const Tensor& slot);
  // A 4-bit state's parts on the host, as quantize_4bit gives them or a checkpoint holds them.
  struct HostState {
    const void* packed;
    const void* absmax;  // float32, or nested uint8 codes
    const float* absmax2;
    float offset;
  };
  void upload(Entry& e, const HostState& s);
  // e's values dequantized into `slot` (fp16 runs: rounded to fp16 values).
  void dequantize(const Entry& e, const Tensor& slot);
  Backend::Quant4Tensor view(const Entry& e) const;
  // A block product multiplied where its weights are kept: its entries (segment, index), in
  // order, and its matrix once the store is bound.
  struct Product {
    int layer = -1, site = -1;
    std::vector<std::pair<int, int>> entries;
    int64_t cols = 0;
    Backend::Quant4Matrix matrix;
  };
  void find_direct_products();
  // Product `p`'s entries of `segment`, when its weights are all kept 4-bit there.
  bool direct_product(int segment, const ProductParams& p, Product& out) const;
  void find_holes();
  void refresh(Product& p) const;  // its matrix from its entries' current state
  std::vector<Product> products_;
  std::vector<ElementRange> holes_;
  int64_t largest_ = 0, largest_blocked_ = 0;
  const Model& model_;
  Quant4Options options_;
  Backend* be_ = nullptr;
  const WeightFiles* source_ = nullptr;
  std::vector<std::vector<Entry>> segments_;  // per segment (param_segments()); empty: resident
  std::vector<bool> present_;
  Tensor packed_, absmax_, qabsmax_, absmax2_, code2_, half_, kept_;
  int64_t packed_bytes_ = 0, blocks_ = 0, nested_blocks_ = 0, half_elements_ = 0,
          kept_elements_ = 0;
};

}  // namespace brisk
