// Rotary position embedding tables (RoPE) as transformers computes them on the host: the inverse
// frequencies of a rope_type ("default", "linear", "llama3") and the cos/sin tables that the
// backend's rotary_forward/rotary_backward read, [positions, head_dim / 2] float32.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace brisk {

// config.json's rope_scaling (transformers 4) or rope_parameters (transformers 5).
struct RopeScaling {
  enum class Type { none, linear, llama3 };  // none is rope_type "default"
  Type type = Type::none;
  double factor = 1.0;  // linear and llama3: how much longer the context is made
  // llama3: wavelengths above original_max_position_embeddings / low_freq_factor are divided by
  // factor, those below original_max_position_embeddings / high_freq_factor kept, those between
  // interpolated.
  double low_freq_factor = 1.0, high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};

// The type named by transformers' rope_type (or its older "type" key): "default", "linear",
// "llama3"; throws brisk::Error naming the unsupported ones ("dynamic", "yarn", "longrope", ...).
RopeScaling::Type rope_type_from_name(const std::string& name);

struct RopeTables {
  int64_t positions = 0, half = 0;  // half = head_dim / 2
  std::vector<float> inv_freq;      // [half]
  std::vector<float> cos, sin;      // [positions, half]; the second half of a head repeats them
};

// inv_freq[i] = 1 / rope_theta^(2i / head_dim), scaled as the type says. Evaluated in float32 in
// transformers' order of operations (its rope init functions work on float32 tensors), so the
// values agree with transformers' up to the last bit of its pow.
std::vector<float> rope_inv_freq(int64_t head_dim, double rope_theta, const RopeScaling& scaling);

// Tables for positions 0..max_positions-1: angle = float32(position * inv_freq[i]) rounded as
// transformers rounds it (the angle, not only its cosine, is float32 there, which is what decides
// far positions), cos and sin of it rounded to float32. Throws unless head_dim is even and
// positive, rope_theta and factor positive and, for llama3, high_freq_factor > low_freq_factor > 0
// and original_max_position_embeddings positive (transformers only warns where factor < 1). Size
// the tables by the longest sequence a run uses, not by max_position_embeddings.
RopeTables rope_tables(int64_t head_dim, double rope_theta, int64_t max_positions,
                       const RopeScaling& scaling = {});

}  // namespace brisk
