#include "adapters/merge.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>

#include "adapters/attach.h"
#include "adapters/lora.h"
#include "core/checked.h"
#include "core/json_file.h"
#include "core/model_files.h"
#include "core/safetensors.h"
#include "core/weight_files.h"
#include "models/config.h"
#include "models/model.h"

namespace brisk {
namespace fs = std::filesystem;

namespace {

constexpr const char* kPeftPrefix = "base_model.model.";

// An adapted linear: its LoRA matrices in the adapter's file and how its weight is laid out.
struct Adapted {
  const Tensor* a = nullptr;  // [r, in]
  const Tensor* b = nullptr;  // [out, r]
  LinearDecl linear;
};

std::vector<float> as_f32(const Tensor& t, const std::string& what) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  copy_to_f32(t, Tensor(v.data(), t.shape(), DType::f32, Device::cpu), what);
  return v;
}

// w + update(element), in float32, rounded to w's dtype as PEFT merges on the CPU (the update
// cast to the weight's dtype, then added in it).
std::vector<char> plus_update(const Tensor& w, const std::string& name,
                              const std::function<double(int64_t)>& update) {
  std::vector<float> v = as_f32(w, name);
  const bool round16 = w.dtype() == DType::bf16;
  BRISK_CHECK(w.dtype() == DType::f32 || round16, name, ": a ", dtype_name(w.dtype()),
              " weight; brisk merges float32 and bf16 weights");
  for (size_t x = 0; x < v.size(); ++x) {
    const auto d = static_cast<float>(update(static_cast<int64_t>(x)));
    v[x] =
        round16 ? bf16_to_float(float_to_bf16(v[x] + bf16_to_float(float_to_bf16(d)))) : v[x] + d;
  }
  std::vector<char> bytes(static_cast<size_t>(w.bytes()));
  if (!round16) {
    std::memcpy(bytes.data(), v.data(), bytes.size());
  } else {
    auto* out16 = reinterpret_cast<uint16_t*>(bytes.data());
    for (size_t i = 0; i < v.size(); ++i) out16[i] = float_to_bf16(v[i]);
  }
  return bytes;
}

// W + scale B A of an adapted linear (its transpose for a Conv1D).
std::vector<char> merged_bytes(const Tensor& w, const Adapted& m, double scale,
                               const std::string& name) {
  const std::vector<float> a = as_f32(*m.a, name + " lora_A"), b = as_f32(*m.b, name + " lora_B");
  const int64_t r = m.a->dim(0), in = m.linear.in, out = m.linear.out;
  return plus_update(w, name, [&](int64_t x) {
    const int64_t o = m.linear.fan_in_fan_out ? x % out : x / in;
    const int64_t i = m.linear.fan_in_fan_out ? x / out : x % in;
    double delta = 0;
    for (int64_t j = 0; j < r; ++j)
      delta += static_cast<double>(b[o * r + j]) * static_cast<double>(a[j * in + i]);
    return scale * delta;
  });
}

// A tensor of the base that holds (part of) an adapted experts' weight: experts [first expert,
// + experts) of it, each its rows [row, row + rows) of the fused [out, in] (a file may hold the
// experts one by one, gate and up apart, or packed).
struct ExpertPart {
  const ExpertTarget* target = nullptr;
  int64_t expert = 0, experts = 1, row = 0, rows = 0;
};

// The adapter's experts' update of a part: scale B_e A_e's rows, from PEFT's A [E r, in] and B
// [out, r E] (B_e's column k at k E + e).
std::vector<char> merged_expert_bytes(const Tensor& w, const ExpertPart& p,
                                      const SafetensorsFile& f, const LoraConfig& c,
                                      const std::string& name) {
  const ExpertWeightsDecl& d = p.target->weights;
  const std::string key = kPeftPrefix + p.target->module;
  const std::vector<float> a = as_f32(f.get(key + ".lora_A.weight"), key + " lora_A");
  const std::vector<float> b = as_f32(f.get(key + ".lora_B.weight"), key + " lora_B");
  const int64_t E = d.experts, in = d.in, r = c.rank_of(d.name);
  const double scale = c.scale_of(d.name);
  BRISK_CHECK(w.numel() == p.experts * p.rows * in, "--model_name_or_path: '", name, "' is ",
              w.shape().str(), " where ", d.name, " takes ", p.experts, " x ", p.rows, " x ", in,
              " values");
  return plus_update(w, name, [&](int64_t x) {
    const int64_t e = p.expert + x / (p.rows * in), o = p.row + x / in % p.rows, i = x % in;
    double delta = 0;
    for (int64_t k = 0; k < r; ++k)
      delta += static_cast<double>(b[(o * r + k) * E + e]) *
               static_cast<double>(a[(e * r + k) * in + i]);
    return scale * delta;
  });
}

// The adapter's LoRA matrices for each target, checked against the linears' shapes and the
// config's rank; every lora_A/lora_B key of the file must belong to a target (a linear, or one
// of `experts`' modules).
std::map<std::string, Adapted> adapted_linears(const LoraTargets& targets, const LoraConfig& c,
                                               const SafetensorsFile& f,
                                               const std::vector<ExpertTarget>& experts = {}) {
  std::map<std::string, Adapted> out;
  for (const LinearDecl& l : targets.linears) {
    const std::string key = kPeftPrefix + l.module;
    BRISK_CHECK(f.has(key + ".lora_A.weight") && f.has(key + ".lora_B.weight"), f.path(),
                ": no lora_A/lora_B weights for ", l.module, ", which adapter_config.json targets");
    Adapted m{&f.get(key + ".lora_A.weight"), &f.get(key + ".lora_B.weight"), l};
    const int64_t r = c.rank_of(l.module);
    BRISK_CHECK(m.a->shape() == Shape({r, l.in}) && m.b->shape() == Shape({l.out, r}), f.path(),
                ": ", l.module, "'s lora_A ", m.a->shape().str(), " and lora_B ",
                m.b->shape().str(), " do not fit its ", l.in, " inputs, ", l.out,
                " outputs and rank ", r, " (an adapter of another model?)");
    out[l.module + ".weight"] = m;
  }
  for (const std::string& name : f.names()) {
    const bool lora =
        name.find(".lora_A.") != std::string::npos || name.find(".lora_B.") != std::string::npos;
    if (!lora) continue;
    const std::string module = name.substr(0, name.find(".lora_")).substr(std::strlen(kPeftPrefix));
    const bool expert = std::any_of(experts.begin(), experts.end(),
                                    [&](const ExpertTarget& t) { return t.module == module; });
    BRISK_CHECK(expert || out.count(module + ".weight"), f.path(), ": ", excerpt(name, 80),
                " adapts a module its adapter_config.json does not target");
  }
  return out;
}

// A saved module's tensor: the adapter's copy where the base's tensor belongs to a module to
// save and the adapter holds it.
const Tensor* saved_copy(const std::string& name, const LoraConfig& c, const SafetensorsFile& f) {
  if (!saved_in_full(name, c.modules_to_save)) return nullptr;
  const std::string key = kPeftPrefix + name;
  return f.has(key) ? &f.get(key) : nullptr;
}

// What save_pretrained and a tokenizer's save write beside the weights.
void copy_beside(const std::string& from, const std::string& to) {
  auto copy = [&](const char* name) {
    const fs::path p = fs::path(from) / name;
    if (fs::exists(p)) fs::copy_file(p, fs::path(to) / name, fs::copy_options::overwrite_existing);
  };
  for (const char* name : kConfigFiles) copy(name);
  for (const char* name : kTokenizerFiles) copy(name);
}

// The adapter's A and B of an experts' target, checked against its experts, shapes and rank.
void check_expert_adapter(const SafetensorsFile& f, const ExpertTarget& t, const LoraConfig& c) {
  const ExpertWeightsDecl& d = t.weights;
  const std::string key = kPeftPrefix + t.module;
  BRISK_CHECK(f.has(key + ".lora_A.weight") && f.has(key + ".lora_B.weight"), f.path(),
              ": no lora_A/lora_B weights for ", d.name, ", which adapter_config.json targets");
  const Tensor& a = f.get(key + ".lora_A.weight");
  const Tensor& b = f.get(key + ".lora_B.weight");
  const int64_t r = c.rank_of(d.name);
  BRISK_CHECK(
      a.shape() == Shape({d.experts * r, d.in}) && b.shape() == Shape({d.out, r * d.experts}),
      f.path(), ": ", d.name, "'s lora_A ", a.shape().str(), " and lora_B ", b.shape().str(),
      " do not fit its ", d.experts, " experts of ", d.in, " inputs, ", d.out, " outputs and rank ",
      r, " (an adapter of another model?)");
}

// The adapter's expert targets merged into the model's weights in place.
void merge_experts_into(Backend& be, const Model& model, const LoraConfig& c,
                        const std::vector<ExpertTarget>& targets, const SafetensorsFile& f) {
  const ParameterSet& ps = model.params();
  for (const ExpertTarget& t : targets) {
    check_expert_adapter(f, t, c);
    const ExpertWeightsDecl& d = t.weights;
    const Tensor w = ps.weight_span(d.first, d.last, Shape{d.experts, d.out, d.in});
    std::vector<float> host(static_cast<size_t>(w.numel()));
    const Tensor staged(host.data(), w.shape(), DType::f32, Device::cpu);
    be.download(w, staged);
    std::vector<char> merged =
        merged_expert_bytes(staged, ExpertPart{&t, 0, d.experts, 0, d.out}, f, c, d.name);
    be.upload(Tensor(merged.data(), w.shape(), DType::f32, Device::cpu), w);
  }
}

// The base's tensors that hold the adapter's expert targets, by name: packed [E, out, in] whole,
// or each expert's gate, up or down projection (the model's parameters, expert after expert,
// gate then up, name the tensors they load from).
std::map<std::string, ExpertPart> expert_parts(const Model& model, const WeightFiles& base,
                                               const std::vector<ExpertTarget>& targets) {
  std::map<std::string, ExpertPart> parts;
  for (const ExpertTarget& t : targets) {
    const ExpertWeightsDecl& d = t.weights;
    for (int j = d.first; j <= d.last; ++j) {
      const std::string src = model.source_name(base, static_cast<size_t>(j));
      BRISK_CHECK(!src.empty(), "--model_name_or_path: no tensor holds ",
                  model.params().list()[static_cast<size_t>(j)].name, " of ", d.name);
      BRISK_CHECK(!base.bnb_4bit(src), "--model_name_or_path: '", src,
                  "' is saved 4-bit; merge into the full-precision base");
      const int64_t k = j - d.first;
      parts[src] = base.get(src).shape().rank() == 3 ? ExpertPart{&t, 0, d.experts, 0, d.out}
                   : d.down                          ? ExpertPart{&t, k, 1, 0, d.out}
                            : ExpertPart{&t, k / 2, 1, k % 2 * d.out / 2, d.out / 2};
    }
  }
  return parts;
}

}  // namespace

