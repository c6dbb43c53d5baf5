#include "train/run_log.h"

#include <chrono>
#include <cmath>

#include "core/error.h"

namespace brisk {

namespace {
double wall_time() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}
}  // namespace

void RunLog::open_events(const TrainOptions& o, const ModelConfig& config) {
  events_ =
      std::make_unique<EventWriter>(event_file_path(logging_dir(o), wall_time()), wall_time());
  events_->text("args", options_to_json(o).dump(2), 0, wall_time());
  events_->text("model_config", config.source.dump(2), 0, wall_time());
  event(nlohmann::json::object(), 0);  // a warning of the three records above
}

void RunLog::event(const nlohmann::json& rec, int64_t step) {
  if (!events_) return;
  events_->log(rec, step, wall_time());
  const std::string warning = events_->take_warning();
  if (warning.empty()) return;
  progress.clear();
  log({{"warning", warning}});
  progress.redraw();
}

void RunLog::report(const nlohmann::json& rec, int64_t step) {
  progress.clear();
  log(rec);
  progress.redraw();
  event(rec, step);
}

BestModel::BestModel(const TrainOptions& o) {
  const std::string& m = o.metric_for_best_model;
  key = m == "perplexity" || m.rfind("eval_", 0) == 0 ? m : "eval_" + m;
  greater = o.greater_is_better.empty() ? !(key == "eval_loss" || key == "perplexity")
                                        : o.greater_is_better == "true";
}

double BestModel::value(const nlohmann::json& metrics) const {
  if (!metrics.contains(key) || !metrics[key].is_number()) {
    std::string have;
    for (const auto& [name, v] : metrics.items())
      if (name.rfind("eval_", 0) == 0 || name == "perplexity") have += " " + name;
    BRISK_FAIL("metric_for_best_model \"", excerpt(key),
               "\" is not among the evaluation's metrics:", have);
  }
  return metrics[key].get<double>();
}

bool BestModel::better(double v, double best) const {
  return std::isnan(best) || (greater ? v > best : v < best);
}

}  // namespace brisk
