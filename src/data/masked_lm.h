// run_mlm's data: text lines tokenized with the model's special tokens, as one sample per line
// (line_by_line: blank lines dropped, truncated to max_length, padded per batch) or concatenated
// in groups of 1000 lines and cut into blocks of max_length (each group's remainder dropped); and
// DataCollatorForLanguageModeling's masking, drawn from (seed, epoch, sample, position) so a
// sample's masks are new each epoch yet the same in a resumed run or a recomputation: every token
// but those the tokenizer's template added is chosen with mlm_probability; of the chosen, 80%
// become the mask token, 10% a random token of the tokenizer, 10% stay; the labels are the
// original ids at the chosen tokens and kIgnoreIndex elsewhere.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "data/text_dataset.h"

namespace brisk {

struct MaskingOptions {
  double probability = 0.15;  // mlm_probability
  int32_t mask_id = -1;       // the tokenizer's [MASK]
  int64_t vocab = 0;          // random replacements come from [0, vocab) (len(tokenizer))
  uint64_t seed = 0;
};

// What one token of a sample becomes: its input id and its label.
struct MaskedToken {
  int32_t input;
  int32_t label;  // kIgnoreIndex unless chosen
};

// The collator's draw for token `id` at `position` of sample `index` in `epoch` (samples are
// `stride` tokens apart in the draw's numbering); `special` tokens are never chosen.
MaskedToken mask_token(const MaskingOptions& m, int64_t index, int64_t epoch, int64_t stride,
                       int64_t position, int32_t id, bool special);

// Rows [first, end) of a text column tokenized with the template (rows as a classification's,
// without labels); with `max_length` > 0 truncated to it; `skip_blank`: empty and all-whitespace
// lines (and empty cells) are left out, as run_mlm's line_by_line does.
TokenizedRows tokenize_lines(const TextTable& table, int64_t column, const TextEncoder& encoder,
                             int64_t first, int64_t end, int64_t max_length, bool skip_blank);

class MaskedLmDataset final : public Dataset {
 public:
  static constexpr size_t kGroupRows = 1000;
  // `rows` as tokenize_lines gives them, each with `lead` special tokens in front and `trail`
  // behind (the template's).
  MaskedLmDataset(TokenizedRows rows, int64_t lead, int64_t trail, int64_t max_length,
                  bool line_by_line, int32_t pad, MaskingOptions masking);
  int64_t size() const override;
  int64_t seq_len() const override { return max_length_; }
  void fill_row(int64_t index, int64_t epoch, const Batch& batch, int64_t row) const override;
  int64_t count_targets(int64_t index, int64_t epoch) const override;
  int64_t length(int64_t index) const override;

 private:
  // Calls f(t, id, special) for each token t of sample `index` (special: the template added it).
  template <typename F>
  void each_token(int64_t index, F&& f) const;

  int64_t lead_, trail_, max_length_;
  bool line_by_line_;
  int32_t pad_;
  MaskingOptions masking_;
  TokenizedRows rows_;  // the lines; line_by_line: the samples
  // Grouped: where each block starts in rows_.ids (the lines end to end, as group_texts joins
  // them), so the blocks are views of the (possibly mapped) rows, not a copy.
  std::vector<int64_t> blocks_;
};

}  // namespace brisk
