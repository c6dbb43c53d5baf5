// The brisk program run as a user runs it: its exit, stdout and stderr, and the check every
// refusal of bad input must pass (exit 1, never a signal, one short line naming the problem).
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

namespace brisk::testing {

struct CliRun {
  int exit_code = -1;
  bool signaled = false;
  std::string out, err;
};

inline CliRun run_brisk(const std::string& args, int timeout_s = 60) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path();
  // Per-process names: CTest runs tests in parallel processes.
  const std::string tag = std::to_string(::getpid());
  const std::string out = (dir / ("brisk_cli_out_" + tag + ".txt")).string();
  const std::string err = (dir / ("brisk_cli_err_" + tag + ".txt")).string();
  // At most timeout_s: a run that blocks (on a FIFO, a peer) or works without bound fails its
  // test instead of stalling it.
  const std::string cmd = "timeout " + std::to_string(timeout_s) + " " + std::string(BRISK_BINARY) +
                          " " + args + " > " + out + " 2> " + err + " < /dev/null";
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

// Refused as every bad input must be: exit 1 (never a signal), and on stderr one short line
// naming the problem.
inline void expect_refused(const std::string& args, const std::string& needle, int timeout_s = 60) {
  const std::string shown = args.size() <= 200 ? args : args.substr(0, 200) + "...";
  const CliRun r = run_brisk(args, timeout_s);
  EXPECT_FALSE(r.signaled) << shown << ": crashed\n" << r.err;
  EXPECT_EQ(r.exit_code, 1) << shown;
  EXPECT_NE(r.err.find(needle), std::string::npos)
      << shown << ": stderr \"" << r.err << "\" does not mention \"" << needle << "\"";
  EXPECT_EQ(r.err.rfind("brisk: error: ", 0), 0u) << shown << ": " << r.err;
  EXPECT_TRUE(!r.err.empty() && r.err.find('\n') == r.err.size() - 1)
      << shown << ": not one line: " << r.err;
  EXPECT_LE(r.err.size(), 400u) << shown << ": the message echoes too much";
}

// A JSON file, parsed.
inline nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

// `brisk estimate <args> --output_json F`: the JSON it wrote (the run's output in *out).
inline nlohmann::json estimate_json(const std::string& args, CliRun* out = nullptr) {
  namespace fs = std::filesystem;
  const std::string json =
      (fs::temp_directory_path() / ("brisk_cli_estimate_" + std::to_string(::getpid()) + ".json"))
          .string();
  const CliRun r = run_brisk("estimate " + args + " --output_json " + json);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  if (out) *out = r;
  if (r.exit_code != 0) return nlohmann::json::object();
  nlohmann::json j = read_json(json);
  fs::remove(json);
  return j;
}

// The bytes of buffer `name` in an estimate's plan (-1: none).
inline int64_t planned_bytes(const nlohmann::json& j, const std::string& name) {
  for (const auto& b : j["memory"]["buffers"])
    if (b["name"] == name) return b["bytes"].get<int64_t>();
  return -1;
}

}  // namespace brisk::testing
