// Casts between float32 and the 16-bit types (bf16, fp16), round_to (float32 values rounded to a
// 16-bit type's grid), into another buffer and in place, and stochastic rounding (below); and the
// float32-to-float32 cast and round_to, which copy. Bit-exact against independent references: fp16
// through the compiler's _Float16 conversions; bf16 by picking the nearer of the two neighbouring
// bf16 values in double, ties to the even one, beyond the largest finite value as if the exponent
// went on (so the tie with 2^128 rounds to inf), as IEEE 754 rounds. Every NaN is only required to
// stay a NaN (a GPU writes the canonical NaN, the CPU keeps payloads): the runs write NaN patterns
// as one marker.
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "backend_support.h"
#include "conformance/op_case.h"
#include "core/dtype.h"
#include "core/rng.h"

namespace brisk::testing {
namespace {

constexpr double kNanPattern = -1;  // a NaN's 16-bit pattern, whatever its payload

// Float32 inputs for the 16-bit conversions: special values, the formats' range limits and
// subnormals, round-to-nearest-even ties for both formats, and random bit patterns (every
// exponent, float32 subnormals and NaNs included).
FVec cast_inputs(std::mt19937& rng) {
  const float inf = std::numeric_limits<float>::infinity();
  const float big = std::numeric_limits<float>::max();
  FVec v = {0.f, -0.f, 1.f, -1.f, inf, -inf, std::nanf(""), -std::nanf("")};
  // NaNs with payloads: signaling, quiet.
  v.insert(v.end(), {bits_float(0x7f800001u), bits_float(0x7fc12345u)});
  // float32's smallest normal and subnormal; its largest, which rounds to inf in bf16; bf16's
  // largest.
  v.insert(v.end(), {std::numeric_limits<float>::min(), std::numeric_limits<float>::denorm_min(),
                     big, -big, 3.3895313892515355e38f});
  // fp16's largest, a value that rounds down to it, the tie above it (rounds to inf).
  v.insert(v.end(), {65504.f, 65519.f, 65520.f, -65520.f});
  // fp16's smallest normal and subnormal, ties at its bottom (to 0, to 2^-23), and below it.
  v.insert(v.end(), {6.103515625e-05f, 5.9604644775390625e-08f, 2.98023223876953125e-08f,
                     8.940696716308594e-08f, 1e-9f});
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 20000; ++i) v.push_back(bits_float(bits(rng)));
  std::uniform_int_distribution<int> exponent(-14, 15);
  for (int i = 0; i < 4000; ++i) {
    const float sign = i % 2 ? 1.f : -1.f;
    // bf16 ties: the 16 dropped bits are exactly half an ulp (both parities of the kept bits).
    v.push_back(bits_float((bits(rng) & 0xffff0000u) | 0x8000u));
    // fp16 ties: half an fp16 ulp above a value on fp16's grid, in its normal range (exponent e,
    // ulp 2^(e-10)) and its subnormal range (ulp 2^-24). Exact in float32 (12 bits).
    const int e = exponent(rng);
    const float m = static_cast<float>(bits(rng) % 1024);
    v.push_back(sign * (std::ldexp(1.f + m / 1024.f, e) + std::ldexp(1.f, e - 11)));
    v.push_back(sign * (std::ldexp(m, -24) + std::ldexp(1.f, -25)));
  }
  return v;
}

bool is_nan16(uint16_t h, DType t) {
  return t == DType::bf16 ? (h & 0x7fffu) > 0x7f80u : (h & 0x7fffu) > 0x7c00u;
}

uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// float32 -> bf16 by distances (see the top).
double ref_bf16(float f) {
  if (std::isnan(f)) return kNanPattern;
  const uint32_t u = float_bits(f), lo = u & 0xffff0000u;  // toward zero
  if (lo == u) return lo >> 16;
  const uint32_t hi = lo + 0x10000u;  // away from zero: the next bf16, or inf
  const double a = std::abs(double(f)), below = std::abs(double(bits_float(lo)));
  const double above =
      (hi & 0x7fffffffu) == 0x7f800000u ? std::ldexp(1.0, 128) : std::abs(double(bits_float(hi)));
  if (a - below != above - a) return (a - below < above - a ? lo : hi) >> 16;
  return ((lo >> 16) & 1) == 0 ? lo >> 16 : hi >> 16;  // a tie: the even one
}

double ref_f16(float f) {
  if (std::isnan(f)) return kNanPattern;
  const _Float16 h = static_cast<_Float16>(f);
  uint16_t b;
  std::memcpy(&b, &h, 2);
  return b;
}

// A 16-bit pattern's float32 value.
double widen16(uint16_t h, DType t) {
  if (t == DType::bf16) return bits_float(static_cast<uint32_t>(h) << 16);
  _Float16 v;
  std::memcpy(&v, &h, 2);
  return static_cast<float>(v);
}

OpCase cast_case(DType t) {
  OpCase c;
  c.name = std::string("cast_") + dtype_name(t);
  c.inputs = [](std::mt19937& rng) {
    const FVec x = cast_inputs(rng);
    Vec patterns(65536);
    for (size_t i = 0; i < patterns.size(); ++i) patterns[i] = static_cast<double>(i);
    return Values{{"x", Vec(x.begin(), x.end())}, {"patterns", patterns}};
  };
  c.run = [=](Backend& be, const Values& in) {
    const Vec& xv = in.at("x");
    const auto n = static_cast<int64_t>(xv.size());
    DeviceBuffers d(be);
    const Tensor x = d.put_as(xv, {n}), narrow = d.alloc({n}, t);
    be.cast(x, narrow);
    const std::vector<uint16_t> all16(in.at("patterns").begin(), in.at("patterns").end());
    const Tensor patterns = d.put(all16, {65536}, t), wide = d.alloc({65536});
    be.cast(patterns, wide);
    const Tensor r = d.alloc({n}), r_in_place = d.put_as(xv, {n});
    be.round_to(t, x, r);
    be.round_to(t, r_in_place);
    const Tensor copy = d.alloc({n}), r32 = d.alloc({n});
    be.cast(x, copy);
    be.round_to(DType::f32, x, r32);
    Vec bits;
    for (uint16_t h : d.get<uint16_t>(narrow)) bits.push_back(is_nan16(h, t) ? kNanPattern : h);
    return Values{{"cast_from_f32", bits},
                  {"cast_to_f32", d.values(wide)},
                  {"round_to", d.values(r)},
                  {"round_to_in_place", d.values(r_in_place)},
                  {"cast_f32_to_f32", d.values(copy)},
                  {"round_to_f32", d.values(r32)}};
  };
  c.reference = [=](const Values& in) {
    Vec narrow, rounded, wide;
    for (double x : in.at("x")) {
      const double h = t == DType::bf16 ? ref_bf16(static_cast<float>(x)) : ref_f16(float(x));
      narrow.push_back(h);
      rounded.push_back(h == kNanPattern ? NAN : widen16(static_cast<uint16_t>(h), t));
    }
    for (double p : in.at("patterns")) wide.push_back(widen16(static_cast<uint16_t>(p), t));
    return Values{{"cast_from_f32", narrow},       {"cast_to_f32", wide},
                  {"round_to", rounded},           {"round_to_in_place", rounded},
                  {"cast_f32_to_f32", in.at("x")}, {"round_to_f32", in.at("x")}};
  };
  for (const char* out : {"cast_from_f32", "cast_to_f32", "round_to", "round_to_in_place",
                          "cast_f32_to_f32", "round_to_f32"})
    c.checks.push_back({out, Metric::exact});
  return c;
}

// stochastic_round to bf16 in place (bf16 weights without a master copy), over a view `offset`
// floats into its buffer: offset 1 breaks the 16-byte alignment of a GPU's vectorized path
// (element ids are the view's indices). More than one pass of a GPU's grid-stride loop (4096
// blocks x 256 threads x 4 elements), not a multiple of 4, and values of every kind: exact bf16
// values, zeros, subnormals, the largest floats (which may round up to inf), inf and NaN. The
// same random words on every backend and integer arithmetic: bit-exact against the CPU, whose
// rounding test_optim.cpp checks for bias and reproducibility (no fp64 reference: the rounding
// is the generator's).
OpCase stochastic_round_case(const RngKey& key, int64_t offset) {
  const int64_t n = 4 * 4096 * 256 + 13;
  OpCase c;
  c.name =
      "stochastic_round_bf16_step" + std::to_string(key.step) + "_offset" + std::to_string(offset);
  c.inputs = [=](std::mt19937& rng) {
    FVec x = randn(n, rng);
    for (int64_t i = 0; i < n; i += 97) x[i] *= 1e-39f;  // subnormal
    for (int64_t i = 5; i < n; i += 101)                 // exact bf16: the low 16 bits cleared
      x[i] = bits_float(float_bits(x[i]) & 0xffff0000u);
    x[1] = 0.f;
    x[2] = -0.f;
    x[3] = std::numeric_limits<float>::max();
    x[4] = -std::numeric_limits<float>::max();
    x[6] = std::numeric_limits<float>::infinity();
    x[7] = -std::numeric_limits<float>::infinity();
    x[8] = std::nanf("");
    return Values{{"x", Vec(x.begin(), x.end())}};
  };
  c.run = [=](Backend& be, const Values& in) {
    DeviceBuffers d(be);
    const Tensor t = d.put_as(in.at("x"), {n});
    be.stochastic_round(DType::bf16,
                        Tensor(t.f32() + offset, Shape{n - offset}, DType::f32, t.device()), key);
    return Values{{"rounded", d.values(t)}};
  };
  c.checks = {{"rounded", Metric::exact}};
  return c;
}

}  // namespace

std::vector<OpCase> cast_cases() {
  std::vector<OpCase> cases = {cast_case(DType::bf16), cast_case(DType::f16)};
  // Three steps' keys, one beyond 32 bits.
  for (const RngKey& key :
       {RngKey{17, 1, 0}, RngKey{17, 2, 0}, RngKey{0x1234'5678'9abcULL, (1ULL << 32) + 7, 5}})
    for (int64_t offset : {0, 1}) cases.push_back(stochastic_round_case(key, offset));
  return cases;
}

}  // namespace brisk::testing
