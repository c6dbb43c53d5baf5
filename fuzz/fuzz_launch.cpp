// libFuzzer target: any bytes as the process environment a launcher leaves (lines NAME=VALUE).
// An accepted launch has 0 <= rank < size and 0 <= local rank < size; bad ones end in
// brisk::Error.
#include <cstdint>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>

#include "core/error.h"
#include "parallel/launch.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::map<std::string, std::string> env;
  const std::string text(reinterpret_cast<const char*>(data), size);
  size_t at = 0;
  while (at < text.size()) {
    size_t end = text.find('\n', at);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(at, end - at);
    const size_t eq = line.find('=');
    if (eq != std::string::npos) env[line.substr(0, eq)] = line.substr(eq + 1);
    at = end + 1;
  }
  try {
    const brisk::LaunchInfo l =
        brisk::launch_info_from_env([&](const std::string& name) -> std::optional<std::string> {
          const auto it = env.find(name);
          return it == env.end() ? std::nullopt : std::optional<std::string>(it->second);
        });
    if (l.rank < 0 || l.rank >= l.size || l.local_rank < 0 || l.local_rank >= l.size) std::abort();
  } catch (const brisk::Error&) {
  }
  return 0;
}
