// RoPE inverse frequencies and cos/sin tables, in transformers' float32 arithmetic (see rope.h).
#include "backend/rope.h"

#include <cmath>
#include <numbers>

#include "core/error.h"

namespace brisk {

RopeScaling::Type rope_type_from_name(const std::string& name) {
  if (name == "default") return RopeScaling::Type::none;
  if (name == "linear") return RopeScaling::Type::linear;
  if (name == "llama3") return RopeScaling::Type::llama3;
  BRISK_FAIL("rope_type \"", name,
             "\" is not supported (brisk knows \"default\", \"linear\" and \"llama3\")");
}

std::vector<float> rope_inv_freq(int64_t head_dim, double rope_theta, const RopeScaling& scaling) {
  BRISK_CHECK(head_dim > 0 && head_dim % 2 == 0, "rotary embeddings: head_dim ", head_dim,
              " is not a positive even number");
  BRISK_CHECK(std::isfinite(rope_theta) && rope_theta > 0, "rotary embeddings: rope_theta ",
              rope_theta, " is not a positive number");
  const int64_t half = head_dim / 2;
  std::vector<float> inv(static_cast<size_t>(half));
  // transformers: 1.0 / (base ** (arange(0, dim, 2).float() / dim)), every step a float32 tensor
  // operation (the exponent divided in float32, pow of the float32 base, the reciprocal in
  // float32). pow is the one operation not correctly rounded there; double pow rounded once is
  // within its last bit.
  const float base = static_cast<float>(rope_theta);
  for (int64_t i = 0; i < half; ++i) {
    const float e = static_cast<float>(2 * i) / static_cast<float>(head_dim);
    const float p = static_cast<float>(std::pow(static_cast<double>(base), static_cast<double>(e)));
    inv[static_cast<size_t>(i)] = 1.0f / p;
  }
  if (scaling.type == RopeScaling::Type::none) return inv;

  BRISK_CHECK(std::isfinite(scaling.factor) && scaling.factor > 0,
              "rotary embeddings: the scaling factor ", scaling.factor,
              " is not a positive number");
  const float factor = static_cast<float>(scaling.factor);
  if (scaling.type == RopeScaling::Type::linear) {
    for (float& f : inv) f /= factor;
    return inv;
  }

  // llama3 (Llama 3.1's long-context scaling), with transformers' float32 tensors: a Python
  // scalar over a tensor is the tensor's reciprocal times the scalar (Tensor.__rtruediv__), and
  // every Python scalar enters a float32 operation as a float.
  const double low = scaling.low_freq_factor, high = scaling.high_freq_factor;
  const int64_t old_len = scaling.original_max_position_embeddings;
  BRISK_CHECK(low > 0 && high > low && std::isfinite(high),
              "rotary embeddings (llama3): need high_freq_factor > low_freq_factor > 0, got ", high,
              " and ", low);
  BRISK_CHECK(old_len > 0, "rotary embeddings (llama3): original_max_position_embeddings ", old_len,
              " is not positive");
  const float low_wavelen = static_cast<float>(static_cast<double>(old_len) / low);
  const float high_wavelen = static_cast<float>(static_cast<double>(old_len) / high);
  const float two_pi = static_cast<float>(2 * std::numbers::pi);
  const float old_len_f = static_cast<float>(old_len);
  const float low_f = static_cast<float>(low);
  const float span = static_cast<float>(high - low);
  for (float& f : inv) {
    const float wavelen = (1.0f / f) * two_pi;
    if (wavelen > low_wavelen) {
      f = f / factor;  // long wavelengths: interpolated as linear scaling would
    } else if (!(wavelen < high_wavelen)) {
      // In between: blend the scaled and unscaled frequency (f is still unscaled here).
      const float smooth = ((1.0f / wavelen) * old_len_f - low_f) / span;
      f = (1.0f - smooth) * f / factor + smooth * f;
    }
  }
  return inv;
}

RopeTables rope_tables(int64_t head_dim, double rope_theta, int64_t max_positions,
                       const RopeScaling& scaling) {
  BRISK_CHECK(max_positions >= 0, "rotary embeddings: ", max_positions, " positions");
  RopeTables t;
  t.inv_freq = rope_inv_freq(head_dim, rope_theta, scaling);
  t.positions = max_positions;
  t.half = head_dim / 2;
  const size_t n = static_cast<size_t>(max_positions * t.half);
  t.cos.resize(n);
  t.sin.resize(n);
  for (int64_t p = 0; p < max_positions; ++p)
    for (int64_t i = 0; i < t.half; ++i) {
      // The angle is a float32 product, as transformers' position_ids.float() * inv_freq; its
      // cosine and sine are then rounded once from double.
      const float angle = static_cast<float>(p) * t.inv_freq[static_cast<size_t>(i)];
      const size_t at = static_cast<size_t>(p * t.half + i);
      t.cos[at] = static_cast<float>(std::cos(static_cast<double>(angle)));
      t.sin[at] = static_cast<float>(std::sin(static_cast<double>(angle)));
    }
  return t;
}

}  // namespace brisk
