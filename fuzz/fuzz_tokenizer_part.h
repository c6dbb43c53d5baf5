// Shared by the tokenizer-part targets: the bytes before the first NUL are one part of a
// tokenizer.json (its "normalizer" or "pre_tokenizer"), put beside each of a few small models;
// the bytes after it are a text, encoded with `pair` and decoded by each tokenizer that loads.
#pragma once

#include <cstring>
#include <string>
#include <string_view>

#include "core/error.h"
#include "fuzz_support.h"
#include "tokenizer/tokenizer.h"

namespace brisk::fuzz {

template <size_t N>
void tokenizer_part(const uint8_t* data, size_t size, const char* key,
                    const char* const (&models)[N], const char* default_text,
                    std::string_view pair) {
  const auto* nul = static_cast<const uint8_t*>(std::memchr(data, 0, size));
  const size_t spec = nul ? static_cast<size_t>(nul - data) : size;
  const std::string part(reinterpret_cast<const char*>(data), spec);
  const std::string text =
      nul ? std::string(reinterpret_cast<const char*>(nul + 1), size - spec - 1) : default_text;
  for (const char* model : models) {
    const std::string json = std::string(R"({"model":)") + model + ",\"" + key + "\":" + part + "}";
    const std::string path =
        input_file(reinterpret_cast<const uint8_t*>(json.data()), json.size(), ".json");
    try {
      const auto t = Tokenizer::load(path);
      const Encoded e = t->encode(text, pair, 0);
      t->decode(e.ids);
    } catch (const Error&) {
    }
  }
}

}  // namespace brisk::fuzz