void merge_adapter(const MergeArgs& args) {
  BRISK_CHECK(fs::is_directory(args.model_name_or_path), "--model_name_or_path '",
              args.model_name_or_path, "' is not a model folder");
  BRISK_CHECK(fs::is_directory(args.adapter_name_or_path), "--adapter_name_or_path '",
              args.adapter_name_or_path, "' is not an adapter folder");
  BRISK_CHECK(!args.output_dir.empty(), "--output_dir is needed");
  const fs::path adapter(args.adapter_name_or_path);
  const std::string config_path = (adapter / "adapter_config.json").string();
  const LoraConfig c =
      read_adapter_config(read_json_file(config_path, "adapter config"), config_path);
  const ModelConfig config = resolve_config(args.model_name_or_path);
  const std::unique_ptr<Model> model = Model::create(config);
  const LoraTargets targets = lora_targets(model->linears(), c, config.type_name());
  const std::vector<ExpertTarget> experts =
      expert_targets(model->expert_weights(), c, targets.routers);
  const SafetensorsFile f((adapter / "adapter_model.safetensors").string());
  std::map<std::string, Adapted> adapted = adapted_linears(targets, c, f, experts);
  for (const ExpertTarget& t : experts) check_expert_adapter(f, t, c);
  const std::string weights = WeightFiles::find_in_folder(args.model_name_or_path);
  BRISK_CHECK(!weights.empty(), "'", args.model_name_or_path, "' holds no model.safetensors");
  const WeightFiles base(weights);
  for (const LinearDecl& l : targets.linears) {  // (a router: transformers 4 names it apart)
    const std::string& name = model->params().list()[static_cast<size_t>(l.param)].name;
    BRISK_CHECK(base.has(name) || base.has(l.module + ".weight"), "--model_name_or_path: '",
                args.model_name_or_path, "' holds no ", name, ", which the adapter adapts");
    adapted.emplace(name, adapted.at(l.module + ".weight"));
  }
  for (const auto& [name, m] : adapted)
    BRISK_CHECK(!base.bnb_4bit(name), "--model_name_or_path: '", name,
                "' is saved 4-bit; merge into the full-precision base the 4-bit one was "
                "quantized from (as PEFT users reload it in bf16 before merge_and_unload)");
  const std::map<std::string, ExpertPart> parts = expert_parts(*model, base, experts);
  // One entry's merged bytes at a time, made when its first piece is read.
  auto current = std::make_shared<std::pair<std::string, std::vector<char>>>();
  std::vector<StreamedTensor> entries;
  for (const std::string& name : base.names()) {
    const Tensor& w = base.get(name);
    const Tensor* saved = saved_copy(name, c, f);
    const Tensor& src = saved ? *saved : w;
    BRISK_CHECK(src.shape() == w.shape(), f.path(), ": ", name, " is ", src.shape().str(),
                " where the base's is ", w.shape().str());
    const auto it = adapted.find(name);
    const auto part = parts.find(name);
    StreamedTensor e{name, src.dtype(), src.shape(), nullptr};
    if (part != parts.end()) {
      e.read = [&w, &p = part->second, &f, &c, name, current](size_t offset, size_t bytes,
                                                              void* dst) {
        if (current->first != name) *current = {name, merged_expert_bytes(w, p, f, c, name)};
        std::memcpy(dst, current->second.data() + offset, bytes);
      };
    } else if (it == adapted.end()) {
      e.read = [&src](size_t offset, size_t bytes, void* dst) {
        std::memcpy(dst, static_cast<const char*>(src.data()) + offset, bytes);
      };
    } else {
      const Adapted& m = it->second;
      const double scale = c.scale_of(m.linear.module);
      e.read = [&w, &m, scale, name, current](size_t offset, size_t bytes, void* dst) {
        if (current->first != name) *current = {name, merged_bytes(w, m, scale, name)};
        std::memcpy(dst, current->second.data() + offset, bytes);
      };
    }
    entries.push_back(std::move(e));
  }
  fs::create_directories(args.output_dir);
  write_streamed_safetensors((fs::path(args.output_dir) / "model.safetensors").string(), entries,
                             {{"format", "pt"}});
  copy_beside(args.model_name_or_path, args.output_dir);
}

