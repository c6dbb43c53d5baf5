// Reads VmHWM / VmRSS from /proc/self/status.
#include "core/process_memory.h"

#include <fstream>
#include <string>

namespace brisk {

namespace {
size_t status_kib(const std::string& key, const char* file = "/proc/self/status") {
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(key + ":", 0) == 0) return std::stoull(line.substr(key.size() + 1)) * 1024;
  return 0;
}
}  // namespace

bool reset_peak_rss() {
  std::ofstream out("/proc/self/clear_refs");
  out << "5";
  out.flush();
  return out.good();
}

size_t peak_rss_bytes() {
  return status_kib("VmHWM");
}
size_t current_rss_bytes() {
  return status_kib("VmRSS");
}
size_t available_host_bytes() {
  return status_kib("MemAvailable", "/proc/meminfo");
}

}  // namespace brisk
