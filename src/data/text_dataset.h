// Datasets from the user's text files, prepared as the example scripts prepare them:
// run_glue's sequence classification (text columns and labels chosen as it chooses them) and
// run_clm's causal LM (every line tokenized, concatenated and cut into blocks).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "data/dataset.h"
#include "data/text_table.h"
#include "data/token_cache.h"

namespace brisk {

struct Encoded {
  std::vector<int32_t> ids;
  std::vector<int32_t> type_ids;  // empty: all 0
};

// What the text datasets need from a tokenizer.
class TextEncoder {
 public:
  virtual ~TextEncoder() = default;
  // With the model's special tokens; truncated to max_length tokens in all (longest_first for
  // pairs) when max_length > 0.
  virtual Encoded encode(std::string_view text, std::optional<std::string_view> pair,
                         int64_t max_length) const = 0;
  virtual int32_t pad_id() const = 0;
  // Called now and then while rows are encoded, from one thread: rows done of all (a progress
  // bar). Does nothing unless overridden.
  virtual void progress(int64_t done, int64_t total) const {
    (void)done;
    (void)total;
  }
};

// Whether a text is empty or all ASCII whitespace (a blank line).
bool blank_text(std::string_view s);

// An index column: named "idx" (GLUE's exports), "Unnamed: 0" (pandas' to_csv index, whose
// empty header reads as pandas reads it) or "", and holding whole numbers only. The columns chosen
// by position skip it, as run_glue users drop it.
bool is_index_column(const TextTable& t, int64_t col);

// How run_glue reads a classification table: the text columns (sentence1/sentence2 when both
// exist, else the first one or two columns other than "label" and the index columns, or the one
// named), and the labels (text or whole numbers: classes sorted as the train file's distinct
// values; reals: regression).
struct ClassificationColumns {
  int64_t first = -1, second = -1;  // second -1: single texts
  int64_t label = -1;               // -1: no label column (a test file)
  std::vector<int64_t> skipped;     // index columns passed over when choosing by position
};
ClassificationColumns classification_columns(const TextTable& t,
                                             const std::string& text_column_name);

// The label set of a training table: the sorted distinct values of its label column. Whole
// numbers sort numerically, text lexicographically; reals mean regression (empty names).
struct LabelSet {
  bool regression = false;
  bool whole = false;              // whole-number labels: "01" and "1" are one class
  std::vector<std::string> names;  // index = class id
  std::unordered_map<std::string, int64_t> ids;
  int64_t id_of(const std::string& name) const;  // -1 when unknown
};
LabelSet label_set(const TextTable& train, int64_t label_column);

// Tokenized classification examples: each row's ids (truncated to max_length) and its class, or
// its number when the label set is a regression's.
class TextClassificationDataset final : public Dataset {
 public:
  // Rows of `table`; labels mapped through `labels` (a label the set lacks is refused naming
  // the row), or none when the table has no label column. In a test table (test_labels_optional)
  // label -1 marks a row without one, as GLUE's test splits hold it: in classification where -1
  // is not a class, in regression where every row holds -1.
  TextClassificationDataset(const TextTable& table, const ClassificationColumns& columns,
                            const LabelSet& labels, const TextEncoder& encoder, int64_t max_length,
                            bool test_labels_optional = false);
  // Rows tokenized before (a cache); checked against max_length and the label kind.
  TextClassificationDataset(TokenizedRows rows, bool regression, int32_t pad, int64_t max_length);
  int64_t size() const override { return static_cast<int64_t>(rows_.offsets.size()) - 1; }
  int64_t seq_len() const override { return max_length_; }
  void fill_row(int64_t index, int64_t epoch, const Batch& batch, int64_t row) const override;
  int64_t count_targets(int64_t index, int64_t epoch) const override;
  int64_t length(int64_t index) const override {
    const size_t i = static_cast<size_t>(index);
    return rows_.offsets[i + 1] - rows_.offsets[i];
  }
  int64_t longest() const { return longest_; }
  const TokenizedRows& rows() const { return rows_; }

 private:
  int64_t max_length_;
  int32_t pad_;
  bool regression_;  // labels are numbers (rows_.values), not classes (rows_.labels)
  int64_t longest_ = 0;
  TokenizedRows rows_;  // labels: kIgnoreIndex, values: NaN = none
};

// run_clm's blocks: every row of a text column tokenized, concatenated, and cut into blocks of
// block_size tokens, in groups of 1000 rows (run_clm's map batches: each group's remainder is
// dropped); the labels are the inputs.
class CausalLmDataset final : public Dataset {
 public:
  static constexpr size_t kGroupRows = 1000;
  CausalLmDataset(const TextTable& table, int64_t text_column, const TextEncoder& encoder,
                  int64_t block_size, int64_t first_row, int64_t end_row);
  // Blocks tokenized before (a cache): the token stream, a whole number of blocks.
  CausalLmDataset(TokenizedRows tokens, int64_t block_size);
  int64_t size() const override { return static_cast<int64_t>(rows_.ids.size()) / block_size_; }
  int64_t seq_len() const override { return block_size_; }
  void fill_row(int64_t index, int64_t epoch, const Batch& batch, int64_t row) const override;
  int64_t count_targets(int64_t, int64_t) const override { return block_size_ - 1; }
  const TokenizedRows& rows() const { return rows_; }

 private:
  int64_t block_size_;
  TokenizedRows rows_;
};

// The text column run_clm uses: "text" when present, else the first column that is not an
// index column (those passed over are added to *skipped when given).
int64_t causal_lm_text_column(const TextTable& t, const std::string& text_column_name,
                              std::vector<int64_t>* skipped = nullptr);

// run_clm's validation_split_percentage on a table of `rows`: rows [0, cut) validate, [cut, rows)
// train, cut = rows * percentage / 100 rounded to the nearest row.
int64_t validation_split_rows(int64_t rows, double percentage);

}  // namespace brisk
