#include "tokenizer/encode_lines.h"

#include <exception>
#include <optional>
#include <string_view>

#include "core/error.h"

namespace brisk {

namespace {
std::vector<int32_t> encode_line(const Tokenizer& tok, const LineEncoding& how,
                                 std::string_view line) {
  std::optional<std::string_view> pair;
  std::string_view first = line;
  const size_t sep = how.pair_separator.empty() ? std::string::npos : line.find(how.pair_separator);
  if (sep != std::string::npos) {
    first = line.substr(0, sep);
    pair = line.substr(sep + how.pair_separator.size());
  }
  if (how.add_special_tokens) return tok.encode(first, pair, 0).ids;
  std::vector<int32_t> ids = tok.tokenize(first);
  if (pair) {
    const std::vector<int32_t> b = tok.tokenize(*pair);
    ids.insert(ids.end(), b.begin(), b.end());
  }
  return ids;
}
}  // namespace

std::vector<std::vector<int32_t>> encode_lines(const Tokenizer& tok, const LineEncoding& how,
                                               const std::vector<std::string>& lines,
                                               int64_t lines_before) {
  std::vector<std::vector<int32_t>> ids(lines.size());
  const auto n = static_cast<int64_t>(lines.size());
  // An error may not leave the parallel loop: the first line's is raised after it.
  int64_t failed = n;
  std::string error;
#pragma omp parallel for schedule(dynamic, 64)
  for (int64_t i = 0; i < n; ++i) {
    try {
      ids[i] = encode_line(tok, how, lines[i]);
    } catch (const std::exception& e) {
#pragma omp critical(brisk_tokenize_error)
      if (i < failed) {
        failed = i;
        error = e.what();
      }
    }
  }
  BRISK_CHECK(failed == n, "line ", lines_before + failed + 1, " of the input: ", error);
  return ids;
}

}  // namespace brisk
