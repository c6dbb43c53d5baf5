// The run's datasets from the user's text files (--train_file, --validation_file, --test_file),
// tokenized once with the model's tokenizer and prepared as the example scripts prepare them:
// BERT models classify (run_glue), GPT-2 models learn the text (run_clm).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "models/config.h"
#include "tokenizer/tokenizer.h"
#include "train/options.h"

namespace brisk {

struct FileData {
  std::unique_ptr<Tokenizer> tokenizer;
  std::string tokenizer_path;  // where the tokenizer's files are (copied next to the model)
  std::unique_ptr<Dataset> train, eval, test;
  int64_t seq_len = 0;  // what the run plans for: max_seq_length or block_size
  // The samples are rows of text, each its own length (a causal LM's rows, a masked LM's lines):
  // what --packing packs.
  bool rows = false;
  // What the tokenization cache did, a line per file ("loaded ...", "wrote ...", "rebuilt ...").
  std::vector<std::string> cache_notes;
  // What the column choice noticed: index columns skipped, a line per column name.
  std::vector<std::string> notes;
};

// Whether the options name any text file.
bool uses_text_files(const TrainOptions& o);

// Reads and tokenizes the files. For classification the config learns the label names from the
// training file (num_labels, id2label and label2id in its JSON, as run_glue sets them); a run
// without one takes them from the config's label2id. The tokenized files are cached in
// tokenized_cache_dir (default output_dir/tokenized_cache; "none": no cache), keyed by the file's
// bytes, the tokenizer's files and the options that shape the rows, and mapped by later runs
// (overwrite_cache: tokenize again).
FileData load_file_data(const TrainOptions& o, ModelConfig& config);

// Copies the tokenizer's files (tokenizer.json, vocab files, tokenizer_config.json,
// special_tokens_map.json) into `folder`, so that it is a complete transformers model folder;
// each is written beside and renamed into place (a full disk leaves no cut file).
void copy_tokenizer_files(const std::string& tokenizer_path, const std::string& folder);

}  // namespace brisk
