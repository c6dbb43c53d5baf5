// Refusals as a user meets them on the command line: each names the user's own option or config
// key, comes before any note of the run, and ends with exit 1 and one line within seconds.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "cli_support.h"
#include "test_support.h"

namespace brisk::testing {
namespace {

std::string write_json(const TempDir& dir, const std::string& name, const nlohmann::json& j) {
  const std::string path = dir / name;
  std::ofstream(path) << j.dump();
  return path;
}

// A degree set by a DeepSpeed config or a ParallelismConfig file is named as the file's key,
// never as a flag the user did not type.
TEST(Refusals, ALayoutThatDoesNotDivideTheRanksNamesTheKeyThatSetIt) {
  TempDir dir("layout_source");
  const std::string ds = write_json(dir, "ds.json", {{"tensor_parallel", {{"autotp_size", 4}}}});
  const CliRun r = run_brisk("train --model gpt2-tiny --max_steps 1 --deepspeed " + ds +
                             " --output_dir " + dir / "out");
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("--deepspeed '" + ds +
                       "': tensor_parallel.autotp_size 4 does not divide the run's 1 rank"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(r.err.find("--tp_size"), std::string::npos) << r.err;
  expect_refused("estimate --model gpt2-tiny --world_size 6 --tp_size 2 --pp_size 2",
                 "--tp_size 2 x --pp_size 2 = 4 does not divide the run's 6 ranks");
  expect_refused("estimate --model gpt2-tiny --world_size 3 --deepspeed " + ds + " --pp_size 2",
                 "--deepspeed '" + ds +
                     "': tensor_parallel.autotp_size 4 x --pp_size 2 = 8 "
                     "does not divide the run's 3 ranks");
}

// A refused run prints only why: the notes of a run (synthetic data, a built-in configuration)
// follow its checks.
TEST(Refusals, NotesFollowTheChecks) {
  TempDir dir("notes_after");
  for (const char* bad : {"--pp_size 5", "--seq_len 100000"}) {
    const CliRun refused = run_brisk("train --model gpt2-tiny --max_steps 1 " + std::string(bad) +
                                     " --output_dir " + dir / "out");
    EXPECT_EQ(refused.exit_code, 1) << bad << ": " << refused.err;
    EXPECT_EQ(refused.out.find("\"note\""), std::string::npos) << bad << ": " << refused.out;
  }
  const CliRun ran = run_brisk(
      "train --model gpt2-tiny --max_steps 1 --dataset_size 8 "
      "--seq_len 16 --output_dir " +
      dir / "out");
  ASSERT_EQ(ran.exit_code, 0) << ran.err;
  EXPECT_NE(ran.out.find("training on synthetic data"), std::string::npos) << ran.out;
  EXPECT_NE(ran.out.find("built-in configuration"), std::string::npos) << ran.out;
}

// Real options finite in double but not in the float32 that computes with them are refused.
TEST(Refusals, RealOptionsBeyondFloat32AreRefusedByName) {
  expect_refused("estimate --model gpt2-tiny --seq_len 64 --learning_rate 1e300",
                 "learning_rate must be a number float32 holds (at most 3.4e38 in size), got "
                 "1e+300");
  expect_refused("estimate --model gpt2-tiny --seq_len 64 --adam_epsilon 1e39",
                 "adam_epsilon must be a number float32 holds");
}

// A measurement switch set to a value it does not take is refused at start, named, whether or
// not the run would reach its path.
TEST(Refusals, ASwitchSetToAValueItDoesNotTakeIsRefusedByName) {
  const std::vector<std::pair<const char*, const char*>> bad = {{"BRISK_RECORDED_STEPS", "true"},
                                                                {"BRISK_RECORDED_STEPS", "banana"},
                                                                {"BRISK_FUSED_ATTENTION", "false"},
                                                                {"BRISK_CPU_PRODUCTS", "mkl"},
                                                                {"BRISK_KEY_LENGTHS", " 0"}};
  for (const auto& [name, value] : bad) {
    SCOPED_TRACE(std::string(name) + "=" + value);
    ::setenv(name, value, 1);
    expect_refused(
        "estimate --model gpt2-tiny --seq_len 64",
        "environment variable " + std::string(name) + "=" + value + ": the switch takes");
    ::unsetenv(name);
  }
  ::setenv("BRISK_CPU_PRODUCTS", "openblas", 1);
  EXPECT_EQ(run_brisk("estimate --model gpt2-tiny --seq_len 64").exit_code, 0);
  ::unsetenv("BRISK_CPU_PRODUCTS");
}

}  // namespace
}  // namespace brisk::testing
