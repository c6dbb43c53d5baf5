// libFuzzer target: any bytes as a tokenizer.json, loaded, then a few texts encoded and decoded.
#include "core/error.h"
#include "fuzz_support.h"
#include "tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = brisk::fuzz::input_file(data, size, ".json");
  try {
    const auto t = brisk::Tokenizer::load(path);
    for (const char* text : {"Hello, world! café 你好 😀", "[CLS] x [SEP]", "", "  \t\n"}) {
      const brisk::Encoded e = t->encode(text, std::string_view("pair text"), 8);
      t->decode(e.ids);
    }
  } catch (const brisk::Error&) {
  }
  return 0;
}
