// Lines of text encoded into ids (`brisk tokenize`, the Python API's tokenize): each line split
// at a separator into a sentence pair where asked, encoded with the special tokens or tokenized
// plainly, many lines in parallel.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace brisk {

struct LineEncoding {
  bool add_special_tokens = true;
  std::string pair_separator;  // when set, a line's text after it is the second of a pair
};

// Every line's ids, in order (OpenMP across lines). The first failing line's error is raised,
// naming it (`lines_before`: the lines read before these, for the line's number).
std::vector<std::vector<int32_t>> encode_lines(const Tokenizer& tok, const LineEncoding& how,
                                               const std::vector<std::string>& lines,
                                               int64_t lines_before = 0);

}  // namespace brisk