void merge_adapter_into(Backend& be, const Model& model, const std::string& folder,
                        const std::string& option) {
  const LoraConfig c = read_adapter_folder(folder, option);
  const LoraTargets targets = lora_targets(model.linears(), c, model.config().type_name());
  const std::vector<ExpertTarget> experts =
      expert_targets(model.expert_weights(), c, targets.routers);
  const SafetensorsFile f(adapter_weights_path(folder, option));
  const ParameterSet& ps = model.params();
  merge_experts_into(be, model, c, experts, f);
  for (const auto& [name, m] : adapted_linears(targets, c, f, experts)) {
    const Tensor& w = ps.weight(m.linear.param);
    BRISK_CHECK(w.dtype() == DType::f32, "internal error: ", name, " is not float32");
    std::vector<float> host(static_cast<size_t>(w.numel()));
    const Tensor staged(host.data(), w.shape(), DType::f32, Device::cpu);
    be.download(w, staged);
    std::vector<char> merged = merged_bytes(staged, m, c.scale_of(m.linear.module), name);
    be.upload(Tensor(merged.data(), w.shape(), DType::f32, Device::cpu), w);
  }
  for (size_t i = 0; i < ps.list().size(); ++i) {
    const ParamInfo& p = ps.list()[i];
    if (saved_copy(p.name, c, f) != nullptr)
      load_adapter_tensor(be, f, kPeftPrefix + p.name, p, ps.weight(static_cast<int>(i)));
  }
}

}  // namespace brisk
