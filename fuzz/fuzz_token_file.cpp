// libFuzzer target: any bytes as a token file, opened for a small model and every sample read.
#include "core/error.h"
#include "data/token_file.h"
#include "fuzz_support.h"
#include "models/model.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = brisk::fuzz::input_file(data, size, ".bin");
  try {
    brisk::TokenFileDataset tokens(path, /*seq_len=*/8, /*vocab_size=*/1000);
    std::vector<int32_t> ids(8), mask(8), labels(8);
    brisk::Batch b;
    b.input_ids = brisk::Tensor(ids.data(), brisk::Shape{1, 8}, brisk::DType::i32);
    b.attention_mask = brisk::Tensor(mask.data(), brisk::Shape{1, 8}, brisk::DType::i32);
    b.labels = brisk::Tensor(labels.data(), brisk::Shape{1, 8}, brisk::DType::i32);
    for (int64_t i = 0; i < tokens.size() && i < 64; ++i) tokens.fill_row(i, b, 0);
  } catch (const brisk::Error&) {
  }
  return 0;
}
