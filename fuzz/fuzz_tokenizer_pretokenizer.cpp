// libFuzzer target: the bytes before the first NUL as a tokenizer.json "pre_tokenizer" (ByteLevel,
// a Split regex, Digits, Metaspace, Sequence, ...) in a byte-level BPE and a Unigram tokenizer;
// the bytes after it as text, encoded and decoded by each that loads (a regex that backtracks
// without end must be refused, not time out).
#include <cstring>
#include <string>

#include "core/error.h"
#include "fuzz_support.h"
#include "tokenizer/tokenizer.h"

namespace {

const char* const kModels[] = {
    R"({"type":"BPE","vocab":{"a":0,"b":1,"c":2,"\u0120":3,"ab":4,"\u0120a":5,"1":6,"2":7},)"
    R"("merges":["a b","\u0120 a"]})",
    R"({"type":"Unigram","unk_id":0,"vocab":[["<unk>",0],["\u2581",-1],["a",-2],["b",-2],)"
    R"(["ab",-1.5],["\u2581a",-1],["_",-2]]})",
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto* nul = static_cast<const uint8_t*>(std::memchr(data, 0, size));
  const size_t spec = nul ? static_cast<size_t>(nul - data) : size;
  const std::string pre(reinterpret_cast<const char*>(data), spec);
  const std::string text =
      nul ? std::string(reinterpret_cast<const char*>(nul + 1), size - spec - 1) : "ab a 12 c!";
  for (const char* model : kModels) {
    const std::string json =
        std::string(R"({"model":)") + model + R"(,"pre_tokenizer":)" + pre + "}";
    const std::string path = brisk::fuzz::input_file(reinterpret_cast<const uint8_t*>(json.data()),
                                                     json.size(), ".json");
    try {
      const auto t = brisk::Tokenizer::load(path);
      const brisk::Encoded e = t->encode(text, std::string_view("ab  a"), 0);
      t->decode(e.ids);
    } catch (const brisk::Error&) {
    }
  }
  return 0;
}
