// The dynamic quantization map.
#include "core/quantization.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace brisk {

std::array<float, 256> dynamic_quant_map(bool is_signed) {
  std::vector<double> values;
  constexpr int kDecades = 7;  // 10^-6 .. 10^0
  for (int i = 0; i < kDecades; ++i) {
    const int parts = is_signed ? (1 << i) : (1 << (i + 1));
    const double scale = std::pow(10.0, i - (kDecades - 1));
    for (int k = 0; k < parts; ++k) {
      // Midpoint of the k-th of `parts` even steps from 0.1 to 1.
      const double lo = 0.1 + 0.9 * k / parts, hi = 0.1 + 0.9 * (k + 1) / parts;
      const double v = scale * (lo + hi) / 2;
      values.push_back(v);
      if (is_signed) values.push_back(-v);
    }
  }
  values.push_back(0.0);
  values.push_back(1.0);
  std::sort(values.begin(), values.end());
  std::array<float, 256> map{};
  for (size_t i = 0; i < map.size(); ++i) map[i] = static_cast<float>(values.at(i));
  return map;
}

}  // namespace brisk
