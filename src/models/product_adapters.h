// Low-rank adapters (LoRA) on a layer's dense products, as the products' callers meet them: the
// block's four, and a sparse MLP's router and shared expert. The model holds them
// (models/model_adapters.h), the adapter layer (adapters/) attaches them from outside.
#pragma once

#include "backend/backend.h"

namespace brisk {

// A layer's products that adapters may add to: the block's packed query/key/value, attention
// output, first and second MLP products; a sparse MLP's router, its shared expert's packed
// gate/up and down products and its shared expert's gate.
enum class ProductSite { qkv, proj, fc, out, router, shared_fc, shared_out, shared_gate };

// `key` (the step's; null outside training) draws the adapters' dropout on their input: the
// same masks in forward and backward, whichever pass recomputes them.
class ProductAdapters {
 public:
  virtual ~ProductAdapters() = default;
  virtual bool on(int layer, ProductSite site) const = 0;
  // y (the product's float32 output for input x) gains the adapters' terms.
  virtual void forward(Backend& be, int layer, ProductSite site, const Tensor& x, const Tensor& y,
                       const RngKey* key) const = 0;
  // Backward in two parts around the product's own: first the adapters' gradients (added to)
  // from x and the output's gradient dy, while x is intact (the product's input gradient may be
  // written over it); then dx (float32, the product's input gradient) gains theirs.
  virtual void backward_weights(Backend& be, int layer, ProductSite site, const Tensor& x,
                                const Tensor& dy, const RngKey* key) const = 0;
  virtual void backward_input(Backend& be, int layer, ProductSite site, const Tensor& dx,
                              const RngKey* key) const = 0;
};

// One layer's adapters as a product's caller holds them: the model's (null: none), the layer,
// the step's key.
struct LayerAdapters {
  const ProductAdapters* adapters = nullptr;
  int layer = -1;
  const RngKey* key = nullptr;

  bool on(ProductSite site) const { return adapters != nullptr && adapters->on(layer, site); }
  // y gains the site's adapters' terms (none: nothing).
  void forward(Backend& be, ProductSite site, const Tensor& x, const Tensor& y) const {
    if (on(site)) adapters->forward(be, layer, site, x, y, key);
  }
  // Backend::linear_backward of the site's product with its adapters' backward around it.
  void linear_backward(Backend& be, ProductSite site, const Tensor& x, const Tensor& w,
                       const Tensor& dy, WeightLayout layout, const Tensor& dx, bool accumulate_dx,
                       const Tensor& dw, const Tensor& db, bool accumulate_dw) const {
    const bool adapted = on(site);
    if (adapted) adapters->backward_weights(be, layer, site, x, dy, key);
    be.linear_backward(x, w, dy, layout, dx, accumulate_dx, dw, db, accumulate_dw);
    if (adapted) adapters->backward_input(be, layer, site, dx, key);
  }
  // The same for a frozen weight kept 4-bit (Backend::quantized_linear_backward): dx alone
  // (skipped when empty).
  void quantized_backward(Backend& be, ProductSite site, const Tensor& x,
                          const Backend::Quant4Matrix& w, const Tensor& dy, const Tensor& dx,
                          bool accumulate_dx) const {
    const bool adapted = on(site);
    if (adapted) adapters->backward_weights(be, layer, site, x, dy, key);
    if (!dx.empty()) be.quantized_linear_backward(dy, w, dx, accumulate_dx);
    if (adapted) adapters->backward_input(be, layer, site, dx, key);
  }
};

}  // namespace brisk
