// Datasets a caller gives a run in place of the data its options name: a Dataset to train on
// (the tests), or rows tokenized before the run (the Python API's datasets with input_ids
// columns), read where they lie and prepared as load_file_data prepares the rows of text files.
#pragma once

#include <optional>

#include "data/dataset.h"
#include "data/token_cache.h"
#include "models/config.h"
#include "train/file_data.h"
#include "train/options.h"

namespace brisk {

// Per split: for classification each row's ids [offsets[r], offsets[r + 1]) with its class
// (labels, kIgnoreIndex: none) or its number (values) as the model is a classifier or a
// regression; for a causal LM the rows' ids one after another (offsets as for classification;
// the labels are the inputs).
struct TokenizedInput {
  std::optional<TokenizedRows> train, eval, test;
};

struct GivenData {
  GivenData(const Dataset* train_set = nullptr) : train(train_set) {}  // NOLINT: implicit
  explicit GivenData(const TokenizedInput* rows) : tokenized(rows) {}
  const Dataset* train = nullptr;
  const TokenizedInput* tokenized = nullptr;
};

// The run's datasets from `input`: classification rows of at most max_seq_length tokens (labels
// classes of the config's num_labels, or numbers for a regression; a head taken from the
// config's architectures gives way to labelled rows, as to labelled files); a causal LM's
// stream cut into blocks of block_size (run_clm's grouping; the remainder dropped). Ids must lie
// in the vocabulary. The tokenizer (tokenizer_name, or the model folder's) is loaded when there
// is one, so that it is saved with the model.
FileData tokenized_data(const TrainOptions& o, ModelConfig& config, const TokenizedInput& input);

}  // namespace brisk
