// run_glue- and run_clm-style datasets from text tables (see text_dataset.h).
#include "data/text_dataset.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>

#include "core/checked.h"
#include "core/error.h"
#include "data/encode_rows.h"

namespace brisk {

bool blank_text(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
  });
}

bool is_index_column(const TextTable& t, int64_t col) {
  const std::string& name = t.columns()[static_cast<size_t>(col)];
  if (name != "idx" && !name.empty() && name != "Unnamed: 0") return false;
  for (int64_t r = 0; r < t.rows(); ++r)
    if (t.kind(r, col) != CellKind::integer) return false;
  return true;
}

ClassificationColumns classification_columns(const TextTable& t,
                                             const std::string& text_column_name) {
  ClassificationColumns c;
  c.label = t.column("label");
  if (!text_column_name.empty()) {
    c.first = t.column(text_column_name);
    BRISK_CHECK(c.first >= 0, "'", t.origin(), "' has no column \"", excerpt(text_column_name),
                "\" (--text_column_name)");
    return c;
  }
  const int64_t s1 = t.column("sentence1"), s2 = t.column("sentence2");
  if (s1 >= 0 && s2 >= 0) {
    c.first = s1;
    c.second = s2;
    return c;
  }
  std::vector<int64_t> others;
  for (int64_t i = 0; i < static_cast<int64_t>(t.columns().size()); ++i) {
    if (i == c.label) continue;
    (is_index_column(t, i) ? c.skipped : others).push_back(i);
  }
  BRISK_CHECK(!others.empty(), "'", t.origin(), "' has no text column besides \"label\"",
              c.skipped.empty() ? "" : " and index columns");
  c.first = others[0];
  if (others.size() >= 2) c.second = others[1];
  return c;
}

namespace {
// A whole number's canonical digits ("+007" -> "7", "-0" -> "0"), exact at any length: labels
// beyond 64 bits stay distinct. A real of whole value ("-1.0") names the same class; any other
// text stays as it is (and names no class of whole numbers).
std::string whole_key(const std::string& text) {
  const bool minus = !text.empty() && text[0] == '-';
  size_t i = !text.empty() && (text[0] == '-' || text[0] == '+') ? 1 : 0;
  if (i == text.size() || text.find_first_not_of("0123456789", i) != std::string::npos) {
    char* end = nullptr;
    const double v = std::strtod(text.c_str(), &end);
    const bool whole = !text.empty() && end == text.c_str() + text.size() &&
                       text.find_first_of("xX") == std::string::npos && std::fabs(v) < 0x1p53 &&
                       v == std::floor(v);
    return whole ? std::to_string(static_cast<int64_t>(v)) : text;
  }
  while (i + 1 < text.size() && text[i] == '0') ++i;
  const std::string digits = text.substr(i);
  return minus && digits != "0" ? "-" + digits : digits;
}
std::string label_key(const std::string& text, bool whole) {
  return whole ? whole_key(text) : text;
}
// Numeric order of canonical whole numbers.
bool whole_less(const std::string& a, const std::string& b) {
  const bool na = a[0] == '-', nb = b[0] == '-';
  if (na != nb) return na;
  // Same sign: the longer digits are the larger magnitude, equal lengths compare as text.
  const bool smaller = a.size() != b.size() ? a.size() < b.size() : a < b;
  return na ? a != b && !smaller : smaller;
}
// A regression label: a number whose float32 value is finite.
float label_value(const TextTable& t, int64_t row, int64_t col) {
  const CellKind k = t.kind(row, col);
  const std::string& text = t.text(row, col);
  BRISK_CHECK(k == CellKind::real || k == CellKind::integer, t.where(row), ": label \"",
              excerpt(text), "\" is not a number, while the training labels are (regression)");
  const float v = std::strtof(text.c_str(), nullptr);
  BRISK_CHECK(std::isfinite(v), t.where(row), ": label ", excerpt(text),
              " is beyond float32's range");
  return v;
}
bool holds_minus_one(const TextTable& t, int64_t row, int64_t col) {
  const CellKind k = t.kind(row, col);
  return (k == CellKind::integer || k == CellKind::real) &&
         std::strtod(t.text(row, col).c_str(), nullptr) == -1.0;
}
// The rows of a test table whose label -1 means "none" (GLUE's test splits; run_glue drops their
// labels before predicting): in classification where -1 is not a class, in regression where
// every row holds -1 (-1 may be a real score).
std::vector<bool> rows_without_label(const TextTable& t, int64_t col, const LabelSet& labels) {
  std::vector<bool> none(static_cast<size_t>(t.rows()), false);
  if (col < 0) return none;
  for (int64_t r = 0; r < t.rows(); ++r) none[static_cast<size_t>(r)] = holds_minus_one(t, r, col);
  const bool all = std::find(none.begin(), none.end(), false) == none.end();
  if (labels.regression ? !all : labels.id_of("-1") >= 0) none.assign(none.size(), false);
  return none;
}
// A row's class; a label the set lacks is refused naming the row (and GLUE's -1, which means "no
// label" in test files only).
int32_t class_id(const TextTable& t, int64_t row, int64_t col, const LabelSet& labels) {
  const int64_t id = labels.id_of(t.text(row, col));
  BRISK_CHECK(id >= 0, t.where(row), ": label \"", excerpt(t.text(row, col)),
              "\" does not occur in the training data",
              holds_minus_one(t, row, col) ? " (-1 means \"no label\" in a --test_file only)" : "");
  return static_cast<int32_t>(id);
}
}  // namespace

