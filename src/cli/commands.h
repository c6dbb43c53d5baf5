// The actions behind the brisk subcommands; main.cpp only parses arguments and calls these.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "eval/generate.h"
#include "train/trainer.h"

namespace brisk::cli {

struct ForwardBackwardArgs {
  std::string config;   // built-in name, config.json or model folder
  std::string weights;  // model.safetensors; empty = initialize from seed
  std::string batch;    // batch.safetensors
  std::string output;   // where to write loss, logits and gradients; empty = none
  bool dropout = false;
  uint64_t seed = 42;
  uint64_t step = 0;
};

int run_train(const TrainOptions& options);
// The value of --options_file in argv, if any (read before the other flags so they override it).
std::string find_options_file(int argc, char** argv);
int run_forward_backward(const ForwardBackwardArgs& args);
// Plans the run `options` describe on their device (cuda needs no GPU) and prints the plan by
// category and per block, the fixed overheads it assumes and the guides' rules of thumb; writes
// it as JSON too when json_path is not empty.
struct EstimateArgs {
  std::string json_path;   // also write the plan (and the fit) as JSON here
  bool fit = false;        // rank the configurations that fit max_memory
  std::string precisions;  // comma-separated, for --fit; empty: the run's own
  std::string optims;      // comma-separated, for --fit; empty: the run's own
  std::string html_path;   // draw the plan (or the fit's candidates) into this HTML file
  int64_t world_size = 1;  // plan rank 0 of a data-parallel run of this many processes
  const TokenizedInput* tokenized = nullptr;  // rows tokenized before the run (the Python API)
};
int run_estimate(const TrainOptions& options, const EstimateArgs& args);
// The same plan printed, returned as the JSON --output_json writes (the Python API's
// estimate_memory).
nlohmann::json estimate(const TrainOptions& options, const EstimateArgs& args);

// Reads text lines (a file, or stdin when empty) and prints each one's ids as a JSON list.
struct TokenizeArgs {
  std::string tokenizer;  // a folder or tokenizer file
  std::string input;      // empty: stdin
  bool add_special_tokens = true;
  std::string pair_separator;  // when set, a line's text after it is the second of a pair
  bool count_only = false;     // print only the counts and the time (for benchmarks)
};
int run_tokenize(const TokenizeArgs& args);
// The ids of each text as run_tokenize prints a line's (args.input and count_only unused).
std::vector<std::vector<int32_t>> tokenize_texts(const TokenizeArgs& args,
                                                 const std::vector<std::string>& texts);

// Prints the prompt and its continuation (stdout) and the speed (stderr).
int run_generate(const GenerateOptions& options);

}  // namespace brisk::cli
