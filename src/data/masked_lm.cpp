// run_mlm's samples and masking (see masked_lm.h).
#include "data/masked_lm.h"

#include <algorithm>

#include "core/error.h"
#include "core/rng.h"
#include "data/encode_rows.h"
#include "data/token_cache.h"

namespace brisk {

namespace {
constexpr uint32_t kMaskingSite = 0x6d6c6d00u;  // "mlm": apart from every dropout site

bool below(uint32_t word, double p) {
  return static_cast<double>(word) < p * 4294967296.0;
}
}  // namespace

MaskedToken mask_token(const MaskingOptions& m, int64_t index, int64_t epoch, int64_t stride,
                       int64_t position, int32_t id, bool special) {
  if (special) return {id, kIgnoreIndex};
  const RngKey key{m.seed, static_cast<uint64_t>(epoch), kMaskingSite};
  const Philox4 r = rng_block(key, static_cast<uint64_t>(index * stride + position));
  if (!below(r.v[0], m.probability)) return {id, kIgnoreIndex};
  if (below(r.v[1], 0.8)) return {m.mask_id, id};
  // Of the remaining 20%, half random (the collator's 0.1 / 0.2), half kept.
  if (!below(r.v[2], 0.5)) return {id, id};
  const auto random =
      static_cast<int32_t>((uint64_t{r.v[3]} * static_cast<uint64_t>(m.vocab)) >> 32);
  return {random, id};
}

TokenizedRows tokenize_lines(const TextTable& t, int64_t column, const TextEncoder& encoder,
                             int64_t first, int64_t end, int64_t max_length, bool skip_blank) {
  std::vector<int64_t> kept;
  for (int64_t r = first; r < end; ++r) {
    const bool empty = t.kind(r, column) == CellKind::null || blank_text(t.text(r, column));
    if (!(skip_blank && empty)) kept.push_back(r);
  }
  const std::vector<Encoded> rows =
      encode_rows(encoder, static_cast<int64_t>(kept.size()), [&](int64_t i) {
        const int64_t r = kept[static_cast<size_t>(i)];
        const std::string_view text =
            t.kind(r, column) == CellKind::null ? std::string_view() : t.text(r, column);
        return encoder.encode(text, std::nullopt, max_length);
      });
  auto a = std::make_shared<TokenArrays>();
  a->offsets.push_back(0);
  for (const Encoded& e : rows) {
    a->ids.insert(a->ids.end(), e.ids.begin(), e.ids.end());
    a->types.insert(a->types.end(), e.ids.size(), 0);
    a->offsets.push_back(static_cast<int64_t>(a->ids.size()));
  }
  return view_of(std::move(a));
}

MaskedLmDataset::MaskedLmDataset(TokenizedRows rows, int64_t lead, int64_t trail,
                                 int64_t max_length, bool line_by_line, int32_t pad,
                                 MaskingOptions masking)
    : lead_(lead),
      trail_(trail),
      max_length_(max_length),
      line_by_line_(line_by_line),
      pad_(pad),
      masking_(masking),
      rows_(std::move(rows)) {
  BRISK_CHECK(max_length >= 1, "max_seq_length must be positive for masked language modeling");
  BRISK_CHECK(masking.probability > 0 && masking.probability < 1,
              "mlm_probability must lie in (0, 1), got ", masking.probability);
  BRISK_CHECK(masking.mask_id >= 0 && masking.mask_id < masking.vocab && masking.vocab > 0,
              "the mask token id ", masking.mask_id, " lies outside the tokenizer's ",
              masking.vocab, " tokens");
  BRISK_CHECK(
      !rows_.offsets.empty() && (rows_.types.empty() || rows_.types.size() == rows_.ids.size()),
      "tokenized rows without the arrays a masked-LM dataset needs");
  const int64_t n = static_cast<int64_t>(rows_.offsets.size()) - 1;
  if (line_by_line_) {
    for (int64_t r = 0; r < n; ++r)
      BRISK_CHECK(length(r) <= max_length, "tokenized line ", r, " holds ", length(r),
                  " tokens, more than max_seq_length ", max_length);
    BRISK_CHECK(n > 0, "no line with text to learn from");
    return;
  }
  // run_mlm's group_texts over map batches of 1000 lines: each batch's lines concatenated and cut
  // into blocks, its remainder dropped.
  for (int64_t first = 0; first < n; first += static_cast<int64_t>(kGroupRows)) {
    const int64_t begin = rows_.offsets[static_cast<size_t>(first)];
    const int64_t end =
        rows_.offsets[static_cast<size_t>(std::min(n, first + static_cast<int64_t>(kGroupRows)))];
    for (int64_t at = begin; at + max_length <= end; at += max_length) blocks_.push_back(at);
  }
  BRISK_CHECK(!blocks_.empty(), "the text holds ", rows_.ids.size(),
              " tokens: not one block of max_seq_length ", max_length,
              " in any group of 1000 lines");
}

int64_t MaskedLmDataset::size() const {
  return line_by_line_ ? static_cast<int64_t>(rows_.offsets.size()) - 1
                       : static_cast<int64_t>(blocks_.size());
}

int64_t MaskedLmDataset::length(int64_t index) const {
  if (!line_by_line_) return max_length_;
  const size_t i = static_cast<size_t>(index);
  return rows_.offsets[i + 1] - rows_.offsets[i];
}

template <typename F>
void MaskedLmDataset::each_token(int64_t index, F&& f) const {
  const std::span<const int64_t> off = rows_.offsets;
  const int64_t start = line_by_line_ ? off[static_cast<size_t>(index)] : blocks_[index];
  // The line holding the first token, then the lines the block runs through.
  size_t r =
      line_by_line_
          ? static_cast<size_t>(index)
          : static_cast<size_t>(std::upper_bound(off.begin(), off.end(), start) - off.begin() - 1);
  const int64_t n = length(index);
  for (int64_t t = 0; t < n; ++t) {
    const int64_t at = start + t;
    while (off[r + 1] <= at) ++r;
    const bool special = at - off[r] < lead_ || at >= off[r + 1] - trail_;
    f(t, rows_.ids[static_cast<size_t>(at)], special);
  }
}

void MaskedLmDataset::fill_row(int64_t index, int64_t epoch, const Batch& b, int64_t row) const {
  const int64_t T = b.input_ids.dim(1);
  int32_t* ids = b.input_ids.i32() + row * T;
  int32_t* labels = b.labels.i32() + row * T;
  int32_t* mask = b.attention_mask.i32() + row * T;
  int32_t* types = b.token_type_ids.empty() ? nullptr : b.token_type_ids.i32() + row * T;
  for (int64_t t = 0; t < T; ++t) {  // padding, overwritten where the sample has tokens
    ids[t] = pad_;
    labels[t] = kIgnoreIndex;
    mask[t] = 0;
    if (types) types[t] = 0;
  }
  each_token(index, [&](int64_t t, int32_t id, bool special) {
    if (t >= T) return;
    const MaskedToken m = mask_token(masking_, index, epoch, max_length_, t, id, special);
    ids[t] = m.input;
    labels[t] = m.label;
    mask[t] = 1;
  });
}

int64_t MaskedLmDataset::count_targets(int64_t index, int64_t epoch) const {
  int64_t chosen = 0;
  each_token(index, [&](int64_t t, int32_t id, bool special) {
    chosen += mask_token(masking_, index, epoch, max_length_, t, id, special).label != kIgnoreIndex;
  });
  return chosen;
}

}  // namespace brisk
