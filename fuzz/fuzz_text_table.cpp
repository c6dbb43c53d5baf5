// libFuzzer target: any bytes as a CSV, TSV, JSON Lines or text data file (the first byte picks
// the format), parsed and every cell read.
#include "core/error.h"
#include "data/text_table.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const auto format = static_cast<brisk::TableFormat>(data[0] % 4);
  try {
    const brisk::TextTable t = brisk::parse_text_table(
        std::string_view(reinterpret_cast<const char*>(data) + 1, size - 1), format, "fuzz");
    size_t total = 0;
    for (int64_t r = 0; r < t.rows(); ++r)
      for (size_t c = 0; c < t.columns().size(); ++c)
        total += t.text(r, static_cast<int64_t>(c)).size() + static_cast<size_t>(t.kind(r, c));
    if (total == size_t(-1)) return 1;  // keeps the reads
  } catch (const brisk::Error&) {
  }
  return 0;
}
