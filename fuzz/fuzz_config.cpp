// libFuzzer target: any bytes as a model's config.json, then the model built from it and its
// memory planned for one small batch: refused with brisk::Error or planned, never a crash.
#include "core/error.h"
#include "core/memory_plan.h"
#include "fuzz_support.h"
#include "models/config.h"
#include "models/model.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = brisk::fuzz::input_file(data, size, ".json");
  try {
    const brisk::ModelConfig config = brisk::load_config(path);
    // Sizes the fuzzer can reach in a few ms: bigger configs are valid but slow, not bugs.
    if (config.num_layers > 64 || config.vocab_size > (1 << 20) || config.hidden_size > 4096 ||
        config.moe.experts > 64)
      return 0;
    auto model = brisk::Model::create(config);
    brisk::MemoryPlan plan;
    model->plan(plan, {1, std::min<int64_t>(8, config.max_position_embeddings)}, {});
    plan.finalize();
  } catch (const brisk::Error&) {
  }
  return 0;
}
