// run_glue's and run_clm's data preparation on text tables, with a stand-in tokenizer (one id per
// word): column choice, label sets, padding and truncation, unknown labels, blocks.
#include <gtest/gtest.h>

#include <numeric>

#include "data/masked_lm.h"
#include "data/text_dataset.h"
#include "test_support.h"

namespace brisk::testing {
namespace {

// Words -> ids 10 + length of the word; [CLS] 1, [SEP] 2, [PAD] 0; pairs get type ids 0 then 1.
class WordEncoder final : public TextEncoder {
 public:
  Encoded encode(std::string_view text, std::optional<std::string_view> pair,
                 int64_t max_length) const override {
    auto words = [](std::string_view s) {
      std::vector<int32_t> ids;
      size_t at = 0;
      while (at < s.size()) {
        const size_t end = std::min(s.find(' ', at), s.size());
        if (end > at) ids.push_back(static_cast<int32_t>(10 + end - at));
        at = end + 1;
      }
      return ids;
    };
    std::vector<int32_t> a = words(text), b = pair ? words(*pair) : std::vector<int32_t>();
    const size_t special = pair ? 3 : 2;
    while (max_length > 0 && a.size() + b.size() + special > static_cast<size_t>(max_length))
      (a.size() >= b.size() ? a : b).pop_back();  // longest_first
    Encoded e;
    e.ids.push_back(1);
    e.ids.insert(e.ids.end(), a.begin(), a.end());
    e.ids.push_back(2);
    e.type_ids.assign(e.ids.size(), 0);
    if (pair) {
      e.ids.insert(e.ids.end(), b.begin(), b.end());
      e.ids.push_back(2);
      e.type_ids.resize(e.ids.size(), 1);
    }
    return e;
  }
  int32_t pad_id() const override { return 0; }
};

TextTable csv(const std::string& text) {
  return parse_text_table(text, TableFormat::csv, "d.csv");
}

struct Rows {
  std::vector<int32_t> ids, mask, types, labels;
  Batch batch(int64_t B, int64_t T, bool per_token) {
    ids.assign(B * T, -7);
    mask.assign(B * T, -7);
    types.assign(B * T, -7);
    labels.assign(per_token ? B * T : B, -7);
    return Batch{Tensor(ids.data(), Shape{B, T}, DType::i32),
                 Tensor(mask.data(), Shape{B, T}, DType::i32),
                 Tensor(types.data(), Shape{B, T}, DType::i32),
                 per_token ? Tensor(labels.data(), Shape{B, T}, DType::i32)
                           : Tensor(labels.data(), Shape{B}, DType::i32)};
  }
};

TEST(TextDataset, ColumnsAreChosenAsRunGlueChoosesThem) {
  auto cols = [](const std::string& header, const std::string& name = "") {
    const ClassificationColumns c = classification_columns(csv(header + "\n"), name);
    return std::vector<int64_t>{c.first, c.second, c.label};
  };
  EXPECT_EQ(cols("idx,sentence2,label,sentence1"), (std::vector<int64_t>{3, 1, 2}));
  EXPECT_EQ(cols("label,question,passage,extra"), (std::vector<int64_t>{1, 2, 0}));
  EXPECT_EQ(cols("sentence,label"), (std::vector<int64_t>{0, -1, 1}));
  EXPECT_EQ(cols("text"), (std::vector<int64_t>{0, -1, -1}));  // a test file without labels
  EXPECT_EQ(cols("a,b,label", "b"), (std::vector<int64_t>{1, -1, 2}));
  expect_error([&] { cols("a,label", "review"); }, "has no column \"review\"");
  expect_error([&] { cols("label"); }, "no text column besides \"label\"");
}

// GLUE's idx and pandas' index column (an empty header in to_csv's output, read as "Unnamed: 0"
// as pandas reads it) are passed over when columns are chosen by position, so the rows tokenize as
// without them.
TEST(TextDataset, IndexColumnsAreSkippedAsRunGlueUsersDropThem) {
  const WordEncoder enc;
  const TextTable plain = csv("sentence,label\nab c,1\nx,0\n");
  const ClassificationColumns plain_cols = classification_columns(plain, "");
  const LabelSet labels = label_set(plain, plain_cols.label);
  const TextClassificationDataset want(plain, plain_cols, labels, enc, 8);
  for (const std::string text :
       {",sentence,label\n0,ab c,1\n1,x,0\n", "Unnamed: 0,sentence,label\n7,ab c,1\n3,x,0\n",
        "sentence,label,idx\nab c,1,0\nx,0,1\n"}) {
    SCOPED_TRACE(text);
    const TextTable t = csv(text);
    const ClassificationColumns c = classification_columns(t, "");
    EXPECT_EQ(t.columns()[static_cast<size_t>(c.first)], "sentence");
    EXPECT_EQ(c.second, -1);
    ASSERT_EQ(c.skipped.size(), 1u);
    EXPECT_TRUE(is_index_column(t, c.skipped[0]));
    const TextClassificationDataset d(t, c, labels, enc, 8);
    for (int64_t i = 0; i < 2; ++i) {
      Rows a, b;
      const Batch ba = a.batch(1, 8, false), bb = b.batch(1, 8, false);
      d.fill_row(i, 0, ba, 0);
      want.fill_row(i, 0, bb, 0);
      EXPECT_EQ(a.ids, b.ids);
      EXPECT_EQ(a.types, b.types);
      EXPECT_EQ(a.labels, b.labels);
    }
  }
  // Not an index: another name, or values that are not all whole numbers.
  EXPECT_EQ(classification_columns(csv("id,sentence,label\n0,a,1\n"), "").second, 1);
  EXPECT_EQ(classification_columns(csv("idx,sentence,label\nq7,a,1\n"), "").second, 1);
  expect_error([] { classification_columns(csv("label,idx\n1,0\n"), ""); },
               "no text column besides \"label\" and index columns");
  // run_clm's first column, when there is no "text" column.
  std::vector<int64_t> skipped;
  EXPECT_EQ(causal_lm_text_column(csv(",body\n0,some words\n"), "", &skipped), 1);
  EXPECT_EQ(skipped, (std::vector<int64_t>{0}));
  expect_error([] { causal_lm_text_column(csv("idx\n0\n"), ""); },
               "no text column besides index columns");
}

// GLUE's test splits hold label -1: in a test table it means "no label" (the row is predicted
// and counts in no metric) unless -1 is a class; in training and validation tables a label the
// training data lacks is refused, -1 with a hint.
TEST(TextDataset, LabelMinusOneMeansNoLabelInATestTable) {
  const WordEncoder enc;
  const TextTable train = csv("sentence,label\na,0\nb,1\n");
  const ClassificationColumns cols = classification_columns(train, "");
  const LabelSet labels = label_set(train, cols.label);
  const TextTable test = csv("sentence,label\nx,-1\ny,1\nz,-1.0\n");
  const TextClassificationDataset t(test, cols, labels, enc, 8, true);
  EXPECT_EQ(t.count_targets(0, 0), 0);
  EXPECT_EQ(t.count_targets(1, 0), 1);
  EXPECT_EQ(t.count_targets(2, 0), 0);
  Rows r;
  const Batch b = r.batch(2, 8, false);
  t.fill_row(0, 0, b, 0);
  t.fill_row(1, 0, b, 1);
  EXPECT_EQ(r.labels, (std::vector<int32_t>{kIgnoreIndex, 1}));
  expect_error([&] { TextClassificationDataset(test, cols, labels, enc, 8); },
               "d.csv:2: label \"-1\" does not occur in the training data (-1 means \"no label\" "
               "in a --test_file only)");
  // Training labels may hold -1 as a class; then it is that class in the test file too.
  const TextTable signs = csv("sentence,label\na,-1\nb,1\n");
  const LabelSet sign_labels = label_set(signs, 1);
  EXPECT_EQ(sign_labels.names, (std::vector<std::string>{"-1", "1"}));
  const TextClassificationDataset s(test, cols, sign_labels, enc, 8, true);
  EXPECT_EQ(s.count_targets(0, 0), 1);
  // Regression: -1 can be a score, so only a test table labelled -1 throughout has no labels.
  const LabelSet scores = label_set(csv("sentence,label\na,0.5\nb,-1\n"), 1);
  ASSERT_TRUE(scores.regression);
  const TextClassificationDataset none(csv("sentence,label\nx,-1.0\ny,-1\n"), cols, scores, enc, 8,
                                       true);
  EXPECT_EQ(none.count_targets(0, 0) + none.count_targets(1, 0), 0);
  const TextClassificationDataset some(csv("sentence,label\nx,-1\ny,2.5\n"), cols, scores, enc, 8,
                                       true);
  EXPECT_EQ(some.count_targets(0, 0) + some.count_targets(1, 0), 2);
}

TEST(TextDataset, LabelSetsSortAsRunGlueSortsThem) {
  const LabelSet words = label_set(csv("s,label\na,rotten\nb,fresh\nc,rotten\n"), 1);
  EXPECT_EQ(words.names, (std::vector<std::string>{"fresh", "rotten"}));
  EXPECT_EQ(words.id_of("rotten"), 1);
  EXPECT_EQ(words.id_of("stale"), -1);
  const LabelSet numbers = label_set(csv("s,label\na,10\nb,9\nc,01\nd,1\n"), 1);
  EXPECT_EQ(numbers.names, (std::vector<std::string>{"1", "9", "10"}));  // numeric order
  EXPECT_EQ(numbers.id_of("001"), 0);
  EXPECT_TRUE(label_set(csv("s,label\na,0.5\nb,1\n"), 1).regression);
  expect_error([] { label_set(csv("s,label\na,x\nb,x\n"), 1); }, "take 1 value");
  expect_error([] { label_set(csv("s,label\na,\nb,x\n"), 1); }, "d.csv:2: the label is missing");
  expect_error([] { label_set(csv("s,label\na,0.5\nb,high\n"), 1); }, "d.csv:3: label \"high\"");
  expect_error([] { label_set(csv("s\na\n"), -1); }, "no \"label\" column");
}

TEST(TextDataset, ClassificationRowsArePaddedTruncatedAndLabelled) {
  const WordEncoder enc;
  const TextTable train = csv("sentence1,sentence2,label\nab c,dddd,yes\nx,,no\n");
  const ClassificationColumns cols = classification_columns(train, "");
  const LabelSet labels = label_set(train, cols.label);
  expect_error([&] { TextClassificationDataset(train, cols, labels, enc, 8); },
               "d.csv:3: column \"sentence2\" is empty");
  const TextTable ok = csv("sentence1,sentence2,label\nab c,dddd,yes\nx y z w,q,no\n");
  const TextClassificationDataset d(ok, cols, labels, enc, 6);
  ASSERT_EQ(d.size(), 2);
  Rows r;
  const Batch b = r.batch(2, 8, false);  // a wider batch than max_length: padded
  d.fill_row(0, 0, b, 0);
  d.fill_row(1, 0, b, 1);
  EXPECT_EQ(std::vector<int32_t>(r.ids.begin(), r.ids.begin() + 8),
            (std::vector<int32_t>{1, 12, 11, 2, 14, 2, 0, 0}));
  const std::vector<int32_t> mask0(r.mask.begin(), r.mask.begin() + 8);
  const std::vector<int32_t> want_mask0{1, 1, 1, 1, 1, 1, 0, 0};
  EXPECT_EQ(mask0, want_mask0);
  EXPECT_EQ(std::vector<int32_t>(r.types.begin(), r.types.begin() + 8),
            (std::vector<int32_t>{0, 0, 0, 0, 1, 1, 0, 0}));
  // Truncated to 6 tokens, the longer text first.
  EXPECT_EQ(std::vector<int32_t>(r.ids.begin() + 8, r.ids.end()),
            (std::vector<int32_t>{1, 11, 11, 2, 11, 2, 0, 0}));
  EXPECT_EQ(r.labels, (std::vector<int32_t>{1, 0}));  // "no" < "yes"
  EXPECT_EQ(d.longest(), 6);
  expect_error(
      [&] {
        TextClassificationDataset(csv("sentence1,sentence2,label\na,b,maybe\n"), cols, labels, enc,
                                  6);
      },
      "d.csv:2: label \"maybe\" does not occur in the training data");
  // A test file without labels: every row is predicted, none counts in a metric.
  const TextTable test = csv("sentence1,sentence2\na,b\n");
  const TextClassificationDataset t(test, classification_columns(test, ""), labels, enc, 6);
  EXPECT_EQ(t.count_targets(0, 0), 0);
}

TEST(TextDataset, CausalLmBlocksAsRunClmGroupsThem) {
  const WordEncoder enc;  // each line: [1, words..., 2]
  const TextTable t = parse_text_table("a bb\n\nccc\ndddd eeeee f\n", TableFormat::text, "kjv.txt");
  EXPECT_EQ(causal_lm_text_column(t, ""), 0);
  // Tokens: 1 11 12 2 | 1 2 | 1 13 2 | 1 14 15 11 2: 14 -> blocks [1 11 12 2] [1 2 1 13]
  // [2 1 14 15], the last 2 dropped.
  const CausalLmDataset d(t, 0, enc, 4, 0, t.rows());
  ASSERT_EQ(d.size(), 3);
  Rows r;
  const Batch b = r.batch(1, 5, true);
  d.fill_row(2, 0, b, 0);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{2, 1, 14, 15, 0}));
  EXPECT_EQ(r.labels, (std::vector<int32_t>{2, 1, 14, 15, kIgnoreIndex}));
  EXPECT_EQ(r.mask, (std::vector<int32_t>{1, 1, 1, 1, 0}));
  EXPECT_EQ(d.count_targets(0, 0), 3);
  // Only rows [2, 4): 1 13 2 1 14 15 11 2 -> 2 blocks.
  EXPECT_EQ(CausalLmDataset(t, 0, enc, 4, 2, 4).size(), 2);
  expect_error([&] { CausalLmDataset(t, 0, enc, 64, 0, t.rows()); }, "not one block");
  // Groups of 1000 rows, as run_clm's map batches: 1001 one-word lines (3 tokens each) in
  // blocks of 7 give 428 blocks from the first group's 3000 tokens and none from the last row.
  std::string many;
  for (int i = 0; i < 1001; ++i) many += "a\n";
  const TextTable m = parse_text_table(many, TableFormat::text, "many.txt");
  EXPECT_EQ(CausalLmDataset(m, 0, enc, 7, 0, m.rows()).size(), 428);
  // run_clm's lines keep their line break (keep_linebreaks), a last line without one stays so.
  const TextTable kept = parse_text_table("a b\r\n\nc", TableFormat::text, "k.txt", true);
  ASSERT_EQ(kept.rows(), 3);
  EXPECT_EQ(kept.text(0, 0), "a b\n");
  EXPECT_EQ(kept.text(1, 0), "\n");
  EXPECT_EQ(kept.text(2, 0), "c");
  EXPECT_EQ(validation_split_rows(34669, 5), 1733);
  EXPECT_EQ(validation_split_rows(10, 0), 0);
  expect_error([] { validation_split_rows(10, 100); }, "validation_split_percentage");
}

