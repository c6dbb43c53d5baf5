// Bounded JSON files (see json_file.h).
#include "core/json_file.h"

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "core/error.h"

namespace brisk {

nlohmann::json read_json_file(const std::string& path, const std::string& what, size_t max_bytes,
                              int max_depth) {
  std::error_code ec;
  BRISK_CHECK(std::filesystem::exists(path, ec), "cannot open ", what, " '", path,
              "': no such file");
  BRISK_CHECK(std::filesystem::is_regular_file(path, ec), what, " '", path, "' is not a file");
  const uintmax_t size = std::filesystem::file_size(path, ec);
  BRISK_CHECK(!ec && size <= max_bytes, what, " '", path, "' is larger than ",
              format_mib(max_bytes));
  std::ifstream in(path);
  BRISK_CHECK(in.good(), "cannot open ", what, " '", path, "'");
  try {
    return nlohmann::json::parse(
        in, [max_depth](int depth, nlohmann::json::parse_event_t, nlohmann::json&) {
          BRISK_CHECK(depth <= max_depth, "nested deeper than ", max_depth, " levels");
          return true;
        });
  } catch (const std::exception& e) {
    // The parser's message quotes the offending token: keep the line short.
    const std::string why = e.what();
    BRISK_FAIL(what, " '", path,
               "' is not valid JSON: ", why.size() <= 160 ? why : why.substr(0, 157) + "...");
  }
}

std::string format_mib(size_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  return buf;
}

}  // namespace brisk