int64_t LabelSet::id_of(const std::string& name) const {
  const auto it = ids.find(label_key(name, whole));
  return it == ids.end() ? -1 : it->second;
}

LabelSet label_set(const TextTable& train, int64_t label_column) {
  BRISK_CHECK(label_column >= 0, "'", train.origin(),
              "' has no \"label\" column: training needs labels");
  LabelSet s;
  bool all_whole = true;
  for (int64_t r = 0; r < train.rows(); ++r) {
    const CellKind k = train.kind(r, label_column);
    BRISK_CHECK(k != CellKind::null, train.where(r), ": the label is missing");
    if (k == CellKind::real) s.regression = true;
    if (k != CellKind::integer) all_whole = false;
  }
  if (s.regression) {
    for (int64_t r = 0; r < train.rows(); ++r) {
      const CellKind k = train.kind(r, label_column);
      BRISK_CHECK(k == CellKind::real || k == CellKind::integer, train.where(r), ": label \"",
                  excerpt(train.text(r, label_column)),
                  "\" is not a number, while other rows hold real numbers (regression)");
    }
    return s;
  }
  // Distinct values, sorted as run_glue sorts label_list: numerically for whole numbers.
  s.whole = all_whole;
  std::vector<std::string> names;
  for (int64_t r = 0; r < train.rows(); ++r) {
    const std::string key = label_key(train.text(r, label_column), all_whole);
    if (s.ids.emplace(key, 0).second) names.push_back(key);
  }
  if (all_whole)
    std::sort(names.begin(), names.end(), whole_less);
  else
    std::sort(names.begin(), names.end());
  for (size_t i = 0; i < names.size(); ++i) s.ids[names[i]] = static_cast<int64_t>(i);
  BRISK_CHECK(names.size() >= 2, "'", train.origin(), "': the labels take ", names.size(),
              " value: classification needs at least 2");
  s.names = std::move(names);
  return s;
}

