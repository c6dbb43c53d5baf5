// 4-bit quantization (core/quant4.h) against bitsandbytes' quantize_4bit and dequantize_4bit on
// stored vectors (tests/fixtures/qlora/quant4.safetensors, scripts/make_qlora_fixtures.py): NF4
// and FP4, float32 and bf16 inputs, blocks of 64 and 128, a partial last block, nested absmaxes.
// The packed codes, the absmaxes (or their 8-bit codes, nested absmaxes and offset) and the
// dequantized float32 and bf16 values must be bit for bit bitsandbytes'.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/dtype.h"
#include "core/quant4.h"
#include "core/quantization.h"
#include "core/safetensors.h"
#include "test_support.h"

namespace brisk::testing {
namespace {

std::vector<float> as_f32(const Tensor& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  copy_to_f32(t, Tensor(v.data(), t.shape(), DType::f32), "fixture");
  return v;
}

template <typename T>
int64_t differing(const T* a, const T* b, int64_t n) {
  int64_t d = 0;
  for (int64_t i = 0; i < n; ++i) d += std::memcmp(a + i, b + i, sizeof(T)) != 0;
  return d;
}

TEST(Quant4, CodesAreBitsandbytesValues) {
  const SafetensorsFile f(fixture("qlora/quant4.safetensors"));
  for (const auto [type, name] :
       {std::pair{Quant4Type::nf4, "code.nf4"}, std::pair{Quant4Type::fp4, "code.fp4"}})
    for (int c = 0; c < 16; ++c) EXPECT_EQ(quant4_value(type, c), f.get(name).f32()[c]) << name;
  const std::array<float, 256> map = dynamic_quant_map(true);
  for (int c = 0; c < 256; ++c) EXPECT_EQ(map[c], f.get("code.dynamic").f32()[c]) << c;
}

TEST(Quant4, QuantizesAndDequantizesAsBitsandbytes) {
  const SafetensorsFile f(fixture("qlora/quant4.safetensors"));
  int cases = 0;
  for (const std::string& key : f.names()) {
    if (!key.ends_with(".meta")) continue;
    const std::string name = key.substr(0, key.size() - 5);
    SCOPED_TRACE(name);
    const int64_t* meta = f.get(key).as<int64_t>();
    const std::vector<float> x = as_f32(f.get(name + ".input"));
    Quant4Layout layout;
    layout.numel = static_cast<int64_t>(x.size());
    layout.blocksize = meta[0];
    layout.type = meta[1] ? Quant4Type::nf4 : Quant4Type::fp4;
    layout.nested = meta[2] != 0;
    const Quant4Host q = quantize_4bit(x.data(), layout, name.c_str());
    const Tensor& packed = f.get(name + ".packed");
    ASSERT_EQ(static_cast<int64_t>(q.packed.size()), packed.numel());
    EXPECT_EQ(differing(q.packed.data(), packed.as<uint8_t>(), packed.numel()), 0);
    // Nested: the offset is the absmaxes' float32 mean, which torch sums in an order of its own
    // (vectorized, machine-dependent); brisk's is the exactly rounded mean. Given the same
    // offset, the nested codes and absmaxes are bitsandbytes'; dequantization of bitsandbytes'
    // own state is bit for bit.
    Quant4Host theirs = q;
    if (layout.nested) {
      const float offset = f.get(name + ".offset").f32()[0];
      EXPECT_LE(std::abs(q.offset - offset), 2e-7f * offset);
      const Tensor& qa = f.get(name + ".qabsmax");
      const Tensor& a2 = f.get(name + ".absmax2");
      ASSERT_EQ(static_cast<int64_t>(q.qabsmax.size()), qa.numel());
      ASSERT_EQ(static_cast<int64_t>(q.absmax2.size()), a2.numel());
      if (q.offset == offset) {
        EXPECT_EQ(differing(q.qabsmax.data(), qa.as<uint8_t>(), qa.numel()), 0);
        EXPECT_EQ(differing(q.absmax2.data(), a2.f32(), a2.numel()), 0);
      }
      theirs.offset = offset;
      theirs.qabsmax.assign(qa.as<uint8_t>(), qa.as<uint8_t>() + qa.numel());
      theirs.absmax2.assign(a2.f32(), a2.f32() + a2.numel());
    } else {
      const Tensor& a = f.get(name + ".absmax");
      ASSERT_EQ(static_cast<int64_t>(q.absmax.size()), a.numel());
      EXPECT_EQ(differing(q.absmax.data(), a.f32(), a.numel()), 0);
    }
    std::vector<float> out(x.size());
    dequantize_4bit(theirs, out.data());
    EXPECT_EQ(differing(out.data(), f.get(name + ".f32").f32(), layout.numel), 0);
    std::vector<uint16_t> bf16(x.size());
    for (size_t i = 0; i < out.size(); ++i) bf16[i] = float_to_bf16(out[i]);
    EXPECT_EQ(differing(bf16.data(), f.get(name + ".bf16").as<uint16_t>(), layout.numel), 0);
    std::vector<float> own(x.size());  // brisk's own state: within the offset's rounding
    dequantize_4bit(q, own.data());
    EXPECT_LE(rel_error(own.data(), out.data(), layout.numel), 1e-6);
    ++cases;
  }
  EXPECT_EQ(cases, 7);
}

TEST(Quant4, NonFiniteWeightsAreRefusedByName) {
  std::vector<float> x(100, 0.5f);
  x[70] = std::numeric_limits<float>::infinity();
  Quant4Layout layout;
  layout.numel = 100;
  expect_error([&] { quantize_4bit(x.data(), layout, "model.layers.0.mlp.up_proj.weight"); },
               "model.layers.0.mlp.up_proj.weight holds a non-finite value (inf) at element 70");
}

}  // namespace
}  // namespace brisk::testing
