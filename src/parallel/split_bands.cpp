// Banded reads of split parameters (split_bands.h).
#include "parallel/split_bands.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace brisk {

void SplitBands::read(const ParamInfo& share, size_t element_bytes, size_t at, size_t n, char* dst,
                      const ReadShare& read_share) {
  while (n > 0) {
    if (band_.empty() || at < first_ || at >= first_ + band_.size())
      fill(share, element_bytes, at, read_share);
    const size_t take = std::min(n, first_ + band_.size() - at);
    std::memcpy(dst, band_.data() + (at - first_), take);
    dst += take;
    at += take;
    n -= take;
  }
}

void SplitBands::fill(const ParamInfo& share, size_t element_bytes, size_t at,
                      const ReadShare& read_share) {
  const SplitGeometry g = split_geometry(share);
  const auto eb = static_cast<int64_t>(element_bytes);
  const int64_t row = g.full * g.inner;  // one index of the dimensions before the split one
  const int64_t rows = share.full_shape().numel() / row;
  const int64_t e = static_cast<int64_t>(at) / eb;
  const int64_t slice_part = g.piece * share.split.ranks;  // a part's extent in the full
  if (rows == 1) {
    // Indices [k0, k1) along the first dimension: runs of one slice's consecutive rows.
    const int64_t per = std::max<int64_t>(1, static_cast<int64_t>(band_bytes_) / (g.inner * eb));
    const int64_t k0 = e / g.inner, k1 = std::min(g.full, k0 + per);
    band_.resize(static_cast<size_t>((k1 - k0) * g.inner * eb));
    first_ = static_cast<size_t>(k0 * g.inner * eb);
    for (int64_t k = k0; k < k1;) {
      const int64_t part = k / slice_part, o = k % slice_part;
      const int64_t slice = o / g.piece, local = part * g.piece + o % g.piece;
      const int64_t length = std::min(k1 - k, g.piece - o % g.piece);
      read_share(static_cast<int>(slice), static_cast<size_t>(local * g.inner * eb),
                 static_cast<size_t>(length * g.inner * eb),
                 band_.data() + static_cast<size_t>((k - k0) * g.inner * eb));
      k += length;
    }
    return;
  }
  // Rows [r0, r1) of the dimensions before the split one: each slice's elements of them lie
  // together on its rank, and for_each_split_run places them.
  const int64_t per = std::max<int64_t>(1, static_cast<int64_t>(band_bytes_) / (row * eb));
  const int64_t r0 = e / row, r1 = std::min(rows, r0 + per);
  band_.resize(static_cast<size_t>((r1 - r0) * row * eb));
  first_ = static_cast<size_t>(r0 * row * eb);
  const int64_t local_first = r0 * g.extent * g.inner, count = (r1 - r0) * g.extent * g.inner;
  piece_.resize(static_cast<size_t>(count * eb));
  ParamInfo slice = share;
  for (int s = 0; s < share.split.ranks; ++s) {
    read_share(s, static_cast<size_t>(local_first * eb), piece_.size(), piece_.data());
    slice.split.rank = s;
    for_each_split_run(slice, local_first, count, [&](int64_t local, int64_t full, int64_t n) {
      std::memcpy(band_.data() + static_cast<size_t>((full - r0 * row) * eb),
                  piece_.data() + static_cast<size_t>((local - local_first) * eb),
                  static_cast<size_t>(n * eb));
    });
  }
}

}  // namespace brisk
