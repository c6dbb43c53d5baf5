// A row of an attention mask (int32, nonzero keeps the key), as the host's right-padding check and
// the CPU attention's check of given key counts both read it.
#pragma once

#include <algorithm>
#include <cstdint>

namespace brisk {

// Whether mask row [0, T) keeps exactly its first n keys: nonzero before n, zero from n on.
inline bool keeps_first_keys(const int32_t* row, int64_t T, int64_t n) {
  return n >= 0 && n <= T && std::all_of(row, row + n, [](int32_t v) { return v != 0; }) &&
         std::all_of(row + n, row + T, [](int32_t v) { return v == 0; });
}

}  // namespace brisk
