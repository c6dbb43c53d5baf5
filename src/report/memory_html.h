// The memory anatomy as a picture: one self-contained HTML file with inline SVG (no scripts, no
// external files), stacked bars of the planned bytes by category, the fixed overhead outside the
// plan, and, after a run, the measured peaks beside each bar.
#pragma once

#include <array>
#include <string>
#include <utility>
#include <vector>

#include "core/memory_plan.h"

namespace brisk {

struct MemoryBar {
  std::string label;  // e.g. "batch 8 x 1\nbf16": a newline starts a second line under the bar
  std::array<size_t, kNumCategories> planned{};  // bytes by category
  size_t overlaid = 0;  // of the gradients', bytes over consumed activations (drawn once)
  size_t fixed = 0;     // outside the plan (libraries, context)
  std::string fixed_label = "outside the plan";          // what `fixed` is
  std::vector<std::pair<std::string, size_t>> measured;  // e.g. {"process peak", bytes}
};

// The page: a title, a line of context, and the bars side by side on one scale.
std::string memory_html(const std::string& title, const std::string& subtitle,
                        const std::vector<MemoryBar>& bars);

// Writes memory_html(...) to `path` (through a temporary file and a rename).
void write_memory_html(const std::string& path, const std::string& title,
                       const std::string& subtitle, const std::vector<MemoryBar>& bars);

}  // namespace brisk
