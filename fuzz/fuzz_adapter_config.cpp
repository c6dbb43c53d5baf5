// libFuzzer target: any bytes as PEFT's adapter_config.json, read as brisk reads an adapter's
// config, its targets then resolved against a small model's linears and the config written
// back and read again.
#include "adapters/lora.h"
#include "core/error.h"
#include "core/json_file.h"
#include "fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = brisk::fuzz::input_file(data, size, ".json");
  std::vector<brisk::LinearDecl> linears;
  for (const char* m : {"model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.v_proj",
                        "model.layers.0.mlp.down_proj", "lm_head"}) {
    brisk::LinearDecl l;
    l.module = m;
    l.in = l.out = 8;
    linears.push_back(l);
  }
  linears.back().output = true;
  try {
    const brisk::LoraConfig c =
        brisk::read_adapter_config(brisk::read_json_file(path, "adapter config"), "fuzz");
    brisk::lora_targets(linears, c, "llama");
    brisk::read_adapter_config(brisk::adapter_config_json(c), "written");
  } catch (const brisk::Error&) {
  }
  return 0;
}
