// brisk command line: argument parsing only; every action lives in commands.cpp.
#include <CLI/CLI.hpp>
#include <iostream>

#include "cli/commands.h"
#include "core/error.h"

int main(int argc, char** argv) {
  using namespace brisk;
  CLI::App app{"brisk: train transformer models natively, with every byte planned"};
  app.require_subcommand(1);

  TrainOptions train;
  auto* t = app.add_subcommand("train", "train a model on the built-in synthetic dataset");
  t->add_option("--model_name_or_path,--model", train.model,
                "built-in config name, config.json, or model folder")
      ->capture_default_str();
  t->add_option("--per_device_train_batch_size", train.per_device_train_batch_size)
      ->capture_default_str();
  t->add_option("--num_train_epochs", train.num_train_epochs)->capture_default_str();
  t->add_option("--max_steps", train.max_steps, "overrides num_train_epochs when > 0")
      ->capture_default_str();
  t->add_option("--learning_rate", train.learning_rate)->capture_default_str();
  t->add_option("--weight_decay", train.weight_decay)->capture_default_str();
  t->add_option("--adam_beta1", train.adam_beta1)->capture_default_str();
  t->add_option("--adam_beta2", train.adam_beta2)->capture_default_str();
  t->add_option("--adam_epsilon", train.adam_epsilon)->capture_default_str();
  t->add_option("--max_grad_norm", train.max_grad_norm)->capture_default_str();
  t->add_option("--seed", train.seed)->capture_default_str();
  t->add_option("--logging_steps", train.logging_steps)->capture_default_str();
  t->add_flag("--gradient_checkpointing", train.gradient_checkpointing);
  t->add_option("--dataset_size", train.dataset_size, "synthetic samples")->capture_default_str();
  t->add_option("--seq_len", train.seq_len, "synthetic sequence length")->capture_default_str();

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
