// libFuzzer target: the bytes before the first NUL as a tokenizer.json "pre_tokenizer" (ByteLevel,
// a Split regex, Digits, Metaspace, Sequence, ...) in a byte-level BPE and a Unigram tokenizer;
// the bytes after it as text, encoded and decoded by each that loads (a regex that backtracks
// without end must be refused, not time out).
#include "fuzz_tokenizer_part.h"

namespace {

const char* const kModels[] = {
    R"({"type":"BPE","vocab":{"a":0,"b":1,"c":2,"\u0120":3,"ab":4,"\u0120a":5,"1":6,"2":7},)"
    R"("merges":["a b","\u0120 a"]})",
    R"({"type":"Unigram","unk_id":0,"vocab":[["<unk>",0],["\u2581",-1],["a",-2],["b",-2],)"
    R"(["ab",-1.5],["\u2581a",-1],["_",-2]]})",
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  brisk::fuzz::tokenizer_part(data, size, "pre_tokenizer", kModels, "ab a 12 c!", "ab  a");
  return 0;
}
