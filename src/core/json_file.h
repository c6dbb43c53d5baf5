// Files in and out: reading a JSON file from input with bounds: a regular file of at most
// `max_bytes`, nested at most `max_depth` levels (checked in one pass before parsing), refused
// with one short message naming `what`.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>

namespace brisk {

// 16 MiB by default: generous for configs and options files (whitespace included), bounded.
nlohmann::json read_json_file(const std::string& path, const std::string& what,
                              size_t max_bytes = size_t{16} << 20, int max_depth = 32);

// Parses JSON text from input nested at most `max_depth` levels (checked before parsing); a
// parse error becomes one short message naming `what`.
nlohmann::json parse_json_bounded(const char* begin, const char* end, const std::string& what,
                                  int max_depth = 32);

// Writes `text` to `path` through a temporary file beside it (written, flushed, fsynced, renamed):
// a full disk or a kill leaves the previous file or none, never a truncated one, and ends in one
// message naming the file.
void write_file_atomically(const std::string& path, const std::string& text);

// Bytes as "12.3 MiB", for messages and reports.
std::string format_mib(size_t bytes);

}  // namespace brisk
