// A save's reads of a tensor-parallel parameter's full tensor from the ranks' shares, a band of
// it at a time: no rank ever holds a whole copy of a split parameter (the largest, a vocabulary
// table, can be gigabytes).
#pragma once

#include <cstddef>
#include <functional>
#include <vector>

#include "core/parameters.h"

namespace brisk {

class SplitBands {
 public:
  // read(slice, at, n, dst): bytes [at, at + n) of the share holding `slice` (ParamSplit::rank),
  // as laid out on its rank.
  using ReadShare = std::function<void(int slice, size_t at, size_t n, char* dst)>;
  // Bands of at most `band_bytes` (one index of the dimensions before the split one, if more).
  explicit SplitBands(size_t band_bytes = size_t{8} << 20) : band_bytes_(band_bytes) {}

  // Bytes [at, at + n) of the full tensor of `share`'s parameter (any slice's ParamInfo; each
  // element `element_bytes`) into dst, from the band in hand or a new one. Give the same
  // parameter and read until it changes (forget() between parameters or wholes).
  void read(const ParamInfo& share, size_t element_bytes, size_t at, size_t n, char* dst,
            const ReadShare& read_share);
  void forget() { band_.clear(); }
  size_t band_size() const { return band_.size(); }

 private:
  // The band holding byte `at`: a run of indices along the split dimension where it is the
  // first (each slice's rows of them lie together), else a run of the dimensions before it
  // (each slice's elements of them lie together).
  void fill(const ParamInfo& share, size_t element_bytes, size_t at, const ReadShare& read_share);

  size_t band_bytes_;
  std::vector<char> band_, piece_;
  size_t first_ = 0;  // the band's first byte in the full tensor
};

}  // namespace brisk
