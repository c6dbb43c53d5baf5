// Streaming evaluation metrics (see metrics.h).
#include "eval/metrics.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"

namespace brisk {

ClassificationMetrics::ClassificationMetrics(int64_t num_labels)
    : num_labels_(num_labels),
      tp_(static_cast<size_t>(num_labels)),
      fp_(static_cast<size_t>(num_labels)),
      fn_(static_cast<size_t>(num_labels)) {
  BRISK_CHECK(num_labels >= 2, "classification metrics need at least 2 labels");
}

void ClassificationMetrics::add(int64_t label, int64_t predicted) {
  BRISK_CHECK(label >= 0 && label < num_labels_ && predicted >= 0 && predicted < num_labels_,
              "label ", label, " or prediction ", predicted, " outside [0, ", num_labels_, ")");
  ++count_;
  if (label == predicted) {
    ++correct_;
    ++tp_[static_cast<size_t>(label)];
  } else {
    ++fn_[static_cast<size_t>(label)];
    ++fp_[static_cast<size_t>(predicted)];
  }
}

double ClassificationMetrics::accuracy() const {
  return count_ > 0 ? static_cast<double>(correct_) / static_cast<double>(count_) : 0.0;
}

double ClassificationMetrics::f1() const {
  auto f1_of = [&](size_t c) {
    const int64_t denom = 2 * tp_[c] + fp_[c] + fn_[c];
    return denom > 0 ? 2.0 * static_cast<double>(tp_[c]) / static_cast<double>(denom) : 0.0;
  };
  if (num_labels_ == 2) return f1_of(1);
  double sum = 0;
  int64_t seen = 0;
  for (size_t c = 0; c < tp_.size(); ++c) {
    if (tp_[c] + fp_[c] + fn_[c] == 0) continue;  // neither a label nor a prediction
    sum += f1_of(c);
    ++seen;
  }
  return seen > 0 ? sum / static_cast<double>(seen) : 0.0;
}

std::vector<double> ClassificationMetrics::counts() const {
  std::vector<double> c{static_cast<double>(count_), static_cast<double>(correct_)};
  for (const auto* v : {&tp_, &fp_, &fn_})
    for (int64_t x : *v) c.push_back(static_cast<double>(x));
  return c;
}

void ClassificationMetrics::set_counts(const std::vector<double>& c) {
  BRISK_CHECK(c.size() == 2 + 3 * tp_.size(), "internal error: ", c.size(),
              " classification counts for ", num_labels_, " labels");
  count_ = static_cast<int64_t>(c[0]);
  correct_ = static_cast<int64_t>(c[1]);
  size_t at = 2;
  for (auto* v : {&tp_, &fp_, &fn_})
    for (int64_t& x : *v) x = static_cast<int64_t>(c[at++]);
}

void RegressionMetrics::add(float label, float predicted) {
  labels_.push_back(label);
  predictions_.push_back(predicted);
}

double RegressionMetrics::mse() const {
  double s = 0;
  for (size_t i = 0; i < labels_.size(); ++i) {
    const double d = static_cast<double>(predictions_[i]) - labels_[i];
    s += d * d;
  }
  return labels_.empty() ? 0.0 : s / static_cast<double>(labels_.size());
}

namespace {
double pearson_of(const std::vector<double>& x, const std::vector<double>& y) {
  const size_t n = x.size();
  if (n < 2) return std::nan("");
  const double mx = std::accumulate(x.begin(), x.end(), 0.0) / static_cast<double>(n);
  const double my = std::accumulate(y.begin(), y.end(), 0.0) / static_cast<double>(n);
  double sxy = 0, sxx = 0, syy = 0;
  for (size_t i = 0; i < n; ++i) {
    sxy += (x[i] - mx) * (y[i] - my);
    sxx += (x[i] - mx) * (x[i] - mx);
    syy += (y[i] - my) * (y[i] - my);
  }
  return sxx > 0 && syy > 0 ? sxy / std::sqrt(sxx * syy) : std::nan("");
}

// 1-based ranks, ties sharing the mean of the ranks they span.
std::vector<double> ranks(const std::vector<float>& v) {
  std::vector<size_t> order(v.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return v[a] < v[b]; });
  std::vector<double> r(v.size());
  for (size_t i = 0; i < order.size();) {
    size_t j = i;
    while (j + 1 < order.size() && v[order[j + 1]] == v[order[i]]) ++j;
    const double mean_rank = (static_cast<double>(i) + static_cast<double>(j)) / 2.0 + 1.0;
    for (size_t k = i; k <= j; ++k) r[order[k]] = mean_rank;
    i = j + 1;
  }
  return r;
}
}  // namespace

double RegressionMetrics::pearson() const {
  return pearson_of(std::vector<double>(labels_.begin(), labels_.end()),
                    std::vector<double>(predictions_.begin(), predictions_.end()));
}

double RegressionMetrics::spearman() const {
  return pearson_of(ranks(labels_), ranks(predictions_));
}

}  // namespace brisk
