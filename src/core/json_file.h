// Reading a JSON file from input with bounds: a regular file of at most `max_bytes`, nested at
// most `max_depth` levels (checked while parsing), refused with one short message naming `what`.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>

namespace brisk {

nlohmann::json read_json_file(const std::string& path, const std::string& what,
                              size_t max_bytes = size_t{1} << 20, int max_depth = 32);

// Bytes as "12.3 MiB", for messages and reports.
std::string format_mib(size_t bytes);

}  // namespace brisk
