// The merge loop BPE models share: adjacent symbols joined lowest merge rank first.
#pragma once

#include <functional>
#include <queue>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace brisk {

// Merge ranks are keyed "a\x01b" (no side empty); `parts` is merged in place until no adjacent
// pair has a rank: the lowest-ranked pair first, each of its occurrences left to right, as the
// slow tokenizers do. A heap of (rank, left part) over a linked list of the parts makes a word of
// n symbols cost n log n. Pairs a round makes that rank below it wait for the next round, as they
// would have in the rescan this replaces.
inline void merge_pieces(std::vector<std::string>& parts,
                         const std::unordered_map<std::string, int>& ranks) {
  const size_t n = parts.size(), none = n;
  if (n < 2) return;
  std::vector<size_t> prev(n), next(n);
  for (size_t i = 0; i < n; ++i) {
    prev[i] = i == 0 ? none : i - 1;
    next[i] = i + 1;  // n: none
  }
  std::vector<bool> alive(n, true);
  std::string key;
  auto rank_of = [&](size_t left) {  // of the pair starting at `left`; -1: none
    if (left == none || next[left] == none) return -1;
    key.assign(parts[left]).append(1, '\x01').append(parts[next[left]]);
    const auto it = ranks.find(key);
    return it == ranks.end() ? -1 : it->second;
  };
  using Entry = std::pair<int, size_t>;  // (rank, left part)
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap;
  std::vector<Entry> waiting;  // made in this round, ranked below it
  for (size_t i = 0; i + 1 < n; ++i)
    if (const int r = rank_of(i); r >= 0) heap.emplace(r, i);
  int round = -1;
  while (true) {
    if (heap.empty() || heap.top().first != round) {
      for (const Entry& e : waiting) heap.push(e);
      waiting.clear();
      if (heap.empty()) break;
      round = heap.top().first;
    }
    const size_t left = heap.top().second;
    heap.pop();
    if (!alive[left] || rank_of(left) != round) continue;  // merged away or changed since
    const size_t right = next[left];
    parts[left] += parts[right];
    parts[right].clear();
    alive[right] = false;
    next[left] = next[right];
    if (next[left] != none) prev[next[left]] = left;
    for (const size_t at : {prev[left], left}) {
      const int r = rank_of(at);
      if (r >= 0 && r < round) waiting.emplace_back(r, at);
      if (r >= round) heap.emplace(r, at);
    }
  }
  size_t kept = 0;
  for (size_t i = 0; i < n; ++i)
    if (alive[i] && kept++ != i) parts[kept - 1] = std::move(parts[i]);
  parts.resize(kept);
}

}  // namespace brisk