TextClassificationDataset::TextClassificationDataset(const TextTable& t,
                                                     const ClassificationColumns& columns,
                                                     const LabelSet& labels,
                                                     const TextEncoder& encoder, int64_t max_length,
                                                     bool test_labels_optional)
    : max_length_(max_length), pad_(encoder.pad_id()), regression_(labels.regression) {
  BRISK_CHECK(max_length > 0, "max_seq_length must be positive");
  // Checked in order first, so the first bad row is the one named.
  for (int64_t r = 0; r < t.rows(); ++r)
    for (int64_t col : {columns.first, columns.second})
      BRISK_CHECK(col < 0 || t.kind(r, col) != CellKind::null, t.where(r), ": column \"",
                  t.columns()[col], "\" is empty");
  const std::vector<Encoded> rows = encode_rows(encoder, t.rows(), [&](int64_t r) {
    std::optional<std::string_view> second;
    if (columns.second >= 0) second = t.text(r, columns.second);
    return encoder.encode(t.text(r, columns.first), second, max_length);
  });
  const std::vector<bool> none =
      test_labels_optional ? rows_without_label(t, columns.label, labels)
                           : std::vector<bool>(static_cast<size_t>(t.rows()), columns.label < 0);
  auto a = std::make_shared<TokenArrays>();
  a->offsets.push_back(0);
  for (int64_t r = 0; r < t.rows(); ++r) {
    const Encoded& e = rows[static_cast<size_t>(r)];
    BRISK_CHECK(static_cast<int64_t>(e.ids.size()) <= max_length, t.where(r), ": the tokenizer ",
                "returned ", e.ids.size(), " tokens where at most ", max_length, " were asked for");
    a->ids.insert(a->ids.end(), e.ids.begin(), e.ids.end());
    if (e.type_ids.empty())
      a->types.insert(a->types.end(), e.ids.size(), 0);
    else
      a->types.insert(a->types.end(), e.type_ids.begin(), e.type_ids.end());
    a->offsets.push_back(static_cast<int64_t>(a->ids.size()));
    longest_ = std::max<int64_t>(longest_, static_cast<int64_t>(e.ids.size()));
    const bool unlabelled = columns.label < 0 || none[static_cast<size_t>(r)];
    if (regression_) {
      a->values.push_back(unlabelled ? std::numeric_limits<float>::quiet_NaN()
                                     : label_value(t, r, columns.label));
      continue;
    }
    if (unlabelled) {
      a->labels.push_back(kIgnoreIndex);
      continue;
    }
    a->labels.push_back(class_id(t, r, columns.label, labels));
  }
  rows_ = view_of(std::move(a));
}

TextClassificationDataset::TextClassificationDataset(TokenizedRows rows, bool regression,
                                                     int32_t pad, int64_t max_length)
    : max_length_(max_length), pad_(pad), regression_(regression), rows_(std::move(rows)) {
  const size_t n = rows_.offsets.empty() ? 0 : rows_.offsets.size() - 1;
  BRISK_CHECK(!rows_.offsets.empty() &&
                  (rows_.types.empty() || rows_.types.size() == rows_.ids.size()) &&
                  (regression ? rows_.values.size() == n && rows_.labels.empty()
                              : rows_.labels.size() == n && rows_.values.empty()),
              "tokenized rows without the arrays a classification dataset needs");
  for (size_t r = 0; r < n; ++r) {
    const int64_t len = rows_.offsets[r + 1] - rows_.offsets[r];
    BRISK_CHECK(len <= max_length, "tokenized row ", r, " holds ", len, " tokens, more than ",
                max_length);
    longest_ = std::max(longest_, len);
  }
}

void TextClassificationDataset::fill_row(int64_t index, int64_t, const Batch& b,
                                         int64_t row) const {
  const int64_t T = b.input_ids.dim(1);
  const int64_t begin = rows_.offsets[static_cast<size_t>(index)];
  const int64_t n = std::min(rows_.offsets[static_cast<size_t>(index) + 1] - begin, T);
  int32_t* ids = b.input_ids.i32() + row * T;
  int32_t* mask = b.attention_mask.i32() + row * T;
  int32_t* types = b.token_type_ids.empty() ? nullptr : b.token_type_ids.i32() + row * T;
  for (int64_t t = 0; t < T; ++t) {
    const bool real = t < n;
    ids[t] = real ? rows_.ids[static_cast<size_t>(begin + t)] : pad_;
    mask[t] = real ? 1 : 0;
    if (types)
      types[t] = real && !rows_.types.empty() ? rows_.types[static_cast<size_t>(begin + t)] : 0;
  }
  if (regression_)
    b.label_values.f32()[row] = rows_.values[static_cast<size_t>(index)];
  else
    b.labels.i32()[row] = rows_.labels[static_cast<size_t>(index)];
}

