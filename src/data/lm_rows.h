// A causal LM's samples one per row, as TRL's SFTTrainer prepares a plain dataset: a text
// column's non-blank rows (--line_by_line), or prompt/completion pairs. Each sample is the row's
// tokens (the tokenizer's template included) followed by the end-of-sequence token, the labels
// its inputs (the model shifts them); a pair is tokenized as prompt + completion, its prompt's
// tokens (the prompt tokenized alone) without loss under completion_only_loss. A sample longer
// than the limit keeps its start, as TRL truncates.
#pragma once

#include <cstdint>
#include <vector>

#include "data/dataset.h"
#include "data/text_dataset.h"
#include "data/token_cache.h"

namespace brisk {

// Where a table's samples come from: its "prompt" and "completion" columns when it has them
// (one without the other is refused), else `text`.
struct LmRowColumns {
  int64_t text = -1;
  int64_t prompt = -1, completion = -1;
  bool pairs() const { return prompt >= 0; }
};
// The prompt/completion columns of `t`, or none (-1) when it has neither.
LmRowColumns prompt_completion_columns(const TextTable& t);

// Rows [first, end) of `t` tokenized as samples (without truncation: the dataset truncates, so
// a cache serves any limit): offsets and ids, and labels[r] = the tokens of row r's prompt (0 for
// text rows). Text rows skip blank cells; a missing prompt or completion reads as "".
TokenizedRows tokenize_lm_rows(const TextTable& t, const LmRowColumns& columns,
                               const TextEncoder& encoder, int32_t eos, int64_t first, int64_t end);

class LmRowsDataset final : public Dataset {
 public:
  // `rows` as tokenize_lm_rows gives them (checked: a cache may hold anything), samples cut to
  // max_length tokens; completion_only_loss: no loss on the prompts' tokens.
  LmRowsDataset(TokenizedRows rows, int64_t max_length, int32_t pad, bool completion_only_loss);
  int64_t size() const override { return static_cast<int64_t>(kept_.size()); }
  int64_t seq_len() const override { return max_length_; }
  void fill_row(int64_t index, int64_t epoch, const Batch& batch, int64_t row) const override;
  int64_t count_targets(int64_t index, int64_t epoch) const override;
  int64_t length(int64_t index) const override;
  // The rows longer than max_length, cut to it; the rows left out (no token to learn).
  int64_t truncated() const { return truncated_; }
  int64_t dropped() const { return static_cast<int64_t>(rows_.offsets.size()) - 1 - size(); }

 private:
  // The row of sample `index`; the leading tokens of a row without loss.
  size_t row(int64_t index) const;
  int64_t unlearned_in_row(size_t row) const;

  int64_t max_length_;
  int32_t pad_;
  bool completion_only_loss_;
  int64_t truncated_ = 0;
  TokenizedRows rows_;
  std::vector<int64_t> kept_;  // the samples' rows
};

}  // namespace brisk
