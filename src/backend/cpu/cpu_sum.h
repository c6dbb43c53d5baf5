// Sums that give the same bits on any number of threads. OpenMP's reduction clause adds the
// threads' partial sums in the order the threads finish, so with three or more threads a
// floating-point sum changes from run to run (with two, a + b = b + a hides it). ordered_sum
// splits [0, n) into blocks whose size depends on n alone, sums each block on whichever thread,
// and adds the blocks' sums in block order.
#pragma once

#include <algorithm>
#include <cstdint>

namespace brisk {

constexpr int64_t kSumBlocks = 256;

// block_sum(begin, end) -> double sums [begin, end); blocks are at least min_block long.
template <class BlockSum>
double ordered_sum(int64_t n, int64_t min_block, bool parallel, BlockSum block_sum) {
  if (n <= 0) return 0.0;
  const int64_t block = std::max({int64_t{1}, min_block, (n + kSumBlocks - 1) / kSumBlocks});
  const int64_t blocks = (n + block - 1) / block;
  double part[kSumBlocks];
#pragma omp parallel for schedule(static) if (parallel && blocks > 1)
  for (int64_t b = 0; b < blocks; ++b) part[b] = block_sum(b * block, std::min(n, (b + 1) * block));
  double total = 0.0;
  for (int64_t b = 0; b < blocks; ++b) total += part[b];
  return total;
}

// x[0]^2 + ... + x[n-1]^2 in double, vectorized (a plain pointer and count: indexing a captured
// pointer from a lambda's begin/end made GCC emit gathers, 4x slower).
inline double sum_of_squares(const float* __restrict x, int64_t n) {
  double sq = 0.0;
#pragma omp simd reduction(+ : sq)
  for (int64_t i = 0; i < n; ++i) sq += static_cast<double>(x[i]) * static_cast<double>(x[i]);
  return sq;
}

}  // namespace brisk
