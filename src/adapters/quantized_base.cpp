#include "adapters/quantized_base.h"

#include <algorithm>
#include <array>
#include <set>

#include "backend/workspace.h"
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
  std::set<int> linear, transposed;  // the blocks' linears, as BitsAndBytesConfig quantizes them
  for (const LinearDecl& l : model.linears())
    if (l.layer >= 0 && !l.expert && !l.router) {
      linear.insert(l.param);
      if (l.fan_in_fan_out) transposed.insert(l.param);
    }
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
      if (transposed.count(e.param) && p.shape.rank() == 2) e.transposed_cols = p.shape[0];
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
  if (!options.kept_16bit()) find_direct_products();
}

bool QuantizedBase::direct_product(int segment, const ProductParams& p, Product& out) const {
  if (p.first < 0) return false;
  const std::vector<Entry>& entries = segments_[static_cast<size_t>(segment)];
  const std::vector<ParamInfo>& params = model_.params().list();
  for (int param = p.first; param <= p.last; ++param) {
    const auto it = std::find_if(entries.begin(), entries.end(),
                                 [&](const Entry& e) { return e.param == param; });
    const Shape& shape = params[static_cast<size_t>(param)].shape;
    if (it == entries.end() || !it->quantized || shape.rank() != 2) return false;
    const int64_t cols = it->transposed_cols ? it->transposed_cols : shape[1];
    if (out.cols != 0 && out.cols != cols) return false;
    out.cols = cols;
    out.entries.emplace_back(segment, static_cast<int>(it - entries.begin()));
  }
  return true;
}

void QuantizedBase::find_direct_products() {
  const int64_t first = model_.config().first_layer(), end = model_.config().end_layer();
  const std::vector<ParamInfo>& params = model_.params().list();
  for (int64_t l = first; l < end; ++l) {
    const BlockProducts products = model_.layer_products(static_cast<int>(l));
    for (size_t s = 0; s < products.size(); ++s) {
      Product p;
      p.layer = static_cast<int>(l);
      p.site = static_cast<int>(s);
      if (!direct_product(static_cast<int>(end - l), products[s], p)) continue;
      int64_t elements = 0;
      for (const auto& [segment, i] : p.entries) {
        Entry& e = segments_[static_cast<size_t>(segment)][static_cast<size_t>(i)];
        e.direct = true;
        elements += params[static_cast<size_t>(e.param)].shape.numel();
      }
      largest_ = std::max(largest_, elements);
      largest_blocked_ =
          std::max(largest_blocked_, cpu_blocked_elements(elements / p.cols, p.cols));
      products_.push_back(std::move(p));
    }
  }
  find_holes();
}

// Every block's directly multiplied parameters at the same places from its start (the slots'
// holes), else none multiplied directly.
void QuantizedBase::find_holes() {
  const std::vector<ElementRange>& segments = model_.param_segments();
  const std::vector<ParamInfo>& params = model_.params().list();
  std::vector<std::vector<ElementRange>> blocks;
  for (size_t s = 1; s + 1 < segments.size(); ++s) {
    std::vector<ElementRange>& holes = blocks.emplace_back();
    for (const Entry& e : segments_[s]) {
      if (!e.direct) continue;
      const ParamInfo& p = params[static_cast<size_t>(e.param)];
      const int64_t at = p.offset - segments[s].offset, n = p.shape.numel();
      if (!holes.empty() && holes.back().offset + holes.back().count == at)
        holes.back().count += n;
      else
        holes.push_back({at, n});
    }
  }
  const bool alike = !blocks.empty() && std::all_of(blocks.begin(), blocks.end(),
                                                    [&](auto& h) { return h == blocks.front(); });
  if (alike) {
    holes_ = blocks.front();
    return;
  }
  for (auto& segment : segments_)
    for (Entry& e : segment) e.direct = false;
  products_.clear();
  largest_ = largest_blocked_ = 0;
}

void QuantizedBase::refresh(Product& p) const {
  p.matrix.parts.clear();
  p.matrix.cols = p.cols;
  p.matrix.fp16 = options_.round_to_fp16;
  for (const auto& [segment, i] : p.entries) {
    const Entry& e = segments_[static_cast<size_t>(segment)][static_cast<size_t>(i)];
    Backend::Quant4Tensor q = view(e);
    q.transposed_cols = 0;  // kept as nn.Linear's [out, in], as the product reads it
    p.matrix.parts.push_back({q, e.dtype});
  }
}

const Backend::Quant4Matrix* QuantizedBase::matrix(int layer, int site) const {
  for (const Product& p : products_)
    if (p.layer == layer && p.site == site) return p.matrix.parts.empty() ? nullptr : &p.matrix;
  return nullptr;
}

