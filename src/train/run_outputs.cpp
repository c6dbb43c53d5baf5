#include "train/run_outputs.h"

#include <cstdio>
#include <filesystem>

#include "core/json_file.h"
#include "report/memory_html.h"
#include "train/file_data.h"

namespace brisk {

namespace fs = std::filesystem;

nlohmann::json write_predictions(Backend& be, RunAssembly& run, const TrainOptions& o,
                                 const LogSink& on_log, Communicator& comm, bool lead,
                                 StagedForward* staged, EvaluatedRows* rows) {
  const nlohmann::json id2label = run.config.source.value("id2label", nlohmann::json::object());
  std::string out = "index\tprediction\n";
  if (rows) rows->regression = run.config.regression;
  nlohmann::json metrics = run.evaluator.run(
      be, *run.model, *run.test_data, "predict",
      [&](const Prediction& p) {
        if (rows) rows->add(p);
        out += std::to_string(p.index) + "\t";
        if (run.config.regression) {
          char number[64];
          std::snprintf(number, sizeof number, "%.3f", static_cast<double>(p.value));
          out += std::string(number) + "\n";
          return;
        }
        const std::string id = std::to_string(p.label);
        const bool named =
            id2label.is_object() && id2label.contains(id) && id2label[id].is_string();
        out += (named ? id2label[id].get<std::string>() : id) + "\n";
      },
      &comm, staged);
  if (lead) write_file_atomically((fs::path(o.output_dir) / "predict_results.txt").string(), out);
  on_log(metrics);
  return metrics;
}

void write_anatomy(const TrainOptions& o, const TrainSummary& s, const std::string& path) {
  MemoryBar bar;
  bar.label = "batch " + std::to_string(o.per_device_train_batch_size) + " x " +
              std::to_string(o.gradient_accumulation_steps);
  bar.planned = s.memory.planned;
  bar.overlaid = s.memory.overlaid;
  const bool gpu = s.memory.device_memory_used >= 0;
  if (gpu) {
    bar.fixed = static_cast<size_t>(std::max<int64_t>(0, s.memory.device_memory_before_arena));
    bar.fixed_label = "GPU memory before the arena";
    bar.measured = {{"GPU memory occupied", static_cast<size_t>(s.memory.device_memory_used)}};
  } else {
    bar.fixed = s.memory.rss_before_arena;
    bar.fixed_label = "resident before the arena";
    bar.measured = {{"process peak", s.memory.peak_rss},
                    {"peak during steps", s.memory.peak_rss_steps}};
  }
  write_memory_html(path, "brisk memory anatomy: " + o.model_name_or_path,
                    "device " + s.device + "; planned bytes by category, what lay outside the " +
                        "plan, and the measured peaks (lines)",
                    {bar});
}

void summarize_memory(const Backend& be, const MemoryPlan& plan, const Arena& arena,
                      const PeakPhases& peaks, TrainSummary& s) {
  s.memory.planned = plan.bytes_by_category();
  s.memory.overlaid = plan.overlaid_bytes();
  s.memory.arena_bytes = arena.capacity();
  s.memory.peak_rss = peaks.overall();
  s.memory.peak_rss_steps = peaks.peak[PeakPhases::steps];
  s.memory.peak_rss_saves = peaks.peak[PeakPhases::saves];
  s.memory.device_memory_used = be.device_memory_used();
}

std::vector<nlohmann::json> run_notes(const TrainOptions& o, bool data_given) {
  std::vector<nlohmann::json> records;
  if (!o.ignored_keys.empty()) records.push_back({{"options_without_effect", o.ignored_keys}});
  std::vector<std::string> notes;
  if (o.do_train && !data_given && !uses_text_files(o) && o.dataset == "synthetic")
    notes.push_back("no data files given: training on synthetic data (" +
                    std::to_string(o.dataset_size) + " random sequences of " +
                    std::to_string(o.seq_len) +
                    " tokens, the Hugging Face guides' dummy data); give --train_file to train "
                    "on yours");
  if (o.resume_from_checkpoint.empty() && is_builtin_config(o.model_name_or_path))
    notes.push_back("'" + o.model_name_or_path +
                    "' is brisk's built-in configuration of that architecture, from random "
                    "weights (brisk downloads nothing: for pretrained weights, give a model "
                    "folder)");
  for (const std::string& note : notes) records.push_back({{"note", note}});
  return records;
}

nlohmann::json train_metrics_json(const TrainSummary& s) {
  return {{"train_runtime", s.train_runtime},
          {"train_samples_per_second", s.train_samples_per_second},
          {"train_steps_per_second", s.train_steps_per_second},
          {"train_loss", s.train_loss},
          {"total_flos", s.total_flos},
          {"epoch", s.epoch}};
}

nlohmann::json summary_json(const TrainSummary& s) {
  nlohmann::json planned = nlohmann::json::object();
  for (int c = 0; c < kNumCategories; ++c)
    planned[category_name(static_cast<Category>(c))] = s.memory.planned[c];
  nlohmann::json j = train_metrics_json(s);
  j.update(
      nlohmann::json{{"global_step", s.global_step},
                     {"memory",
                      {{"planned_bytes", planned},
                       {"overlaid_bytes", s.memory.overlaid},
                       {"arena_bytes", s.memory.arena_bytes},
                       {"rss_before_arena_bytes", s.memory.rss_before_arena},
                       {"peak_rss_bytes", s.memory.peak_rss},
                       {"peak_rss_steps_bytes", s.memory.peak_rss_steps},
                       {"peak_rss_saves_bytes", s.memory.peak_rss_saves},
                       {"device_memory_before_arena_bytes", s.memory.device_memory_before_arena},
                       {"device_memory_used_bytes", s.memory.device_memory_used}}},
                     {"device", s.device},
                     {"ranks", s.ranks},
                     {"communication_seconds", s.communication_seconds},
                     {"communication_wait_seconds", s.communication_wait_seconds},
                     {"auto_find_batch_size", s.auto_fit}});
  for (const auto& [name, value] : s.parallel) j[name] = value;
  return j;
}

}  // namespace brisk
