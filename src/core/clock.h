// Seconds on the steady clock, for the run's timings (steps, collectives, evaluation).
#pragma once

#include <chrono>

namespace brisk {

inline double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace brisk
