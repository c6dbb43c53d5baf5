// What a training run logs and keeps as it goes, beside its loop (train/trainer.cpp): the run's
// log with the progress bar below it and TensorBoard events, the best model's metric, and the
// process's peak memory by phase.
#pragma once

#include <algorithm>
#include <array>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "core/process_memory.h"
#include "models/config.h"
#include "report/progress.h"
#include "report/tensorboard.h"
#include "train/options.h"
#include "train/trainer.h"

namespace brisk {

// What a run writes and shows as it goes: records to rank 0's log sink, the progress bar kept
// below them, and (--report_to tensorboard) every record also as TensorBoard scalars at the step
// it belongs to. Events that can no longer be written (a full disk) end with one warning; the run
// goes on, and its saves report the disk as errors of their own.
class RunLog {
 public:
  RunLog(const LogSink& all_log, bool lead) : all_log_(all_log), lead_(lead) {}
  // A record for the log alone (rank 0's).
  void log(const nlohmann::json& rec) const {
    if (lead_) all_log_(rec);
  }
  LogSink sink() const {
    return [this](const nlohmann::json& rec) { log(rec); };
  }
  // As transformers' TensorBoardCallback at the start of training.
  void open_events(const TrainOptions& o, const ModelConfig& config);
  // A record as TensorBoard scalars at `step`.
  void event(const nlohmann::json& rec, int64_t step);
  // A record for the log, above the progress bar, and as events.
  void report(const nlohmann::json& rec, int64_t step);
  Progress progress;

 private:
  const LogSink& all_log_;
  bool lead_;
  std::unique_ptr<EventWriter> events_;
};

// load_best_model_at_end: the evaluation's value of metric_for_best_model and whether it beats
// the best so far (greater_is_better defaults to false for loss and perplexity, as transformers'
// does for loss).
struct BestModel {
  std::string key;
  bool greater = false;
  explicit BestModel(const TrainOptions& o);
  // The metric's value in an evaluation's metrics; refused, naming those there are, when absent.
  double value(const nlohmann::json& metrics) const;
  bool better(double v, double best) const;
};

// The process's peak resident memory by phase of the run: the kernel's high-water mark is read
// and reset at each change of phase, so the steps' own peak is known apart from the saves'.
struct PeakPhases {
  enum Phase { setup, steps, saves, done };
  std::array<size_t, 3> peak{};
  Phase current = setup;
  PeakPhases() { reset_peak_rss(); }  // the peak reported is this run's
  void enter(Phase next) {
    peak[current] = std::max(peak[current], peak_rss_bytes());
    reset_peak_rss();
    current = next;
  }
  size_t overall() const { return *std::max_element(peak.begin(), peak.end()); }
};

}  // namespace brisk
