// libFuzzer target: any bytes as a tokenization cache file, parsed as a later run maps it (copied
// to 8-byte-aligned memory, as a mapping is) under the key its header claims and under another,
// with limits no value reaches and with narrow ones, and every array it views read through once.
#include <cstring>
#include <vector>

#include "core/error.h"
#include "data/token_cache.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<uint64_t> aligned((size + 7) / 8 + 1);  // never empty: data() is not null
  if (size > 0) std::memcpy(aligned.data(), data, size);
  const std::string_view bytes(reinterpret_cast<const char*>(aligned.data()), size);
  uint64_t key = 0;
  if (size >= 16) std::memcpy(&key, bytes.data() + 8, sizeof key);
  const brisk::TokenLimits wide{int64_t{1} << 31, int64_t{1} << 31, int64_t{1} << 31};
  const brisk::TokenLimits narrow{1000, 2, 3};
  for (const auto& [k, limits] :
       {std::pair{key, wide}, std::pair{key, narrow}, std::pair{key ^ 1, wide}}) {
    try {
      std::string why;
      const auto rows = brisk::parse_token_cache(bytes, k, limits, &why);
      if (!rows) continue;
      int64_t sum = 0;
      for (int64_t v : rows->offsets) sum += v;
      for (int32_t v : rows->ids) sum += v;
      for (int32_t v : rows->types) sum += v;
      for (int32_t v : rows->labels) sum += v;
      for (float v : rows->values) sum += static_cast<int64_t>(v == v);
      if (sum == 42) std::memset(aligned.data(), 0, 1);  // keeps the reads
    } catch (const brisk::Error&) {
    }
  }
  return 0;
}
