// What a training run writes when it ends, beside its loop (train/trainer.cpp): the predictions
// file, the memory anatomy (planned and measured, and its HTML page), the notes logged at the
// start and the results' JSON (trainer.h's run_notes, summary_json and train_metrics_json).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "backend/backend.h"
#include "core/memory_plan.h"
#include "parallel/communicator.h"
#include "parallel/policy.h"
#include "train/assembly.h"
#include "train/run_log.h"
#include "train/trainer.h"

namespace brisk {

// --do_predict: predict_results.txt as run_glue writes it (index and label name per test row,
// names from the config's id2label when it has them; for regression the number, as "{:3.3f}").
// The data replicas of `comm` predict their shares; `lead` writes the file. In a run of one
// process the rows go into *rows when it is given.
nlohmann::json write_predictions(Backend& be, RunAssembly& run, const TrainOptions& o,
                                 const LogSink& on_log, Communicator& comm, bool lead,
                                 StagedForward* staged, EvaluatedRows* rows);
// output_dir/memory.html: the plan by category, what lay outside it, and the measured peaks.
void write_anatomy(const TrainOptions& o, const TrainSummary& s, const std::string& path);
// The memory anatomy, planned and measured, into the summary.
void summarize_memory(const Backend& be, const MemoryPlan& plan, const Arena& arena,
                      const PeakPhases& peaks, TrainSummary& s);

}  // namespace brisk
