// The dynamic quantization map.
#include "core/quantization.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace brisk {

namespace {
// torch.linspace(0.1, 1, n)'s value i in float32, as torch computes it: the step in float32, the
// first half counted up from the start, the second down from the end, each in one fused
// multiply-add.
float linspace_at(int n, int i) {
  const float start = 0.1f, end = 1.0f;
  const float step = (end - start) / static_cast<float>(n - 1);
  return i < n / 2 ? std::fma(step, static_cast<float>(i), start)
                   : std::fma(-step, static_cast<float>(n - 1 - i), end);
}
}  // namespace

std::array<float, 256> dynamic_quant_map(bool is_signed) {
  // bitsandbytes' create_dynamic_map: float32 arithmetic throughout (the boundaries, their
  // midpoints, the midpoints times the decade's power of ten rounded to float32).
  std::vector<float> values;
  constexpr int kDecades = 7;  // 10^-6 .. 10^0
  for (int i = 0; i < kDecades; ++i) {
    const int parts = is_signed ? (1 << i) : (1 << (i + 1));
    const auto scale = static_cast<float>(std::pow(10.0, i - (kDecades - 1)));
    for (int k = 0; k < parts; ++k) {
      const float mid = (linspace_at(parts + 1, k) + linspace_at(parts + 1, k + 1)) / 2.0f;
      values.push_back(scale * mid);
      if (is_signed) values.push_back(-scale * mid);
    }
  }
  values.push_back(0.0f);
  values.push_back(1.0f);
  std::sort(values.begin(), values.end());
  std::array<float, 256> map{};
  std::copy_n(values.begin(), map.size(), map.begin());
  return map;
}

}  // namespace brisk
