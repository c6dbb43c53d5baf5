// brisk command line: argument parsing only; every action lives in commands.cpp.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <limits>
#include <map>
#include <thread>

#include "adapters/merge.h"
#include "cli/commands.h"
#include "core/error.h"
#include "core/switches.h"
#include "models/config.h"
#include "parallel/communicator.h"
#include "train/options.h"
#include "train/trainer_keys.h"

namespace {
// A flag's whole number, read exactly: digits only (a sign for signed options) and in range.
template <typename T>
CLI::Validator whole_number() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        T value{};
        const char* end = text.data() + text.size();
        const auto [ptr, ec] = std::from_chars(text.data(), end, value);
        if (ec == std::errc() && ptr == end) return {};
        return "\"" + brisk::excerpt(text) + "\" is not a whole number from " +
               std::to_string(std::numeric_limits<T>::min()) + " to " +
               std::to_string(std::numeric_limits<T>::max());
      },
      "", "whole number");
}

// A switch's text, as HfArgumentParser's string_to_bool reads it (any case): true, false, yes,
// no, t, f, y, n, 1, 0. CLI11 alone would take any number, "2" included, for true.
CLI::Validator switch_text() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        std::string t = text;
        std::transform(t.begin(), t.end(), t.begin(),
                       [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
        for (const char* ok : {"true", "false", "yes", "no", "t", "f", "y", "n", "1", "0"})
          if (t == ok) return {};
        return "\"" + brisk::excerpt(text) + "\" is not true or false";
      },
      "", "switch");
}

// A refused command line's message, with the option meant when an unknown one is a typo.
std::string parse_error_message(const CLI::ParseError& err, int argc, char** argv) {
  std::string message = brisk::excerpt(err.what(), 300);
  if (dynamic_cast<const CLI::ExtrasError*>(&err))
    for (int i = 1; i < argc; ++i) {
      const std::string_view arg = argv[i];
      if (!arg.starts_with("--")) continue;
      const size_t eq = arg.find('=');
      const std::string name(arg.substr(2, eq == arg.npos ? arg.npos : eq - 2));
      if (message.find("--" + name) == std::string::npos) continue;
      const std::string near = brisk::closest_option(name);
      if (!near.empty() && near != name) return message + " (did you mean --" + near + "?)";
    }
  return message + " (see --help)";
}

// " (rank r of N)" in a launch of several processes, read from the environment (errors may come
// before any communicator exists); "" for one process or a contradicting environment.
std::string launch_tag() {
  try {
    const brisk::LaunchInfo launch = brisk::launch_info_from_env();
    if (launch.size > 1)
      return " (rank " + std::to_string(launch.rank) + " of " + std::to_string(launch.size) + ")";
  } catch (const brisk::Error&) {  // the run itself reports that environment
  }
  return "";
}

// Reports an error and ends the run: one line, written whole in one write (a launcher that
// forwards several ranks' output, as mpirun, cannot cut it with its own lines). In a launch of
// several processes, rank 0 reports at once and the others only after a moment: an error every
// rank meets alike (a bad flag, option or file) is then shown once, by rank 0, whose end makes the
// launcher end the others before they write; an error of one rank alone is still shown, by that
// rank. Then every rank of the run ends (a rank that failed must not leave the others waiting).
int report_error(const std::string& message) {
  const std::string tag = launch_tag();
  if (!tag.empty() && tag.rfind(" (rank 0 ", 0) != 0)
    std::this_thread::sleep_for(std::chrono::seconds(2));
  const std::string line = "brisk: error" + tag + ": " + message + "\n";
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
  brisk::end_every_rank_on_error(1);
  return 1;
}
}  // namespace

