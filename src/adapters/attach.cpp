#include "adapters/attach.h"

#include <vector>

#include "core/error.h"

namespace brisk {

namespace {

constexpr const char* kPeftPrefix = "base_model.model.";

// PEFT's tensor `key` into the parameter `dst`, shapes checked.
void load_tensor(Backend& be, const SafetensorsFile& f, const std::string& key, const Tensor& dst) {
  const Tensor& src = f.get(key);
  BRISK_CHECK(src.shape() == dst.shape(), f.path(), ": ", key, " is ", src.shape().str(),
              " where the model's is ", dst.shape().str(), " (an adapter of another model?)");
  std::vector<float> host(static_cast<size_t>(src.numel()));
  const Tensor staged(host.data(), src.shape(), DType::f32, Device::cpu);
  copy_to_f32(src, staged, f.path() + ": " + key);
  be.upload(staged, dst);
}

}  // namespace

LoraTargets attach_lora(Model& model, const LoraConfig& c) {
  LoraTargets t = lora_targets(model.linears(), c, model.config().type_name());
  std::vector<AdapterDecl> decls;
  for (const LinearDecl& l : t.linears) {
    BRISK_CHECK(l.layer >= 0, "LoRA on ", l.module,
                ", a linear outside the blocks, is not built yet: leave it out of "
                "--lora_target_modules (or train it in full with --lora_modules_to_save)");
    decls.push_back(AdapterDecl{l.param, l.module, l.layer, l.in, l.out, c.r, l.fan_in_fan_out,
                                static_cast<float>(c.scale())});
  }
  model.add_adapters(decls,
                     [&](const ParamInfo& p) { return saved_in_full(p.name, c.modules_to_save); });
  return t;
}

void load_adapter(Backend& be, const Model& model, const SafetensorsFile& f) {
  const ModelAdapters* adapters = model.adapters();
  BRISK_CHECK(adapters != nullptr, "internal error: no adapters attached to load");
  const ParameterSet& ps = model.params();
  for (const ModelAdapters::Entry& e : adapters->entries()) {
    const std::string key = kPeftPrefix + e.decl.module;
    load_tensor(be, f, key + ".lora_A.weight", ps.weight(e.a));
    load_tensor(be, f, key + ".lora_B.weight", ps.weight(e.b));
  }
  for (size_t i = 0; i < ps.list().size(); ++i) {  // the modules to save, where the file has them
    const ParamInfo& p = ps.list()[i];
    if (!p.frozen && f.has(kPeftPrefix + p.name))
      load_tensor(be, f, kPeftPrefix + p.name, ps.weight(static_cast<int>(i)));
  }
}

}  // namespace brisk
