// Shared by brisk's libFuzzer targets: the input is written to a per-process file (the parsers
// read files, mmap included), and a brisk::Error is the expected way to refuse bad input.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>

namespace brisk::fuzz {

inline std::string input_file(const uint8_t* data, size_t size, const char* suffix) {
  const std::string path = std::string("/tmp/brisk_fuzz_") + std::to_string(::getpid()) + suffix;
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f) {
    if (size) std::fwrite(data, 1, size, f);
    std::fclose(f);
  }
  return path;
}

}  // namespace brisk::fuzz