namespace {

// train's and estimate's options: TrainOptions' fields as flags, from an options file first
// (flags override it), and the TrainingArguments keys brisk has no option for
// (train/trainer_keys.h), checked once parsing is done.
struct RunFlags {
  brisk::TrainOptions options;
  std::string options_file;
  std::map<std::string, std::string> trainer_key_flags;
  std::vector<std::pair<std::string, CLI::Option*>> trainer_key_options;
};

void add_run_options(CLI::App* sub, RunFlags& flags) {
  using namespace brisk;
  TrainOptions& options = flags.options;
  std::string& options_file = flags.options_file;
  auto& trainer_key_flags = flags.trainer_key_flags;
  auto& trainer_key_options = flags.trainer_key_options;
  sub->add_option("--options_file", options_file, "JSON file of options (flags override it)");
  // One flag of an option (the other spellings' hidden, group "").
  auto add_flag = [&](const std::string& flag, auto& field, const std::string& help,
                      const std::string& group) {
    auto* opt = sub->add_option(flag, field, help)->capture_default_str()->group(group);
    using Field = std::decay_t<decltype(field)>;
    if constexpr (std::is_integral_v<Field> && !std::is_same_v<Field, bool>)
      opt->check(whole_number<Field>());  // "-1" or 10^30 would otherwise wrap or saturate
    if constexpr (std::is_same_v<Field, bool>)
      // --fp16, --fp16 true, --fp16=false; the help shows the real default.
      opt->expected(0, 1)
          ->default_str("true")
          ->check(switch_text())
          ->option_text(field ? "[BOOLEAN=true]" : "[BOOLEAN=false]");
  };
  visit_options(options, [&](const char* name, auto& field, const char* help) {
    add_flag(std::string("--") + name, field, help, option_group(name));
    for (const auto& [other, own] : other_spellings())
      if (own == name) add_flag("--" + other, field, std::string("--") + name, "");
  });
  std::string builtins;
  for (const std::string& n : builtin_config_names())
    builtins += (builtins.empty() ? "" : ", ") + n;
  sub->get_option("--model_name_or_path")
      ->description("config.json, model folder, or a built-in configuration (random weights): " +
                    builtins);
  sub->add_option("--model", options.model_name_or_path, "alias of --model_name_or_path")
      ->group("Model");
  for (const std::string& name : trainer_key_names()) {
    CLI::Option* opt = sub->add_option("--" + name, trainer_key_flags[name])->expected(0, 1);
    opt->group("");  // accepted, not listed: see the footer
    trainer_key_options.emplace_back(name, opt);
  }
  sub->footer(
      "Other TrainingArguments and run_glue/run_clm/run_mlm options are accepted at values "
      "that change nothing in brisk (listed as ignored when the run starts) and refused "
      "otherwise, naming what to use instead (docs/usage.md).");
}

CLI::App* add_forward_backward(CLI::App& app, brisk::cli::ForwardBackwardArgs& fb) {
  auto* f = app.add_subcommand("forward-backward",
                               "run one forward and backward pass and report loss, logits and "
                               "gradients");
  f->add_option("--config", fb.config, "built-in name, config.json or model folder")->required();
  f->add_option("--weights", fb.weights, "model.safetensors (default: initialize from --seed)");
  f->add_option("--batch", fb.batch, "safetensors with input_ids, attention_mask, labels, ...")
      ->required();
  f->add_option("--output", fb.output, "write loss, logits and grad.<name> here (safetensors)");
  f->add_option("--adapter_name_or_path", fb.adapter,
                "a LoRA adapter folder (PEFT's adapter_config.json and adapter_model.safetensors) "
                "on the model, its base frozen: the gradients reported are the adapter's and its "
                "modules to save's");
  f->add_flag("--dropout", fb.dropout, "train-mode dropout (default off)");
  f->add_option("--seed", fb.seed)->capture_default_str()->check(whole_number<uint64_t>());
  f->add_option("--step", fb.step, "step of the dropout RNG")
      ->capture_default_str()
      ->check(whole_number<uint64_t>());

  return f;
}

CLI::App* add_estimate(CLI::App& app, brisk::EstimateArgs& est, RunFlags& flags) {
  auto* e = app.add_subcommand("estimate",
                               "print the memory plan of a training run (train's options; "
                               "--device cuda plans a GPU run without a GPU)");
  add_run_options(e, flags);
  e->add_option(
      "--output_json", est.json_path,
      "also write the plan as JSON (keys as train_results.json's memory, and every buffer)");
  e->add_flag("--fit", est.fit,
              "rank every batch x accumulation (same global batch) x recomputation (none, "
              "selective, full) x "
              "precision x optimizer allowed whose plan fits --max_memory, by predicted step time; "
              "with --world_size N also every layout of the N ranks: tensor-parallel degree x "
              "data replicas x ZeRO stage");
  e->add_option(
      "--html", est.html_path,
      "draw the plan (with --fit: the best candidates) as stacked bars in this HTML file");
  e->add_option("--fit_precisions", est.precisions,
                "precisions --fit may choose, e.g. fp32,bf16 (default: the run's)");
  e->add_option("--world_size", est.world_size,
                "plan a data-parallel run of this many processes: rank 0's plan, and each "
                "rank's share of what --zero_stage partitions")
      ->capture_default_str();
  e->add_option("--fit_optims", est.optims,
                "optimizers --fit may choose, e.g. adamw_torch,adafactor (default: the run's)");
  e->add_option("--fit_methods", est.methods,
                "fine-tuning methods --fit may choose: full, lora (adapters on a frozen base, "
                "the run's lora_* options), qlora (the same on a 4-bit base), e.g. "
                "full,lora,qlora (default: the run's)");

  return e;
}

CLI::App* add_tokenize(CLI::App& app, brisk::cli::TokenizeArgs& tk) {
  auto* k = app.add_subcommand("tokenize",
                               "print the ids of each input line as a JSON list (as transformers' "
                               "tokenizer(line)[\"input_ids\"])");
  k->add_option("--tokenizer", tk.tokenizer,
                "model folder, tokenizer.json, tokenizer.model, vocab.txt or vocab.json")
      ->required();
  k->add_option("--input", tk.input, "text file, one input per line (default: stdin)");
  k->add_option("--add_special_tokens", tk.add_special_tokens, "add [CLS]/[SEP] and the like")
      ->capture_default_str();
  k->add_option("--pair_separator", tk.pair_separator,
                "split each line at this text into a pair (e.g. a tab)");
  k->add_flag("--count_only", tk.count_only,
              "print only the lines, tokens and seconds (tokenizer throughput)");

  return k;
}

CLI::App* add_merge(CLI::App& app, brisk::MergeArgs& m) {
  auto* c = app.add_subcommand("merge",
                               "fold a LoRA adapter into its base model's weights (PEFT's "
                               "merge_and_unload, then save_pretrained)");
  c->add_option("--model,--model_name_or_path", m.model_name_or_path, "the base model's folder")
      ->required();
  c->add_option("--adapter_name_or_path", m.adapter_name_or_path,
                "the adapter's folder (adapter_config.json, adapter_model.safetensors)")
      ->required();
  c->add_option("--output_dir", m.output_dir, "where to write the merged model")->required();
  return c;
}

CLI::App* add_generate(CLI::App& app, brisk::GenerateOptions& gen, std::string& adapter) {
  using brisk::GenerateOptions;
  auto* g = app.add_subcommand("generate",
                               "continue a prompt with a trained causal LM (a key/value cache; "
                               "greedy, or sampled as transformers' generate)");
  g->add_option("--model,--model_name_or_path", gen.model_name_or_path,
                "model folder (config.json, model.safetensors, tokenizer files)")
      ->required();
  g->add_option("--prompt", gen.prompt, "the text to continue")->required();
  g->add_option("--max_new_tokens", gen.max_new_tokens, "tokens to generate at most")
      ->capture_default_str()
      ->check(whole_number<int64_t>());
  g->add_flag("--do_sample", gen.do_sample, "sample instead of choosing the most likely token");
  g->add_option("--temperature", gen.temperature, "divide the logits by this before sampling")
      ->capture_default_str();
  g->add_option("--top_k", gen.top_k, "sample among the k most likely tokens (0 = all)")
      ->capture_default_str()
      ->check(whole_number<int64_t>());
  g->add_option("--top_p", gen.top_p,
                "sample among the most likely tokens whose probabilities sum to top_p")
      ->capture_default_str();
  g->add_option("--seed", gen.seed, "seed of the sampling")
      ->capture_default_str()
      ->check(whole_number<uint64_t>());
  g->add_option("--device", gen.device, "cpu, cuda, or auto")->capture_default_str();
  g->add_option("--adapter_name_or_path", adapter,
                "a LoRA adapter folder (PEFT's or brisk's) merged into the model's weights first");

  return g;
}

// `gen` merging the adapter folder into the loaded weights (none when `adapter` is empty).
brisk::GenerateOptions with_adapter(brisk::GenerateOptions gen, const std::string& adapter) {
  if (!adapter.empty())
    gen.adjust_weights = [adapter](brisk::Backend& be, const brisk::Model& model) {
      brisk::merge_adapter_into(be, model, adapter, "--adapter_name_or_path");
    };
  return gen;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace brisk;
  CLI::App app{"brisk: train transformer models natively, with every byte planned"};
  app.require_subcommand(1);
  // A repeated flag keeps its last value, as argparse does.
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  RunFlags flags;
  flags.options_file = cli::find_options_file(argc, argv);
  try {
    if (!flags.options_file.empty()) load_options_file(flags.options, flags.options_file);
  } catch (const Error& err) {
    return report_error(excerpt(err.what(), 1000));  // a safety net
  }
  auto* t = app.add_subcommand("train", "train a model (TrainingArguments option names)");
  add_run_options(t, flags);
  cli::ForwardBackwardArgs fb;
  CLI::App* f = add_forward_backward(app, fb);
  EstimateArgs est;
  CLI::App* e = add_estimate(app, est, flags);
  cli::TokenizeArgs tk;
  CLI::App* k = add_tokenize(app, tk);
  GenerateOptions gen;
  std::string gen_adapter;
  CLI::App* g = add_generate(app, gen, gen_adapter);
  MergeArgs merge;
  CLI::App* m = add_merge(app, merge);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& err) {
    if (err.get_exit_code() == 0) return app.exit(err);  // --help
    // One short line and exit 1, as every other refusal (CLI11 quotes the bad value whole).
    return report_error(parse_error_message(err, argc, argv));
  }
  try {
    for (const auto& [name, opt] : flags.trainer_key_options) {
      if (opt->count() == 0) continue;
      accept_trainer_key(flags.options, name, flag_value(flags.trainer_key_flags[name]),
                         "--" + name);
    }
  } catch (const Error& err) {
    return report_error(excerpt(err.what(), 1000));
  }
  try {
    // The measurement switches, read (and checked) once before any work.
    const Switches switches = read_switches();
    flags.options.switches = fb.switches = gen.switches = switches;
    if (*t) return cli::run_train(flags.options);
    if (*f) return cli::run_forward_backward(fb);
    if (*e) return cli::run_estimate(flags.options, est);
    if (*k) return cli::run_tokenize(tk);
    if (*g) return cli::run_generate(with_adapter(gen, gen_adapter));
    if (*m) return merge_adapter(merge), 0;
  } catch (const Error& err) {
    return report_error(excerpt(err.what(), 1000));
  } catch (const std::bad_alloc&) {
    return report_error("out of host memory");
  } catch (const std::exception& err) {
    return report_error(excerpt(err.what(), 1000));  // a safety net
  }
  return 0;
}
