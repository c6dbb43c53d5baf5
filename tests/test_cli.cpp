// The brisk program end to end: forward-backward reproduces the fixtures through files, train
// runs on the built-in data, and every kind of bad input ends with one clear message and a
// non-zero exit (never a signal).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "test_support.h"

namespace brisk::testing {
namespace {

struct CliRun {
  int exit_code = -1;
  bool signaled = false;
  std::string out, err;
};

CliRun run_brisk(const std::string& args) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path();
  // Per-process names: CTest runs tests in parallel processes.
  const std::string tag = std::to_string(::getpid());
  const std::string out = (dir / ("brisk_cli_out_" + tag + ".txt")).string();
  const std::string err = (dir / ("brisk_cli_err_" + tag + ".txt")).string();
  const std::string cmd =
      std::string(BRISK_BINARY) + " " + args + " > " + out + " 2> " + err + " < /dev/null";
  const int status = std::system(cmd.c_str());
  CliRun r;
  r.signaled = WIFSIGNALED(status) || (WIFEXITED(status) && WEXITSTATUS(status) >= 128);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  auto slurp = [](const std::string& p) {
    std::ifstream in(p);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  };
  r.out = slurp(out);
  r.err = slurp(err);
  std::filesystem::remove(out);
  std::filesystem::remove(err);
  return r;
}

void expect_refused(const std::string& args, const std::string& needle) {
  const CliRun r = run_brisk(args);
  EXPECT_FALSE(r.signaled) << args << ": crashed\n" << r.err;
  EXPECT_NE(r.exit_code, 0) << args << ": exit 0";
  EXPECT_NE(r.err.find(needle), std::string::npos)
      << args << ": stderr \"" << r.err << "\" does not mention \"" << needle << "\"";
  EXPECT_EQ(r.err.find("terminate called"), std::string::npos) << r.err;
}

TEST(Cli, ForwardBackwardWritesLossLogitsAndGradients) {
  const std::string folder = fixture("gpt2_tiny");
  const std::string out = (std::filesystem::temp_directory_path() /
                           ("brisk_fb_" + std::to_string(::getpid()) + ".safetensors"))
                              .string();
  const CliRun r =
      run_brisk("forward-backward --config " + folder + " --weights " + folder +
                "/model.safetensors --batch " + folder + "/batch.safetensors --output " + out);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  SafetensorsFile got(out), want(folder + "/expected.safetensors");
  EXPECT_NEAR(got.get("loss").f32()[0], want.get("loss").f32()[0], 1e-4);
  const Tensor& gl = got.get("logits");
  ASSERT_EQ(gl.numel(), want.get("logits").numel());
  EXPECT_LE(rel_error(gl.f32(), want.get("logits").f32(), gl.numel()), 1e-4);
  const Tensor& gw = got.get("grad.transformer.wte.weight");
  EXPECT_LE(rel_error(gw.f32(), want.get("grad.transformer.wte.weight").f32(), gw.numel()), 1e-4);
  std::filesystem::remove(out);
}

TEST(Cli, TrainRunsOnTheBuiltInDataAndPrintsTheSummary) {
  const CliRun r = run_brisk(
      "train --model bert-tiny --max_steps 3 --per_device_train_batch_size 2 --seq_len 16 "
      "--dataset_size 8 --logging_steps 1 --output_dir " +
      (std::filesystem::temp_directory_path() / ("brisk_cli_train_" + std::to_string(::getpid())))
          .string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* key :
       {"\"step\":3", "train_runtime", "train_samples_per_second", "train_steps_per_second",
        "train_loss", "total_flos", "activations", "optimizer_state", "process peak"})
    EXPECT_NE(r.out.find(key), std::string::npos) << "missing " << key << " in\n" << r.out;
}

TEST(Cli, EstimatePrintsThePlanByCategory) {
  const CliRun fp32 =
      run_brisk("estimate --model bert-large-uncased --per_device_train_batch_size 4");
  ASSERT_EQ(fp32.exit_code, 0) << fp32.err;
  EXPECT_NE(fp32.out.find("335143938 parameters"), std::string::npos) << fp32.out;
  EXPECT_NE(fp32.out.find("optimizer_state    2556.9 MiB"), std::string::npos) << fp32.out;
  const CliRun bf16 = run_brisk("estimate --model gpt2 --bf16 --seq_len 1024");
  ASSERT_EQ(bf16.exit_code, 0) << bf16.err;
  EXPECT_NE(bf16.out.find("master_weights"), std::string::npos);
  expect_refused("estimate --fp16 --bf16", "contradict");
}

// The optimizer-state line of `brisk estimate`, in MiB.
double optimizer_state_mib(const std::string& args) {
  const CliRun r = run_brisk("estimate --model bert-large-uncased " + args);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  const size_t at = r.out.find("optimizer_state");
  if (at == std::string::npos) {
    ADD_FAILURE() << r.out;
    return 0;
  }
  return std::stod(r.out.substr(at + 15));
}

TEST(Cli, EstimatePlansEachOptimizersState) {
  const double adamw = optimizer_state_mib("");
  EXPECT_NEAR(adamw, 2556.9, 0.1);
  // 8-bit AdamW: 2 bytes per parameter plus block maxima, but 8 for the 31.8M embedding values
  // (and for the ~0.2M values of biases and LayerNorms, the 2 MiB margin).
  EXPECT_NEAR(optimizer_state_mib("--optim adamw_bnb_8bit"),
              (2 * (335143938.0 - 31782912) * (1 + 4.0 / 256) + 8 * 31782912 + 2048) / (1 << 20),
              2.0);
  EXPECT_LT(optimizer_state_mib("--optim adafactor"), 0.005 * adamw);
  EXPECT_NEAR(optimizer_state_mib("--optim sgd --optim_args momentum=0.9"), adamw / 2, 0.1);
  const CliRun direct = run_brisk("estimate --model gpt2 --bf16 --bf16_master_weights false");
  ASSERT_EQ(direct.exit_code, 0) << direct.err;
  EXPECT_NE(direct.out.find("without master weights"), std::string::npos) << direct.out;
  EXPECT_NE(direct.out.find("master_weights        0.0 MiB"), std::string::npos) << direct.out;
  expect_refused("estimate --optim adam", "unknown optim \"adam\"");
  expect_refused("estimate --bf16_master_weights false", "applies to --bf16 training only");
}

TEST(Cli, BadInputEndsWithOneClearMessage) {
  const std::string bad = fixture("bad/");
  const std::string bert = fixture("bert_tiny/");
  const std::string fb = "forward-backward --batch " + bert + "batch.safetensors --config ";
  expect_refused(fb + bad + "not_json.json", "is not valid JSON");
  expect_refused(fb + bad + "missing_size.json", "missing required key \"hidden_size\"");
  expect_refused(fb + bad + "negative_size.json", "must be positive, got -2");
  expect_refused(fb + bad + "unknown_type.json", "unknown model_type \"mamba\"");
  expect_refused(fb + bad + "heads_not_dividing.json", "not divisible");
  expect_refused(
      "forward-backward --config " + bert + " --batch " + bad + "batch_too_long.safetensors",
      "exceeds max_position_embeddings");
  expect_refused(
      "forward-backward --config " + bert + " --batch " + bad + "batch_bad_token.safetensors",
      "token id 97");
  expect_refused("forward-backward --config " + bert + " --weights " + bad +
                     "truncated.safetensors --batch " + bert + "batch.safetensors",
                 "is corrupt");
  expect_refused("forward-backward --config " + bert + " --batch " + bert + "missing.safetensors",
                 "cannot open");
  expect_refused("train --per_device_train_batch_size 0", "per_device_train_batch_size");
  expect_refused("train --dataset_size 2 --per_device_train_batch_size 4",
                 "smaller than one batch");
  expect_refused("train --no_such_option 1", "no_such_option");
  expect_refused("train --model nonexistent-model", "neither a built-in config");
  expect_refused("train --fp16 --bf16", "contradict each other");
  expect_refused("train --lr_scheduler_type weird", "unknown lr_scheduler_type");
  expect_refused("train --optim adam",
                 "unknown optim \"adam\" (valid: adamw_torch, adamw_torch_fused, adafactor");
  expect_refused("train --optim sgd --optim_args momentum=0.9,nesterov=perhaps",
                 "nesterov must be true or false");
  if (!cuda_available()) expect_refused("train --device cuda --max_steps 1", "--device cuda:");
  expect_refused("train --options_file " + bad + "not_json.json", "not valid JSON");
}

}  // namespace
}  // namespace brisk::testing
