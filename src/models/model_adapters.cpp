#include "models/model_adapters.h"

#include <algorithm>

#include "core/error.h"

namespace brisk {

namespace {
// The first `rows` rows of a [planned rows, cols] buffer.
Tensor rows_of(const Tensor& t, int64_t rows, int64_t cols) {
  return Tensor(t.data(), Shape{rows, cols}, t.dtype(), t.device());
}

int64_t rows_in(const Tensor& x, int64_t cols) {
  return x.numel() / std::max<int64_t>(cols, 1);
}

// The block's fourth dropout site of a layer, which it leaves to the layer's adapters.
constexpr int kAdapterSite = 3;
}  // namespace

void ModelAdapters::declare(MemoryPlan& plan, BufferBinder& binder, int64_t rows,
                            bool low_precision) {
  int64_t widest = 0;
  bool drops = false;
  for (Entry& e : entries_) {
    binder.declare(plan, &e.u, e.decl.module + ".lora_u", Category::activations, DType::f32,
                   {rows, e.decl.r});
    binder.declare(plan, &e.v, e.decl.module + ".lora_v", Category::temporaries, DType::f32,
                   {rows, e.decl.r});
    widest = std::max(widest, e.decl.in);
    drops = drops || e.decl.dropout > 0;
  }
  if ((drops || low_precision) && widest > 0)
    binder.declare(plan, &input_, "lora.input", Category::temporaries, DType::f32, {rows, widest});
}

// The entry's place in the block product whose parameters hold its linear's weight; false where
// none does.
bool ModelAdapters::place_in_block(Entry& e, const BlockProducts& products) const {
  const std::vector<ParamInfo>& list = params_.list();
  for (size_t s = 0; s < products.size(); ++s) {
    const ProductParams& p = products[s];
    if (p.first < 0 || e.decl.linear < p.first || e.decl.linear > p.last) continue;
    const int64_t offset =
        list[static_cast<size_t>(e.decl.linear)].offset - list[static_cast<size_t>(p.first)].offset;
    BRISK_CHECK(!e.decl.fan_in_fan_out || offset == 0, "LoRA on ", e.decl.module,
                ": a part of a transposed product is not built yet");
    e.site = static_cast<ProductSite>(s);
    e.at = offset / e.in;
    return true;
  }
  return false;
}

void ModelAdapters::place(const std::function<BlockProducts(int layer)>& block,
                          const LayerProducts& products) {
  for (Entry& e : entries_) {
    if (place_in_block(e, block(e.decl.layer))) continue;
    const Tensor p = params_.weight(e.decl.linear);
    const auto* at = static_cast<const char*>(p.data());
    bool found = false;
    for (const auto& [site, t] : products(e.decl.layer)) {
      if (t.empty()) continue;
      const auto* first = static_cast<const char*>(t.data());
      if (at < first || at + p.bytes() > first + t.bytes()) continue;
      const int64_t offset = (at - first) / static_cast<int64_t>(sizeof(float));
      BRISK_CHECK(!e.decl.fan_in_fan_out || offset == 0, "LoRA on ", e.decl.module,
                  ": a part of a transposed product is not built yet");
      e.site = site;
      e.at = offset / e.in;
      found = true;
    }
    BRISK_CHECK(found, "internal error: LoRA on ", e.decl.module, ": no product of layer ",
                e.decl.layer, " reads its weight");
  }
}

bool ModelAdapters::on(int layer, ProductSite site) const {
  for (const Entry& e : entries_)
    if (e.decl.layer == layer && e.site == site) return true;
  return false;
}

RngKey ModelAdapters::dropout_key(const RngKey& key, const Entry& e, size_t i) {
  RngKey k = key;
  k.site = block_rng_site(e.decl.layer, kAdapterSite);
  // Each adapter's masks from its own range of the site's counter (a layer's adapters draw
  // apart, as PEFT's dropout modules do).
  k.first_element += static_cast<uint64_t>(i) << 40;
  return k;
}

Tensor ModelAdapters::input(Backend& be, size_t i, const Tensor& x, const RngKey* key) const {
  const Entry& e = entries_[i];
  const bool drops = key != nullptr && e.decl.dropout > 0;
  if (!drops && x.dtype() == DType::f32) return x;
  BRISK_CHECK(!input_.empty(), "internal error: no buffer planned for a LoRA input");
  const Tensor in = rows_of(input_, rows_in(x, e.in), e.in);
  be.cast(x, in);
  if (drops) be.dropout_forward(in, e.decl.dropout, dropout_key(*key, e, i), in);
  return in;
}

void ModelAdapters::forward(Backend& be, int layer, ProductSite site, const Tensor& x,
                            const Tensor& y, const RngKey* key) const {
  for (size_t i = 0; i < entries_.size(); ++i) {
    const Entry& e = entries_[i];
    if (e.decl.layer != layer || e.site != site) continue;
    const Tensor u = rows_of(e.u, rows_in(x, e.in), e.decl.r);
    be.lora_forward(input(be, i, x, key), params_.weight(e.a), params_.weight(e.b), e.decl.scale, u,
                    y, e.at);
  }
}

void ModelAdapters::backward_weights(Backend& be, int layer, ProductSite site, const Tensor& x,
                                     const Tensor& dy, const RngKey* key) const {
  for (size_t i = 0; i < entries_.size(); ++i) {
    const Entry& e = entries_[i];
    if (e.decl.layer != layer || e.site != site) continue;
    const int64_t rows = rows_in(x, e.in);
    be.lora_backward(input(be, i, x, key), params_.weight(e.a), params_.weight(e.b), e.decl.scale,
                     rows_of(e.u, rows, e.decl.r), dy, e.at, rows_of(e.v, rows, e.decl.r),
                     params_.grad(e.a), params_.grad(e.b), Tensor(), true);
  }
}

// dx += v A: the input gradient of a product of v by A (out_in: A is [r, in]), which reads no x
// when it computes no weight gradient (dx stands in for it, of x's shape). With dropout, v A
// goes through the entry's mask first (in the input buffer), then adds to dx.
void ModelAdapters::backward_input(Backend& be, int layer, ProductSite site, const Tensor& dx,
                                   const RngKey* key) const {
  for (size_t i = 0; i < entries_.size(); ++i) {
    const Entry& e = entries_[i];
    if (e.decl.layer != layer || e.site != site) continue;
    const int64_t rows = rows_in(dx, e.in);
    const Tensor v = rows_of(e.v, rows, e.decl.r);
    if (key == nullptr || e.decl.dropout == 0) {
      be.linear_backward(dx, params_.weight(e.a), v, WeightLayout::out_in, dx, true, Tensor(),
                         Tensor(), false);
      continue;
    }
    const Tensor in = rows_of(input_, rows, e.in);
    be.linear_backward(in, params_.weight(e.a), v, WeightLayout::out_in, in, false, Tensor(),
                       Tensor(), false);
    be.dropout_backward(in, e.decl.dropout, dropout_key(*key, e, i), in);
    be.add_inplace(dx, in);
  }
}

}  // namespace brisk
