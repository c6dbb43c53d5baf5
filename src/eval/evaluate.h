// Evaluation and prediction (Trainer.evaluate / Trainer.predict): a dataset in order, in
// micro-batches of the model's planned batch, dropout off and no gradients, metrics computed as
// the batches stream by. Classification reads each batch's logits into a planned host buffer;
// causal LM needs only the summed loss. In a data-parallel run every rank evaluates every N-th
// batch and the metrics are made from what all ranks counted (the same as one process's, up to
// the order of the sums).
#pragma once

#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <span>
#include <string>

#include "backend/backend.h"
#include "core/memory_plan.h"
#include "data/dataset.h"
#include "models/model.h"
#include "models/step_recorder.h"

namespace brisk {

class Communicator;
class StagedForward;

// One row's prediction: the class (classification) or the number (regression), and in a run of
// one process the row's logits (valid during the call that hands the prediction on).
struct Prediction {
  int64_t index = 0;
  int64_t label = 0;
  float value = 0;
  std::span<const float> logits;
  // The row's own label (a class id, or a regression value); NaN where it has none. Handed on
  // in one process only, as the logits.
  float target = std::numeric_limits<float>::quiet_NaN();
};

class Evaluator {
 public:
  // Declares the host buffer for one batch of logits (classification models; none for causal LM).
  // dynamic_padding: each batch computed at its longest sample's length (rounded up to 8);
  // padding_free: each batch's samples laid end to end over its rows (data/loader.h's
  // lay_end_to_end), no padding computed.
  void plan(const Model& model, MemoryPlan& plan, BufferBinder& binder, bool dynamic_padding,
            bool padding_free = false);

  // Metrics named "<prefix>_loss", "<prefix>_accuracy" and "<prefix>_f1" (classification),
  // "<prefix>_mse", "<prefix>_pearson" and "<prefix>_spearmanr" (regression, as run_glue's
  // STS-B metrics) or "perplexity" (causal LM, as run_clm names it), "<prefix>_runtime",
  // "<prefix>_samples_per_second" and "<prefix>_steps_per_second". Rows without a label (an
  // unlabelled test set) count in no metric. `on_prediction`, when given, receives each
  // classification or regression row's prediction, in row order (on rank 0 of several: every
  // rank's; on the others none). With `comm` of several ranks, every rank must call run alike
  // and gets the metrics of the whole dataset. With `staged` (pipeline stages), every stage of
  // the pipeline calls it alike: the forward passes go through the stages and every stage gets
  // the metrics. With `sequence` (sequence parallelism: the ranks that split each batch's
  // sequences), every rank of it calls run alike and their tokens' losses are summed.
  nlohmann::json run(Backend& be, Model& model, const Dataset& data, const std::string& prefix,
                     const std::function<void(const Prediction&)>& on_prediction = nullptr,
                     Communicator* comm = nullptr, StagedForward* staged = nullptr,
                     Communicator* sequence = nullptr);
  // The forward passes of one process's own batches through `recorder` (recorded once per
  // signature, then replayed: models/step_recorder.h); null: as they are.
  void record_forward(StepRecorder* recorder) { recorder_ = recorder; }

 private:
  Tensor logits_;  // host, float32 [B, num_labels]
  bool dynamic_padding_ = false, padding_free_ = false;
  PackedSamples samples_;  // padding-free: the batch's samples (reserved: no allocation)
  StepRecorder* recorder_ = nullptr;
};

}  // namespace brisk
