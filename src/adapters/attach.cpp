#include "adapters/attach.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <memory>
#include <set>
#include <vector>

#include "core/error.h"
#include "core/json_file.h"

namespace brisk {

namespace {

constexpr const char* kPeftPrefix = "base_model.model.";

// The trained parameters must lie in one run (the optimizer steps them as one): a module to save
// declared before the blocks' parameters (an embedding) breaks it.
void check_trained_together(const Model& model) {
  const std::vector<ParamInfo>& list = model.params().list();
  int first = -1;
  for (size_t i = 0; i < list.size(); ++i) {
    if (!list[i].frozen && first < 0) first = static_cast<int>(i);
    if (first >= 0 && list[i].frozen)
      BRISK_FAIL("--lora_modules_to_save: '", list[static_cast<size_t>(first)].name,
                 "' lies before the blocks' frozen parameters; training it in full beside the "
                 "adapters is not built yet (only the modules after the blocks, such as a "
                 "classifier or score head)");
  }
}

// Tensor parallelism: a row-parallel linear's adapter reads its rank's columns of the input, whose
// dropout masks would be drawn apart from one process's; not built.
void check_split_dropout(const Model& model) {
  for (const ModelAdapters::Entry& e : model.adapters()->entries())
    BRISK_CHECK(
        e.decl.dropout == 0 || !model.params().list()[static_cast<size_t>(e.a)].split.split(),
        "--lora_dropout ", e.decl.dropout, " on ", e.decl.module,
        " (a row-parallel linear under --tp_size) is not built yet: give --lora_dropout 0, "
        "or leave it out of --lora_target_modules");
}

// An expert adapter's B: brisk's [E out, r] (expert after expert) and PEFT's lora_B [out, r E]
// (B_e's column k at column k E + e), one into the other.
struct ExpertB {
  int64_t experts, out, r;
  int64_t peft_at(int64_t e, int64_t o, int64_t k) const {
    return o * r * experts + k * experts + e;
  }
  int64_t at(int64_t e, int64_t o, int64_t k) const { return (e * out + o) * r + k; }
  void to_peft(const float* b, float* peft) const {
    for (int64_t e = 0; e < experts; ++e)
      for (int64_t o = 0; o < out; ++o)
        for (int64_t k = 0; k < r; ++k) peft[peft_at(e, o, k)] = b[at(e, o, k)];
  }
  void from_peft(const float* peft, float* b) const {
    for (int64_t e = 0; e < experts; ++e)
      for (int64_t o = 0; o < out; ++o)
        for (int64_t k = 0; k < r; ++k) b[at(e, o, k)] = peft[peft_at(e, o, k)];
  }
};

// The expert adapter whose B is parameter i, if one is.
const ModelAdapters::ExpertEntry* expert_b(const Model& model, int i) {
  if (const ModelAdapters* a = model.adapters())
    for (const ModelAdapters::ExpertEntry& e : a->experts())
      if (e.b == i) return &e;
  return nullptr;
}

ExpertB expert_b_layout(const ModelAdapters::ExpertEntry& e) {
  return {e.decl.weights.experts, e.decl.weights.out, e.decl.r};
}

}  // namespace

LoraTargets attach_lora(Model& model, const LoraConfig& c) {
  LoraTargets t = lora_targets(model.linears(), c, model.config().type_name());
  std::vector<AdapterDecl> decls;
  for (const LinearDecl& l : t.linears) {
    BRISK_CHECK(l.layer >= 0, "LoRA on ", l.module,
                ", a linear outside the blocks, is not built yet: leave it out of "
                "--lora_target_modules (or train it in full with --lora_modules_to_save)");
    decls.push_back(AdapterDecl{l.param, l.module, l.layer, l.in, l.out, c.rank_of(l.module),
                                l.fan_in_fan_out, static_cast<float>(c.scale_of(l.module)),
                                static_cast<float>(c.dropout)});
  }
  std::vector<ExpertAdapterDecl> experts;
  for (const ExpertTarget& t : expert_targets(model.expert_weights(), c, t.routers))
    experts.push_back({t.weights, t.module, c.rank_of(t.weights.name),
                       static_cast<float>(c.scale_of(t.weights.name))});
  BRISK_CHECK(experts.empty() || model.config().tensor_ranks == 1,
              "--lora_target_parameters with --tp_size is not built yet: adapt the experts under "
              "data parallelism");
  model.add_adapters(decls, experts,
                     [&](const ParamInfo& p) { return saved_in_full(p.name, c.modules_to_save); });
  check_trained_together(model);
  check_split_dropout(model);
  return t;
}

LoraConfig read_adapter_folder(const std::string& folder, const std::string& option) {
  namespace fs = std::filesystem;
  BRISK_CHECK(fs::is_directory(folder), option, ": '", folder, "' is no folder");
  const std::string path = (fs::path(folder) / "adapter_config.json").string();
  BRISK_CHECK(fs::exists(path), option, ": '", folder,
              "' holds no adapter_config.json (is it a PEFT adapter folder?)");
  return read_adapter_config(read_json_file(path, "adapter config"), path);
}

std::string adapter_weights_path(const std::string& folder, const std::string& option) {
  const std::string path = (std::filesystem::path(folder) / "adapter_model.safetensors").string();
  BRISK_CHECK(std::filesystem::exists(path), option, ": '", folder,
              "' holds no adapter_model.safetensors");
  return path;
}

LoraConfig lora_for_task(LoraConfig c, const Model& model) {
  c = with_fused_experts(std::move(c), model.config().type_name());
  switch (model.config().task) {
    case ModelTask::sequence_classification:
      c.task_type = "SEQ_CLS";
      for (const char* head : {"classifier", "score"})
        if (std::find(c.modules_to_save.begin(), c.modules_to_save.end(), head) ==
            c.modules_to_save.end())
          c.modules_to_save.emplace_back(head);
      break;
    case ModelTask::causal_lm:
      c.task_type = "CAUSAL_LM";
      break;
    case ModelTask::masked_lm:
      c.task_type.clear();  // PEFT has none
      break;
  }
  return c;
}

LoraConfig saved_adapter_config(LoraConfig c, const Model& model, const std::string& base) {
  // PEFT's default targets are written as the names they stand for (the adapted modules' last
  // parts), as PEFT writes them.
  // So is all-linear beside the router and experts it reaches as parameters.
  const bool defaults = !c.all_linear && c.target_pattern.empty() && c.target_modules.empty() &&
                        c.target_parameters.empty();
  const bool converted = c.all_linear && !c.target_parameters.empty();
  std::set<std::string> names, routers;
  for (const LinearDecl& l : model.linears())
    if (l.router) routers.insert(l.module);
  c.fan_in_fan_out = false;
  if (const ModelAdapters* a = model.adapters())
    for (const ModelAdapters::Entry& e : a->entries()) {
      c.fan_in_fan_out = c.fan_in_fan_out || e.decl.fan_in_fan_out;
      if (!routers.count(e.decl.module))
        names.insert(e.decl.module.substr(e.decl.module.rfind('.') + 1));
    }
  if (defaults || converted) c.target_modules.assign(names.begin(), names.end());
  c.all_linear = c.all_linear && !converted;
  c.base_model_name_or_path = base;
  return c;
}

void save_adapter(const std::string& folder, const Model& model, const LoraConfig& c,
                  const TrainedReader& read) {
  const ParameterSet& ps = model.params();
  const ParameterSet::Run run = ps.trained_run();
  std::vector<StreamedTensor> tensors;
  for (int i = run.first; i < run.last; ++i) {
    const ParamInfo& p = ps.list()[static_cast<size_t>(i)];
    const ModelAdapters::ExpertEntry* e = expert_b(model, i);
    if (e == nullptr) {
      tensors.push_back({kPeftPrefix + p.name, DType::f32, p.full_shape(),
                         [&read, &p](size_t at, size_t n, void* dst) { read(p, at, n, dst); }});
      continue;
    }
    // An expert adapter's B in PEFT's layout: read whole (a few rank-r columns) and permuted.
    const ExpertB l = expert_b_layout(*e);
    auto peft = std::make_shared<std::vector<float>>();
    const int64_t n = p.shape.numel();
    tensors.push_back({kPeftPrefix + p.name, DType::f32, Shape{l.out, l.r * l.experts},
                       [&read, &p, l, peft, n](size_t at, size_t bytes, void* dst) {
                         if (peft->empty()) {
                           std::vector<float> b(static_cast<size_t>(n));
                           read(p, 0, b.size() * 4, b.data());
                           peft->resize(b.size());
                           l.to_peft(b.data(), peft->data());
                         }
                         std::memcpy(dst, reinterpret_cast<const char*>(peft->data()) + at, bytes);
                       }});
  }
  namespace fs = std::filesystem;
  write_streamed_safetensors((fs::path(folder) / "adapter_model.safetensors").string(), tensors,
                             {{"format", "pt"}});
  write_file_atomically((fs::path(folder) / "adapter_config.json").string(),
                        adapter_config_json(c).dump(2) + "\n");
}

Shape to_peft_layout(const Model& model, int i, const float* values, float* out) {
  const ParamInfo& p = model.params().list().at(static_cast<size_t>(i));
  const ModelAdapters::ExpertEntry* e = expert_b(model, i);
  if (e == nullptr) {
    std::copy_n(values, p.shape.numel(), out);
    return p.shape;
  }
  const ExpertB l = expert_b_layout(*e);
  l.to_peft(values, out);
  return Shape{l.out, l.r * l.experts};
}

void load_adapter(Backend& be, const Model& model, const SafetensorsFile& f) {
  const ModelAdapters* adapters = model.adapters();
  BRISK_CHECK(adapters != nullptr, "internal error: no adapters attached to load");
  const ParameterSet& ps = model.params();
  for (const ModelAdapters::Entry& e : adapters->entries()) {
    const std::string key = kPeftPrefix + e.decl.module;
    load_adapter_tensor(be, f, key + ".lora_A.weight", ps.list()[static_cast<size_t>(e.a)],
                        ps.weight(e.a));
    load_adapter_tensor(be, f, key + ".lora_B.weight", ps.list()[static_cast<size_t>(e.b)],
                        ps.weight(e.b));
  }
  for (const ModelAdapters::ExpertEntry& e : adapters->experts()) {
    const std::string key = kPeftPrefix + e.decl.module;
    load_adapter_tensor(be, f, key + ".lora_A.weight", ps.list()[static_cast<size_t>(e.a)],
                        ps.weight(e.a));
    const Tensor& src = f.get(key + ".lora_B.weight");
    const ExpertB l = expert_b_layout(e);
    BRISK_CHECK(src.shape() == Shape({l.out, l.r * l.experts}), f.path(), ": ", key,
                ".lora_B.weight is ", src.shape().str(), " where the model's is [", l.out, ", ",
                l.r * l.experts, "] (an adapter of another model?)");
    std::vector<float> peft(static_cast<size_t>(src.numel())), b(peft.size());
    copy_to_f32(src, Tensor(peft.data(), src.shape(), DType::f32, Device::cpu),
                f.path() + ": " + key);
    l.from_peft(peft.data(), b.data());
    be.upload(Tensor(b.data(), ps.weight(e.b).shape(), DType::f32, Device::cpu), ps.weight(e.b));
  }
  for (size_t i = 0; i < ps.list().size(); ++i) {  // the modules to save, where the file has them
    const ParamInfo& p = ps.list()[i];
    if (!p.frozen && f.has(kPeftPrefix + p.name) && !expert_b(model, static_cast<int>(i)))
      load_adapter_tensor(be, f, kPeftPrefix + p.name, p, ps.weight(static_cast<int>(i)));
  }
}

void load_adapter_tensor(Backend& be, const SafetensorsFile& f, const std::string& key,
                         const ParamInfo& p, const Tensor& dst) {
  const Tensor& src = f.get(key);
  BRISK_CHECK(src.shape() == p.full_shape(), f.path(), ": ", key, " is ", src.shape().str(),
              " where the model's is ", p.full_shape().str(), " (an adapter of another model?)");
  std::vector<float> full(static_cast<size_t>(src.numel())), host(static_cast<size_t>(dst.numel()));
  copy_to_f32(src, Tensor(full.data(), src.shape(), DType::f32, Device::cpu),
              f.path() + ": " + key);
  // A tensor-parallel share: its runs' places in the full tensor.
  for_each_split_run(p, 0, dst.numel(), [&](int64_t local, int64_t at, int64_t n) {
    std::copy_n(full.begin() + at, n, host.begin() + local);
  });
  be.upload(Tensor(host.data(), dst.shape(), DType::f32, Device::cpu), dst);
}

}  // namespace brisk
