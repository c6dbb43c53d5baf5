// A causal LM's samples one per row (see lm_rows.h).
#include "data/lm_rows.h"

#include <algorithm>
#include <limits>
#include <string>

#include "core/error.h"
#include "data/encode_rows.h"

namespace brisk {

LmRowColumns prompt_completion_columns(const TextTable& t) {
  LmRowColumns c;
  c.prompt = t.column("prompt");
  c.completion = t.column("completion");
  BRISK_CHECK((c.prompt >= 0) == (c.completion >= 0), "'", t.origin(), "' has a \"",
              c.prompt >= 0 ? "prompt" : "completion", "\" column but no \"",
              c.prompt >= 0 ? "completion" : "prompt",
              "\" column: prompt/completion data needs both");
  return c;
}

namespace {
std::string_view cell(const TextTable& t, int64_t row, int64_t col) {
  return t.kind(row, col) == CellKind::null ? std::string_view() : t.text(row, col);
}

// A sample's tokens and its prompt's length.
struct LmRow {
  Encoded tokens;
  int64_t prompt = 0;
};

LmRow encode_row(const TextTable& t, const LmRowColumns& c, const TextEncoder& encoder, int32_t eos,
                 int64_t row) {
  LmRow r;
  if (c.pairs()) {
    const std::string_view prompt = cell(t, row, c.prompt);
    std::string text(prompt);
    text += cell(t, row, c.completion);
    r.tokens = encoder.encode(text, std::nullopt, 0);
    // The completion starts where the two tokenizations part (tokens may merge across the
    // boundary), as TRL's.
    const std::vector<int32_t> alone = encoder.encode(prompt, std::nullopt, 0).ids;
    const auto parted =
        std::mismatch(alone.begin(), alone.end(), r.tokens.ids.begin(), r.tokens.ids.end()).first;
    r.prompt = parted - alone.begin();
  } else {
    r.tokens = encoder.encode(cell(t, row, c.text), std::nullopt, 0);
  }
  std::vector<int32_t>& ids = r.tokens.ids;
  if (ids.empty() || ids.back() != eos) ids.push_back(eos);
  return r;
}
}  // namespace

TokenizedRows tokenize_lm_rows(const TextTable& t, const LmRowColumns& c,
                               const TextEncoder& encoder, int32_t eos, int64_t first,
                               int64_t end) {
  std::vector<int64_t> kept;
  for (int64_t r = first; r < end; ++r)
    if (c.pairs() || !blank_text(cell(t, r, c.text))) kept.push_back(r);
  const std::vector<LmRow> rows = encode_rows_as<LmRow>(
      encoder, static_cast<int64_t>(kept.size()),
      [&](int64_t i) { return encode_row(t, c, encoder, eos, kept[static_cast<size_t>(i)]); });
  auto a = std::make_shared<TokenArrays>();
  a->offsets.push_back(0);
  for (const LmRow& r : rows) {
    BRISK_CHECK(r.prompt <= std::numeric_limits<int32_t>::max(), "a prompt of ", r.prompt,
                " tokens in '", t.origin(), "'");
    a->ids.insert(a->ids.end(), r.tokens.ids.begin(), r.tokens.ids.end());
    a->offsets.push_back(static_cast<int64_t>(a->ids.size()));
    a->labels.push_back(static_cast<int32_t>(r.prompt));
  }
  return view_of(std::move(a));
}

LmRowsDataset::LmRowsDataset(TokenizedRows rows, int64_t max_length, int32_t pad,
                             bool completion_only_loss)
    : max_length_(max_length),
      pad_(pad),
      completion_only_loss_(completion_only_loss),
      rows_(std::move(rows)) {
  BRISK_CHECK(max_length >= 2, "a causal LM's samples need a limit of at least 2 tokens, got ",
              max_length);
  const size_t n = rows_.offsets.empty() ? 0 : rows_.offsets.size() - 1;
  BRISK_CHECK(n > 0 && rows_.labels.size() == n && rows_.types.empty() && rows_.values.empty(),
              "tokenized rows without the arrays a causal LM's samples need");
  for (size_t r = 0; r < n; ++r) {
    const int64_t len = rows_.offsets[r + 1] - rows_.offsets[r];
    BRISK_CHECK(len >= 1 && rows_.labels[r] >= 0 && rows_.labels[r] <= len, "tokenized row ", r,
                " holds ", len, " tokens and a prompt of ", rows_.labels[r]);
    truncated_ += len > max_length;
    // As TRL, a sample whose cut leaves no token to learn (a prompt filling the limit) is left
    // out.
    if (std::min(len, max_length) > unlearned_in_row(r)) {
      kept_.push_back(static_cast<int64_t>(r));
    }
  }
  BRISK_CHECK(!kept_.empty(), "no sample keeps a completion token within block_size ", max_length);
}

int64_t LmRowsDataset::unlearned_in_row(size_t row) const {
  return completion_only_loss_ ? rows_.labels[row] : 0;
}

size_t LmRowsDataset::row(int64_t index) const {
  return static_cast<size_t>(kept_[static_cast<size_t>(index)]);
}

int64_t LmRowsDataset::length(int64_t index) const {
  const size_t r = row(index);
  return std::min(rows_.offsets[r + 1] - rows_.offsets[r], max_length_);
}

void LmRowsDataset::fill_row(int64_t index, int64_t, const Batch& b, int64_t at) const {
  const int64_t T = b.input_ids.dim(1);
  const int32_t* src = rows_.ids.data() + rows_.offsets[row(index)];
  const int64_t n = std::min(length(index), T), prompt = unlearned_in_row(row(index));
  int32_t* ids = b.input_ids.i32() + at * T;
  int32_t* labels = b.labels.i32() + at * T;
  int32_t* mask = b.attention_mask.i32() + at * T;
  for (int64_t t = 0; t < T; ++t) {
    const bool real = t < n;
    ids[t] = real ? src[t] : pad_;
    labels[t] = real && t >= prompt ? src[t] : kIgnoreIndex;
    mask[t] = real ? 1 : 0;
  }
}

int64_t LmRowsDataset::count_targets(int64_t index, int64_t) const {
  // The labels at positions 1 and on: the first token is no target.
  return std::max<int64_t>(0, length(index) - std::max<int64_t>(1, unlearned_in_row(row(index))));
}

}  // namespace brisk
