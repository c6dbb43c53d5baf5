// Evaluation metrics against values worked out by hand (the same scikit-learn and scipy give).
#include <gtest/gtest.h>

#include "eval/metrics.h"
#include "test_support.h"

namespace brisk::testing {
namespace {

TEST(Metrics, AccuracyAndBinaryF1) {
  ClassificationMetrics m(2);
  const int labels[] = {1, 1, 0, 0, 1}, preds[] = {1, 0, 0, 1, 1};
  for (int i = 0; i < 5; ++i) m.add(labels[i], preds[i]);
  EXPECT_DOUBLE_EQ(m.accuracy(), 3.0 / 5.0);
  EXPECT_DOUBLE_EQ(m.f1(), 4.0 / 6.0);  // label 1: tp 2, fp 1, fn 1
  ClassificationMetrics none(2);
  none.add(0, 0);
  EXPECT_EQ(none.f1(), 0.0);  // no positive label or prediction: 0, as zero_division gives
  expect_error([&] { m.add(2, 0); }, "outside [0, 2)");
}

TEST(Metrics, MacroF1AveragesTheLabelsThatOccur) {
  ClassificationMetrics m(4);  // label 3 never occurs: left out of the mean
  const int labels[] = {0, 1, 2, 2, 1, 0}, preds[] = {0, 2, 2, 2, 1, 1};
  for (int i = 0; i < 6; ++i) m.add(labels[i], preds[i]);
  // Per label: 0 -> 2/3, 1 -> 2/4, 2 -> 4/5.
  EXPECT_NEAR(m.f1(), (2.0 / 3 + 0.5 + 0.8) / 3, 1e-15);
  EXPECT_DOUBLE_EQ(m.accuracy(), 4.0 / 6.0);
}

TEST(Metrics, RegressionMsePearsonSpearman) {
  RegressionMetrics m;
  const float labels[] = {1, 2, 3, 4, 5}, preds[] = {2, 4, 5, 4, 5};
  for (int i = 0; i < 5; ++i) m.add(labels[i], preds[i]);
  EXPECT_NEAR(m.mse(), 1.8, 1e-12);
  EXPECT_NEAR(m.pearson(), 6.0 / std::sqrt(60.0), 1e-12);
  // Ranks of the predictions with ties averaged: 1, 2.5, 4.5, 2.5, 4.5.
  EXPECT_NEAR(m.spearman(), 7.0 / std::sqrt(90.0), 1e-12);
  RegressionMetrics flat;
  flat.add(1, 3);
  flat.add(2, 3);
  EXPECT_TRUE(std::isnan(flat.pearson()));  // a constant prediction has no correlation
}

}  // namespace
}  // namespace brisk::testing
