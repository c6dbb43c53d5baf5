// 4-bit dequantization (QLoRA's frozen base, core/quant4.h): dequantize_4bit of a tensor the
// host codec quantized (NF4 and FP4, blocks of 64 and 128, a partial last block, nested absmaxes)
// into float32, bf16 and f16, and written transposed (a Conv1D's weight quantized as nn.Linear's,
// [out, in]). The host codec equals bitsandbytes bit for bit (test_quant4.cpp),
// so every backend must give its bits exactly: the reference is the host's dequantization,
// rounded to nearest even for the 16-bit outputs (their bit patterns compared).
#include <string>

#include "backend_support.h"
#include "conformance/op_case.h"
#include "core/dtype.h"
#include "core/quant4.h"
#include "core/quantization.h"

namespace brisk::testing {
namespace {

struct Quant4Case {
  int64_t numel, blocksize;
  Quant4Type type;
  bool nested;
  DType out;
  int64_t transposed_cols = 0;
};

std::string case_name(const Quant4Case& c) {
  return std::string("dequantize_4bit_") + (c.type == Quant4Type::nf4 ? "nf4" : "fp4") + "_n" +
         std::to_string(c.numel) + "_block" + std::to_string(c.blocksize) +
         (c.nested ? "_nested" : "") + "_" + dtype_name(c.out) +
         (c.transposed_cols ? "_transposed" + std::to_string(c.transposed_cols) : "");
}

Quant4Host quantized(const Quant4Case& c, const Vec& x) {
  const std::vector<float> v(x.begin(), x.end());
  return quantize_4bit(v.data(), {c.numel, c.blocksize, c.type, c.nested}, "x");
}

OpCase quant4_case(const Quant4Case& c) {
  OpCase op;
  op.name = case_name(c);
  op.inputs = [=](std::mt19937& rng) { return Values{{"x", randn_d(c.numel, rng, 0.05)}}; };
  op.run = [=](Backend& be, const Values& in) {
    const Quant4Host q = quantized(c, in.at("x"));
    DeviceBuffers d(be);
    Backend::Quant4Tensor t;
    t.layout = q.layout;
    t.packed = d.put(q.packed, {c.numel > 0 ? q.layout.packed_bytes() : 0}, DType::u8);
    if (c.nested) {
      const std::array<float, 256> map = dynamic_quant_map(true);
      t.qabsmax = d.put(q.qabsmax, {q.layout.blocks()}, DType::u8);
      t.absmax2 = d.put(q.absmax2, {q.layout.nested_blocks()});
      t.code2 = d.put(std::vector<float>(map.begin(), map.end()), {256});
      t.offset = q.offset;
    } else {
      t.absmax = d.put(q.absmax, {q.layout.blocks()});
    }
    t.transposed_cols = c.transposed_cols;
    const Tensor out = d.alloc({c.numel}, c.out);
    be.dequantize_4bit(t, out);
    return Values{{"out", d.values(out)}};
  };
  op.reference = [=](const Values& in) {
    const Quant4Host q = quantized(c, in.at("x"));
    std::vector<float> f(static_cast<size_t>(c.numel));
    dequantize_4bit(q, f.data());
    Vec want(f.size());
    const int64_t cols = c.transposed_cols, rows = cols ? c.numel / cols : 0;
    for (int64_t i = 0; i < c.numel; ++i) {
      const float v = f[static_cast<size_t>(i)];
      want[static_cast<size_t>(cols ? (i % cols) * rows + i / cols : i)] = c.out == DType::f32 ? v
                                                                           : c.out == DType::bf16
                                                                               ? float_to_bf16(v)
                                                                               : float_to_fp16(v);
    }
    return Values{{"out", want}};
  };
  op.checks = {{"out", Metric::exact}};
  return op;
}

}  // namespace

std::vector<OpCase> quant4_cases() {
  std::vector<OpCase> cases;
  for (const DType out : {DType::f32, DType::bf16, DType::f16}) {
    cases.push_back(quant4_case({4096, 64, Quant4Type::nf4, false, out}));
    cases.push_back(quant4_case({64 * 300 + 22, 64, Quant4Type::nf4, true, out}));
    cases.push_back(quant4_case({1000, 128, Quant4Type::fp4, false, out}));
  }
  cases.push_back(quant4_case({64 * 257 + 1, 64, Quant4Type::fp4, true, DType::f32}));
  // A [90, 30] weight (GPT-2's c_attn, [out, in]) into its [30, 90] place; rows across blocks.
  cases.push_back(quant4_case({90 * 30, 64, Quant4Type::nf4, false, DType::f32, 30}));
  cases.push_back(quant4_case({37 * 300, 64, Quant4Type::fp4, true, DType::bf16, 300}));
  return cases;
}

}  // namespace brisk::testing
