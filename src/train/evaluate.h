// Evaluation and prediction (Trainer.evaluate / Trainer.predict): a dataset in order, in
// micro-batches of the model's planned batch, dropout off and no gradients, metrics computed as
// the batches stream by. Classification reads each batch's logits into a planned host buffer;
// causal LM needs only the summed loss.
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "backend/backend.h"
#include "core/memory_plan.h"
#include "data/dataset.h"
#include "models/model.h"

namespace brisk {

class Evaluator {
 public:
  // Declares the host buffer for one batch of logits (classification models; none for causal LM).
  void plan(const Model& model, MemoryPlan& plan, BufferBinder& binder);

  // Metrics named "<prefix>_loss", "<prefix>_accuracy" and "<prefix>_f1" (classification) or
  // "perplexity" (causal LM, as run_clm names it), "<prefix>_runtime",
  // "<prefix>_samples_per_second" and "<prefix>_steps_per_second". Rows whose label is ignored
  // (an unlabelled test set) count in no metric. `on_prediction(index, label)`, when given,
  // receives each classification row's predicted label.
  nlohmann::json run(Backend& be, Model& model, const Dataset& data, const std::string& prefix,
                     const std::function<void(int64_t, int64_t)>& on_prediction = nullptr);

 private:
  Tensor logits_;  // host, float32 [B, num_labels]
};

}  // namespace brisk
