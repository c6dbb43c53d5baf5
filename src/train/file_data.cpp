// Datasets from text files (see file_data.h).
#include "train/file_data.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <optional>

#include "core/error.h"
#include "core/input_file.h"
#include "core/json_file.h"
#include "core/model_files.h"
#include "data/lm_rows.h"
#include "data/masked_lm.h"
#include "data/text_dataset.h"
#include "data/text_table.h"
#include "data/token_cache.h"

namespace brisk {

namespace fs = std::filesystem;

bool uses_text_files(const TrainOptions& o) {
  return !o.train_file.empty() || !o.validation_file.empty() || !o.test_file.empty();
}

namespace {
// The label set a run without a training file uses: the config's label2id (a fine-tuned model
// names its classes), else the evaluation file's labels.
LabelSet labels_from_config(const ModelConfig& c) {
  LabelSet s;
  s.regression = c.regression;
  if (s.regression) return s;
  const nlohmann::json l2i = c.source.value("label2id", nlohmann::json());
  if (!l2i.is_object() || static_cast<int64_t>(l2i.size()) != c.num_labels) return s;
  s.names.resize(l2i.size());
  for (const auto& [name, id] : l2i.items()) {
    if (!id.is_number_unsigned() || id.get<uint64_t>() >= s.names.size()) return LabelSet{};
    s.names[id.get<size_t>()] = name;
    s.ids[name] = id.get<int64_t>();
  }
  return s;
}

// As run_glue configures the model: one output named LABEL_0 for regression (the problem type
// transformers records), else the classes by name.
void set_labels(ModelConfig& c, const LabelSet& labels) {
  const std::vector<std::string> names =
      labels.regression ? std::vector<std::string>{"LABEL_0"} : labels.names;
  c.num_labels = static_cast<int64_t>(names.size());
  c.regression = labels.regression;
  nlohmann::json id2label = nlohmann::json::object(), label2id = nlohmann::json::object();
  for (size_t i = 0; i < names.size(); ++i) {
    id2label[std::to_string(i)] = names[i];
    label2id[names[i]] = i;
  }
  c.source["id2label"] = id2label;
  c.source["label2id"] = label2id;
  c.source.erase("num_labels");
  if (labels.regression)
    c.source["problem_type"] = "regression";
  else
    c.source.erase("problem_type");
}
// The classes (or regression) of the run: the training file's, else the config's label2id,
// else the validation file's; the config learns them from a file.
LabelSet run_labels(const TrainOptions& o, ModelConfig& config, const TextTable& train,
                    const TextTable& eval) {
  if (!o.train_file.empty()) {
    const LabelSet labels =
        label_set(train, classification_columns(train, o.text_column_name).label);
    set_labels(config, labels);
    return labels;
  }
  LabelSet labels = labels_from_config(config);
  if (!labels.regression && labels.names.empty() && !o.validation_file.empty()) {
    labels = label_set(eval, classification_columns(eval, o.text_column_name).label);
    set_labels(config, labels);
  }
  BRISK_CHECK(labels.regression || !labels.names.empty(),
              "no label names: the model's config has no label2id and there is no labelled file");
  return labels;
}

// The run's tokenization cache (see load_file_data).
class TokenCache {
 public:
  TokenCache(const TrainOptions& o, const std::string& tokenizer_path,
             std::vector<std::string>* notes)
      : overwrite_(o.overwrite_cache), notes_(notes) {
    dir_ = o.tokenized_cache_dir.empty()     ? (fs::path(o.output_dir) / "tokenized_cache").string()
           : o.tokenized_cache_dir == "none" ? ""
                                             : o.tokenized_cache_dir;
    if (dir_.empty()) return;
    Fingerprint f;
    std::error_code ec;
    if (fs::is_directory(tokenizer_path, ec)) {
      for (const char* name : kTokenizerFiles) {
        const fs::path p = fs::path(tokenizer_path) / name;
        if (fs::is_regular_file(p, ec)) f.add(name).add_file(p.string());
      }
    } else {
      f.add_file(tokenizer_path);
    }
    tokenizer_ = f.value();
  }

