// Evaluation and prediction over a dataset (see evaluate.h).
#include "eval/evaluate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "backend/held_weights.h"
#include "core/clock.h"
#include "core/step_control.h"
#include "data/loader.h"
#include "eval/metrics.h"
#include "parallel/communicator.h"
#include "parallel/policy.h"

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

// One evaluation's inputs and settings, shared by its batches.
struct EvalContext {
  Backend& be;
  Model& model;
  const Dataset& data;
  const Tensor& logits;  // classification: the planned host buffer [B, L]; else empty
  const std::function<void(const Prediction&)>& on_prediction;
  StepOptions so;
  int64_t planned_seq, L;
  int ranks;
  bool dynamic_padding, classification, regression;
  PackedSamples* samples;  // padding-free: where the batch's samples are laid; else null
  // Pipeline stages: the forward passes go through them, and only the last holds the results.
  StagedForward* staged;
  // Sequence parallelism: only the rank holding the first tokens holds a classifier's results.
  Communicator* sequence;
  StepRecorder* recorder;  // where the forward passes are recorded and replayed; else null
  bool last_stage() const {
    return !staged || staged->stages().rank() == staged->stages().size() - 1;
  }
  bool holds_results() const {
    return last_stage() && (sequence == nullptr || sequence->rank() == 0);
  }
  // Predictions are handed on once every rank's are gathered.
  bool gathers() const { return ranks > 1 || staged; }
};

// What evaluation counts as the batches stream by.
struct EvalTally {
  explicit EvalTally(int64_t labels) : scores(labels) {}
  ClassificationMetrics scores;
  RegressionMetrics numbers;
  double loss = 0;
  int64_t targets = 0, batches = 0;
  std::vector<Prediction> predicted;  // several ranks: this rank's, for rank 0 to order
};

// The predictions of a classification or regression batch's rows from their logits: counted
// in the metrics where the row has a label, and handed on (one rank) or kept (several).
void tally_predictions(const EvalContext& c, int64_t first, int64_t rows, EvalTally& t) {
  const int64_t L = c.L;
  const float* z = c.logits.f32();
  for (int64_t r = 0; r < rows; ++r) {
    Prediction p{first + r, 0, z[r * L], {z + r * L, static_cast<size_t>(L)}};
    if (c.regression) {
      const float y = c.model.batch().label_values.f32()[r];
      if (!no_label_value(y)) {
        t.numbers.add(y, p.value);
        p.target = y;
      }
    } else {
      for (int64_t k = 1; k < L; ++k)  // the first of equal maxima, as argmax
        if (z[r * L + k] > z[r * L + p.label]) p.label = k;
      const int32_t y = c.model.batch().labels.i32()[r];
      if (y != kIgnoreIndex) {
        t.scores.add(y, p.label);
        p.target = static_cast<float>(y);
      }
    }
    if (c.on_prediction && !c.gathers()) c.on_prediction(p);
    if (c.on_prediction && c.gathers()) t.predicted.push_back({p.index, p.label, p.value, {}});
  }
}

// Rows samples from `first` laid end to end over the model's batch (padding-free), the tokens
// after them one padding sample.
void fill_padding_free(const EvalContext& c, int64_t first, int64_t rows) {
  PackedSamples& samples = *c.samples;
  const int64_t seq = lay_end_to_end(
      rows, [&](int64_t r) { return c.data.length(first + r); }, c.model.planned_shape().batch,
      c.planned_seq, c.model.config().sequence_ranks, samples);
  c.model.use_seq(seq);
  c.model.use_samples(samples);
  c.model.reset_batch();
  const Batch& b = c.model.batch();
  int32_t* mask = b.attention_mask.i32();
  std::fill(mask + samples.starts[static_cast<size_t>(rows)], mask + b.attention_mask.numel(), 0);
  for (int64_t r = 0; r < rows; ++r)
    c.data.fill_row(first + r, 0,
                    token_view(b, samples.starts[static_cast<size_t>(r)], samples.length(r), r), 0);
}

