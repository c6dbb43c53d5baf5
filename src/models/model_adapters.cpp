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
}  // namespace

void ModelAdapters::declare(MemoryPlan& plan, BufferBinder& binder, int64_t rows) {
  for (Entry& e : entries_) {
    binder.declare(plan, &e.u, e.decl.module + ".lora_u", Category::activations, DType::f32,
                   {rows, e.decl.r});
    binder.declare(plan, &e.v, e.decl.module + ".lora_v", Category::temporaries, DType::f32,
                   {rows, e.decl.r});
  }
}

void ModelAdapters::place(const std::function<BlockParams(int)>& layer_weights) {
  for (Entry& e : entries_) {
    const BlockParams w = layer_weights(e.decl.layer);
    const Tensor p = params_.weight(e.decl.linear);
    const auto* at = static_cast<const char*>(p.data());
    bool found = false;
    const std::pair<ProductSite, const Tensor*> sites[] = {{ProductSite::qkv, &w.qkv_w},
                                                           {ProductSite::proj, &w.proj_w},
                                                           {ProductSite::fc, &w.fc_w},
                                                           {ProductSite::out, &w.out_w}};
    for (const auto& [site, t] : sites) {
      if (t->empty()) continue;
      const auto* first = static_cast<const char*>(t->data());
      if (at < first || at + p.bytes() > first + t->bytes()) continue;
      const int64_t offset = (at - first) / static_cast<int64_t>(sizeof(float));
      BRISK_CHECK(!e.decl.fan_in_fan_out || offset == 0, "LoRA on ", e.decl.module,
                  ": a part of a transposed product is not built yet");
      e.site = site;
      e.at = offset / e.decl.in;
      found = true;
    }
    BRISK_CHECK(found, "LoRA on ", e.decl.module, ": it is no product of a block's");
  }
}

bool ModelAdapters::on(int layer, ProductSite site) const {
  for (const Entry& e : entries_)
    if (e.decl.layer == layer && e.site == site) return true;
  return false;
}

void ModelAdapters::forward(Backend& be, int layer, ProductSite site, const Tensor& x,
                            const Tensor& y) const {
  for (const Entry& e : entries_) {
    if (e.decl.layer != layer || e.site != site) continue;
    const Tensor u = rows_of(e.u, rows_in(x, e.decl.in), e.decl.r);
    be.lora_forward(x, params_.weight(e.a), params_.weight(e.b), e.decl.scale, u, y, e.at);
  }
}

void ModelAdapters::backward_weights(Backend& be, int layer, ProductSite site, const Tensor& x,
                                     const Tensor& dy) const {
  for (const Entry& e : entries_) {
    if (e.decl.layer != layer || e.site != site) continue;
    const int64_t rows = rows_in(x, e.decl.in);
    be.lora_backward(x, params_.weight(e.a), params_.weight(e.b), e.decl.scale,
                     rows_of(e.u, rows, e.decl.r), dy, e.at, rows_of(e.v, rows, e.decl.r),
                     params_.grad(e.a), params_.grad(e.b), Tensor(), true);
  }
}

// dx += v A: the input gradient of a product of v by A (out_in: A is [r, in]), which reads no x
// when it computes no weight gradient (dx stands in for it, of x's shape).
void ModelAdapters::backward_input(Backend& be, int layer, ProductSite site,
                                   const Tensor& dx) const {
  for (const Entry& e : entries_) {
    if (e.decl.layer != layer || e.site != site) continue;
    const int64_t rows = rows_in(dx, e.decl.in);
    be.linear_backward(dx, params_.weight(e.a), rows_of(e.v, rows, e.decl.r), WeightLayout::out_in,
                       dx, true, Tensor(), Tensor(), false);
  }
}

}  // namespace brisk
