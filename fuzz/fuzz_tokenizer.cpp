// libFuzzer target: any bytes as a tokenizer.json (or, after the "spm:" prefix, as a SentencePiece
// tokenizer.model), loaded, then a few texts encoded and decoded.
#include <cstring>

#include "core/error.h"
#include "fuzz_support.h"
#include "tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  constexpr char kModelPrefix[] = "spm:";
  constexpr size_t kPrefix = sizeof kModelPrefix - 1;
  const bool model = size >= kPrefix && std::memcmp(data, kModelPrefix, kPrefix) == 0;
  const std::string path = model ? brisk::fuzz::input_file(data + kPrefix, size - kPrefix, ".model")
                                 : brisk::fuzz::input_file(data, size, ".json");
  try {
    const auto t = brisk::Tokenizer::load(path);
    for (const char* text : {"Hello, world! café 你好 😀", "[CLS] x [SEP] <s>", "", "  \t\n"}) {
      const brisk::Encoded e = t->encode(text, std::string_view("pair text"), 8);
      t->decode(e.ids);
    }
  } catch (const brisk::Error&) {
  }
  return 0;
}
