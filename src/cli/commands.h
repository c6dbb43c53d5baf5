// The actions behind the brisk subcommands; main.cpp only parses arguments and calls these.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "eval/generate.h"
#include "train/estimate.h"
#include "train/trainer.h"

namespace brisk::cli {

struct ForwardBackwardArgs {
  std::string config;   // built-in name, config.json or model folder
  std::string weights;  // model.safetensors; empty = initialize from seed
  std::string batch;    // batch.safetensors
  std::string output;   // where to write loss, logits and gradients; empty = none
  std::string adapter;  // a LoRA adapter folder on the model (PEFT's files); empty = none
  bool dropout = false;
  uint64_t seed = 42;
  uint64_t step = 0;
  Switches switches;  // the measurement switches the front door read (core/switches.h)
};

int run_train(const TrainOptions& options);
// The value of --options_file in argv, if any (read before the other flags so they override it).
std::string find_options_file(int argc, char** argv);
int run_forward_backward(const ForwardBackwardArgs& args);
// Plans the run `options` describe on their device (train/estimate.h) and prints the plan by
// category and per block, the fixed overheads it assumes and the guides' rules of thumb; writes
// it as JSON and HTML too where asked.
int run_estimate(const TrainOptions& options, const EstimateArgs& args);

// Reads text lines (a file, or stdin when empty) and prints each one's ids as a JSON list.
struct TokenizeArgs {
  std::string tokenizer;  // a folder or tokenizer file
  std::string input;      // empty: stdin
  bool add_special_tokens = true;
  std::string pair_separator;  // when set, a line's text after it is the second of a pair
  bool count_only = false;     // print only the counts and the time (for benchmarks)
};
int run_tokenize(const TokenizeArgs& args);
// Prints the prompt and its continuation (stdout) and the speed (stderr).
int run_generate(const GenerateOptions& options);

}  // namespace brisk::cli
