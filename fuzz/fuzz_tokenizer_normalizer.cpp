// libFuzzer target: the bytes before the first NUL as a tokenizer.json "normalizer" (Prepend,
// Replace, Sequence, BertNormalizer, ...) in a Unigram, a byte-fallback BPE and a WordPiece
// tokenizer; the bytes after it as text, encoded and decoded by each that loads.
#include "fuzz_tokenizer_part.h"

namespace {

// Small vocabularies with the pieces each model needs: "▁", byte tokens, an unknown token.
const char* const kModels[] = {
    R"({"type":"Unigram","unk_id":0,"byte_fallback":true,"vocab":[["<unk>",0],["\u2581",-1],)"
    R"(["a",-2],["b",-2],["ab",-1.5],["\u2581a",-1],["<0x41>",-3],["<0xC3>",-3],["<0xA9>",-3]]})",
    R"({"type":"BPE","byte_fallback":true,"unk_token":"<unk>","vocab":{"<unk>":0,"\u2581":1,)"
    R"("a":2,"b":3,"ab":4,"\u2581a":5,"<0x41>":6,"<0xC3>":7,"<0xA9>":8},)"
    R"("merges":["a b","\u2581 a"]})",
    R"({"type":"WordPiece","unk_token":"[UNK]","max_input_chars_per_word":100,)"
    R"("vocab":{"[UNK]":0,"a":1,"##a":2,"b":3,"##b":4,"ab":5}})",
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  brisk::fuzz::tokenizer_part(data, size, "normalizer", kModels, "a b ab É", "ab a");
  return 0;
}