void QuantizedBase::filled_param(int param) {
  for (size_t s = 0; s < segments_.size(); ++s)
    for (size_t i = 0; i < segments_[s].size(); ++i) {
      Entry& e = segments_[s][i];
      if (e.param != param || !e.direct) continue;
      if (!adopted(e)) quantize(e, model_.params().weight(param));
      const std::pair<int, int> at{static_cast<int>(s), static_cast<int>(i)};
      for (Product& p : products_)  // its product's matrix: the entry's new state and dtype
        if (std::find(p.entries.begin(), p.entries.end(), at) != p.entries.end()) refresh(p);
      return;
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
  // Each directly multiplied parameter is written at the dequantization buffer, then kept.
  if (!products_.empty()) {
    const Tensor buffer = be.dequantized_buffer();
    model.set_outside_weights(Tensor(buffer.data(),
                                     Shape{static_cast<int64_t>(buffer.bytes() / sizeof(float))},
                                     DType::f32, buffer.device()));
  }
  for (Product& p : products_) refresh(p);
}

Backend::Quant4Tensor QuantizedBase::view(const Entry& e) const {
  Backend::Quant4Tensor q;
  q.layout = e.layout;
  q.transposed_cols = e.transposed_cols;
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
    if (e.direct) continue;  // kept as it was written (filled_param)
    const Tensor slot = ps.weight(e.param);
    if (!e.quantized) {
      be_->copy(slot, element_range(kept_, e.kept_at, slot.numel()));
      continue;
    }
    if (options_.kept_16bit()) {
      be_->cast(slot, element_range(half_, e.half_at, slot.numel()));
      continue;
    }
    if (!adopted(e)) quantize(e, slot);
  }
  // The slot holds the full-precision values: the passes read the dequantized ones.
  present_[static_cast<size_t>(segment)] = false;
}

namespace {
// [rows, cols] values transposed into out ([cols, rows]).
void transpose_into(const std::vector<float>& in, int64_t rows, int64_t cols, float* out) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) out[c * rows + r] = in[static_cast<size_t>(r * cols + c)];
}
}  // namespace

void QuantizedBase::quantize(Entry& e, const Tensor& slot) {
  e.dtype = DType::f32;
  std::vector<float> host(static_cast<size_t>(slot.numel()));
  be_->download(slot, Tensor(host.data(), slot.shape(), DType::f32));
  if (e.transposed_cols) {  // [in, out] as nn.Linear's [out, in]
    std::vector<float> turned(host.size());
    transpose_into(host, e.transposed_cols, slot.numel() / e.transposed_cols, turned.data());
    host.swap(turned);
  }
  const std::string& name = model_.params().list()[static_cast<size_t>(e.param)].name;
  const Quant4Host q = quantize_4bit(host.data(), e.layout, name.c_str());
  upload(e, {q.packed.data(),
             e.layout.nested ? static_cast<const void*>(q.qabsmax.data())
                             : static_cast<const void*>(q.absmax.data()),
             q.absmax2.data(), q.offset});
}

bool QuantizedBase::adopted(Entry& e) {
  if (!source_) return false;
  const std::string key = model_.source_name(*source_, static_cast<size_t>(e.param));
  const Bnb4bitWeight* w = key.empty() ? nullptr : source_->bnb_4bit(key);
  if (!w) return false;
  const Quant4Layout& l = w->layout;
  const char* type = l.type == Quant4Type::nf4 ? "nf4" : "fp4";
  BRISK_CHECK(l.blocksize == options_.blocksize, "--load_in_4bit: '", key,
              "' is saved 4-bit in blocks of ", l.blocksize,
              "; brisk's 4-bit store holds blocks of ", options_.blocksize,
              " (leave out --load_in_4bit to train on its dequantized values)");
  BRISK_CHECK(l.type == options_.type && l.nested == options_.nested, "--load_in_4bit: '", key,
              "' is saved 4-bit as ", type, l.nested ? " with" : " without",
              " nested absmaxes: train it as saved with --bnb_4bit_quant_type ", type,
              l.nested ? " --use_bnb_nested_quant" : " and without --use_bnb_nested_quant");
  BRISK_CHECK(l.numel == e.layout.numel, "internal error: '", key, "' holds ", l.numel,
              " values where the store plans ", e.layout.numel);
  const SafetensorsFile& f = *w->file;
  upload(e, {f.get(key).data(), f.get(key + ".absmax").data(),
             l.nested ? f.get(key + ".nested_absmax").f32() : nullptr, w->offset});
  e.dtype = w->dtype;
  return true;
}

void QuantizedBase::upload(Entry& e, const HostState& s) {
  const Backend::Quant4Tensor v = view(e);
  auto put = [&](const void* p, const Tensor& dst) {
    be_->upload(Tensor(const_cast<void*>(p), dst.shape(), dst.dtype()), dst);
  };
  put(s.packed, v.packed);
  if (e.layout.nested) {
    put(s.absmax, v.qabsmax);
    put(s.absmax2, v.absmax2);
    e.offset = s.offset;
  } else {
    put(s.absmax, v.absmax);
  }
}

// As bitsandbytes' matmul_4bit: dequantized into the state's dtype, then into the compute one.
void QuantizedBase::dequantize(const Entry& e, const Tensor& slot) {
  be_->dequantize_4bit(view(e), slot);
  if (e.dtype != DType::f32) be_->round_to(e.dtype, slot, slot);
  if (options_.round_to_fp16) be_->round_to(DType::f16, slot, slot);
}

void QuantizedBase::need(int segment) {
  const auto s = static_cast<size_t>(segment);
  if (segments_[s].empty() || present_[s]) return;
  const ParameterSet& ps = model_.params();
  for (const Entry& e : segments_[s]) {
    if (e.direct) continue;  // its product reads it where it is kept
    const Tensor slot = ps.weight(e.param);
    if (e.quantized && options_.kept_16bit())
      be_->cast(element_range(half_, e.half_at, slot.numel()), slot);
    else if (e.quantized)
      dequantize(e, slot);
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
