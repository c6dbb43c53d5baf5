#include "models/block_products.h"

#include <array>

#include "core/error.h"

namespace brisk {

const RngKey* adapter_key(const BlockStyle& st) {
  return st.adapter_key ? &*st.adapter_key : nullptr;
}

bool stores_output(const Backend& be, const BlockStyle& st, int layer, ProductSite site) {
  return be.stores_product_output(st.act_dtype) &&
         !(st.adapters != nullptr && st.adapters->on(layer, site));
}

LayerAdapters layer_adapters(const BlockStyle& st, int layer) {
  return {st.adapters, layer, adapter_key(st)};
}

void adapt(Backend& be, const BlockStyle& st, int layer, ProductSite site, const Tensor& x,
           const Tensor& y) {
  layer_adapters(st, layer).forward(be, site, x, y);
}

const Tensor& weight_at(const BlockParams& w, ProductSite site) {
  const std::array<const Tensor*, 4> weights{&w.qkv_w, &w.proj_w, &w.fc_w, &w.out_w};
  return *weights.at(static_cast<size_t>(site));
}

void product_forward(Backend& be, const BlockStyle& st, const BlockParams& w, ProductSite site,
                     const Tensor& x, const Tensor& b, const Tensor& y) {
  if (const Backend::Quant4Matrix* q = w.quantized_at(site))
    be.quantized_linear_forward(x, *q, b, y);
  else
    be.linear_forward(x, weight_at(w, site), b, st.layout, y);
}

void adapted_backward(Backend& be, const BlockStyle& st, int layer, ProductSite site,
                      const Tensor& x, const BlockParams& w, const Tensor& dy, const Tensor& dx,
                      bool accumulate_dx, const Tensor& dw, const Tensor& db, bool accumulate_dw) {
  const LayerAdapters a = layer_adapters(st, layer);
  if (const Backend::Quant4Matrix* q = w.quantized_at(site)) {
    BRISK_CHECK(dw.empty() && db.empty(), "internal error: a 4-bit weight with a gradient");
    a.quantized_backward(be, site, x, *q, dy, dx, accumulate_dx);
    return;
  }
  a.linear_backward(be, site, x, weight_at(w, site), dy, st.layout, dx, accumulate_dx, dw, db,
                    accumulate_dw);
}

}  // namespace brisk
