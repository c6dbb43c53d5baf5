// The environment's measurement switches: a variable set to "0" turns a path off to compare
// against (BRISK_FUSED_ATTENTION, BRISK_BF16_ACTIVATIONS, BRISK_RECOMPUTE_ACTIVATION,
// BRISK_LABELLED_ROWS_ONLY, ...), one set to "1" opts into a path that is off by default
// (BRISK_BF16_PRODUCT_OUTPUT).
#pragma once

#include <cstdlib>
#include <cstring>

namespace brisk {

// Whether the environment variable `name` is "0".
inline bool switched_off(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && std::strcmp(v, "0") == 0;
}

// Whether the environment variable `name` is "1".
inline bool switched_on(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && std::strcmp(v, "1") == 0;
}

}  // namespace brisk
