// Rows tokenized before the run (see tokenized_data.h).
#include "train/tokenized_data.h"

#include <algorithm>
#include <limits>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"
#include "data/text_dataset.h"

namespace brisk {

namespace {

// The tokenizer to save with the model: tokenizer_name, or the model folder's when it has one.
void load_tokenizer(const TrainOptions& o, FileData& d) {
  d.tokenizer_path = !o.tokenizer_name.empty()                    ? o.tokenizer_name
                     : Tokenizer::in_folder(o.model_name_or_path) ? o.model_name_or_path
                                                                  : std::string();
  if (!d.tokenizer_path.empty()) d.tokenizer = Tokenizer::load(d.tokenizer_path);
}

const std::optional<TokenizedRows>& first_part(const TokenizedInput& in) {
  return in.train ? in.train : in.eval ? in.eval : in.test;
}

// Refuses a split whose arrays do not agree (offsets rising within the ids, a label or number per
// row, types beside the ids) or whose values do not fit the model, naming the split.
void check_rows(const char* split, const TokenizedRows& rows, const TokenLimits& limits) {
  const auto ids = static_cast<int64_t>(rows.ids.size());
  BRISK_CHECK(!rows.offsets.empty() && rows.offsets.front() >= 0 && rows.offsets.back() <= ids &&
                  std::is_sorted(rows.offsets.begin(), rows.offsets.end()),
              "the ", split, " set's row offsets do not rise within its ", ids, " token ids");
  const size_t n = rows.offsets.size() - 1;
  BRISK_CHECK(rows.labels.empty() || rows.labels.size() == n, "the ", split, " set has ",
              rows.labels.size(), " labels for ", n, " rows");
  BRISK_CHECK(rows.values.empty() || rows.values.size() == n, "the ", split, " set has ",
              rows.values.size(), " labels for ", n, " rows");
  BRISK_CHECK(rows.types.empty() || rows.types.size() == rows.ids.size(), "the ", split,
              " set has ", rows.types.size(), " token types for ", ids, " token ids");
  if (const char* bad = out_of_limits(rows, limits))
    BRISK_FAIL("the ", split, " set's tokenized rows hold ", bad);
}

// Rows to predict without labels: each marked as having none (kIgnoreIndex, or NaN for a
// regression's numbers).
TokenizedRows without_labels(const TokenizedRows& rows, bool regression) {
  struct Held {
    std::shared_ptr<const void> rows;
    std::vector<int32_t> labels;
    std::vector<float> values;
  };
  auto held = std::make_shared<Held>();
  held->rows = rows.memory;
  const size_t n = rows.offsets.size() - 1;
  TokenizedRows out = rows;
  if (regression) {
    held->values.assign(n, std::numeric_limits<float>::quiet_NaN());
    out.values = held->values;
  } else {
    held->labels.assign(n, kIgnoreIndex);
    out.labels = held->labels;
  }
  out.memory = held;
  return out;
}

std::unique_ptr<Dataset> classification(const char* split, const TokenizedRows& rows,
                                        const ModelConfig& config, const TrainOptions& o,
                                        int32_t pad, const TokenLimits& limits) {
  BRISK_CHECK(rows.labels.empty() || !config.regression, "the ", split,
              " set's labels are class ids, but the model is a regression (num_labels 1)");
  BRISK_CHECK(rows.values.empty() || config.regression, "the ", split,
              " set's labels are real numbers, but the model classifies into ", config.num_labels,
              " classes (a regression needs num_labels 1)");
  check_rows(split, rows, limits);
  TokenizedRows held = rows;
  if (rows.labels.empty() && rows.values.empty()) {
    BRISK_CHECK(std::string_view(split) == "prediction", "the ", split,
                " set has no labels (a classifier's rows need a label column)");
    held = without_labels(rows, config.regression);
  }
  return std::make_unique<TextClassificationDataset>(std::move(held), config.regression, pad,
                                                     o.max_seq_length);
}

std::unique_ptr<Dataset> causal_lm(const char* split, const TokenizedRows& rows, int64_t block,
                                   const TokenLimits& limits) {
  BRISK_CHECK(rows.labels.empty() && rows.values.empty(), "the ", split,
              " set has a label per row, but the model is a causal LM (its labels are its "
              "inputs)");
  check_rows(split, rows, limits);
  const auto first = static_cast<size_t>(rows.offsets.front());
  const size_t tokens = static_cast<size_t>(rows.offsets.back()) - first;
  const size_t whole = tokens / static_cast<size_t>(block) * static_cast<size_t>(block);
  BRISK_CHECK(whole > 0, "the ", split, " set holds ", tokens, " tokens, fewer than one block of ",
              block);
  TokenizedRows stream;  // the rows one after another
  stream.ids = rows.ids.subspan(first, whole);
  stream.memory = rows.memory;
  return std::make_unique<CausalLmDataset>(std::move(stream), block);
}
}  // namespace

FileData tokenized_data(const TrainOptions& o, ModelConfig& config, const TokenizedInput& in) {
  BRISK_CHECK(first_part(in).has_value(), "no tokenized rows given");
  FileData d;
  load_tokenizer(o, d);
  const TokenizedRows& first = *first_part(in);
  const bool labelled = !first.labels.empty() || !first.values.empty();
  if (config.task_from_architectures && labelled) use_sequence_classification(config);
  const TokenLimits limits{config.vocab_size, std::max<int64_t>(1, config.type_vocab_size),
                           config.regression ? 0 : config.num_labels};
  const auto make = [&](const char* split,
                        const std::optional<TokenizedRows>& rows) -> std::unique_ptr<Dataset> {
    if (!rows) return nullptr;
    if (config.task == ModelTask::sequence_classification) {
      const int32_t pad = d.tokenizer ? d.tokenizer->pad_id() : 0;
      return classification(split, *rows, config, o, pad, limits);
    }
    BRISK_CHECK(config.task == ModelTask::causal_lm, "a masked LM learns from text: give the ",
                split, " set's text, not its input_ids");
    return causal_lm(split, *rows, d.seq_len, limits);
  };
  d.seq_len = config.task == ModelTask::sequence_classification ? o.max_seq_length
              : o.block_size > 0                                ? o.block_size
                                 : std::min<int64_t>(1024, config.max_position_embeddings);
  BRISK_CHECK(config.task != ModelTask::causal_lm || !in.test,
              "a causal LM has no labels to predict");
  d.train = make("training", in.train);
  d.eval = make("evaluation", in.eval);
  d.test = make("prediction", in.test);
  return d;
}

}  // namespace brisk
