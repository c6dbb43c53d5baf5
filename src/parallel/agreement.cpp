// The ranks' agreement at start (see agreement.h): rank 0's values broadcast as JSON, each rank's
// first difference summed into a table every rank reads.
#include "parallel/agreement.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace brisk {

std::string broadcast_text(Communicator& comm, const std::string& text, int root) {
  double length = static_cast<double>(text.size());
  comm.broadcast(Tensor(&length, Shape{1}, DType::f64), root);
  std::string out = comm.rank() == root ? text : std::string(static_cast<size_t>(length), '\0');
  if (!out.empty())
    comm.broadcast(Tensor(out.data(), Shape{static_cast<int64_t>(out.size())}, DType::u8), root);
  return out;
}

void check_ranks_agree(Communicator& comm, const std::vector<AgreedValue>& values) {
  if (comm.size() <= 1) return;
  nlohmann::json mine = nlohmann::json::array();
  for (const AgreedValue& v : values) mine.push_back(v.value);
  const nlohmann::json first = nlohmann::json::parse(broadcast_text(comm, mine.dump(), 0));
  // This rank's first value that differs from rank 0's (values.size(): none).
  const size_t n = values.size();
  size_t differs = 0;
  while (differs < n && differs < first.size() && first[differs] == mine[differs]) ++differs;
  std::vector<double> table(static_cast<size_t>(comm.size()), 0.0);
  table[static_cast<size_t>(comm.rank())] = static_cast<double>(differs);
  comm.all_reduce_sum(Tensor(table.data(), Shape{comm.size()}, DType::f64));
  const auto earliest = std::min_element(table.begin(), table.end());
  const auto index = static_cast<size_t>(*earliest);
  if (index >= n) return;
  const int rank = static_cast<int>(earliest - table.begin());
  const std::string theirs = broadcast_text(comm, mine[index].get<std::string>(), rank);
  BRISK_FAIL("the ranks disagree on ", values[index].name, ": ",
             excerpt(first.size() > index ? first[index].get<std::string>() : "(none)"),
             " on rank 0, ", excerpt(theirs), " on rank ", rank,
             " (start every rank with the same options and model)");
}

}  // namespace brisk
