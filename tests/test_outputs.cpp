// Output folders shaped as Trainer's: output_dir and every checkpoint hold the tokenizer's files,
// trainer_state.json with Trainer's keys and training_args.json; a checkpoint Trainer wrote is
// recognised and explained, not called incomplete.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "test_support.h"
#include "train/trainer.h"
#include "trainer_support.h"

namespace brisk::testing {
namespace {

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << path;
  return std::string(std::istreambuf_iterator<char>(in), {});
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  return nlohmann::json::parse(in);
}

TEST(Outputs, FoldersHoldWhatTrainersHold) {
  TempDir dir("trainer_shaped");
  TrainOptions o = tiny_options(write_wordpiece_bert(dir), dir / "out");
  o.tokenizer_name = fixture("tokenizer/wordpiece");
  o.train_file = write_varied_csv(dir, "train.csv", 16);
  o.validation_file = o.train_file;
  o.max_seq_length = 16;
  o.max_steps = 4;
  o.save_steps = 2;
  o.logging_steps = 2;
  o.eval_strategy = "steps";
  o.load_best_model_at_end = true;
  train(o, [](const nlohmann::json&) {});
  for (const std::string folder : {o.output_dir, o.output_dir + "/checkpoint-2"}) {
    SCOPED_TRACE(folder);
    EXPECT_EQ(slurp(folder + "/vocab.txt"), slurp(fixture("tokenizer/wordpiece/vocab.txt")));
    for (const auto& e : std::filesystem::directory_iterator(folder))  // renamed into place
      EXPECT_NE(e.path().extension(), ".tmp") << e.path();
    EXPECT_TRUE(std::filesystem::exists(folder + "/training_args.json"));
    const nlohmann::json ts = read_json(folder + "/trainer_state.json");
    EXPECT_EQ(ts["max_steps"], 4);
    EXPECT_EQ(ts["num_train_epochs"], 1);  // 16 samples in batches of 4: 4 steps an epoch
    EXPECT_EQ(ts["logging_steps"], 2);
    EXPECT_EQ(ts["eval_steps"], 2);
    EXPECT_EQ(ts["save_steps"], 2);
    EXPECT_EQ(ts["train_batch_size"], 4);
    EXPECT_TRUE(ts["best_global_step"].is_number_integer()) << ts["best_global_step"];
    EXPECT_EQ(ts["best_model_checkpoint"].get<std::string>(),
              o.output_dir + "/checkpoint-" + std::to_string(ts["best_global_step"].get<int>()));
  }
  // The run's final metrics close the log, as Trainer's last log does.
  const nlohmann::json ts = read_json(o.output_dir + "/trainer_state.json");
  EXPECT_TRUE(ts["log_history"].back().contains("train_runtime")) << ts["log_history"].back();
  EXPECT_EQ(ts["global_step"], 4);
}

// tests/fixtures/trainer_checkpoint/checkpoint-2, written by transformers' Trainer
// (scripts/make_trainer_checkpoint_fixture.py).
TEST(Outputs, ATrainersCheckpointIsExplainedNotCalledIncomplete) {
  TempDir dir("trainer_checkpoint");
  const std::string ckpt = fixture("trainer_checkpoint/checkpoint-2");
  TrainOptions o = tiny_options(ckpt, dir / "resumed");
  o.resume_from_checkpoint = ckpt;
  expect_error([&] { train(o, [](const nlohmann::json&) {}); },
               "was written by transformers' Trainer: brisk cannot read PyTorch's pickled "
               "optimizer state (optimizer.pt); give the folder as --model_name_or_path");
  // As the message says: its weights are a model folder.
  TrainOptions from_weights = tiny_options(ckpt, dir / "from_weights");
  from_weights.max_steps = 1;
  std::vector<std::string> fresh;
  train(from_weights, [&](const nlohmann::json& j) {
    if (j.contains("newly_initialized")) fresh = j["newly_initialized"];
  });
  EXPECT_TRUE(fresh.empty()) << "the classifier is in the checkpoint";
  EXPECT_TRUE(std::filesystem::exists(from_weights.output_dir + "/model.safetensors"));
}

}  // namespace
}  // namespace brisk::testing
