// A block's dense products as its passes run them (models/transformer_block.cpp): by the weight's
// tensor or its 4-bit matrix (BlockParams::quantized), with the product's LoRA adapters around.
#pragma once

#include "models/transformer_block.h"

namespace brisk {

// The step's key of the adapters' dropout (null outside training).
const RngKey* adapter_key(const BlockStyle& st);
LayerAdapters layer_adapters(const BlockStyle& st, int layer);
// Whether the product at `site` may write its output in the 16-bit activation dtype itself
// (Backend::stores_product_output): not where adapters add to it, which they do in float32
// before the one rounding.
bool stores_output(const Backend& be, const BlockStyle& st, int layer, ProductSite site);
// The product's adapters' terms added to y (none: nothing).
void adapt(Backend& be, const BlockStyle& st, int layer, ProductSite site, const Tensor& x,
           const Tensor& y);
// The weight of the block's product at `site` (its tensor; see BlockParams::quantized).
const Tensor& weight_at(const BlockParams& w, ProductSite site);
// y = x w (+ b) by the block's product at `site`: a weight kept 4-bit multiplied where it is kept.
void product_forward(Backend& be, const BlockStyle& st, const BlockParams& w, ProductSite site,
                     const Tensor& x, const Tensor& b, const Tensor& y);
// linear_backward with the product's adapters': theirs from x before the product's input
// gradient may overwrite it (dx can be x's memory: the working set's), dx gaining theirs after.
// A 4-bit weight is frozen: its input gradient alone.
void adapted_backward(Backend& be, const BlockStyle& st, int layer, ProductSite site,
                      const Tensor& x, const BlockParams& w, const Tensor& dy, const Tensor& dx,
                      bool accumulate_dx, const Tensor& dw, const Tensor& db, bool accumulate_dw);

}  // namespace brisk
