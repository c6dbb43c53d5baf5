// The actions behind the brisk subcommands; main.cpp only parses arguments and calls these.
#pragma once

#include <string>

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

struct EstimateArgs {
  std::string model = "bert-large-uncased";
  int64_t batch_size = 8;
  int64_t seq_len = 512;
  bool gradient_checkpointing = false;
  bool bf16 = false;
  bool fp16 = false;
  std::string optim = "adamw_torch";
  std::string optim_args;
  bool bf16_master_weights = true;
};

int run_train(const TrainOptions& options);
// The value of --options_file in argv, if any (read before the other flags so they override it).
std::string find_options_file(int argc, char** argv);
int run_forward_backward(const ForwardBackwardArgs& args);
int run_estimate(const EstimateArgs& args);

}  // namespace brisk::cli
