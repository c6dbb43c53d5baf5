// The merge loop BPE models share: adjacent symbols joined lowest merge rank first.
#pragma once

#include <climits>
#include <string>
#include <unordered_map>
#include <vector>

namespace brisk {

// Merge ranks are keyed "a\x01b"; `parts` is merged in place until no adjacent pair has a rank.
inline void merge_pieces(std::vector<std::string>& parts,
                         const std::unordered_map<std::string, int>& ranks) {
  std::string key;
  while (parts.size() > 1) {
    int best = INT_MAX;
    size_t at = 0;
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
      key.assign(parts[i]).append(1, '\x01').append(parts[i + 1]);
      const auto it = ranks.find(key);
      if (it != ranks.end() && it->second < best) {
        best = it->second;
        at = i;
      }
    }
    if (best == INT_MAX) break;
    // Merge every occurrence of this pair, left to right.
    const std::string a = parts[at], b = parts[at + 1];
    std::vector<std::string> merged;
    for (size_t i = 0; i < parts.size(); ++i) {
      if (i + 1 < parts.size() && parts[i] == a && parts[i + 1] == b) {
        merged.push_back(a + b);
        ++i;
      } else {
        merged.push_back(parts[i]);
      }
    }
    parts.swap(merged);
  }
}

}  // namespace brisk
