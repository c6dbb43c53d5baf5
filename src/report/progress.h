// The optimizer steps' progress on stderr. On a terminal: a bar redrawn in place with the rate and
// the time left; a record written meanwhile goes above it (clear, write, redraw), as tqdm.write.
// Off a terminal: a line after the first step, then one at most every 30 seconds, so that a log
// file shows a live run long before logging_steps. Formats into fixed buffers: no allocation.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>

namespace brisk {

class Progress {
 public:
  enum class Mode { off, bar, lines };
  void start(Mode mode, int64_t total, int64_t first_step);
  void update(int64_t step, double loss);
  // Around a record written to the terminal.
  void clear() const {
    if (mode_ == Mode::bar && line_[0]) std::fprintf(stderr, "\r\033[K");
  }
  void redraw() const {
    if (mode_ == Mode::bar && line_[0]) std::fprintf(stderr, "\r%s\033[K", line_);
  }

 private:
  // mm:ss, or h:mm:ss from an hour on.
  static void clock_text(char (&out)[64], double seconds);
  Mode mode_ = Mode::off;
  int64_t total_ = 1, first_ = 0;
  std::chrono::steady_clock::time_point began_, last_line_;
  char line_[1024] = "";
};

}  // namespace brisk
