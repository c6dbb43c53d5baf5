// Datasets from text files (see file_data.h).
#include "train/file_data.h"

#include <filesystem>

#include "core/error.h"
#include "data/text_dataset.h"
#include "data/text_table.h"

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
}  // namespace

FileData load_file_data(const TrainOptions& o, ModelConfig& config) {
  FileData d;
  d.tokenizer_path = o.tokenizer_name.empty() ? o.model_name_or_path : o.tokenizer_name;
  d.tokenizer = Tokenizer::load(d.tokenizer_path);
  BRISK_CHECK(d.tokenizer->vocab_size() <= config.vocab_size, "the tokenizer at '",
              d.tokenizer_path, "' has ", d.tokenizer->vocab_size(),
              " tokens, more than the model's vocab_size ", config.vocab_size);
  const Tokenizer& tok = *d.tokenizer;
  // run_clm reads plain-text lines with their line breaks unless told otherwise.
  const bool keep_linebreaks = config.model_type != ModelType::bert && o.keep_linebreaks;
  auto table = [&](const std::string& path) {
    return path.empty() ? TextTable() : read_text_table(path, keep_linebreaks);
  };
  const TextTable train = table(o.train_file), eval = table(o.validation_file),
                  test = table(o.test_file);

  if (config.model_type == ModelType::bert) {
    d.seq_len = o.max_seq_length;
    const TextTable& first = !o.train_file.empty()        ? train
                             : !o.validation_file.empty() ? eval
                                                          : test;
    const ClassificationColumns cols = classification_columns(first, o.text_column_name);
    LabelSet labels;
    if (!o.train_file.empty()) {
      labels = label_set(train, cols.label);
      set_labels(config, labels);
    } else {
      labels = labels_from_config(config);
      if (!labels.regression && labels.names.empty() && !o.validation_file.empty()) {
        labels = label_set(eval, classification_columns(eval, o.text_column_name).label);
        set_labels(config, labels);
      }
      BRISK_CHECK(labels.regression || !labels.names.empty(),
                  "no label names: the model's config has no label2id "
                  "and there is no labelled file");
    }
    auto dataset = [&](const TextTable& t) -> std::unique_ptr<Dataset> {
      if (t.rows() == 0) return nullptr;
      return std::make_unique<TextClassificationDataset>(
          t, classification_columns(t, o.text_column_name), labels, tok, o.max_seq_length);
    };
    d.train = dataset(train);
    d.eval = dataset(eval);
    d.test = dataset(test);
    return d;
  }

  // Causal LM, as run_clm: blocks of block_size tokens.
  d.seq_len =
      o.block_size > 0 ? o.block_size : std::min<int64_t>(1024, config.max_position_embeddings);
  BRISK_CHECK(o.test_file.empty(), "--test_file: a causal LM has no labels to predict");
  if (!o.train_file.empty()) {
    const int64_t col = causal_lm_text_column(train, o.text_column_name);
    const int64_t cut = o.validation_file.empty()
                            ? validation_split_rows(train.rows(), o.validation_split_percentage)
                            : 0;
    d.train = std::make_unique<CausalLmDataset>(train, col, tok, d.seq_len, cut, train.rows());
    if (cut > 0) d.eval = std::make_unique<CausalLmDataset>(train, col, tok, d.seq_len, 0, cut);
  }
  if (!o.validation_file.empty())
    d.eval = std::make_unique<CausalLmDataset>(
        eval, causal_lm_text_column(eval, o.text_column_name), tok, d.seq_len, 0, eval.rows());
  return d;
}

void copy_tokenizer_files(const std::string& tokenizer_path, const std::string& folder) {
  std::error_code ec;
  const fs::path src = fs::is_directory(tokenizer_path, ec)
                           ? fs::path(tokenizer_path)
                           : fs::path(tokenizer_path).parent_path();
  if (fs::equivalent(src, folder, ec)) return;
  for (const char* name : {"tokenizer.json", "vocab.txt", "vocab.json", "merges.txt",
                           "tokenizer_config.json", "special_tokens_map.json"}) {
    const fs::path from = src / name;
    if (!fs::is_regular_file(from, ec)) continue;
    fs::copy_file(from, fs::path(folder) / name, fs::copy_options::overwrite_existing, ec);
    BRISK_CHECK(!ec, "cannot copy '", from.string(), "' into '", folder, "': ", ec.message());
  }
}

}  // namespace brisk
