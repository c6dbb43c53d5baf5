// Token files: validation on open, sequences read straight from the mapping.
#include "data/token_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "core/error.h"
#include "core/input_file.h"

namespace brisk {

namespace {
constexpr char kMagic[8] = {'B', 'R', 'I', 'S', 'K', 'T', 'O', 'K'};
constexpr size_t kHeader = 24;

uint64_t read_le(const unsigned char* p, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
}  // namespace

TokenFileDataset::TokenFileDataset(const std::string& path, int64_t seq_len, int64_t vocab_size)
    : path_(path), seq_len_(seq_len) {
  {
    const InputFile file(path, "token file");
    map_size_ = file.size();
    if (map_size_ >= kHeader)
      map_ = ::mmap(nullptr, map_size_, PROT_READ, MAP_PRIVATE, file.fd(), 0);
  }
  BRISK_CHECK(map_size_ >= kHeader, "token file '", path, "' is too short for its ", kHeader,
              "-byte header (", map_size_, " bytes)");
  BRISK_CHECK(map_ != MAP_FAILED, "cannot map token file '", path, "'");
  const auto* p = static_cast<const unsigned char*>(map_);
  try {
    BRISK_CHECK(std::memcmp(p, kMagic, 8) == 0, "'", path,
                "' is not a brisk token file (bad magic)");
    const uint64_t version = read_le(p + 8, 4);
    BRISK_CHECK(version == 1, "token file '", path, "' has unsupported version ", version);
    token_bytes_ = static_cast<uint32_t>(read_le(p + 12, 4));
    BRISK_CHECK(token_bytes_ == 2 || token_bytes_ == 4, "token file '", path, "' declares ",
                token_bytes_, " bytes per token (2 or 4 expected)");
    const uint64_t n = read_le(p + 16, 8);
    BRISK_CHECK(n <= (map_size_ - kHeader) / token_bytes_, "token file '", path,
                "' is truncated: its header promises ", n, " tokens, the file holds ",
                (map_size_ - kHeader) / token_bytes_);
    num_tokens_ = static_cast<int64_t>(n);
    tokens_ = p + kHeader;
    BRISK_CHECK(seq_len > 0 && num_tokens_ >= seq_len, "token file '", path, "' holds ",
                num_tokens_, " tokens: not one sequence of ", seq_len);
    for (int64_t i = 0; i < size() * seq_len_; ++i) {
      const uint64_t t = read_le(tokens_ + i * token_bytes_, static_cast<int>(token_bytes_));
      BRISK_CHECK(t < static_cast<uint64_t>(vocab_size), "token file '", path, "': token ", t,
                  " at position ", i, " is outside the vocabulary of ", vocab_size);
    }
  } catch (...) {
    ::munmap(map_, map_size_);
    throw;
  }
}

TokenFileDataset::~TokenFileDataset() {
  if (map_ && map_ != MAP_FAILED) ::munmap(map_, map_size_);
}

void TokenFileDataset::fill_row(int64_t index, int64_t, const Batch& batch, int64_t row) const {
  const int64_t T = batch.input_ids.dim(1);
  int32_t* ids = batch.input_ids.i32() + row * T;
  int32_t* labels = batch.labels.i32() + row * T;
  int32_t* mask = batch.attention_mask.i32() + row * T;
  const unsigned char* src = tokens_ + index * seq_len_ * token_bytes_;
  for (int64_t t = 0; t < T; ++t) {
    const bool real = t < seq_len_;
    ids[t] =
        real ? static_cast<int32_t>(read_le(src + t * token_bytes_, static_cast<int>(token_bytes_)))
             : 0;
    labels[t] = real ? ids[t] : kIgnoreIndex;
    mask[t] = real ? 1 : 0;
  }
}

void write_token_file(const std::string& path, const std::vector<uint32_t>& tokens,
                      uint32_t bytes_per_token) {
  BRISK_CHECK(bytes_per_token == 2 || bytes_per_token == 4, "bytes per token must be 2 or 4");
  std::vector<unsigned char> out(kHeader + tokens.size() * bytes_per_token);
  std::memcpy(out.data(), kMagic, 8);
  auto put = [&](size_t at, uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) out[at + i] = static_cast<unsigned char>(v >> (8 * i));
  };
  put(8, 1, 4);
  put(12, bytes_per_token, 4);
  put(16, tokens.size(), 8);
  for (size_t i = 0; i < tokens.size(); ++i) {
    BRISK_CHECK(bytes_per_token == 4 || tokens[i] <= 0xffff, "token ", tokens[i],
                " does not fit in 16 bits");
    put(kHeader + i * bytes_per_token, tokens[i], static_cast<int>(bytes_per_token));
  }
  FILE* f = std::fopen(path.c_str(), "wb");
  BRISK_CHECK(f, "cannot write token file '", path, "'");
  const bool ok = std::fwrite(out.data(), 1, out.size(), f) == out.size();
  BRISK_CHECK(std::fclose(f) == 0 && ok, "failed writing token file '", path, "'");
}

}  // namespace brisk
