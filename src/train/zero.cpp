#include "train/zero.h"

#include <algorithm>

#include "core/error.h"
#include "dist/communicator.h"
#include "optim/optimizer.h"

namespace brisk {

std::vector<ParamShard> partition_params(const ParameterSet& params, int ranks,
                                         bool split_parameters) {
  BRISK_CHECK(ranks >= 1, "internal error: ", ranks, " ranks");
  const std::vector<ParamInfo>& list = params.list();
  const int count = static_cast<int>(list.size());
  const int64_t total = params.total_elements();
  std::vector<ParamShard> shards(static_cast<size_t>(ranks));
  if (split_parameters) {
    const int64_t chunk = (total + ranks - 1) / ranks;
    int at = 0;
    for (int r = 0; r < ranks; ++r) {
      ParamShard& s = shards[static_cast<size_t>(r)];
      const int64_t begin = std::min<int64_t>(chunk * r, total);
      const int64_t end = std::min<int64_t>(begin + chunk, total);
      s.elements = {begin, end - begin};
      // The parameters overlapping [begin, end).
      while (at < count &&
             list[static_cast<size_t>(at)].offset + list[static_cast<size_t>(at)].shape.numel() <=
                 begin)
        ++at;
      s.first = at;
      int last = at;
      while (last < count && list[static_cast<size_t>(last)].offset < end) ++last;
      s.last = end > begin ? last : at;
    }
    return shards;
  }
  int at = 0;
  for (int r = 0; r < ranks; ++r) {
    ParamShard& s = shards[static_cast<size_t>(r)];
    s.first = at;
    // Rank r ends at the parameter boundary nearest to (r + 1) / ranks of the elements.
    const double target = static_cast<double>(total) * (r + 1) / ranks;
    while (at < count) {
      const ParamInfo& p = list[static_cast<size_t>(at)];
      const double end = static_cast<double>(p.offset + p.shape.numel());
      if (r < ranks - 1 && end - target > target - static_cast<double>(p.offset)) break;
      ++at;
    }
    s.last = at;
    const int64_t begin = s.first < count ? list[static_cast<size_t>(s.first)].offset : total;
    const int64_t end = s.last < count ? list[static_cast<size_t>(s.last)].offset : total;
    s.elements = {begin, end - begin};
  }
  return shards;
}

ParameterSet shard_params(const ParameterSet& params, const ParamShard& shard) {
  ParameterSet out;
  const int64_t begin = shard.elements.offset, end = begin + shard.elements.count;
  for (int i = shard.first; i < shard.last; ++i) {
    const ParamInfo& p = params.list()[static_cast<size_t>(i)];
    const int64_t lo = std::max(begin, p.offset), hi = std::min(end, p.offset + p.shape.numel());
    if (lo >= hi) continue;
    const bool whole = lo == p.offset && hi == p.offset + p.shape.numel();
    out.add(p.name, whole ? p.shape : Shape{hi - lo}, ParamRole{p.decay, p.embedding, p.product});
  }
  return out;
}

std::vector<std::pair<std::string, std::vector<uint8_t>>> gather_optimizer_state(
    Communicator& comm, const Optimizer& optimizer) {
  std::vector<std::pair<std::string, std::vector<uint8_t>>> out;
  for (const auto& [name, t] : optimizer.state()) {
    BRISK_CHECK(t.device() == Device::cpu,
                "internal error: gathering optimizer state from device memory");
    out.emplace_back(name, gather_pieces(comm, t));
  }
  return out;
}

}  // namespace brisk
