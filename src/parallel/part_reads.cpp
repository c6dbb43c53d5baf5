// The helpers of the layouts whose ranks hold parts of the whole model (part_reads.h).
#include "parallel/part_reads.h"

namespace brisk {

ElementRange held_range(const ParamInfo& p, int64_t base, int64_t n) {
  const int64_t lo = std::max(p.offset, base), hi = std::min(p.offset + p.shape.numel(), base + n);
  return lo < hi ? ElementRange{lo - base, hi - lo} : ElementRange{};
}

void for_each_held_run(const ParameterSet& params, const std::vector<int>& ids, int64_t base,
                       int64_t n, const std::function<void(ElementRange)>& f) {
  ElementRange run;
  for (int i : ids) {
    const ElementRange r = held_range(params.list()[static_cast<size_t>(i)], base, n);
    if (r.count == 0) continue;
    if (run.count > 0 && run.offset + run.count == r.offset) {
      run.count += r.count;
      continue;
    }
    if (run.count > 0) f(run);
    run = r;
  }
  if (run.count > 0) f(run);
}

StateShare whole_layout_share(const Optimizer& optimizer, const ParameterSet& part,
                              const ParameterSet& whole, ElementRange run,
                              const StateLayout& layout) {
  std::vector<HeldPiece> held;
  const int64_t begin = run.offset, end = run.offset + run.count;
  for (const ParamInfo& p : part.list()) {
    const int64_t lo = std::max(begin, p.offset), hi = std::min(end, p.offset + p.shape.numel());
    if (lo < hi)
      held.push_back({&p, static_cast<size_t>(whole.index(p.name)), lo - p.offset, hi - lo});
  }
  return checkpoint_state_share(optimizer, held, layout);
}

void place_part(const Optimizer& optimizer, const ParameterSet& part, const ParameterSet& whole,
                int holder, size_t tensor, std::vector<std::vector<Placed>>& placed) {
  const StateLayout held = state_layout(optimizer, part);
  for (size_t j = 0; j < part.list().size(); ++j) {
    const ParamInfo& p = part.list()[j];
    Placed& where = placed[static_cast<size_t>(whole.index(p.name))][tensor];
    if (where.holder >= 0) continue;
    where = {holder, p, {}};
    for (const std::vector<int64_t>& at : held.at) where.state_at.push_back(at[j]);
  }
}

}  // namespace brisk
