// Runs that meet in one output_dir: the run writing there holds it (OutputDirLock) and a second
// run ends at start naming the holder; a killed holder leaves no stale lock; the save folders of
// a live run are never cleaned up by another, and a clean-up that cannot remove a folder says so.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "test_support.h"
#include "train/checkpoint.h"
#include "train/trainer.h"
#include "trainer_support.h"

namespace brisk::testing {
namespace {

namespace fs = std::filesystem;

struct Exit {
  int code = -1;
  bool signaled = false;
  std::string out, err;
};

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// brisk with `args`, at most 60 s.
Exit run_brisk(const TempDir& dir, const std::string& args) {
  const std::string out = dir / "stdout.txt", err = dir / "stderr.txt";
  const int status = std::system(("timeout 60 " + std::string(BRISK_BINARY) + " " + args + " > " +
                                  out + " 2> " + err + " < /dev/null")
                                     .c_str());
  Exit r;
  r.signaled = WIFSIGNALED(status) || (WIFEXITED(status) && WEXITSTATUS(status) >= 128);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = slurp(out);
  r.err = slurp(err);
  return r;
}

// A run in another process holding `output_dir` until it is killed: a child that takes the lock,
// says so through a pipe and waits.
struct Holder {
  pid_t pid = -1;
  explicit Holder(const std::string& output_dir) {
    int ready[2];
    EXPECT_EQ(::pipe(ready), 0);
    pid = ::fork();
    if (pid == 0) {
      ::close(ready[0]);
      try {
        OutputDirLock lock(output_dir);
        [[maybe_unused]] const ssize_t n = ::write(ready[1], "1", 1);
        for (;;) ::pause();
      } catch (...) {
        ::_exit(3);
      }
    }
    ::close(ready[1]);
    char byte = 0;
    EXPECT_EQ(::read(ready[0], &byte, 1), 1) << "the holder did not take the lock";
    ::close(ready[0]);
  }
  // As a kill ends a run: no clean-up code runs.
  void kill() {
    if (pid <= 0) return;
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    pid = -1;
  }
  ~Holder() { kill(); }
};

// A second run on a held output_dir, whether it trains, evaluates or predicts (each writes there),
// ends at start with one line naming the folder and the holder's PID, and touches nothing there:
// not the holder's save folders, whose PID is alive. Once the holder is killed, a run starts (no
// stale lock), finds those folders stale and cleans them up.
TEST(RunCollisions, ASecondRunOnAHeldOutputDirEndsAtStartNamingTheHolder) {
  TempDir dir("collide");
  const std::string out = dir / "out", model = write_config(dir, "gpt2", 0.0);
  Holder holder(out);
  const std::string tmp = out + "/checkpoint-3.tmp-" + std::to_string(holder.pid);
  const std::string old = out + "/checkpoint-2.old-" + std::to_string(holder.pid);
  fs::create_directories(tmp);
  fs::create_directories(old);
  std::ofstream(old + "/trainer_state.json") << "{}";
  const std::string common = "--model " + model + " --output_dir " + out +
                             " --max_steps 2 --seq_len 8 --dataset_size 8 --eval_dataset_size 8"
                             " --per_device_train_batch_size 4 --disable_tqdm";
  // (Runs that do not train read trained weights, or a built-in name's random ones.)
  const struct {
    const char* kind;
    std::string args;
  } runs[] = {
      {"training", "train " + common},
      {"evaluation only", "train " + common + " --model gpt2-tiny --do_train false --do_eval"},
      {"prediction only", "train " + common +
                              " --model bert-tiny --synthetic_task learnable "
                              "--do_train false --do_predict"}};
  const std::string want = "brisk: error: output_dir '" + out + "' is in use by another run (PID " +
                           std::to_string(holder.pid) + " on host ";
  for (const auto& run : runs) {
    const Exit r = run_brisk(dir, run.args);
    EXPECT_FALSE(r.signaled) << run.kind;
    EXPECT_EQ(r.code, 1) << run.kind << r.err;
    EXPECT_EQ(r.err.rfind(want, 0), 0u) << run.kind << ": " << r.err;
    EXPECT_NE(r.err.find("give another --output_dir"), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << run.kind << ": " << r.err;
    EXPECT_TRUE(fs::is_directory(tmp) && fs::is_directory(old)) << run.kind;
    EXPECT_FALSE(fs::exists(out + "/all_results.json")) << run.kind;
  }
  holder.kill();
  const Exit r = run_brisk(dir, "train " + common);
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_FALSE(fs::exists(tmp));
  EXPECT_FALSE(fs::exists(old));
  EXPECT_TRUE(fs::exists(out + "/checkpoint-2/trainer_state.json"));  // put back, then re-saved
  EXPECT_NE(r.out.find("\"removed_interrupted_save\":\"checkpoint-3.tmp-"), std::string::npos)
      << r.out;
  EXPECT_FALSE(fs::exists(out + "/.brisk-run.lock"));  // gone with the run that held it
}

// Within one process, too, a run cannot take a folder another part holds (flock locks conflict
// between open files, not only between processes), and a run that fails releases it.
TEST(RunCollisions, ARunReleasesItsOutputDirHoweverItEnds) {
  TempDir dir("release");
  TrainOptions o = tiny_options(write_config(dir, "gpt2", 0.0), dir / "out");
  o.max_steps = 1;
  {
    OutputDirLock held(o.output_dir);
    expect_error([&] { train(o, [](const nlohmann::json&) {}); },
                 "output_dir '" + o.output_dir + "' is in use by another run (PID " +
                     std::to_string(::getpid()));
  }
  TrainOptions failing = o;
  failing.model_name_or_path = dir / "no_such_model";
  EXPECT_THROW(train(failing, [](const nlohmann::json&) {}), Error);
  EXPECT_FALSE(fs::exists(o.output_dir)) << "a run that created output_dir and failed leaves it";
  train(o, [](const nlohmann::json&) {});  // free again
  EXPECT_TRUE(fs::exists(o.output_dir + "/all_results.json"));
}

// Acts as another user (nobody) while it lives, where the tests run as root, so that permissions
// hold: root may remove anything.
struct AsAnotherUser {
  bool switched = false;
  AsAnotherUser() { switched = ::geteuid() == 0 && ::seteuid(65534) == 0; }
  ~AsAnotherUser() {
    if (switched) EXPECT_EQ(::seteuid(0), 0);
  }
};

// Interrupted saves that cannot be removed are reported as such, naming the folder, and left in
// place; the run goes on. A copy moved aside that cannot be put back ends the run, naming it: a
// resume would otherwise silently take an older checkpoint.
TEST(RunCollisions, ACleanUpReportsOnlyWhatItDid) {
  TempDir dir("cleanup");
  const std::string model = write_config(dir, "gpt2", 0.0);
  const struct {
    const char* leftover;
    bool output_dir_writable;
    const char* error;  // "" when the run goes on
  } cases[] = {
      {"checkpoint-7.tmp-4243", true, ""},
      {"checkpoint-1.del-4244", true, ""},
      {"checkpoint-2.old-4242", false, "' back as checkpoint-2 (the step's only complete copy"},
  };
  const fs::perms read_only = fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec |
                              fs::perms::others_read | fs::perms::others_exec;
  for (const auto& c : cases) {
    const std::string out = dir / c.leftover;  // one output_dir per case
    const std::string leftover = out + "/" + c.leftover;
    fs::create_directories(leftover + "/locked");
    std::ofstream(leftover + "/locked/model.safetensors") << "partial";
    // The lock file exists already and is writable by all: only the folders are out of reach.
    std::ofstream(out + "/.brisk-run.lock").close();
    fs::permissions(out + "/.brisk-run.lock", fs::perms::all);
    fs::permissions(out, c.output_dir_writable ? fs::perms::all : read_only);
    fs::permissions(leftover + "/locked", fs::perms::owner_read | fs::perms::owner_exec);
    if (::geteuid() != 0 && !c.output_dir_writable) continue;  // another user needs root
    TrainOptions o = tiny_options(model, out);
    o.max_steps = 1;
    std::vector<std::string> removed, warnings;
    const auto log = [&](const nlohmann::json& j) {
      if (j.contains("removed_interrupted_save")) removed.push_back(j["removed_interrupted_save"]);
      if (j.contains("warning")) warnings.push_back(j["warning"]);
    };
    {
      AsAnotherUser other;
      if (*c.error)
        expect_error([&] { train(o, log); }, "cannot put '" + leftover + c.error);
      else
        train(o, log);
    }
    EXPECT_TRUE(removed.empty()) << c.leftover << ": claims " << removed.front();
    EXPECT_TRUE(fs::exists(leftover + "/locked/model.safetensors")) << c.leftover;
    if (*c.error) continue;
    ASSERT_EQ(warnings.size(), 1u) << c.leftover;
    EXPECT_EQ(warnings[0].rfind("cannot remove the interrupted save '" + leftover + "': ", 0), 0u)
        << warnings[0];
    fs::permissions(leftover + "/locked", fs::perms::owner_all);
  }
  for (const auto& c : cases)
    fs::permissions(dir / (std::string(c.leftover) + "/" + c.leftover + "/locked"),
                    fs::perms::owner_all);
}

}  // namespace
}  // namespace brisk::testing
