// The training loop (the equivalent of transformers' Trainer.train for the models brisk knows):
// plan every buffer, allocate once, then micro-steps of forward, loss and backward, clipping and
// the optimizer step, with JSON logs and a summary that includes the memory anatomy.
#pragma once

#include <array>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "core/memory_plan.h"

namespace brisk {

// Names follow transformers' TrainingArguments; defaults are transformers' where it has one.
struct TrainOptions {
  std::string model = "bert-tiny";  // built-in name, config.json, or model folder
  int64_t per_device_train_batch_size = 8;
  double num_train_epochs = 3.0;
  int64_t max_steps = -1;
  float learning_rate = 5e-5f;
  float weight_decay = 0.0f;
  float adam_beta1 = 0.9f;
  float adam_beta2 = 0.999f;
  float adam_epsilon = 1e-8f;
  float max_grad_norm = 1.0f;
  uint64_t seed = 42;
  int64_t logging_steps = 500;
  bool gradient_checkpointing = false;
  // Synthetic data (the seeds' dummy dataset).
  int64_t dataset_size = 512;
  int64_t seq_len = 512;
};

struct MemoryReport {
  std::array<size_t, kNumCategories> planned{};  // bytes by category
  size_t arena_bytes = 0;
  size_t arena_high_water = 0;
  size_t peak_rss = 0;  // measured, whole process
};

struct TrainSummary {
  double train_runtime = 0;
  double train_samples_per_second = 0;
  double train_steps_per_second = 0;
  double train_loss = 0;
  double total_flos = 0;
  int64_t global_step = 0;
  double epoch = 0;
  MemoryReport memory;
};

using LogSink = std::function<void(const nlohmann::json&)>;

TrainSummary train(const TrainOptions& options, const LogSink& on_log);

nlohmann::json summary_json(const TrainSummary& s);

}  // namespace brisk
