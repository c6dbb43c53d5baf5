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
#include <memory>
#include <random>
#include <string>

#include "backend/backend.h"
#include "backend_support.h"
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

// A 4-bit weight's products on the CPU: on bf16 units dequantized straight into the blocked
// layout oneDNN's kernel reads, or (BRISK_BLOCKED_4BIT_WEIGHTS=0, as where that layout is not
// brisk's packer's) into plain bf16 rows; with the products forced onto OpenBLAS dequantized
// whole into float32 and multiplied as any weight. The same values but for the summation order (the
// conformance cases hold whichever this CPU takes to the fp64 reference).
TEST(Quant4, TheCpusTwoWaysOfMultiplyingA4BitWeightAgree) {
  const int64_t M = 64, K = 256, N = 192;
  std::mt19937 rng(7);
  const FVec x = rounded(randn(M * K, rng), DType::bf16),
             dy = rounded(randn(M * N, rng), DType::bf16);
  const FVec w = randn(N * K, rng, 0.05f);
  const std::array<int64_t, 2> rows{128, 64};
  std::vector<Quant4Host> parts;
  for (int64_t r = 0, at = 0; r < 2; at += rows[static_cast<size_t>(r)] * K, ++r)
    parts.push_back(quantize_4bit(
        w.data() + at, {rows[static_cast<size_t>(r)] * K, 64, Quant4Type::nf4, r == 1}, "w"));
  const std::array<float, 256> map = dynamic_quant_map(true);
  auto host = [](const auto& v, DType dtype) {
    return Tensor(const_cast<void*>(static_cast<const void*>(v.data())),
                  Shape{static_cast<int64_t>(v.size())}, dtype);
  };
  Backend::Quant4Matrix matrix;
  matrix.cols = K;
  for (const Quant4Host& q : parts) {
    Backend::Quant4Tensor t;
    t.layout = q.layout;
    t.packed = host(q.packed, DType::u8);
    t.absmax = host(q.absmax, DType::f32);
    t.qabsmax = host(q.qabsmax, DType::u8);
    t.absmax2 = host(q.absmax2, DType::f32);
    t.code2 = host(map, DType::f32);
    t.offset = q.offset;
    matrix.parts.push_back({t, DType::f32});
  }
  auto run = [&](const std::string& products, bool blocked, FVec* y, FVec* dx) {
    Switches switches;
    switches.cpu_products = products;
    switches.blocked_4bit_weights = blocked;
    const std::unique_ptr<Backend> be = make_cpu_backend(switches);
    be->set_matmul_dtype(DType::bf16);
    DeviceBuffers d(*be);
    MatmulOperands operands(N * K);
    operands.quantized = N * K;
    operands.quantized_blocked = cpu_blocked_elements(N, K);
    d.workspace(operands);
    y->assign(static_cast<size_t>(M * N), 0.f);
    dx->assign(static_cast<size_t>(M * K), 0.f);
    be->quantized_linear_forward(Tensor(const_cast<float*>(x.data()), Shape{M, K}, DType::f32),
                                 matrix, Tensor(), Tensor(y->data(), Shape{M, N}, DType::f32));
    be->quantized_linear_backward(Tensor(const_cast<float*>(dy.data()), Shape{M, N}, DType::f32),
                                  matrix, Tensor(dx->data(), Shape{M, K}, DType::f32), false);
  };
  FVec y_units, dx_units, y_plain, dx_plain, y_blas, dx_blas;
  run("", true, &y_units, &dx_units);
  run("", false, &y_plain, &dx_plain);
  run("openblas", true, &y_blas, &dx_blas);
  EXPECT_LE(rel_error(y_units.data(), y_blas.data(), M * N), 1e-5);
  EXPECT_LE(rel_error(dx_units.data(), dx_blas.data(), M * K), 1e-5);
  EXPECT_LE(rel_error(y_plain.data(), y_blas.data(), M * N), 1e-5);
  EXPECT_LE(rel_error(dx_plain.data(), dx_blas.data(), M * K), 1e-5);
  double norm = 0;
  for (const float v : y_units) norm += v * v;
  EXPECT_GT(norm, 1.0);  // not zeros on both sides
}

}  // namespace
}  // namespace brisk::testing
