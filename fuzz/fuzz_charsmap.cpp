// libFuzzer target: any bytes as a SentencePiece precompiled charsmap. brisk's check decides;
// a blob it accepts is put into the sentencepiece_unigram fixture's model (a later
// normalizer_spec merges over the first) and handed to libsentencepiece, which must then load
// and encode any text without reading outside it.
#include <fstream>
#include <sstream>
#include <string>

#include "core/error.h"
#include "fuzz_support.h"
#include "tokenizer/charsmap.h"
#include "tokenizer/tokenizer.h"

namespace {

std::string varint(size_t n) {
  std::string out;
  for (; n >= 0x80; n >>= 7) out.push_back(static_cast<char>(0x80 | (n & 0x7F)));
  out.push_back(static_cast<char>(n));
  return out;
}

const std::string& base_model() {
  static const std::string model = [] {
    std::ifstream in(BRISK_FIXTURES_DIR "/tokenizer/sentencepiece_unigram/tokenizer.model",
                     std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }();
  return model;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string blob(reinterpret_cast<const char*>(data), size);
  try {
    brisk::check_precompiled_charsmap(blob, "blob");
  } catch (const brisk::Error&) {
    return 0;
  }
  const std::string spec = "\x12" + varint(blob.size()) + blob;                  // field 2, bytes
  const std::string model = base_model() + "\x1a" + varint(spec.size()) + spec;  // field 3
  const std::string path = brisk::fuzz::input_file(reinterpret_cast<const uint8_t*>(model.data()),
                                                   model.size(), ".model");
  try {
    const auto t = brisk::Tokenizer::load(path);
    std::string all;
    for (int b = 1; b < 256; ++b) all.push_back(static_cast<char>(b));
    for (const std::string& text : {all, std::string("Hello ｶﾀｶﾅ ① ﬁ é")}) t->tokenize(text);
  } catch (const brisk::Error&) {
  }
  return 0;
}
