// Helpers shared by the model-level tests: build a model from a fixture folder and compare
// tensors with a norm-wise relative error.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/safetensors.h"
#include "models/batch.h"
#include "models/model.h"

namespace brisk::testing {

// Heap allocations made through operator new so far (test_alloc_counter.cpp).
size_t heap_allocations();

inline std::string fixture(const std::string& rel) {
  return std::string(BRISK_FIXTURES_DIR) + "/" + rel;
}

// ||a - b|| / max(||b||, floor)
inline double rel_error(const float* a, const float* b, int64_t n, double floor = 1e-30) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; ++i) {
    num += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    den += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(num) / std::max(std::sqrt(den), floor);
}

// Runs f and expects a brisk::Error whose message contains `needle`.
template <typename F>
void expect_error(F&& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one mentioning \"" << needle << "\"";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
        << "message \"" << e.what() << "\" does not mention \"" << needle << "\"";
  }
}

// A model with its plan and arena, loaded from a fixture folder holding config.json,
// model.safetensors and batch.safetensors.
struct LoadedModel {
  std::unique_ptr<Backend> be = make_cpu_backend();
  std::unique_ptr<Model> model;
  MemoryPlan plan;
  std::unique_ptr<Arena> arena;

  LoadedModel(const std::string& folder, PlanOptions options = {}, bool dropout = false) {
    ModelConfig c = resolve_config(folder);
    if (!dropout) disable_dropout(c);
    model = Model::create(c);
    SafetensorsFile batch(folder + "/batch.safetensors");
    model->plan(plan, batch_shape_of(batch), options);
    plan.finalize();
    arena = std::make_unique<Arena>(plan, Device::cpu);
    model->bind(*arena);
    model->load_weights(*be, SafetensorsFile(folder + "/model.safetensors"));
    load_batch(batch, *model, *be);
  }

  // One training micro-step; returns the mean loss.
  double step(bool training, uint64_t seed = 7, uint64_t micro_step = 3) {
    StepOptions so;
    so.training = training;
    so.rng = RngKey{seed, micro_step, 0};
    const int64_t n = model->count_targets();
    so.loss_grad_scale = 1.0f / static_cast<float>(n);
    model->zero_grads(*be);
    const double loss = model->forward(*be, so) / n;
    model->backward(*be, so);
    return loss;
  }

  std::vector<float> grads() const {
    const Tensor& g = model->params().flat_grads();
    return std::vector<float>(g.f32(), g.f32() + g.numel());
  }
};

}  // namespace brisk::testing