int64_t TextClassificationDataset::count_targets(int64_t index, int64_t) const {
  const size_t i = static_cast<size_t>(index);
  return regression_ ? !no_label_value(rows_.values[i]) : rows_.labels[i] != kIgnoreIndex;
}

CausalLmDataset::CausalLmDataset(const TextTable& t, int64_t column, const TextEncoder& encoder,
                                 int64_t block_size, int64_t first_row, int64_t end_row)
    : block_size_(block_size) {
  BRISK_CHECK(block_size >= 2, "block_size must be at least 2");
  const std::vector<Encoded> rows = encode_rows(encoder, end_row - first_row, [&](int64_t i) {
    const int64_t r = first_row + i;
    return t.kind(r, column) == CellKind::null ? Encoded{}
                                               : encoder.encode(t.text(r, column), std::nullopt, 0);
  });
  // run_clm groups the rows in map batches of 1000: each batch's tokens are concatenated and cut
  // into blocks, its remainder dropped.
  auto a = std::make_shared<TokenArrays>();
  std::vector<int32_t>& tokens = a->ids;
  int64_t total = 0;
  for (size_t first = 0; first < rows.size(); first += kGroupRows) {
    const size_t end = std::min(rows.size(), first + kGroupRows);
    const size_t begin_tokens = tokens.size();
    for (size_t r = first; r < end; ++r)
      tokens.insert(tokens.end(), rows[r].ids.begin(), rows[r].ids.end());
    const size_t n = tokens.size() - begin_tokens;
    total += static_cast<int64_t>(n);
    tokens.resize(begin_tokens +
                  n / static_cast<size_t>(block_size) * static_cast<size_t>(block_size));
  }
  BRISK_CHECK(!tokens.empty(), "'", t.origin(), "' rows [", first_row, ", ", end_row, ") hold ",
              total, " tokens: not one block of block_size ", block_size,
              " in any group of 1000 rows");
  tokens.shrink_to_fit();
  rows_ = view_of(std::move(a));
}

CausalLmDataset::CausalLmDataset(TokenizedRows tokens, int64_t block_size)
    : block_size_(block_size), rows_(std::move(tokens)) {
  BRISK_CHECK(block_size >= 2 && !rows_.ids.empty() &&
                  rows_.ids.size() % static_cast<size_t>(block_size) == 0 && rows_.offsets.empty(),
              "tokenized blocks that are not a whole number of blocks of ", block_size);
}

void CausalLmDataset::fill_row(int64_t index, int64_t, const Batch& b, int64_t row) const {
  const int64_t T = b.input_ids.dim(1);
  const int32_t* src = rows_.ids.data() + index * block_size_;
  int32_t* ids = b.input_ids.i32() + row * T;
  int32_t* labels = b.labels.i32() + row * T;
  int32_t* mask = b.attention_mask.i32() + row * T;
  for (int64_t t = 0; t < T; ++t) {
    const bool real = t < block_size_;
    ids[t] = real ? src[t] : 0;
    labels[t] = real ? src[t] : kIgnoreIndex;
    mask[t] = real ? 1 : 0;
  }
}

int64_t causal_lm_text_column(const TextTable& t, const std::string& text_column_name,
                              std::vector<int64_t>* skipped) {
  const std::string name = text_column_name.empty() ? "text" : text_column_name;
  const int64_t c = t.column(name);
  if (c >= 0) return c;
  BRISK_CHECK(text_column_name.empty(), "'", t.origin(), "' has no column \"", excerpt(name),
              "\" (--text_column_name)");
  const auto columns = static_cast<int64_t>(t.columns().size());
  int64_t first = 0;
  while (first < columns && is_index_column(t, first)) ++first;
  BRISK_CHECK(first < columns, "'", t.origin(), "' has no text column besides index columns");
  for (int64_t i = 0; skipped && i < first; ++i) skipped->push_back(i);
  return first;
}

int64_t validation_split_rows(int64_t rows, double percentage) {
  BRISK_CHECK(percentage >= 0 && percentage < 100,
              "validation_split_percentage must lie in [0, 100), got ", percentage);
  return static_cast<int64_t>(std::llround(static_cast<double>(rows) * percentage / 100.0));
}

}  // namespace brisk
