// Evaluation metrics computed as batches stream by (never holding all logits): accuracy and F1
// for classification (binary F1 of label 1 with two labels, else macro F1 over the labels that
// occur, as scikit-learn computes them), MSE, Pearson and Spearman for regression (one pair of
// floats per example), and the mean loss and perplexity for language models.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace brisk {

class ClassificationMetrics {
 public:
  explicit ClassificationMetrics(int64_t num_labels);
  void add(int64_t label, int64_t predicted);
  int64_t count() const { return count_; }
  double accuracy() const;
  // Two labels: F1 of label 1. More: the mean F1 of the labels seen as a label or a prediction.
  double f1() const;
  // The counts behind the metrics as numbers to sum across ranks (count, correct, then per label
  // true positives, false positives, false negatives), and the metrics of such summed counts.
  std::vector<double> counts() const;
  void set_counts(const std::vector<double>& counts);

 private:
  int64_t num_labels_;
  int64_t count_ = 0, correct_ = 0;
  std::vector<int64_t> tp_, fp_, fn_;  // per label
};

class RegressionMetrics {
 public:
  void add(float label, float predicted);
  int64_t count() const { return static_cast<int64_t>(labels_.size()); }
  double mse() const;
  double pearson() const;
  double spearman() const;  // Pearson of the ranks, ties sharing their mean rank
  const std::vector<float>& labels() const { return labels_; }
  const std::vector<float>& predictions() const { return predictions_; }

 private:
  std::vector<float> labels_, predictions_;
};

}  // namespace brisk
