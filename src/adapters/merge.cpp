#include "adapters/merge.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>

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

// W + scale B A, in float32, rounded to W's dtype as PEFT merges on the CPU (the update cast to
// the weight's dtype, then added in it).
std::vector<char> merged_bytes(const Tensor& w, const Adapted& m, double scale,
                               const std::string& name) {
  const std::vector<float> a = as_f32(*m.a, name + " lora_A"), b = as_f32(*m.b, name + " lora_B");
  std::vector<float> v = as_f32(w, name);
  const int64_t r = m.a->dim(0), in = m.linear.in, out = m.linear.out;
  const bool round16 = w.dtype() == DType::bf16;
  BRISK_CHECK(w.dtype() == DType::f32 || round16, name, ": a ", dtype_name(w.dtype()),
              " weight; brisk merges float32 and bf16 weights");
  for (int64_t o = 0; o < out; ++o)
    for (int64_t i = 0; i < in; ++i) {
      double delta = 0;
      for (int64_t j = 0; j < r; ++j)
        delta += static_cast<double>(b[o * r + j]) * static_cast<double>(a[j * in + i]);
      const auto d = static_cast<float>(scale * delta);
      float& x = v[m.linear.fan_in_fan_out ? i * out + o : o * in + i];
      x = round16 ? bf16_to_float(float_to_bf16(x + bf16_to_float(float_to_bf16(d)))) : x + d;
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
    BRISK_CHECK(m.a->shape() == Shape({c.r, l.in}) && m.b->shape() == Shape({l.out, c.r}), f.path(),
                ": ", l.module, "'s lora_A ", m.a->shape().str(), " and lora_B ",
                m.b->shape().str(), " do not fit its ", l.in, " inputs, ", l.out,
                " outputs and rank ", c.r, " (an adapter of another model?)");
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

// Merging the experts' fused weights' adapters (target_parameters) into a model's files is not
// built yet.
void refuse_expert_adapters(const LoraConfig& c, const std::string& option) {
  BRISK_CHECK(c.target_parameters.empty(), option,
              ": the adapter adapts a mixture's experts (target_parameters); merging it into "
              "the base's files is not built yet: evaluate or generate with "
              "--adapter_name_or_path instead");
}

// An experts' adapter into the model's fused weights `w` [E, out, in] (float32, host): each
// W_e += scale B_e A_e, with PEFT's A [E r, in] and B [out, r E] (B_e's column k at k E + e).
void merge_experts(const ExpertWeightsDecl& d, const std::vector<float>& a,
                   const std::vector<float>& b, int64_t r, double scale, std::vector<float>& w) {
  const int64_t E = d.experts, in = d.in, out = d.out;
  for (int64_t e = 0; e < E; ++e)
    for (int64_t o = 0; o < out; ++o)
      for (int64_t i = 0; i < in; ++i) {
        double delta = 0;
        for (int64_t k = 0; k < r; ++k)
          delta += static_cast<double>(b[(o * r + k) * E + e]) *
                   static_cast<double>(a[(e * r + k) * in + i]);
        w[(e * out + o) * in + i] += static_cast<float>(scale * delta);
      }
}

// The adapter's expert targets merged into the model's weights in place.
void merge_experts_into(Backend& be, const Model& model, const LoraConfig& c,
                        const std::vector<ExpertTarget>& targets, const SafetensorsFile& f) {
  const ParameterSet& ps = model.params();
  for (const ExpertTarget& t : targets) {
    const ExpertWeightsDecl& d = t.weights;
    const std::string key = kPeftPrefix + t.module;
    BRISK_CHECK(f.has(key + ".lora_A.weight") && f.has(key + ".lora_B.weight"), f.path(),
                ": no lora_A/lora_B weights for ", d.name, ", which adapter_config.json targets");
    const Tensor& a = f.get(key + ".lora_A.weight");
    const Tensor& b = f.get(key + ".lora_B.weight");
    BRISK_CHECK(
        a.shape() == Shape({d.experts * c.r, d.in}) && b.shape() == Shape({d.out, c.r * d.experts}),
        f.path(), ": ", d.name, "'s lora_A ", a.shape().str(), " and lora_B ", b.shape().str(),
        " do not fit its ", d.experts, " experts of ", d.in, " inputs, ", d.out,
        " outputs and rank ", c.r, " (an adapter of another model?)");
    const Tensor w = ps.weight_span(d.first, d.last, Shape{d.experts, d.out, d.in});
    std::vector<float> host(static_cast<size_t>(w.numel()));
    be.download(w, Tensor(host.data(), w.shape(), DType::f32, Device::cpu));
    merge_experts(d, as_f32(a, key + " lora_A"), as_f32(b, key + " lora_B"), c.r, c.scale(), host);
    be.upload(Tensor(host.data(), w.shape(), DType::f32, Device::cpu), w);
  }
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
  refuse_expert_adapters(c, "--adapter_name_or_path");
  const ModelConfig config = resolve_config(args.model_name_or_path);
  const LoraTargets targets = lora_targets(Model::create(config)->linears(), c, config.type_name());
  const SafetensorsFile f((adapter / "adapter_model.safetensors").string());
  const std::map<std::string, Adapted> adapted = adapted_linears(targets, c, f);
  const std::string weights = WeightFiles::find_in_folder(args.model_name_or_path);
  BRISK_CHECK(!weights.empty(), "'", args.model_name_or_path, "' holds no model.safetensors");
  const WeightFiles base(weights);
  for (const auto& [name, m] : adapted)
    BRISK_CHECK(!base.bnb_4bit(name), "--model_name_or_path: '", name,
                "' is saved 4-bit; merge into the full-precision base the 4-bit one was "
                "quantized from (as PEFT users reload it in bf16 before merge_and_unload)");
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
    StreamedTensor e{name, src.dtype(), src.shape(), nullptr};
    if (it == adapted.end()) {
      e.read = [&src](size_t offset, size_t bytes, void* dst) {
        std::memcpy(dst, static_cast<const char*>(src.data()) + offset, bytes);
      };
    } else {
      const Adapted& m = it->second;
      const double scale = c.scale();
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
  const std::vector<ExpertTarget> experts = expert_targets(model.expert_weights(), c);
  const SafetensorsFile f(adapter_weights_path(folder, option));
  const ParameterSet& ps = model.params();
  merge_experts_into(be, model, c, experts, f);
  for (const auto& [name, m] : adapted_linears(targets, c, f, experts)) {
    const Tensor& w = ps.weight(m.linear.param);
    BRISK_CHECK(w.dtype() == DType::f32, "internal error: ", name, " is not float32");
    std::vector<float> host(static_cast<size_t>(w.numel()));
    const Tensor staged(host.data(), w.shape(), DType::f32, Device::cpu);
    be.download(w, staged);
    std::vector<char> merged = merged_bytes(staged, m, c.scale(), name);
    be.upload(Tensor(merged.data(), w.shape(), DType::f32, Device::cpu), w);
  }
  for (size_t i = 0; i < ps.list().size(); ++i) {
    const ParamInfo& p = ps.list()[i];
    if (saved_copy(p.name, c, f) != nullptr)
      load_adapter_tensor(be, f, kPeftPrefix + p.name, ps.weight(static_cast<int>(i)));
  }
}

}  // namespace brisk