  // The dataset `make` builds from the rows of `file` prepared as `shape` says: rows mapped from
  // the cache when it holds them with values inside `limits` and `make` accepts them, else built
  // and cached.
  using Make = std::function<std::unique_ptr<Dataset>(TokenizedRows)>;
  std::unique_ptr<Dataset> get(const std::string& file, const std::string& shape,
                               const TokenLimits& limits,
                               const std::function<TokenizedRows()>& build, const Make& make) {
    if (dir_.empty()) return make(build());
    const uint64_t key = Fingerprint()
                             .add("brisk tokenized rows 2")
                             .add_file(file)
                             .add(std::to_string(tokenizer_))
                             .add(shape)
                             .value();
    char name[32];
    std::snprintf(name, sizeof name, "%016llx.tok", static_cast<unsigned long long>(key));
    const std::string path = (fs::path(dir_) / name).string();
    if (std::unique_ptr<Dataset> cached = mapped(file, path, key, limits, make)) return cached;
    TokenizedRows rows = build();
    write_token_cache(path, key, rows);
    notes_->push_back("'" + file + "': tokenized, cached in " + path);
    return make(std::move(rows));
  }

 private:
  // The dataset of the rows cached at `path`, or null (noted) when there are none to use.
  std::unique_ptr<Dataset> mapped(const std::string& file, const std::string& path, uint64_t key,
                                  const TokenLimits& limits, const Make& make) {
    std::error_code ec;
    if (overwrite_ || !fs::exists(path, ec)) return nullptr;
    std::string why;
    if (std::optional<TokenizedRows> rows = read_token_cache(path, key, limits, &why)) {
      try {
        std::unique_ptr<Dataset> d = make(std::move(*rows));
        notes_->push_back("'" + file + "': the tokenized rows mapped from " + path);
        return d;
      } catch (const Error& e) {  // arrays of another shape than this run's
        why = e.what();
      }
    }
    notes_->push_back("'" + file + "': the cache " + path + " is unusable (" + why +
                      "): tokenized again");
    return nullptr;
  }

  std::string dir_;
  bool overwrite_;
  std::vector<std::string>* notes_;
  uint64_t tokenizer_ = 0;
};

// The index columns passed over when text columns were chosen by position, noted once per
// column name with the files holding it.
class SkippedColumns {
 public:
  void add(const TextTable& t, const std::vector<int64_t>& columns) {
    for (int64_t c : columns) {
      std::vector<std::string>& files = files_[t.columns()[static_cast<size_t>(c)]];
      const std::string file = fs::path(t.origin()).filename().string();
      if (std::find(files.begin(), files.end(), file) == files.end()) files.push_back(file);
    }
  }
  std::vector<std::string> notes() const {
    std::vector<std::string> out;
    for (const auto& [name, files] : files_) {
      std::string note = "column \"" + name + "\" of ";
      for (size_t i = 0; i < files.size(); ++i) note += (i ? ", " : "") + files[i];
      out.push_back(note + " holds whole numbers: skipped as an index column, not read as text");
    }
    return out;
  }

 private:
  std::map<std::string, std::vector<std::string>> files_;  // column name -> file names
};

// The tokenizer with a progress bar on a terminal ("tokenizing train.csv: 45%", as the
// example scripts' "Running tokenizer on dataset").
class ProgressEncoder final : public TextEncoder {
 public:
  ProgressEncoder(const TextEncoder& inner, bool show) : inner_(inner), show_(show) {}
  void start(const std::string& file) { file_ = fs::path(file).filename().string(); }
  Encoded encode(std::string_view text, std::optional<std::string_view> pair,
                 int64_t max_length) const override {
    return inner_.encode(text, pair, max_length);
  }
  int32_t pad_id() const override { return inner_.pad_id(); }
  void progress(int64_t done, int64_t total) const override {
    if (!show_ || total <= 0) return;
    std::fprintf(stderr, "\rtokenizing %s: %3lld%% (%lld of %lld rows)%s", file_.c_str(),
                 static_cast<long long>(100 * done / total), static_cast<long long>(done),
                 static_cast<long long>(total), done == total ? "\n" : "");
  }

