// Expert parallelism's exchanges over a communicator.
#include "parallel/expert_parallel.h"

#include <chrono>

#include "core/checked.h"

namespace brisk {

namespace {
using Clock = std::chrono::steady_clock;
}  // namespace

// As float64 (exact for counts): the communicators' buffers are floating point.
std::vector<int32_t> CommunicatorExpertGroup::all_gather(const std::vector<int32_t>& counts) {
  const auto start = Clock::now();
  const auto n = static_cast<int64_t>(counts.size());
  std::vector<double> mine(counts.begin(), counts.end());
  std::vector<double> all(static_cast<size_t>(checked_mul(n, size(), "expert counts")));
  comm_.all_gather(Tensor(mine.data(), Shape{n}, DType::f64),
                   Tensor(all.data(), Shape{static_cast<int64_t>(all.size())}, DType::f64));
  seconds_ += std::chrono::duration<double>(Clock::now() - start).count();
  return std::vector<int32_t>(all.begin(), all.end());
}

void CommunicatorExpertGroup::all_to_all_v(Backend&, const Tensor& in,
                                           const std::vector<int64_t>& send, const Tensor& out,
                                           const std::vector<int64_t>& receive) {
  const auto start = Clock::now();
  comm_.all_to_all_v(in, send, out, receive);
  seconds_ += std::chrono::duration<double>(Clock::now() - start).count();
  bytes_ += static_cast<double>(in.bytes());
}

}  // namespace brisk
