// Size arithmetic on values that come from input (shapes, counts, byte sizes): an overflow ends
// in one clear message instead of wrapping to a small size.
#pragma once

#include <cstdint>

#include "core/error.h"

namespace brisk {

inline int64_t checked_mul(int64_t a, int64_t b, const char* what) {
  int64_t r = 0;
  BRISK_CHECK(a >= 0 && b >= 0 && !__builtin_mul_overflow(a, b, &r), what, " is too large (", a,
              " x ", b, " overflows)");
  return r;
}

inline int64_t checked_add(int64_t a, int64_t b, const char* what) {
  int64_t r = 0;
  BRISK_CHECK(a >= 0 && b >= 0 && !__builtin_add_overflow(a, b, &r), what, " is too large (", a,
              " + ", b, " overflows)");
  return r;
}

}  // namespace brisk
