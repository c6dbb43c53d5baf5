// libFuzzer target: the mixture-of-experts keys of a config.json (any bytes up to the first NUL)
// and the router's options (the 16 bytes after it: --router_z_loss_coef and
// --moe_capacity_factor as two doubles), then a small model of it trained one step on the CPU
// from its initial weights: routing, dispatch, the load-balancing and z losses and their
// gradients. Refused with brisk::Error or run, never a crash.
#include <algorithm>
#include <cstring>

#include "backend/backend.h"
#include "core/error.h"
#include "core/memory_plan.h"
#include "fuzz_support.h"
#include "models/config.h"
#include "models/model.h"

namespace {

// The config's bytes, and the two router options after the first NUL (0 where absent).
struct Input {
  std::string config;
  double z_loss = 0, capacity = 0;
};
Input split(const uint8_t* data, size_t size) {
  Input in;
  const auto* end = static_cast<const uint8_t*>(std::memchr(data, 0, size));
  const size_t n = end ? static_cast<size_t>(end - data) : size;
  in.config.assign(reinterpret_cast<const char*>(data), n);
  if (end && size - n - 1 >= 2 * sizeof(double)) {
    std::memcpy(&in.z_loss, end + 1, sizeof(double));
    std::memcpy(&in.capacity, end + 1 + sizeof(double), sizeof(double));
  }
  return in;
}

// One training step of batch 2 x T on token ids drawn from the vocabulary.
void one_step(const brisk::ModelConfig& config) {
  auto be = brisk::make_cpu_backend();
  auto model = brisk::Model::create(config);
  const int64_t T = std::min<int64_t>(8, config.max_position_embeddings);
  brisk::MemoryPlan plan;
  model->plan(plan, {2, T}, {});
  plan.finalize();
  brisk::Arena arena(plan, brisk::Device::cpu);
  model->bind(arena);
  model->init_weights(*be, 1);
  model->reset_batch();
  const brisk::Batch& b = model->batch();
  for (int64_t i = 0; i < b.input_ids.numel(); ++i)
    b.input_ids.i32()[i] = static_cast<int32_t>((i * 7919) % config.vocab_size);
  if (!b.labels.empty()) std::copy_n(b.input_ids.i32(), b.labels.numel(), b.labels.i32());
  brisk::StepOptions so;
  so.training = true;
  so.compute_grad = true;
  so.first_micro_batch = true;
  model->zero_grads(*be);
  model->forward(*be, so);
  model->backward(*be, so);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const Input in = split(data, size);
  const std::string path = brisk::fuzz::input_file(
      reinterpret_cast<const uint8_t*>(in.config.data()), in.config.size(), ".json");
  try {
    brisk::ModelConfig config = brisk::load_config(path);
    brisk::use_router_options(config, in.z_loss, in.capacity);
    // Sizes one step runs in a few ms: bigger configs are valid but slow, not bugs.
    if (config.num_layers > 4 || config.vocab_size > 512 || config.hidden_size > 64 ||
        config.intermediate_size > 256 || config.moe.experts > 16 || config.moe.inner > 256 ||
        config.moe.shared_inner > 256 || config.num_heads > 16)
      return 0;
    one_step(config);
  } catch (const brisk::Error&) {
  }
  return 0;
}
