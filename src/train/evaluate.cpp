// Evaluation and prediction over a dataset (see evaluate.h).
#include "train/evaluate.h"

#include <chrono>
#include <cmath>
#include <limits>

#include "data/loader.h"
#include "train/metrics.h"

namespace brisk {

void Evaluator::plan(const Model& model, MemoryPlan& plan, BufferBinder& binder,
                     bool dynamic_padding) {
  dynamic_padding_ = dynamic_padding;
  const BatchShape s = model.planned_shape();
  if (model.batch_layout(s.batch, s.seq).labels_per_token) return;
  binder.declare(plan, &logits_, "eval.logits", Category::data, DType::f32,
                 {s.batch, model.config().num_labels}, Placement::host);
}

nlohmann::json Evaluator::run(Backend& be, Model& model, const Dataset& data,
                              const std::string& prefix,
                              const std::function<void(const Prediction&)>& on_prediction) {
  const auto start = std::chrono::steady_clock::now();
  const BatchShape planned = model.planned_shape();
  const int64_t B = planned.batch;
  const bool classification = !logits_.empty();
  const bool regression = model.config().regression;
  const int64_t L = classification ? logits_.dim(1) : 0;
  ClassificationMetrics scores(std::max<int64_t>(L, 2));
  RegressionMetrics numbers;
  StepOptions so;
  so.training = false;
  so.compute_grad = false;
  double loss = 0;
  int64_t targets = 0, batches = 0;
  for (int64_t first = 0; first < data.size(); first += B, ++batches) {
    const int64_t rows = std::min(B, data.size() - first);
    int64_t seq = planned.seq;
    if (dynamic_padding_) {
      int64_t longest = 1;
      for (int64_t r = 0; r < rows; ++r) longest = std::max(longest, data.length(first + r));
      seq = dynamic_padded_length(longest, planned.seq);
    }
    model.use_seq(seq);
    model.reset_batch();
    for (int64_t r = 0; r < rows; ++r) data.fill_row(first + r, 0, model.batch(), r);
    targets += model.count_targets();
    loss += model.forward(be, so);
    if (!classification) continue;
    be.download(model.logits(), logits_);
    const float* z = logits_.f32();
    for (int64_t r = 0; r < rows; ++r) {
      Prediction p{first + r, 0, z[r * L]};
      if (regression) {
        const float y = model.batch().label_values.f32()[r];
        if (!no_label_value(y)) numbers.add(y, p.value);
      } else {
        for (int64_t c = 1; c < L; ++c)  // the first of equal maxima, as argmax
          if (z[r * L + c] > z[r * L + p.label]) p.label = c;
        const int32_t y = model.batch().labels.i32()[r];
        if (y != kIgnoreIndex) scores.add(y, p.label);
      }
      if (on_prediction) on_prediction(p);
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  nlohmann::json m;
  const double mean_loss =
      targets > 0 ? loss / static_cast<double>(targets) : std::numeric_limits<double>::quiet_NaN();
  if (targets > 0) m[prefix + "_loss"] = mean_loss;
  if (!classification && targets > 0)
    m["perplexity"] = mean_loss < 709 ? std::exp(mean_loss) : std::numeric_limits<double>::max();
  if (regression && numbers.count() > 0) {
    m[prefix + "_mse"] = numbers.mse();
    m[prefix + "_pearson"] = numbers.pearson();
    m[prefix + "_spearmanr"] = numbers.spearman();
  }
  if (!regression && classification && scores.count() > 0) {
    m[prefix + "_accuracy"] = scores.accuracy();
    m[prefix + "_f1"] = scores.f1();
  }
  m[prefix + "_runtime"] = seconds;
  m[prefix + "_samples_per_second"] = seconds > 0 ? static_cast<double>(data.size()) / seconds : 0;
  m[prefix + "_steps_per_second"] = seconds > 0 ? static_cast<double>(batches) / seconds : 0;
  return m;
}

}  // namespace brisk
