// brisk command line: argument parsing only; every action lives in commands.cpp.
#include <CLI/CLI.hpp>
#include <iostream>

#include "cli/commands.h"
#include "core/error.h"
#include "train/options.h"

int main(int argc, char** argv) {
  using namespace brisk;
  CLI::App app{"brisk: train transformer models natively, with every byte planned"};
  app.require_subcommand(1);

  // Options from a JSON file act as defaults that flags on the command line override.
  TrainOptions train;
  std::string options_file = cli::find_options_file(argc, argv);
  auto* t = app.add_subcommand("train", "train a model (TrainingArguments option names)");
  t->add_option("--options_file", options_file, "JSON file of options (flags override it)");
  try {
    if (!options_file.empty()) load_options_file(train, options_file);
  } catch (const Error& err) {
    std::cerr << "brisk: error: " << err.what() << "\n";
    return 1;
  }
  visit_options(train, [&](const char* name, auto& field, const char* help) {
    auto* opt = t->add_option(std::string("--") + name, field, help)->capture_default_str();
    if constexpr (std::is_same_v<std::decay_t<decltype(field)>, bool>)
      opt->expected(0, 1)->default_str("true");  // --fp16, --fp16 true, --fp16=false
  });
  t->add_option("--model", train.model_name_or_path, "alias of --model_name_or_path");

  cli::ForwardBackwardArgs fb;
  auto* f = app.add_subcommand("forward-backward",
                               "run one forward and backward pass and report loss, logits and "
                               "gradients");
  f->add_option("--config", fb.config, "built-in name, config.json or model folder")->required();
  f->add_option("--weights", fb.weights, "model.safetensors (default: initialize from --seed)");
  f->add_option("--batch", fb.batch, "safetensors with input_ids, attention_mask, labels, ...")
      ->required();
  f->add_option("--output", fb.output, "write loss, logits and grad.<name> here (safetensors)");
  f->add_flag("--dropout", fb.dropout, "train-mode dropout (default off)");
  f->add_option("--seed", fb.seed)->capture_default_str();
  f->add_option("--step", fb.step, "step of the dropout RNG")->capture_default_str();

  cli::EstimateArgs est;
  auto* e = app.add_subcommand("estimate", "print the memory plan of a training run by category");
  e->add_option("--model_name_or_path,--model", est.model)->capture_default_str();
  e->add_option("--per_device_train_batch_size", est.batch_size)->capture_default_str();
  e->add_option("--seq_len", est.seq_len)->capture_default_str();
  e->add_flag("--gradient_checkpointing", est.gradient_checkpointing);
  e->add_flag("--bf16", est.bf16);
  e->add_flag("--fp16", est.fp16);
  e->add_option("--optim", est.optim)->capture_default_str();
  e->add_option("--optim_args", est.optim_args);
  e->add_option("--bf16_master_weights", est.bf16_master_weights)
      ->expected(0, 1)
      ->default_str("true");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& err) {
    return app.exit(err);
  }
  try {
    if (*t) return cli::run_train(train);
    if (*f) return cli::run_forward_backward(fb);
    if (*e) return cli::run_estimate(est);
  } catch (const Error& err) {
    std::cerr << "brisk: error: " << err.what() << "\n";
    return 1;
  } catch (const std::bad_alloc&) {
    std::cerr << "brisk: error: out of host memory\n";
    return 1;
  } catch (const std::exception& err) {
    std::cerr << "brisk: error: " << err.what() << "\n";
    return 1;
  }
  return 0;
}
