#include "report/progress.h"

#include <algorithm>
#include <cstdio>

namespace brisk {

void Progress::start(Mode mode, int64_t total, int64_t first_step) {
  mode_ = mode;
  total_ = std::max<int64_t>(total, 1);
  first_ = first_step;
  began_ = std::chrono::steady_clock::now();
}

void Progress::update(int64_t step, double loss) {
  if (mode_ == Mode::off) return;
  const auto now = std::chrono::steady_clock::now();
  if (mode_ == Mode::lines && step != first_ + 1 && now - last_line_ < std::chrono::seconds(30))
    return;
  const double elapsed = std::chrono::duration<double>(now - began_).count();
  const double rate = elapsed > 0 ? static_cast<double>(step - first_) / elapsed : 0;
  char left[64], spent[64];
  clock_text(spent, elapsed);
  clock_text(left, rate > 0 ? static_cast<double>(total_ - step) / rate : 0);
  if (mode_ == Mode::lines) {
    last_line_ = now;
    std::fprintf(stderr, "brisk: step %lld/%lld, %.2f steps/s, %s left, loss %.4f\n",
                 static_cast<long long>(step), static_cast<long long>(total_), rate, left, loss);
    return;
  }
  constexpr int kWidth = 30;
  char bar[kWidth + 1];
  std::fill(bar, bar + kWidth, ' ');
  std::fill(bar, bar + kWidth * step / total_, '#');
  bar[kWidth] = '\0';
  std::snprintf(line_, sizeof line_, "[%s] %lld/%lld [%s<%s, %.2f it/s, loss %.4f]", bar,
                static_cast<long long>(step), static_cast<long long>(total_), spent, left, rate,
                loss);
  redraw();
  if (step == total_) {
    std::fprintf(stderr, "\n");
    line_[0] = '\0';
  }
}

void Progress::clock_text(char (&out)[64], double seconds) {
  const long long s = static_cast<long long>(std::min(seconds, 3.6e8));
  if (s >= 3600)
    std::snprintf(out, sizeof out, "%lld:%02lld:%02lld", s / 3600, s / 60 % 60, s % 60);
  else
    std::snprintf(out, sizeof out, "%02lld:%02lld", s / 60, s % 60);
}

}  // namespace brisk
