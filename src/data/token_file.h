// A binary token file for causal-LM training, memory-mapped and split into sequences of seq_len
// tokens (labels = input ids). Format (little-endian):
//   bytes 0-7   magic "BRISKTOK"
//   bytes 8-11  uint32 version = 1
//   bytes 12-15 uint32 bytes per token: 2 (uint16) or 4 (uint32)
//   bytes 16-23 uint64 number of tokens N
//   bytes 24-   N tokens
#pragma once

#include <string>
#include <vector>

#include "data/dataset.h"

namespace brisk {

class TokenFileDataset final : public Dataset {
 public:
  TokenFileDataset(const std::string& path, int64_t seq_len, int64_t vocab_size);
  ~TokenFileDataset() override;
  TokenFileDataset(const TokenFileDataset&) = delete;
  TokenFileDataset& operator=(const TokenFileDataset&) = delete;

  int64_t size() const override { return num_tokens_ / seq_len_; }
  int64_t seq_len() const override { return seq_len_; }
  void fill_row(int64_t index, int64_t epoch, const Batch& batch, int64_t row) const override;
  int64_t count_targets(int64_t, int64_t) const override { return seq_len_ - 1; }

 private:
  std::string path_;
  void* map_ = nullptr;
  size_t map_size_ = 0;
  const unsigned char* tokens_ = nullptr;
  uint32_t token_bytes_ = 2;
  int64_t num_tokens_ = 0;
  int64_t seq_len_ = 0;
};

// Writes a token file (used by tests and by whoever prepares data).
void write_token_file(const std::string& path, const std::vector<uint32_t>& tokens,
                      uint32_t bytes_per_token);

}  // namespace brisk
