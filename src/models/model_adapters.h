// Low-rank adapters (LoRA) held by a model: for each adapted linear of the blocks, its A [r, in]
// and B [out, r] among the model's parameters (declared after the base's, trained while the base
// is frozen), the product it adds to and where (the columns of a packed query/key/value or
// gate/up output), and the rank-r activations backward reads. The adapter layer (adapters/lora)
// chooses the linears and the numbers; the blocks call them through ProductAdapters.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "core/memory_plan.h"
#include "core/parameters.h"
#include "models/linears.h"
#include "models/model_options.h"
#include "models/transformer_block.h"

namespace brisk {

// One adapted linear, as the adapter layer declares it.
struct AdapterDecl {
  int linear = -1;     // the linear's weight among the model's parameters
  std::string module;  // its module name ("model.layers.0.self_attn.q_proj")
  int layer = -1;
  int64_t in = 0, out = 0, r = 0;
  bool fan_in_fan_out = false;
  float scale = 1;
  float dropout = 0;  // on the adapter's input, in training
};

// A LoRA of a mixture's fused expert weights (models/moe_layer.h's MoeLora), as the adapter
// layer declares it; `module`: PEFT's name of its wrapper ("model.layers.0.mlp.experts", a
// ".base_layer" for each wrapper around it).
struct ExpertAdapterDecl {
  ExpertWeightsDecl weights;
  std::string module;
  int64_t r = 0;
  float scale = 1;
};

class ModelAdapters final : public ProductAdapters {
 public:
  // An expert adapter's A [E r, in] and B [E out, r] (MoeLora's layouts).
  struct ExpertEntry {
    ExpertAdapterDecl decl;
    int a = -1, b = -1;
  };
  std::vector<ExpertEntry>& experts() { return experts_; }
  const std::vector<ExpertEntry>& experts() const { return experts_; }
  struct Entry {
    AdapterDecl decl;
    int a = -1, b = -1;  // their parameters
    int64_t in = 0;      // the input features this rank's product reads (a row-parallel slice's)
    ProductSite site = ProductSite::qkv;
    int64_t at = 0;  // the first of the product's output columns it adds to
    Tensor u;        // [rows, r]: scale x A^T, kept for backward
    Tensor v;        // [rows, r]: scale dy B, from backward_weights to backward_input
  };
  explicit ModelAdapters(const ParameterSet& params) : params_(params) {}
  std::vector<Entry>& entries() { return entries_; }
  const std::vector<Entry>& entries() const { return entries_; }
  // The rank-r buffers for `rows` tokens: each entry's u (activations) and v (temporaries), and
  // where the adapters drop out their input or it comes in a 16-bit dtype (`low_precision`), one
  // float32 buffer for an input (dropped out, or widened).
  void declare(MemoryPlan& plan, BufferBinder& binder, int64_t rows, bool low_precision);
  // A layer's sparse MLP's products' weights, as the model binds them.
  using LayerProducts = std::function<std::vector<std::pair<ProductSite, Tensor>>(int layer)>;
  // Where each entry adds: the product of its layer whose weight holds its linear's, among the
  // block's four (by their parameters) or else its sparse MLP's (by where their weights lie).
  void place(const std::function<BlockProducts(int layer)>& block, const LayerProducts& sparse);

  bool on(int layer, ProductSite site) const override;
  void forward(Backend& be, int layer, ProductSite site, const Tensor& x, const Tensor& y,
               const RngKey* key) const override;
  void backward_weights(Backend& be, int layer, ProductSite site, const Tensor& x, const Tensor& dy,
                        const RngKey* key) const override;
  void backward_input(Backend& be, int layer, ProductSite site, const Tensor& dx,
                      const RngKey* key) const override;

 private:
  bool place_in_block(Entry& e, const BlockProducts& products) const;
  // Entry i's input as its product reads it: x itself, or float32 in input_ (widened, and in
  // training dropped out with the entry's mask).
  Tensor input(Backend& be, size_t i, const Tensor& x, const RngKey* key) const;
  // Entry i's dropout key: the step's at the layer's adapter site, its own stream in it.
  static RngKey dropout_key(const RngKey& key, const Entry& e, size_t i);
  const ParameterSet& params_;
  std::vector<Entry> entries_;
  std::vector<ExpertEntry> experts_;
  Tensor input_;  // [rows, the widest input] float32, where declared
};

}  // namespace brisk
