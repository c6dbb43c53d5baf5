// The training loop (the equivalent of transformers' Trainer.train for the models brisk knows):
// plan every buffer, allocate once, then optimizer steps of gradient-accumulated micro-steps
// (forward, fused loss, backward), clipping, the schedule and the optimizer, with JSON logs,
// checkpoints and a summary that includes the memory anatomy, planned and measured.
#pragma once

#include <array>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "core/memory_plan.h"
#include "data/dataset.h"
#include "eval/evaluate.h"
#include "train/options.h"
#include "train/tokenized_data.h"

namespace brisk {

class Communicator;

struct MemoryReport {
  std::array<size_t, kNumCategories> planned{};  // bytes by category
  // Of those, bytes laid over others (MemoryPlan::overlaid_bytes: the gradients over the blocks'
  // consumed activations), counted twice in `planned`.
  size_t overlaid = 0;
  size_t arena_bytes = 0;       // the plan plus alignment padding: what was allocated
  size_t rss_before_arena = 0;  // process resident memory before the arena was allocated
  size_t peak_rss = 0;          // measured peak of the whole run (setup, steps and saves)
  size_t peak_rss_steps = 0;    // measured peak while training steps ran, saves excluded
  size_t peak_rss_saves = 0;    // measured peak while checkpoints were written (0: none)
  // On a GPU, "GPU memory occupied" as the driver reports it (NVML), before the arena was
  // allocated (the CUDA context and libraries) and at the end; -1 when not known (the CPU).
  int64_t device_memory_before_arena = -1;
  int64_t device_memory_used = -1;
};

// A classifier's evaluated or predicted rows, in row order (one process): their logits, row after
// row, and their own labels (class ids, or regression values; NaN where a row has none).
struct EvaluatedRows {
  std::vector<float> logits, targets;  // targets: one a row
  bool regression = false;
  size_t rows() const { return targets.size(); }
  void add(const Prediction& p) {
    logits.insert(logits.end(), p.logits.begin(), p.logits.end());
    targets.push_back(p.target);
  }
};

struct TrainSummary {
  double train_runtime = 0;
  double train_samples_per_second = 0;
  double train_steps_per_second = 0;
  double train_loss = 0;
  double total_flos = 0;
  int64_t global_step = 0;
  double epoch = 0;
  std::string last_checkpoint;
  std::string device;  // the backend's name
  int ranks = 1;       // processes of a data-parallel run
  // Rank 0's gradient and loss sums (and ZeRO's gathering of the updated weights): the seconds
  // they ran, and of those the seconds the training loop waited for them (the rest was hidden
  // behind backward's computation).
  double communication_seconds = 0;
  double communication_wait_seconds = 0;
  std::string auto_fit;  // with auto_find_batch_size: what was chosen and why
  // The parallel layout's own measures (ParallelPolicy::statistics), rank 0's.
  std::vector<std::pair<std::string, double>> parallel;
  MemoryReport memory;
  nlohmann::json eval_metrics;     // --do_eval: the final evaluation (eval_results.json)
  nlohmann::json predict_metrics;  // --do_predict: the test data's metrics
  // and its rows, where StepEvents::keep_predictions asks
  EvaluatedRows predicted;
  std::string best_model_checkpoint;  // load_best_model_at_end: the checkpoint loaded
};

// The records train() logs once the run is checked and assembled (rank 0): the keys given that
// change nothing in brisk, and what a user may not have meant: training on synthetic data, or
// from a built-in configuration's random weights. data_given: the caller gives the data.
std::vector<nlohmann::json> run_notes(const TrainOptions& o, bool data_given = false);

// Receives each log record: {"step", "epoch", "loss", "learning_rate", "grad_norm", ...}.
using LogSink = std::function<void(const nlohmann::json&)>;

// Faults a test injects into a run (none by default).
struct FaultHooks {
  // Put an inf into the gradients of this (0-based) optimizer step, as an fp16 overflow would.
  int64_t overflow_at_step = -1;
  // Simulate a kill at this (0-based) point of the save sequence, counted across the run's saves
  // (the points: save_checkpoint in train/checkpoint.h).
  int kill_save_at_point = -1;
};

// A front end's calls between optimizer steps (the Python API's callbacks), each made with no
// step under way, on rank 0; none by default.
struct StepEvents {
  std::function<void(const std::string& checkpoint)> on_save;  // a checkpoint was written
  std::function<void(int64_t global_step)> on_epoch_end;       // the step ended an epoch
  // After each step (of max_steps) with its log, evaluation and save: true ends the training
  // there as its last step would (the model saved, then evaluated and predicted as asked); one
  // process only.
  std::function<bool(int64_t global_step, int64_t max_steps)> on_step_end;
  // After each evaluation of a classifier (during training and the last), in a run of one
  // process: its rows; returns metrics (a JSON object) that join the evaluation's before it is
  // logged, saved or compared (metric_for_best_model may name them).
  std::function<nlohmann::json(EvaluatedRows&& rows)> evaluation_metrics;
  // Keep the prediction set's rows in the summary (TrainSummary::predicted; one process).
  bool keep_predictions = false;
};

// Trains on `dataset` when given (a Dataset, or rows tokenized before the run), else on the one
// the options name (text files, synthetic data or a token file).
// Data parallel over `comm`'s ranks (default: the processes of the launch, world_communicator());
// only rank 0's on_log is called.
TrainSummary train(const TrainOptions& options, const LogSink& on_log, GivenData dataset = nullptr,
                   FaultHooks faults = {}, Communicator* comm = nullptr,
                   const StepEvents& events = {});

// train_results.json: the training metrics (train_metrics_json) with the memory anatomy.
nlohmann::json summary_json(const TrainSummary& s);
nlohmann::json train_metrics_json(const TrainSummary& s);

}  // namespace brisk
