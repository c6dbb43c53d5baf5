// Tokenized datasets cached on disk and memory-mapped by later runs (run_glue's and run_clm's
// map() caches): a file per (data file content, tokenizer files, preparation options), named by
// the fingerprint of all three, with a checksum over its arrays. A stale, missing or damaged
// cache is rebuilt, never trusted.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

struct XXH3_state_s;  // xxhash.h's, kept out of this header

namespace brisk {

// Tokenized rows, viewed in owned vectors or in a mapped cache file (`memory` keeps either
// alive). Classification: row r holds ids/types [offsets[r], offsets[r+1]) and labels[r] or
// values[r]; causal LM: ids is the token stream, the rest empty.
struct TokenizedRows {
  std::span<const int64_t> offsets;
  std::span<const int32_t> ids, types, labels;
  std::span<const float> values;
  std::shared_ptr<const void> memory;
};

// Owned arrays to build TokenizedRows from.
struct TokenArrays {
  std::vector<int64_t> offsets;
  std::vector<int32_t> ids, types, labels;
  std::vector<float> values;
};
TokenizedRows view_of(std::shared_ptr<const TokenArrays> arrays);

// XXH3 (64 bits, xxHash) over the parts, each preceded by its length.
class Fingerprint {
 public:
  Fingerprint();
  ~Fingerprint();
  Fingerprint(Fingerprint&&) noexcept = default;
  Fingerprint& operator=(Fingerprint&&) noexcept = default;
  Fingerprint& add(std::string_view bytes);
  Fingerprint& add_file(const std::string& path);  // its bytes (mapped); throws naming it
  uint64_t value() const;

 private:
  struct FreeState {
    void operator()(XXH3_state_s* s) const;
  };
  std::unique_ptr<XXH3_state_s, FreeState> state_;
};

// The values a cache must hold to be used: a cache whose checksum matches may still come from
// another program or a damaged build. Token ids in [0, vocab), token types in [0, type_vocab),
// labels in [0, classes) or kIgnoreIndex, regression values finite or NaN (no label).
struct TokenLimits {
  int64_t vocab = 0;
  int64_t type_vocab = 1;
  int64_t classes = 0;
};

// Why the arrays' values do not fit `limits` ("a token id outside the vocabulary", ...), or
// nullptr when they do.
const char* out_of_limits(const TokenizedRows& rows, const TokenLimits& limits);

// The cache file's bytes for `rows` under `key`.
std::string serialize_token_cache(uint64_t key, const TokenizedRows& rows);
// Views the arrays of a cache file's bytes (8-byte aligned, as a mapping is); nullopt (and *why)
// when the bytes are not a complete cache for `key` or hold values outside `limits` (one pass
// over the arrays). The views point into `bytes`. Layout: the 48-byte header, then offsets
// (rows + 1 int64, flag 1), ids (int32), types (int32, flag 2; absent: all 0), labels (int32 per
// row, flag 4), values (float32 per row, flag 8); labels and values need offsets.
std::optional<TokenizedRows> parse_token_cache(std::string_view bytes, uint64_t key,
                                               const TokenLimits& limits, std::string* why);

// Maps `path` and parses it: nullopt (and *why) when absent, stale, damaged or out of `limits`.
std::optional<TokenizedRows> read_token_cache(const std::string& path, uint64_t key,
                                              const TokenLimits& limits, std::string* why);
// Writes the cache atomically (creating its folder).
void write_token_cache(const std::string& path, uint64_t key, const TokenizedRows& rows);

}  // namespace brisk