 private:
  const TextEncoder& inner_;
  bool show_;
  std::string file_;
};

// The options that shape a classification table's rows, for the cache key.
std::string classification_shape(const ClassificationColumns& c, const LabelSet& labels,
                                 int64_t max_length) {
  std::string s = "classification " + std::to_string(c.first) + " " + std::to_string(c.second) +
                  " " + std::to_string(c.label) + " " + std::to_string(max_length) +
                  (labels.regression ? " regression"
                   : labels.whole    ? " whole"
                                     : " text");
  for (const std::string& n : labels.names) s += std::string(1, '\0') + n;
  return s;
}
// The language-modeling scripts' splits: the training rows, of which the first
// validation_split_percentage validate when there is no validation file. make(table, first, end)
// builds a dataset of rows [first, end).
template <typename Make>
void split_train_eval(const TrainOptions& o, const TextTable& train, const TextTable& eval,
                      FileData& d, Make&& make) {
  if (!o.train_file.empty()) {
    const int64_t cut = o.validation_file.empty()
                            ? validation_split_rows(train.rows(), o.validation_split_percentage)
                            : 0;
    d.train = make(train, cut, train.rows());
    if (cut > 0) d.eval = make(train, 0, cut);
  }
  if (!o.validation_file.empty()) d.eval = make(eval, 0, eval.rows());
}

// run_mlm: lines tokenized with the template (cached per line), then grouped into blocks of
// max_seq_length or kept one per line, masked as DataCollatorForLanguageModeling masks. `d` in
// place, as the cache writes its notes into it.
void masked_lm_data(const TrainOptions& o, FileData& d, const TextTable& train,
                    const TextTable& eval, ProgressEncoder& tok, TokenCache& cache,
                    const TokenLimits& limits, SkippedColumns& skipped) {
  const Tokenizer& t = *d.tokenizer;
  d.seq_len = o.max_seq_length;
  d.rows = o.line_by_line;
  BRISK_CHECK(o.test_file.empty(), "--test_file: a masked LM has no labels to predict");
  MaskingOptions masking;
  masking.probability = o.mlm_probability;
  masking.mask_id = t.token_id("[MASK]");
  masking.vocab = t.vocab_size();
  masking.seed = o.seed;
  BRISK_CHECK(masking.mask_id >= 0, "the tokenizer at '", d.tokenizer_path,
              "' has no [MASK] token, which masked language modeling needs");
  // (Named variables: clang 14 cannot capture structured bindings in the lambda below.)
  const std::pair<int64_t, int64_t> specials = t.single_specials();
  const int64_t lead = specials.first, trail = specials.second;
  auto samples = [&](const TextTable& table, int64_t first, int64_t end) {
    std::vector<int64_t> index_columns;
    const int64_t col = causal_lm_text_column(table, o.text_column_name, &index_columns);
    skipped.add(table, index_columns);
    // Lines as run_mlm tokenizes them: truncated only one per line.
    const int64_t truncate = o.line_by_line ? o.max_seq_length : 0;
    const std::string shape = "masked_lm " + std::to_string(col) + " " + std::to_string(first) +
                              " " + std::to_string(end) + " " + std::to_string(truncate) +
                              (o.line_by_line ? " line_by_line" : "");
    return cache.get(
        table.origin(), shape, limits,
        [&] {
          tok.start(table.origin());
          return tokenize_lines(table, col, tok, first, end, truncate, o.line_by_line);
        },
        [&](TokenizedRows rows) {
          return std::make_unique<MaskedLmDataset>(std::move(rows), lead, trail, o.max_seq_length,
                                                   o.line_by_line, tok.pad_id(), masking);
        });
  };
  split_train_eval(o, train, eval, d, samples);
}

// run_glue, into d (in place: the cache writes its notes there): each file's rows tokenized
// (cached per file) as sentences or sentence pairs with their labels; in the test file label -1
// means "no label" (GLUE's test splits).
void classification_data(const TrainOptions& o, ModelConfig& config, FileData& d,
                         const TextTable& train, const TextTable& eval, const TextTable& test,
                         ProgressEncoder& tok, TokenCache& cache, TokenLimits limits,
                         SkippedColumns& skipped) {
  d.seq_len = o.max_seq_length;
  BRISK_CHECK(!o.line_by_line,
              "--line_by_line makes a language model's samples of lines; this model classifies "
              "(--mlm: a masked LM)");
  const LabelSet labels = run_labels(o, config, train, eval);
  limits.classes = labels.regression ? 0 : static_cast<int64_t>(labels.names.size());
  auto dataset = [&](const TextTable& t, bool is_test) -> std::unique_ptr<Dataset> {
    if (t.rows() == 0) return nullptr;
    const ClassificationColumns c = classification_columns(t, o.text_column_name);
    skipped.add(t, c.skipped);
    const std::string shape =
        classification_shape(c, labels, o.max_seq_length) + (is_test ? " test" : "");
    return cache.get(
        t.origin(), shape, limits,
        [&] {
          tok.start(t.origin());
          return TextClassificationDataset(t, c, labels, tok, o.max_seq_length, is_test).rows();
        },
        [&](TokenizedRows rows) {
          return std::make_unique<TextClassificationDataset>(std::move(rows), labels.regression,
                                                             tok.pad_id(), o.max_seq_length);
        });
  };
  d.train = dataset(train, false);
  d.eval = dataset(eval, false);
  d.test = dataset(test, true);
}

// The end-of-sequence token each causal-LM row ends with: the tokenizer's eos_token, else the
// config's (first) eos_token_id.
int32_t eos_of(const Tokenizer& t, const ModelConfig& config, const std::string& tokenizer_path) {
  if (t.eos_id() >= 0) return t.eos_id();
  const nlohmann::json e = config.source.value("eos_token_id", nlohmann::json());
  const nlohmann::json id = e.is_array() && !e.empty() ? e[0] : e;
  BRISK_CHECK(
      id.is_number_integer() && id.get<int64_t>() >= 0 && id.get<int64_t>() < t.vocab_size(),
      "the tokenizer at '", tokenizer_path,
      "' names no eos_token (tokenizer_config.json) and config.json no eos_token_id in "
      "its vocabulary: a causal LM's rows end with that token");
  return static_cast<int32_t>(id.get<int64_t>());
}

// A causal LM's rows (TRL's SFTTrainer on a plain dataset), into d (in place, as above): each
// prompt/completion pair, or each non-blank line, one sample of its tokens and the end-of-sequence
// token, cut to seq_len; the rows cached uncut.
void lm_rows_data(const TrainOptions& o, const ModelConfig& config, FileData& d,
                  const TextTable& train, const TextTable& eval, ProgressEncoder& tok,
                  TokenCache& cache, TokenLimits limits, SkippedColumns& skipped) {
  const int32_t eos = eos_of(*d.tokenizer, config, d.tokenizer_path);
  d.rows = true;
  limits.classes = std::numeric_limits<int32_t>::max();  // labels: the prompts' lengths
  int64_t truncated = 0, dropped = 0, samples = 0;
  auto rows = [&](const TextTable& t, int64_t first, int64_t end) -> std::unique_ptr<Dataset> {
    LmRowColumns c = prompt_completion_columns(t);
    std::vector<int64_t> index_columns;
    if (!c.pairs()) c.text = causal_lm_text_column(t, o.text_column_name, &index_columns);
    skipped.add(t, index_columns);
    const std::string shape = "lm_rows " + std::to_string(c.text) + " " + std::to_string(c.prompt) +
                              " " + std::to_string(c.completion) + " " + std::to_string(first) +
                              " " + std::to_string(end) + " " + std::to_string(eos);
    std::unique_ptr<Dataset> data = cache.get(
        t.origin(), shape, limits,
        [&] {
          tok.start(t.origin());
          return tokenize_lm_rows(t, c, tok, eos, first, end);
        },
        [&](TokenizedRows r) {
          return std::make_unique<LmRowsDataset>(std::move(r), d.seq_len, tok.pad_id(),
                                                 o.completion_only_loss);
        });
    const auto& made = static_cast<const LmRowsDataset&>(*data);
    truncated += made.truncated();
    dropped += made.dropped();
    samples += made.size() + made.dropped();
    return data;
  };
  split_train_eval(o, train, eval, d, rows);
  if (truncated > 0)
    d.notes.push_back(std::to_string(truncated) + " of " + std::to_string(samples) +
                      " rows are longer than block_size " + std::to_string(d.seq_len) +
                      " tokens: each keeps its first " + std::to_string(d.seq_len) +
                      (dropped > 0 ? "; " + std::to_string(dropped) +
                                         " left without a completion token are dropped"
                                   : std::string()));
}

// run_clm, into d (in place, as above): the text tokenized (cached per split) into blocks of
// block_size tokens (at most 1024 or the model's positions by default); prompt/completion files
// and --line_by_line: one sample per row (lm_rows_data).
void causal_lm_data(const TrainOptions& o, const ModelConfig& config, FileData& d,
                    const TextTable& train, const TextTable& eval, bool keep_linebreaks,
                    ProgressEncoder& tok, TokenCache& cache, const TokenLimits& limits,
                    SkippedColumns& skipped) {
  d.seq_len =
      o.block_size > 0 ? o.block_size : std::min<int64_t>(1024, config.max_position_embeddings);
  BRISK_CHECK(d.seq_len <= config.max_position_embeddings, "--block_size ", d.seq_len,
              " exceeds the model's max_position_embeddings ", config.max_position_embeddings);
  BRISK_CHECK(o.test_file.empty(), "--test_file: a causal LM has no labels to predict");
  const TextTable& first = !o.train_file.empty() ? train : eval;
  if (o.line_by_line || prompt_completion_columns(first).pairs())
    return lm_rows_data(o, config, d, train, eval, tok, cache, limits, skipped);
  auto blocks = [&](const TextTable& t, int64_t first, int64_t end) {
    std::vector<int64_t> index_columns;
    const int64_t col = causal_lm_text_column(t, o.text_column_name, &index_columns);
    skipped.add(t, index_columns);
    const std::string shape = "causal_lm " + std::to_string(col) + " " + std::to_string(first) +
                              " " + std::to_string(end) + " " + std::to_string(d.seq_len) +
                              (keep_linebreaks ? " linebreaks" : "");
    return cache.get(
        t.origin(), shape, limits,
        [&] {
          tok.start(t.origin());
          return CausalLmDataset(t, col, tok, d.seq_len, first, end).rows();
        },
        [&](TokenizedRows rows) {
          return std::make_unique<CausalLmDataset>(std::move(rows), d.seq_len);
        });
  };
  split_train_eval(o, train, eval, d, blocks);
}
}  // namespace

FileData load_file_data(const TrainOptions& o, ModelConfig& config) {
  FileData d;
  d.tokenizer_path = o.tokenizer_name.empty() ? o.model_name_or_path : o.tokenizer_name;
  d.tokenizer = Tokenizer::load(d.tokenizer_path);
  BRISK_CHECK(d.tokenizer->vocab_size() <= config.vocab_size, "the tokenizer at '",
              d.tokenizer_path, "' has ", d.tokenizer->vocab_size(),
              " tokens, more than the model's vocab_size ", config.vocab_size);
  ProgressEncoder tok(*d.tokenizer, !o.disable_tqdm && ::isatty(STDERR_FILENO));
  // run_clm reads plain-text lines with their line breaks unless told otherwise.
  // (run_mlm's text loader drops them: its default.)
  // Rows (--line_by_line) are samples: their line breaks are not part of them.
  const bool keep_linebreaks =
      config.task == ModelTask::causal_lm && o.keep_linebreaks && !o.line_by_line;
  auto table = [&](const std::string& path) {
    return path.empty() ? TextTable() : read_text_table(path, keep_linebreaks);
  };
  const TextTable train = table(o.train_file), eval = table(o.validation_file),
                  test = table(o.test_file);
  TokenCache cache(o, d.tokenizer_path, &d.cache_notes);
  // What cached rows must hold: ids the model embeds, token types it has (labels: below).
  const TokenLimits limits{config.vocab_size, std::max<int64_t>(1, config.type_vocab_size), 0};
  SkippedColumns skipped;
  const TextTable& first_table = !o.train_file.empty()        ? train
                                 : !o.validation_file.empty() ? eval
                                                              : test;
  // run_glue fine-tunes any checkpoint as a classifier (bert-base-uncased's config names
  // BertForMaskedLM): a head taken from `architectures` gives way to labelled files.
  if (config.task_from_architectures && first_table.column("label") >= 0)
    use_sequence_classification(config);

  if (config.task == ModelTask::sequence_classification)
    classification_data(o, config, d, train, eval, test, tok, cache, limits, skipped);
  else if (config.task == ModelTask::masked_lm)
    masked_lm_data(o, d, train, eval, tok, cache, limits, skipped);
  else  // causal LM, as run_clm
    causal_lm_data(o, config, d, train, eval, keep_linebreaks, tok, cache, limits, skipped);
  for (std::string& note : skipped.notes()) d.notes.push_back(std::move(note));
  return d;
}

void copy_tokenizer_files(const std::string& tokenizer_path, const std::string& folder) {
  std::error_code ec;
  const fs::path src = fs::is_directory(tokenizer_path, ec)
                           ? fs::path(tokenizer_path)
                           : fs::path(tokenizer_path).parent_path();
  if (fs::equivalent(src, folder, ec)) return;
  for (const char* name : kTokenizerFiles) {
    const fs::path from = src / name;
    if (!fs::is_regular_file(from, ec)) continue;
    // Written beside and renamed into place: a full disk never leaves a cut tokenizer file
    // next to complete weights.
    constexpr size_t kMaxTokenizerFile = size_t{256} << 20;
    write_file_atomically((fs::path(folder) / name).string(),
                          InputFile(from.string(), "tokenizer file").read_all(kMaxTokenizerFile));
  }
}

}  // namespace brisk
