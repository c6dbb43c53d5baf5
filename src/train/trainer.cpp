// The training loop over the synthetic dataset with AdamW, a linear schedule and clipping.
#include "train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <random>

#include "backend/backend.h"
#include "core/process_memory.h"
#include "data/synthetic.h"
#include "models/model.h"
#include "optim/adamw.h"

namespace brisk {

namespace {
void validate(const TrainOptions& o) {
  BRISK_CHECK(o.per_device_train_batch_size > 0,
              "per_device_train_batch_size must be positive, got ", o.per_device_train_batch_size);
  BRISK_CHECK(o.max_steps > 0 || o.num_train_epochs > 0,
              "num_train_epochs must be positive when max_steps is not set");
  BRISK_CHECK(o.learning_rate >= 0, "learning_rate must not be negative");
  BRISK_CHECK(o.weight_decay >= 0, "weight_decay must not be negative");
  BRISK_CHECK(o.adam_beta1 >= 0 && o.adam_beta1 < 1, "adam_beta1 must lie in [0, 1)");
  BRISK_CHECK(o.adam_beta2 >= 0 && o.adam_beta2 < 1, "adam_beta2 must lie in [0, 1)");
  BRISK_CHECK(o.adam_epsilon > 0, "adam_epsilon must be positive");
  BRISK_CHECK(o.logging_steps > 0, "logging_steps must be positive");
  BRISK_CHECK(o.dataset_size >= o.per_device_train_batch_size, "the dataset of ", o.dataset_size,
              " samples is smaller than one batch of ", o.per_device_train_batch_size);
}

// Scales gradients so their global L2 norm is at most max_norm; returns the norm before.
double clip_grad_norm(const Tensor& grads, float max_norm) {
  const float* g = grads.f32();
  double sq = 0.0;
#pragma omp parallel for reduction(+ : sq) schedule(static)
  for (int64_t i = 0; i < grads.numel(); ++i) sq += static_cast<double>(g[i]) * g[i];
  const double norm = std::sqrt(sq);
  if (max_norm > 0 && norm > max_norm) {
    const float f = static_cast<float>(max_norm / (norm + 1e-6));
    float* w = grads.f32();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < grads.numel(); ++i) w[i] *= f;
  }
  return norm;
}

int64_t non_embedding_params(const ParameterSet& ps) {
  int64_t n = 0;
  for (const auto& p : ps.list())
    if (p.name.find("embeddings") == std::string::npos &&
        p.name.find(".wte.") == std::string::npos && p.name.find(".wpe.") == std::string::npos)
      n += p.shape.numel();
  return n;
}
}  // namespace

TrainSummary train(const TrainOptions& o, const LogSink& on_log) {
  validate(o);
  ModelConfig config = resolve_config(o.model);
  auto model = Model::create(config);
  auto be = make_cpu_backend();
  SyntheticDataset data({o.dataset_size, o.seq_len, 100, 30000, o.seed}, config);

  const int64_t B = o.per_device_train_batch_size;
  MemoryPlan plan;
  model->plan(plan, {B, o.seq_len}, {o.gradient_checkpointing});
  BufferBinder optim_binder;
  AdamW adamw({o.adam_beta1, o.adam_beta2, o.adam_epsilon, o.weight_decay});
  adamw.plan(plan, optim_binder, model->params().total_elements());
  plan.finalize();
  Arena arena(plan, Device::cpu);
  model->bind(arena);
  optim_binder.bind(arena);
  model->init_weights(o.seed);
  adamw.reset();

  const int64_t steps_per_epoch = (data.size() + B - 1) / B;
  const int64_t total_steps =
      o.max_steps > 0 ? o.max_steps
                      : static_cast<int64_t>(std::ceil(o.num_train_epochs * steps_per_epoch));
  std::vector<int64_t> order(data.size());
  std::mt19937_64 shuffle_gen(o.seed);

  TrainSummary s;
  double loss_total = 0.0, loss_window = 0.0;
  int64_t window = 0, samples = 0;
  const auto start = std::chrono::steady_clock::now();
  for (int64_t step = 0; step < total_steps; ++step) {
    const int64_t pos = step % steps_per_epoch;
    if (pos == 0) {
      std::iota(order.begin(), order.end(), 0);
      std::shuffle(order.begin(), order.end(), shuffle_gen);
    }
    model->reset_batch(*be);
    const int64_t rows = std::min(B, data.size() - pos * B);
    for (int64_t r = 0; r < rows; ++r) data.fill_row(order[pos * B + r], model->batch(), r);
    samples += rows;

    const int64_t targets = model->count_targets();
    StepOptions so;
    so.training = true;
    so.compute_grad = true;
    so.loss_grad_scale = targets ? 1.0f / static_cast<float>(targets) : 0.0f;
    so.rng = RngKey{o.seed, static_cast<uint64_t>(step), 0};
    model->zero_grads(*be);
    const double loss = model->forward(*be, so) / std::max<int64_t>(targets, 1);
    BRISK_CHECK(std::isfinite(loss), "the loss became ", loss, " at step ", step + 1,
                "; stopping (lower the learning rate or check the data)");
    model->backward(*be, so);
    const double grad_norm = clip_grad_norm(model->params().flat_grads(), o.max_grad_norm);
    const float lr =
        o.learning_rate * static_cast<float>(total_steps - step) / static_cast<float>(total_steps);
    adamw.step(model->params(), lr);

    loss_total += loss;
    loss_window += loss;
    ++window;
    if ((step + 1) % o.logging_steps == 0 || step + 1 == total_steps) {
      on_log({{"step", step + 1},
              {"epoch", static_cast<double>(step + 1) / steps_per_epoch},
              {"loss", loss_window / window},
              {"learning_rate", lr},
              {"grad_norm", grad_norm}});
      loss_window = 0.0;
      window = 0;
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  s.global_step = total_steps;
  s.epoch = static_cast<double>(total_steps) / steps_per_epoch;
  s.train_runtime = seconds;
  s.train_samples_per_second = samples / seconds;
  s.train_steps_per_second = total_steps / seconds;
  s.train_loss = loss_total / total_steps;
  s.total_flos = 6.0 * non_embedding_params(model->params()) * static_cast<double>(samples) *
                 static_cast<double>(o.seq_len);
  s.memory.planned = plan.bytes_by_category();
  s.memory.arena_bytes = arena.capacity();
  s.memory.arena_high_water = arena.high_water();
  s.memory.peak_rss = peak_rss_bytes();
  return s;
}

nlohmann::json summary_json(const TrainSummary& s) {
  nlohmann::json planned = nlohmann::json::object();
  for (int c = 0; c < kNumCategories; ++c)
    planned[category_name(static_cast<Category>(c))] = s.memory.planned[c];
  return {{"train_runtime", s.train_runtime},
          {"train_samples_per_second", s.train_samples_per_second},
          {"train_steps_per_second", s.train_steps_per_second},
          {"train_loss", s.train_loss},
          {"total_flos", s.total_flos},
          {"epoch", s.epoch},
          {"global_step", s.global_step},
          {"memory",
           {{"planned_bytes", planned},
            {"arena_bytes", s.memory.arena_bytes},
            {"arena_high_water_bytes", s.memory.arena_high_water},
            {"peak_rss_bytes", s.memory.peak_rss}}}};
}

}  // namespace brisk
