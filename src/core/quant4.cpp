// 4-bit quantization on the host: whole tensors quantized and dequantized as bitsandbytes does.
#include "core/quant4.h"

#include <algorithm>
#include <array>
#include <cmath>

#include "core/error.h"
#include "core/quantization.h"

namespace brisk {

namespace {

// The absmaxes less their mean, 8-bit in blocks of 256 with the signed dynamic map (bitsandbytes'
// quantize_blockwise): each block's largest magnitude, each value's nearest code.
void nest_absmax(Quant4Host& q) {
  const std::vector<float>& a = q.absmax;
  const auto n = static_cast<int64_t>(a.size());
  double sum = 0;
  for (float v : a) sum += v;
  q.offset = static_cast<float>(sum / static_cast<double>(std::max<int64_t>(n, 1)));
  static const std::array<float, 256> map = dynamic_quant_map(true);
  const int64_t B = Quant4Layout::kNestedBlock;
  q.qabsmax.resize(static_cast<size_t>(n));
  q.absmax2.resize(static_cast<size_t>((n + B - 1) / B));
  for (int64_t b = 0; b * B < n; ++b) {
    const int64_t end = std::min(n, (b + 1) * B);
    float most = 0;
    for (int64_t i = b * B; i < end; ++i)
      most = std::max(most, std::abs(a[static_cast<size_t>(i)] - q.offset));
    q.absmax2[static_cast<size_t>(b)] = most;
    const float scale = 1.0f / std::max(most, 1e-38f);
    for (int64_t i = b * B; i < end; ++i) {
      const float v = std::clamp((a[static_cast<size_t>(i)] - q.offset) * scale, -1.0f, 1.0f);
      q.qabsmax[static_cast<size_t>(i)] = quantize_nearest(map.data(), v);
    }
  }
  q.absmax.clear();
}

}  // namespace

Quant4Host quantize_4bit(const float* x, const Quant4Layout& layout, const char* what) {
  BRISK_CHECK(layout.blocksize > 0 && layout.numel >= 0, "internal error: a 4-bit layout of ",
              layout.numel, " values in blocks of ", layout.blocksize);
  Quant4Host q;
  q.layout = layout;
  q.packed.assign(static_cast<size_t>(layout.packed_bytes()), 0);
  q.absmax.resize(static_cast<size_t>(layout.blocks()));
  const int64_t n = layout.numel, B = layout.blocksize;
  for (int64_t b = 0; b < layout.blocks(); ++b) {
    const int64_t begin = b * B, end = std::min(n, begin + B);
    float most = 0;
    for (int64_t i = begin; i < end; ++i) {
      BRISK_CHECK(std::isfinite(x[i]), what, " holds a non-finite value (", x[i], ") at element ",
                  i, ": it cannot be quantized");
      most = std::max(most, std::abs(x[i]));
    }
    // As bitsandbytes: whole blocks scale by the absmax's reciprocal, the last partial block
    // divides by it (its absmax kept at least 1e-38).
    const bool whole = end - begin == B;
    const float kept = std::max(most, 1e-38f), reciprocal = 1.0f / kept;
    q.absmax[static_cast<size_t>(b)] = whole ? most : kept;
    for (int64_t i = begin; i < end; ++i) {
      const float v = std::clamp(whole ? x[i] * reciprocal : x[i] / kept, -1.0f, 1.0f);
      const uint8_t c = quant4_code(layout.type, v);
      q.packed[static_cast<size_t>(i / 2)] |= static_cast<uint8_t>(i % 2 ? c : c << 4);
    }
  }
  if (layout.nested) nest_absmax(q);
  return q;
}

float quant4_absmax(const Quant4Host& q, int64_t b) {
  if (!q.layout.nested) return q.absmax[static_cast<size_t>(b)];
  static const std::array<float, 256> map = dynamic_quant_map(true);
  const float scale = q.absmax2[static_cast<size_t>(b / Quant4Layout::kNestedBlock)];
  return map[q.qabsmax[static_cast<size_t>(b)]] * scale + q.offset;
}

void dequantize_4bit(const Quant4Host& q, float* out) {
  const int64_t B = q.layout.blocksize;
  for (int64_t b = 0; b < q.layout.blocks(); ++b) {
    const float absmax = quant4_absmax(q, b);
    for (int64_t i = b * B; i < std::min(q.layout.numel, (b + 1) * B); ++i) {
      const uint8_t byte = q.packed[static_cast<size_t>(i / 2)];
      out[i] = quant4_value(q.layout.type, i % 2 ? byte & 15 : byte >> 4) * absmax;
    }
  }
}

}  // namespace brisk
