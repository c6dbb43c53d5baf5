// Evaluation and prediction over a dataset (see evaluate.h).
#include "train/evaluate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/clock.h"
#include "data/loader.h"
#include "parallel/communicator.h"
#include "train/metrics.h"

namespace brisk {
namespace {

// Every rank's `mine` (of any length), concatenated in rank order, on every rank or, with
// root >= 0, on that rank only (the others get nothing).
std::vector<double> gather_doubles(Communicator& comm, std::vector<double> mine, int root = -1) {
  const std::vector<uint8_t> bytes =
      gather_pieces(comm, Tensor(mine.data(), Shape{static_cast<int64_t>(mine.size())}, DType::f64),
                    nullptr, root);
  std::vector<double> out(bytes.size() / sizeof(double));
  if (!out.empty()) std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

}  // namespace

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
                              const std::function<void(const Prediction&)>& on_prediction,
                              Communicator* comm) {
  const int ranks = comm ? comm->size() : 1, rank = comm ? comm->rank() : 0;
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
  std::vector<Prediction> predicted;  // several ranks: this rank's, for rank 0 to order
  // Batch i is rank i mod N's. When the model gathers its weights from every rank (ZeRO stage
  // 3), every rank runs as many forward passes: one without a batch of its own runs one over the
  // default batch and discards it.
  const bool in_step = ranks > 1 && model.gathers_weights();
  const int64_t rounds = (data.size() + ranks * B - 1) / (ranks * B);
  for (int64_t first = rank * B; first < (in_step ? rounds * ranks * B : data.size());
       first += ranks * B) {
    if (first >= data.size()) {
      model.use_seq(dynamic_padding_ ? dynamic_padded_length(1, planned.seq) : planned.seq);
      model.reset_batch();
      model.forward(be, so);
      continue;
    }
    ++batches;
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
      if (on_prediction && ranks == 1) on_prediction(p);
      if (on_prediction && ranks > 1) predicted.push_back(p);
    }
  }
  if (ranks > 1) {
    // The sums of every rank's counts, and every rank's pairs and predictions.
    std::vector<double> sums{loss, static_cast<double>(targets), static_cast<double>(batches)};
    const std::vector<double> counts = scores.counts();
    sums.insert(sums.end(), counts.begin(), counts.end());
    comm->all_reduce_sum(Tensor(sums.data(), Shape{static_cast<int64_t>(sums.size())}, DType::f64));
    loss = sums[0];
    targets = static_cast<int64_t>(sums[1]);
    batches = static_cast<int64_t>(sums[2]);
    scores.set_counts(std::vector<double>(sums.begin() + 3, sums.end()));
    if (regression) {
      std::vector<double> pairs;
      for (int64_t i = 0; i < numbers.count(); ++i) {
        pairs.push_back(numbers.labels()[static_cast<size_t>(i)]);
        pairs.push_back(numbers.predictions()[static_cast<size_t>(i)]);
      }
      pairs = gather_doubles(*comm, pairs);  // every rank's metrics agree
      numbers = RegressionMetrics();
      for (size_t i = 0; i + 1 < pairs.size(); i += 2)
        numbers.add(static_cast<float>(pairs[i]), static_cast<float>(pairs[i + 1]));
    }
    if (on_prediction) {
      std::vector<double> mine;
      for (const Prediction& p : predicted)
        mine.insert(mine.end(), {static_cast<double>(p.index), static_cast<double>(p.label),
                                 static_cast<double>(p.value)});
      const std::vector<double> all = gather_doubles(*comm, mine, 0);  // rank 0 writes them
      predicted.clear();
      for (size_t i = 0; i + 2 < all.size(); i += 3)
        predicted.push_back({static_cast<int64_t>(all[i]), static_cast<int64_t>(all[i + 1]),
                             static_cast<float>(all[i + 2])});
      std::sort(predicted.begin(), predicted.end(),
                [](const Prediction& a, const Prediction& b) { return a.index < b.index; });
      for (const Prediction& p : predicted) on_prediction(p);  // none but on rank 0
    }
  }
  const double seconds = seconds_since(start);
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
