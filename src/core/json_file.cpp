// Bounded JSON files (see json_file.h).
#include "core/json_file.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "core/input_file.h"

namespace brisk {

nlohmann::json read_json_file(const std::string& path, const std::string& what, size_t max_bytes,
                              int max_depth) {
  std::error_code ec;
  BRISK_CHECK(std::filesystem::exists(path, ec), "cannot open ", what, " '", path,
              "': no such file");
  const std::string text = InputFile(path, what).read_all(max_bytes);
  return parse_json_bounded(text.data(), text.data() + text.size(), what + " '" + path + "'",
                            max_depth);
}

namespace {
// Whether JSON text nests objects and lists deeper than `max_depth` levels, found in one pass
// that skips strings. The depth is checked before parsing, not in a parse callback: nlohmann's
// callback parser scans a whole object each time one of its members ends, which makes a header
// of n entries cost n^2.
bool nested_deeper(const char* begin, const char* end, int max_depth) {
  int depth = 0;
  bool in_string = false;
  for (const char* p = begin; p < end; ++p) {
    if (in_string) {
      if (*p == '\\')
        ++p;  // the escaped character
      else if (*p == '"')
        in_string = false;
    } else if (*p == '"') {
      in_string = true;
    } else if (*p == '{' || *p == '[') {
      if (++depth > max_depth) return true;
    } else if (*p == '}' || *p == ']') {
      --depth;
    }
  }
  return false;
}
}  // namespace

nlohmann::json parse_json_bounded(const char* begin, const char* end, const std::string& what,
                                  int max_depth) {
  BRISK_CHECK(!nested_deeper(begin, end, max_depth), what,
              " is not valid JSON: nested deeper than ", max_depth, " levels");
  try {
    return nlohmann::json::parse(begin, end);
  } catch (const std::exception& e) {
    // The parser's message quotes the offending token: keep the line short.
    BRISK_FAIL(what, " is not valid JSON: ", excerpt(e.what(), 160));
  }
}

void write_file_atomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  BRISK_CHECK(f != nullptr, "cannot write '", tmp, "': ", std::strerror(errno));
  bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  ok = std::fflush(f) == 0 && ok;
  ok = ::fsync(::fileno(f)) == 0 && ok;
  ok = std::fclose(f) == 0 && ok;
  if (!ok) {
    std::remove(tmp.c_str());
    BRISK_FAIL("failed while writing '", tmp, "' (disk full or unwritable?)");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    BRISK_FAIL("cannot rename '", tmp, "' to '", path, "': ", std::strerror(err));
  }
}

std::string format_mib(size_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  return buf;
}

}  // namespace brisk