// DataCollatorForLanguageModeling's statistics: 15% of the ordinary tokens chosen, of those 80%
// masked, 10% a random token (uniform over the tokenizer), 10% kept; special tokens never.
TEST(MaskedLm, TheCollatorsDrawsHaveItsStatistics) {
  MaskingOptions m;
  m.mask_id = 3;
  m.vocab = 50;
  m.seed = 11;
  const int64_t n = 400000;
  int64_t chosen = 0, masked = 0, random = 0, kept = 0;
  std::vector<int64_t> buckets(5, 0);
  for (int64_t i = 0; i < n; ++i) {
    const int32_t id = 20 + static_cast<int32_t>(i % 7);
    const MaskedToken t = mask_token(m, i / 64, 2, 64, i % 64, id, false);
    if (t.label == kIgnoreIndex) {
      ASSERT_EQ(t.input, id);
      continue;
    }
    ASSERT_EQ(t.label, id);
    ++chosen;
    if (t.input == m.mask_id) {
      ++masked;
    } else if (t.input == id) {
      ++kept;
    } else {
      ++random;
      ASSERT_GE(t.input, 0);
      ASSERT_LT(t.input, m.vocab);
      ++buckets[static_cast<size_t>(t.input / 10)];
    }
    EXPECT_EQ(mask_token(m, i / 64, 2, 64, i % 64, id, true).label, kIgnoreIndex);
  }
  // Binomial standard deviations are below 0.1% of n here; the bounds allow about five.
  EXPECT_NEAR(static_cast<double>(chosen) / n, 0.15, 0.003);
  EXPECT_NEAR(static_cast<double>(masked) / chosen, 0.8, 0.01);
  // A random draw equal to the original (1 in 50) counts as kept.
  EXPECT_NEAR(static_cast<double>(random) / chosen, 0.1 * 49 / 50, 0.008);
  EXPECT_NEAR(static_cast<double>(kept) / chosen, 0.1 + 0.1 / 50, 0.008);
  for (int64_t b : buckets) EXPECT_NEAR(static_cast<double>(b) / random, 0.2, 0.02);
}

