#include "adapters/quantized_base.h"

#include <algorithm>
#include <array>
#include <set>

#include "core/error.h"
#include "core/quantization.h"

namespace brisk {

namespace {
// The segment holding element `at` of the parameters (-1: none).
int segment_at(const std::vector<ElementRange>& segments, int64_t at) {
  for (size_t s = 0; s < segments.size(); ++s)
    if (at >= segments[s].offset && at < segments[s].offset + segments[s].count)
      return static_cast<int>(s);
  return -1;
}
}  // namespace

QuantizedBase::QuantizedBase(const Model& model, Quant4Options options)
    : model_(model), options_(options) {
  std::set<int> linear;  // the blocks' linears, as BitsAndBytesConfig quantizes them
  for (const LinearDecl& l : model.linears())
    if (l.layer >= 0 && !l.expert) linear.insert(l.param);
  const std::vector<ElementRange>& segments = model.param_segments();
  segments_.resize(segments.size());
  present_.assign(segments.size(), false);
  const std::vector<ParamInfo>& params = model.params().list();
  for (size_t i = 0; i < params.size(); ++i) {
    const ParamInfo& p = params[i];
    const int s = segment_at(segments, p.offset);
    // The blocks' segments only: the head's (0) and the embeddings' (last) stay resident.
    if (s <= 0 || s + 1 >= static_cast<int>(segments.size()) || p.shape.numel() == 0) continue;
    BRISK_CHECK(p.frozen, "--load_in_4bit: '", p.name,
                "' of a block is trained, but a 4-bit base is frozen (leave it out of "
                "--lora_modules_to_save)");
    Entry e;
    e.param = static_cast<int>(i);
    e.quantized = linear.count(e.param) > 0;
    if (e.quantized && options.kept_16bit()) {
      e.half_at = half_elements_;
      half_elements_ += p.shape.numel();
    } else if (e.quantized) {
      e.layout = {p.shape.numel(), options.blocksize, options.type, options.nested};
      e.packed_at = packed_bytes_;
      e.blocks_at = blocks_;
      e.nested_at = nested_blocks_;
      packed_bytes_ += e.layout.packed_bytes();
      blocks_ += e.layout.blocks();
      if (options.nested) nested_blocks_ += e.layout.nested_blocks();
    } else {
      e.kept_at = kept_elements_;
      kept_elements_ += p.shape.numel();
    }
    segments_[static_cast<size_t>(s)].push_back(e);
  }
}

void QuantizedBase::declare(MemoryPlan& plan, BufferBinder& binder) {
  auto add = [&](Tensor* t, const char* name, DType dtype, int64_t n) {
    binder.declare(plan, t, name, Category::weights, dtype, Shape{std::max<int64_t>(n, 1)});
  };
  if (options_.kept_16bit()) {
    add(&half_, options_.half == DType::bf16 ? "frozen.bf16" : "frozen.fp16", options_.half,
        half_elements_);
    add(&kept_, "frozen.kept", DType::f32, kept_elements_);
    return;
  }
  add(&packed_, "qlora.packed", DType::u8, packed_bytes_);
  if (options_.nested) {
    add(&qabsmax_, "qlora.absmax_codes", DType::u8, blocks_);
    add(&absmax2_, "qlora.nested_absmax", DType::f32, nested_blocks_);
    add(&code2_, "qlora.nested_map", DType::f32, 256);
  } else {
    add(&absmax_, "qlora.absmax", DType::f32, blocks_);
  }
  add(&kept_, "qlora.kept", DType::f32, kept_elements_);
}

void QuantizedBase::attach(Backend& be, Model& model) {
  BRISK_CHECK(&model == &model_, "internal error: a 4-bit store attached to another model");
  be_ = &be;
  if (options_.nested) {
    std::array<float, 256> map = dynamic_quant_map(true);
    be.upload(Tensor(map.data(), Shape{256}, DType::f32), code2_);
  }
  model.set_weight_slots(this);
}

Backend::Quant4Tensor QuantizedBase::view(const Entry& e) const {
  Backend::Quant4Tensor q;
  q.layout = e.layout;
  q.packed = element_range(packed_, e.packed_at, e.layout.packed_bytes());
  if (e.layout.nested) {
    q.qabsmax = element_range(qabsmax_, e.blocks_at, e.layout.blocks());
    q.absmax2 = element_range(absmax2_, e.nested_at, e.layout.nested_blocks());
    q.code2 = code2_;
    q.offset = e.offset;
  } else {
    q.absmax = element_range(absmax_, e.blocks_at, e.layout.blocks());
  }
  return q;
}

void QuantizedBase::filled(int segment) {
  BRISK_CHECK(be_ != nullptr, "internal error: a 4-bit store used before attach");
  const ParameterSet& ps = model_.params();
  for (Entry& e : segments_[static_cast<size_t>(segment)]) {
    const Tensor slot = ps.weight(e.param);
    if (!e.quantized) {
      be_->copy(slot, element_range(kept_, e.kept_at, slot.numel()));
      continue;
    }
    if (options_.kept_16bit()) {
      be_->cast(slot, element_range(half_, e.half_at, slot.numel()));
      continue;
    }
    std::vector<float> host(static_cast<size_t>(slot.numel()));
    be_->download(slot, Tensor(host.data(), slot.shape(), DType::f32));
    const std::string& name = ps.list()[static_cast<size_t>(e.param)].name;
    Quant4Host q = quantize_4bit(host.data(), e.layout, name.c_str());
    const Backend::Quant4Tensor v = view(e);
    be_->upload(Tensor(q.packed.data(), v.packed.shape(), DType::u8), v.packed);
    if (e.layout.nested) {
      be_->upload(Tensor(q.qabsmax.data(), v.qabsmax.shape(), DType::u8), v.qabsmax);
      be_->upload(Tensor(q.absmax2.data(), v.absmax2.shape(), DType::f32), v.absmax2);
      e.offset = q.offset;
    } else {
      be_->upload(Tensor(q.absmax.data(), v.absmax.shape(), DType::f32), v.absmax);
    }
  }
  // The slot holds the full-precision values: the passes read the dequantized ones.
  present_[static_cast<size_t>(segment)] = false;
}

void QuantizedBase::need(int segment) {
  const auto s = static_cast<size_t>(segment);
  if (segments_[s].empty() || present_[s]) return;
  const ParameterSet& ps = model_.params();
  for (const Entry& e : segments_[s]) {
    const Tensor slot = ps.weight(e.param);
    if (e.quantized && options_.kept_16bit())
      be_->cast(element_range(half_, e.half_at, slot.numel()), slot);
    else if (e.quantized)
      be_->dequantize_4bit(view(e), slot);
    else
      be_->copy(element_range(kept_, e.kept_at, slot.numel()), slot);
  }
  const SegmentLayout& layout = model_.weight_layout();
  for (size_t t = 0; t < present_.size(); ++t)
    if (t != s && layout.overlap(segment, static_cast<int>(t))) present_[t] = false;
  present_[s] = true;
}

int64_t QuantizedBase::quantized_params() const {
  int64_t n = 0;
  for (const auto& s : segments_)
    n += std::count_if(s.begin(), s.end(), [](const Entry& e) { return e.quantized; });
  return n;
}

int64_t QuantizedBase::quantized_elements() const {
  int64_t n = 0;
  for (const auto& s : segments_)
    for (const Entry& e : s)
      if (e.quantized) n += model_.params().list()[static_cast<size_t>(e.param)].shape.numel();
  return n;
}

}  // namespace brisk