// The forward pass over rows samples from `first` (at their longest length with dynamic
// padding, or end to end without padding), its loss and targets counted, its predictions
// tallied.
void evaluate_batch(const EvalContext& c, int64_t first, int64_t rows, EvalTally& t) {
  ++t.batches;
  if (c.samples) {
    fill_padding_free(c, first, rows);
  } else {
    int64_t seq = c.planned_seq;
    if (c.dynamic_padding) {
      int64_t longest = 1;
      for (int64_t r = 0; r < rows; ++r) longest = std::max(longest, c.data.length(first + r));
      seq = dynamic_padded_length(longest, c.planned_seq, c.model.config().sequence_ranks);
    }
    c.model.use_seq(seq);
    c.model.reset_batch();
    for (int64_t r = 0; r < rows; ++r) c.data.fill_row(first + r, 0, c.model.batch(), r);
  }
  t.targets += c.model.count_targets();
  if (c.staged || c.recorder) {
    c.model.reset_step_stats(c.be);
    if (c.staged)
      c.staged->forward(c.be, c.model, c.so);
    else
      c.recorder->forward(c.so);
    t.loss += c.model.read_step_stats(c.be)[kStatLoss];
  } else {
    t.loss += c.model.forward(c.be, c.so);
  }
  if (!c.classification || !c.holds_results()) return;
  c.be.download(c.model.logits(), c.logits);
  tally_predictions(c, first, rows, t);
}

// The sums of every rank's counts, and every rank's regression pairs, on every rank.
void combine_ranks(Communicator& comm, bool regression, EvalTally& t) {
  std::vector<double> sums{t.loss, static_cast<double>(t.targets), static_cast<double>(t.batches)};
  const std::vector<double> counts = t.scores.counts();
  sums.insert(sums.end(), counts.begin(), counts.end());
  comm.all_reduce_sum(Tensor(sums.data(), Shape{static_cast<int64_t>(sums.size())}, DType::f64));
  t.loss = sums[0];
  t.targets = static_cast<int64_t>(sums[1]);
  t.batches = static_cast<int64_t>(sums[2]);
  t.scores.set_counts(std::vector<double>(sums.begin() + 3, sums.end()));
  if (!regression) return;
  std::vector<double> pairs;
  for (int64_t i = 0; i < t.numbers.count(); ++i) {
    pairs.push_back(t.numbers.labels()[static_cast<size_t>(i)]);
    pairs.push_back(t.numbers.predictions()[static_cast<size_t>(i)]);
  }
  pairs = gather_doubles(comm, pairs);  // every rank's metrics agree
  t.numbers = RegressionMetrics();
  for (size_t i = 0; i + 1 < pairs.size(); i += 2)
    t.numbers.add(static_cast<float>(pairs[i]), static_cast<float>(pairs[i + 1]));
}

// Pipeline stages: the last stage's counts, pairs and predictions on every stage (the others
// counted nothing of their own).
void combine_stages(const EvalContext& c, EvalTally& t) {
  if (!c.last_stage()) t = EvalTally(std::max<int64_t>(c.L, 2));
  combine_ranks(c.staged->stages(), c.regression, t);
  std::vector<double> mine;
  for (const Prediction& p : t.predicted)
    mine.insert(mine.end(), {static_cast<double>(p.index), static_cast<double>(p.label),
                             static_cast<double>(p.value)});
  const std::vector<double> all = gather_doubles(c.staged->stages(), mine);
  t.predicted.clear();
  for (size_t i = 0; i + 2 < all.size(); i += 3)
    t.predicted.push_back({static_cast<int64_t>(all[i]), static_cast<int64_t>(all[i + 1]),
                           static_cast<float>(all[i + 2])});
}

// Every rank's predictions gathered on rank 0 and handed on there in row order (none elsewhere).
void deliver_predictions(Communicator& comm, std::vector<Prediction>& predicted,
                         const std::function<void(const Prediction&)>& on_prediction) {
  std::vector<double> mine;
  for (const Prediction& p : predicted)
    mine.insert(mine.end(), {static_cast<double>(p.index), static_cast<double>(p.label),
                             static_cast<double>(p.value)});
  const std::vector<double> all = gather_doubles(comm, mine, 0);  // rank 0 writes them
  predicted.clear();
  for (size_t i = 0; i + 2 < all.size(); i += 3)
    predicted.push_back({static_cast<int64_t>(all[i]),
                         static_cast<int64_t>(all[i + 1]),
                         static_cast<float>(all[i + 2]),
                         {}});
  std::sort(predicted.begin(), predicted.end(),
            [](const Prediction& a, const Prediction& b) { return a.index < b.index; });
  for (const Prediction& p : predicted) on_prediction(p);  // none but on rank 0
}