// Grouped blocks as run_mlm's group_texts: lines with their [CLS]/[SEP] concatenated and cut into
// blocks (the remainder dropped); the template's tokens are never chosen; the masks are a function
// of (seed, epoch, sample): the same in every fill and count, new in the next epoch.
TEST(MaskedLm, GroupedBlocksMaskOnlyTextTokensReproduciblyPerEpoch) {
  WordEncoder enc;
  std::string text;
  for (int i = 0; i < 40; ++i) text += "a bb ccc dddd eeeee ffffff\n";
  const TextTable t = parse_text_table(text, TableFormat::text, "t.txt", false);
  MaskingOptions m;
  m.mask_id = 5;
  m.vocab = 30;
  m.seed = 3;
  MaskedLmDataset d(tokenize_lines(t, 0, enc, 0, t.rows(), 0, false), 1, 1, 16, false, 0, m);
  ASSERT_EQ(d.size(), 40 * 8 / 16);  // 8 tokens a line, 20 blocks of 16
  Rows r;
  const Batch b = r.batch(1, 16, true);
  int64_t labelled = 0, changed = 0;
  for (int64_t i = 0; i < d.size(); ++i) {
    d.fill_row(i, 0, b, 0);
    int64_t here = 0;
    for (int64_t p = 0; p < 16; ++p) {
      const int32_t original = static_cast<int32_t>(p % 8 == 0 ? 1 : p % 8 == 7 ? 2 : 10 + p % 8);
      EXPECT_EQ(r.mask[p], 1);
      EXPECT_EQ(r.types[p], 0);
      if (p % 8 == 0 || p % 8 == 7) {
        EXPECT_EQ(r.labels[p], kIgnoreIndex);
        EXPECT_EQ(r.ids[p], original);
        continue;
      }
      if (r.labels[p] == kIgnoreIndex) {
        EXPECT_EQ(r.ids[p], original);
        continue;
      }
      EXPECT_EQ(r.labels[p], original);
      ++here;
    }
    EXPECT_EQ(d.count_targets(i, 0), here);
    labelled += here;
    const std::vector<int32_t> first = r.ids;
    d.fill_row(i, 0, b, 0);
    EXPECT_EQ(r.ids, first);
    d.fill_row(i, 1, b, 0);
    changed += r.ids != first;
  }
  EXPECT_GT(labelled, 0);
  EXPECT_GT(changed, d.size() / 2);
}

