// Errors: library code throws brisk::Error with a clear message; only the CLI turns it into an
// exit.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace brisk {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

namespace detail {
template <typename... Args>
std::string concat(Args&&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace detail

// A value from input as messages show it: at most `max` characters, so a 10 MB name or value
// never floods the error line.
inline std::string excerpt(const std::string& s, size_t max = 40) {
  return s.size() <= max ? s : s.substr(0, max - 3) + "...";
}

}  // namespace brisk

// BRISK_CHECK(cond, parts...) throws brisk::Error("parts...") when cond is false.
#define BRISK_CHECK(cond, ...)                                               \
  do {                                                                       \
    if (!(cond)) throw ::brisk::Error(::brisk::detail::concat(__VA_ARGS__)); \
  } while (0)

#define BRISK_FAIL(...) throw ::brisk::Error(::brisk::detail::concat(__VA_ARGS__))
