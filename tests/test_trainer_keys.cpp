// TrainingArguments compatibility: option files written by transformers' own
// TrainingArguments.to_json_string() (4.x and 5.x; scripts/make_trainer_args_fixtures.py) read
// as Trainer reads them, every key either honoured, accepted at values that change nothing
// (listed as ignored) or refused by name; the example scripts' max_*_samples,
// ignore_mismatched_sizes and logging_strategy as they behave there.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "cli_support.h"
#include "test_support.h"
#include "train/options.h"
#include "train/trainer.h"
#include "train/trainer_keys.h"
#include "trainer_support.h"

namespace brisk::testing {
namespace {

TrainOptions read_options(const nlohmann::json& j) {
  TrainOptions o;
  apply_options_json(o, j, "options");
  return o;
}

bool has(const std::vector<std::string>& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

// The fixture files whose names end in `suffix`: one per transformers version kept, with and
// without accelerate installed.
std::vector<std::string> trainer_args_files(const std::string& suffix) {
  std::vector<std::string> files;
  for (const auto& entry : std::filesystem::directory_iterator(fixture("trainer_args"))) {
    const std::string name = entry.path().filename().string();
    if (name.size() > suffix.size() && name.ends_with(suffix)) files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

TEST(TrainerKeys, ATrainingArgumentsFileOfEachVersionIsReadAsTrainerReadsIt) {
  const std::vector<std::string> set = trainer_args_files("_set.json");
  ASSERT_GE(set.size(), 6u) << "4.46, 4.57, 5.0 and 5.x with accelerate, and two without";
  for (const std::string& file : set) {
    SCOPED_TRACE(file);
    TrainOptions o;
    load_options_file(o, file);
    EXPECT_TRUE(o.do_train);
    EXPECT_TRUE(o.do_eval);
    EXPECT_EQ(o.eval_strategy, "epoch");  // 4.46 without accelerate: evaluation_strategy
    EXPECT_EQ(o.save_strategy, "epoch");
    EXPECT_EQ(o.logging_strategy, "epoch");
    EXPECT_EQ(o.report_to, "tensorboard");  // ["tensorboard"]
    EXPECT_EQ(o.greater_is_better, "true");
    EXPECT_EQ(o.metric_for_best_model, "accuracy");
    EXPECT_TRUE(o.load_best_model_at_end);
    EXPECT_TRUE(o.gradient_checkpointing);  // 5.x: activation_checkpointing
    EXPECT_DOUBLE_EQ(o.learning_rate, 3e-5);
    EXPECT_DOUBLE_EQ(o.weight_decay, 0.01);
    EXPECT_DOUBLE_EQ(o.warmup_steps, 2);
    EXPECT_DOUBLE_EQ(o.num_train_epochs, 2);
    EXPECT_EQ(o.per_device_train_batch_size, 4);
    EXPECT_EQ(o.per_device_eval_batch_size, 4);
    EXPECT_EQ(o.save_total_limit, 2);
    EXPECT_EQ(o.seed, 7u);
    EXPECT_TRUE(has(o.ignored_keys, "push_to_hub"));
    EXPECT_TRUE(has(o.ignored_keys, "hub_token"));
    EXPECT_FALSE(has(o.ignored_keys, "learning_rate"));
    EXPECT_EQ(has(o.ignored_keys, "accelerator_config"),
              file.find("_accelerate_") != std::string::npos);
    validate_options(o);
  }
  // Defaults as TrainingArguments has them: do_train false, so a run must ask for it.
  const std::vector<std::string> defaults = trainer_args_files("_defaults.json");
  ASSERT_EQ(defaults.size(), set.size());
  for (const std::string& file : defaults) {
    SCOPED_TRACE(file);
    TrainOptions o;
    load_options_file(o, file);
    EXPECT_FALSE(o.do_train);
    expect_error([&] { validate_options(o); }, "nothing to do");
    o.do_train = true;
    validate_options(o);
  }
}

// accelerator_config, as TrainingArguments writes it with accelerate installed: each key
// compared by value with what changes nothing in brisk; another value refused naming the key.
TEST(TrainerKeys, AcceleratorConfigIsReadKeyByKey) {
  const nlohmann::json defaults = {{"split_batches", false},
                                   {"dispatch_batches", nullptr},
                                   {"even_batches", true},
                                   {"use_seedable_sampler", true},
                                   {"non_blocking", false},
                                   {"use_configured_state", false},
                                   {"gradient_accumulation_kwargs", nullptr}};
  EXPECT_EQ(read_options({{"accelerator_config", defaults}}).ignored_keys,
            std::vector<std::string>{"accelerator_config"});
  read_options({{"accelerator_config", nlohmann::json::object()}});
  read_options({{"accelerator_config",
                 {{"gradient_accumulation_kwargs", nlohmann::json::object()},
                  {"use_seedable_sampler", false},
                  {"non_blocking", true}}}});
  const std::vector<std::pair<nlohmann::json, std::string>> refused = {
      {{{"split_batches", true}},
       "accelerator_config.split_batches = true is not implemented in brisk (each brisk rank"},
      {{{"even_batches", false}}, "accelerator_config.even_batches = false"},
      {{{"dispatch_batches", true}}, "accelerator_config.dispatch_batches = true"},
      {{{"gradient_accumulation_kwargs", {{"sync_each_batch", true}}}},
       "accelerator_config.gradient_accumulation_kwargs = {\"sync_each_batch\":true}"},
      {{{"splitbatches", false}}, "accelerator_config holds the unknown key \"splitbatches\""}};
  for (const auto& [value, needle] : refused) {
    SCOPED_TRACE(value.dump());
    expect_error([&] { read_options({{"accelerator_config", value}}); }, needle);
  }
  expect_error(
      [] {
        read_options({{"accelerator_config", "accelerate.json"}});
      },
      "accelerator_config must be a JSON object of AcceleratorConfig's keys");
}

// Values compared by value, not by text: 0 and 0.0, and the same inside lists and dicts.
TEST(TrainerKeys, InertValuesAreComparedByValue) {
  read_options({{"label_smoothing_factor", 0.0}, {"past_index", -1.0}});
  read_options({{"accelerator_config", {{"even_batches", true}, {"split_batches", false}}}});
  expect_error(
      [] {
        read_options({{"label_smoothing_factor", 1e-300}});
      },
      "label_smoothing_factor");
}

// A key of megabytes (a pasted file, a mangled JSON) is refused at once: the suggestion compares
// it only with names of comparable length.
TEST(TrainerKeys, ALongUnknownKeyIsRefusedWithoutComparingItToEveryName) {
  const std::string key(10'000'000, 'k');
  EXPECT_EQ(closest_option(key), "");
  EXPECT_EQ(closest_option("learning_rat"), "learning_rate");
  EXPECT_EQ(closest_option(std::string(60, 'x')), "");
  TempDir dir("long_key");
  const std::string path = dir / "options.json";
  std::ofstream(path) << nlohmann::json{{key, 1}}.dump();
  expect_refused("train --options_file " + path, "unknown option \"kkkk", 20);
}

TEST(TrainerKeys, KeysThatWouldChangeTheRunAreRefusedByName) {
  const std::vector<std::pair<nlohmann::json, std::string>> refused = {
      {{{"push_to_hub", true}}, "push_to_hub = true is not implemented in brisk (brisk cannot"},
      {{{"label_smoothing_factor", 0.1}}, "label_smoothing_factor = 0.1 is not implemented"},
      {{{"fsdp", "full_shard"}},
       "fsdp = \"full_shard\" is not implemented in brisk (use "
       "--zero_stage 3"},
      {{{"task_name", "mrpc"}},
       "task_name = \"mrpc\" is not implemented in brisk (brisk reads "
       "no dataset hub"},
      {{{"dataset_name", "wikitext"}}, "dataset_name = \"wikitext\""},
      {{{"neftune_noise_alpha", 5}}, "neftune_noise_alpha = 5"},
      {{{"data_seed", 3}}, "data_seed = 3"},
      {{{"gradient_checkpointing_kwargs", {{"preserve_rng_state", false}}}},
       "gradient_checkpointing_kwargs"},
      {{{"lerning_rate", 1}}, "unknown option \"lerning_rate\" (did you mean \"learning_rate\"?)"},
      {{{"no_such_setting", 1}}, "unknown option \"no_such_setting\""}};
  for (const auto& [j, needle] : refused) {
    SCOPED_TRACE(j.dump());
    expect_error([&] { read_options(j); }, needle);
  }
  // The values that change nothing, however spelled, are accepted and listed once.
  const TrainOptions o =
      read_options({{"label_smoothing_factor", 0},
                    {"fsdp", ""},
                    {"gradient_checkpointing_kwargs", {{"use_reentrant", false}}},
                    {"data_seed", nullptr},
                    {"run_name", "my run"},
                    {"torch_compile", true}});
  EXPECT_EQ(o.ignored_keys,
            (std::vector<std::string>{"fsdp", "gradient_checkpointing_kwargs",
                                      "label_smoothing_factor", "run_name", "torch_compile"}));
  EXPECT_EQ(closest_option("no_such_setting"), "");
}

TEST(TrainerKeys, ReportToAsAListAndOtherSpellingsReadAsBrisksOptions) {
  EXPECT_EQ(read_options({{"report_to", nlohmann::json::array()}}).report_to, "none");
  EXPECT_EQ(read_options({{"report_to", {"tensorboard"}}}).report_to, "tensorboard");
  const TrainOptions two = read_options({{"report_to", {"tensorboard", "wandb"}}});
  EXPECT_EQ(two.report_to, "tensorboard,wandb");
  expect_error([&] { validate_options(two); }, "unknown report_to \"wandb\"");
  EXPECT_TRUE(reports_to_tensorboard(read_options({{"report_to", {"none", "all"}}})));
  EXPECT_EQ(read_options({{"evaluation_strategy", "steps"}}).eval_strategy, "steps");
  EXPECT_EQ(
      read_options({{"eval_strategy", "epoch"}, {"evaluation_strategy", "steps"}}).eval_strategy,
      "epoch");
  EXPECT_TRUE(read_options({{"no_cuda", true}}).use_cpu);
  EXPECT_EQ(read_options({{"greater_is_better", false}}).greater_is_better, "false");
  TrainOptions cpu;
  cpu.use_cpu = true;
  EXPECT_EQ(resolve_device(cpu), Device::cpu);
  cpu.device = "cuda";
  expect_error([&] { validate_options(cpu); }, "--use_cpu and --device cuda contradict");
}

TEST(TrainerKeys, FlagTextsReadAsHfArgumentParserReadsThem) {
  EXPECT_EQ(flag_value(""), nlohmann::json(true));
  EXPECT_EQ(flag_value("False"), nlohmann::json(false));
  EXPECT_EQ(flag_value("yes"), nlohmann::json(true));
  EXPECT_EQ(flag_value("None"), nlohmann::json(nullptr));
  EXPECT_EQ(flag_value("0.1"), nlohmann::json(0.1));
  EXPECT_EQ(flag_value("-1"), nlohmann::json(-1.0));
  EXPECT_EQ(flag_value("1"), nlohmann::json(1.0));
  EXPECT_EQ(flag_value("[]"), nlohmann::json::array());
  EXPECT_EQ(flag_value("full_shard"), nlohmann::json("full_shard"));
  EXPECT_EQ(flag_value("[oops"), nlohmann::json("[oops"));
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  EXPECT_EQ(flag_value(deep), nlohmann::json(deep)) << "nested past the bound: text";
  check_trainer_key("label_smoothing_factor", flag_value("0"), "--label_smoothing_factor");
  expect_error([] { check_trainer_key("push_to_hub", flag_value(""), "--push_to_hub"); },
               "--push_to_hub: push_to_hub = true is not implemented");
}

TEST(TrainerKeys, EveryOptionHasAHelpHeadingAndNoKeyIsSpelledTwice) {
  TrainOptions o;
  std::vector<std::string> options;
  visit_options(o, [&](const char* name, auto&, const char*) {
    options.emplace_back(name);
    EXPECT_STRNE(option_group(name), "") << name << " is listed under no heading in --help";
    EXPECT_FALSE(is_trainer_key(name)) << name << " is an option and an ignored key";
  });
  for (const auto& [other, own] : other_spellings()) {
    EXPECT_TRUE(has(options, own)) << other << " names no option";
    EXPECT_FALSE(is_trainer_key(other)) << other;
  }
}

// 36 labelled rows cut to 8 train in 2 steps of 4 an epoch, as dataset.select(range(8)).
TEST(TrainerKeys, MaxSamplesCutTheDatasetsAsTheScriptsDo) {
  TempDir dir("max_samples");
  TrainOptions o = tiny_options(write_wordpiece_bert(dir), dir / "out");
  o.tokenizer_name = fixture("tokenizer/wordpiece");
  o.train_file = write_varied_csv(dir, "train.csv", 36);
  o.validation_file = o.train_file;
  o.max_seq_length = 16;
  o.max_steps = -1;
  o.num_train_epochs = 1;
  o.max_train_samples = 8;
  o.max_eval_samples = 5;
  o.do_eval = true;
  std::vector<double> epochs;
  nlohmann::json eval;
  train(o, [&](const nlohmann::json& j) {
    if (j.contains("loss")) epochs.push_back(j["epoch"].get<double>());
    if (j.contains("eval_loss")) eval = j;
  });
  EXPECT_EQ(epochs, (std::vector<double>{0.5, 1.0}));
  ASSERT_TRUE(eval.contains("eval_samples")) << eval.dump();
  EXPECT_EQ(eval["eval_samples"], 5);
  o.max_train_samples = -1;
  expect_error([&] { validate_options(o); }, "max_train_samples must not be negative");
}

// logging_strategy "epoch" logs at each epoch's end, "no" only in the final summary.
TEST(TrainerKeys, LoggingStrategyChoosesTheStepsThatLog) {
  TempDir dir("logging_strategy");
  TrainOptions o = tiny_options(write_config(dir, "bert", 0.0), dir / "out");
  o.max_steps = -1;
  o.num_train_epochs = 2;
  o.dataset_size = 12;  // in batches of 4: 3 steps an epoch
  auto logged_steps = [&](const std::string& strategy) {
    o.logging_strategy = strategy;
    std::vector<int64_t> steps;
    train(o, [&](const nlohmann::json& j) {
      if (j.contains("loss")) steps.push_back(j["step"].get<int64_t>());
    });
    return steps;
  };
  EXPECT_EQ(logged_steps("epoch"), (std::vector<int64_t>{3, 6}));
  EXPECT_EQ(logged_steps("no"), std::vector<int64_t>{});
  EXPECT_EQ(logged_steps("steps").size(), 6u);
  o.logging_strategy = "sometimes";
  expect_error([&] { validate_options(o); }, "unknown logging_strategy \"sometimes\"");
}

// A classifier of three labels fine-tuned on two: refused naming the tensor and the option,
// and with ignore_mismatched_sizes its head initialized anew, as from_pretrained does.
TEST(TrainerKeys, IgnoreMismatchedSizesInitializesTheDifferingHead) {
  TempDir dir("mismatched");
  auto write_labels = [&](const std::string& name, int classes) {
    std::ofstream f(dir / name);
    f << "sentence,label\n";
    for (int i = 0; i < 24; ++i)
      f << "the film " << i % 7 << " and the end," << i % classes << "\n";
    return dir / name;
  };
  TrainOptions three = tiny_options(write_wordpiece_bert(dir), dir / "three");
  three.tokenizer_name = fixture("tokenizer/wordpiece");
  three.train_file = write_labels("three.csv", 3);
  three.max_seq_length = 16;
  three.max_steps = 1;
  train(three, [](const nlohmann::json&) {});
  TrainOptions two = three;
  two.model_name_or_path = three.output_dir;
  two.output_dir = dir / "two";
  two.train_file = write_labels("two.csv", 2);
  expect_error([&] { train(two, [](const nlohmann::json&) {}); },
               "(--ignore_mismatched_sizes initializes it anew)");
  two.ignore_mismatched_sizes = true;
  std::vector<std::string> fresh;
  train(two, [&](const nlohmann::json& j) {
    if (j.contains("newly_initialized")) fresh = j["newly_initialized"];
  });
  EXPECT_EQ(fresh, (std::vector<std::string>{"classifier.bias", "classifier.weight"}));
}

}  // namespace
}  // namespace brisk::testing