// The metrics of a finished evaluation (see Evaluator::run) of `samples` rows in `seconds`.
nlohmann::json eval_metrics(const EvalContext& c, const EvalTally& t, const std::string& prefix,
                            double seconds, int64_t samples) {
  nlohmann::json m;
  const double mean_loss = t.targets > 0 ? t.loss / static_cast<double>(t.targets)
                                         : std::numeric_limits<double>::quiet_NaN();
  if (t.targets > 0) m[prefix + "_loss"] = mean_loss;
  if (!c.classification && t.targets > 0)
    m["perplexity"] = mean_loss < 709 ? std::exp(mean_loss) : std::numeric_limits<double>::max();
  if (c.regression && t.numbers.count() > 0) {
    m[prefix + "_mse"] = t.numbers.mse();
    m[prefix + "_pearson"] = t.numbers.pearson();
    m[prefix + "_spearmanr"] = t.numbers.spearman();
  }
  if (!c.regression && c.classification && t.scores.count() > 0) {
    m[prefix + "_accuracy"] = t.scores.accuracy();
    m[prefix + "_f1"] = t.scores.f1();
  }
  m[prefix + "_runtime"] = seconds;
  m[prefix + "_samples_per_second"] = seconds > 0 ? static_cast<double>(samples) / seconds : 0;
  m[prefix + "_steps_per_second"] = seconds > 0 ? static_cast<double>(t.batches) / seconds : 0;
  return m;
}

}  // namespace

void Evaluator::plan(const Model& model, MemoryPlan& plan, BufferBinder& binder,
                     bool dynamic_padding, bool padding_free) {
  dynamic_padding_ = dynamic_padding;
  padding_free_ = padding_free;
  const BatchShape s = model.planned_shape();
  if (padding_free) samples_.starts.reserve(static_cast<size_t>(s.batch) + 2);
  if (model.batch_layout(s.batch, s.seq).labels_per_token) return;
  binder.declare(plan, &logits_, "eval.logits", Category::data, DType::f32,
                 {s.batch, model.config().num_labels}, Placement::host);
}

nlohmann::json Evaluator::run(Backend& be, Model& model, const Dataset& data,
                              const std::string& prefix,
                              const std::function<void(const Prediction&)>& on_prediction,
                              Communicator* comm, StagedForward* staged, Communicator* sequence) {
  const int ranks = comm ? comm->size() : 1, rank = comm ? comm->rank() : 0;
  const auto start = std::chrono::steady_clock::now();
  const BatchShape planned = model.planned_shape();
  const int64_t B = planned.batch;
  const bool classification = !logits_.empty();
  StepOptions so;
  so.training = false;
  so.compute_grad = false;
  const EvalContext c{be,
                      model,
                      data,
                      logits_,
                      on_prediction,
                      so,
                      planned.seq,
                      classification ? logits_.dim(1) : 0,
                      ranks,
                      dynamic_padding_,
                      classification,
                      model.config().regression,
                      padding_free_ ? &samples_ : nullptr,
                      staged,
                      sequence,
                      staged ? nullptr : recorder_};
  EvalTally t(std::max<int64_t>(c.L, 2));
  const HeldWeights held(be, model.resident_weights());  // nothing changes them meanwhile
  // Batch i is rank i mod N's. When a forward pass meets the other ranks (ZeRO stage 3's
  // gathers, expert parallelism), every rank runs as many forward passes: one without a batch of
  // its own runs one over the default batch and discards it.
  const bool in_step = ranks > 1 && model.forward_meets_peers();
  const int64_t rounds = (data.size() + ranks * B - 1) / (ranks * B);
  for (int64_t first = rank * B; first < (in_step ? rounds * ranks * B : data.size());
       first += ranks * B) {
    if (first >= data.size()) {
      model.use_seq(dynamic_padding_
                        ? dynamic_padded_length(1, planned.seq, model.config().sequence_ranks)
                        : planned.seq);
      model.reset_batch();
      model.forward(be, so);
      continue;
    }
    evaluate_batch(c, first, std::min(B, data.size() - first), t);
  }
  if (staged) combine_stages(c, t);
  if (sequence != nullptr) {  // each held its tokens' losses; the first a classifier's results
    if (sequence->rank() != 0) t.batches = 0;
    combine_ranks(*sequence, c.regression, t);
  }
  if (ranks > 1) combine_ranks(*comm, c.regression, t);
  if (on_prediction && c.gathers())
    deliver_predictions(comm ? *comm : staged->stages(), t.predicted, on_prediction);
  return eval_metrics(c, t, prefix, seconds_since(start), data.size());
}

}  // namespace brisk