// line_by_line: blank lines dropped, each line one sample truncated with its template, padding
// never labelled.
TEST(MaskedLm, LineByLineSamplesAreTheNonBlankLines) {
  WordEncoder enc;
  const TextTable t = parse_text_table("a bb\n\n   \nccc dddd eeeee ffffff gg hh ii jj kk\n",
                                       TableFormat::text, "t.txt", false);
  MaskingOptions m;
  m.mask_id = 5;
  m.vocab = 30;
  m.probability = 0.5;
  MaskedLmDataset d(tokenize_lines(t, 0, enc, 0, t.rows(), 8, true), 1, 1, 8, true, 0, m);
  ASSERT_EQ(d.size(), 2);
  EXPECT_EQ(d.length(0), 4);
  EXPECT_EQ(d.length(1), 8);
  Rows r;
  const Batch b = r.batch(1, 8, true);
  d.fill_row(0, 4, b, 0);
  EXPECT_EQ(r.labels[0], kIgnoreIndex);
  EXPECT_EQ(r.labels[3], kIgnoreIndex);
  for (int p = 4; p < 8; ++p) {
    EXPECT_EQ(r.ids[p], 0);
    EXPECT_EQ(r.mask[p], 0);
    EXPECT_EQ(r.labels[p], kIgnoreIndex);
  }
  d.fill_row(1, 4, b, 0);
  EXPECT_EQ(r.ids[7], 2);  // truncated with its [SEP]
  EXPECT_EQ(r.labels[7], kIgnoreIndex);
  m.probability = 1.5;
  expect_error(
      [&] {
        MaskedLmDataset(tokenize_lines(t, 0, enc, 0, t.rows(), 8, true), 1, 1, 8, true, 0, m);
      },
      "mlm_probability");
}

}  // namespace
}  // namespace brisk::testing
