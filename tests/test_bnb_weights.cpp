// Models saved 4-bit by bitsandbytes (transformers' save_pretrained of a model loaded with a
// BitsAndBytesConfig; tests/fixtures/qlora/llama_nf4 and gpt2_fp4, written by
// scripts/make_qlora_fixtures.py): each 4-bit weight loads as bitsandbytes dequantizes it, bit for
// bit (NF4 with nested absmaxes in float32; FP4 in bf16, GPT-2's Conv1D weights turned back to
// [in, out]), the model's loss and logits are those of the dequantized model, and a state brisk
// cannot read is refused by name.
#include <gtest/gtest.h>

#include <filesystem>

#include "cli_support.h"
#include "core/weight_files.h"
#include "models/config.h"
#include "models/model.h"
#include "test_support.h"

namespace brisk::testing {
namespace {

void loads_as_bitsandbytes_dequantizes(const std::string& name) {
  SCOPED_TRACE(name);
  const std::string folder = fixture("qlora/" + name);
  std::unique_ptr<Model> model = Model::create(resolve_config(folder));
  MemoryPlan plan;
  PlanOptions o;
  o.weights_only = true;
  model->plan(plan, {1, 8}, o);
  plan.finalize();
  Arena arena(plan, Device::cpu);
  model->bind(arena);
  auto be = make_cpu_backend();
  const WeightFiles file(folder + "/model.safetensors");
  model->load_weights(*be, file);
  const SafetensorsFile want(folder + "/expected.safetensors");
  int quantized = 0;
  for (const std::string& n : want.names()) {
    if (n == "loss" || n == "logits") continue;
    ASSERT_NE(file.bnb_4bit(n), nullptr) << n;
    ++quantized;
    const Tensor& got = model->params().weight(model->params().index(n));
    ASSERT_EQ(got.shape(), want.get(n).shape()) << n;
    // Equal values (FP4's code 8, -0, may come out either zero).
    int64_t differ = 0;
    for (int64_t k = 0; k < got.numel(); ++k) differ += got.f32()[k] != want.get(n).f32()[k];
    EXPECT_EQ(differ, 0) << n;
  }
  EXPECT_EQ(quantized, model->config().num_layers * (name == "llama_nf4" ? 7 : 4));
}

TEST(BnbWeights, ASavedFourBitModelLoadsAsBitsandbytesDequantizesIt) {
  loads_as_bitsandbytes_dequantizes("llama_nf4");
  loads_as_bitsandbytes_dequantizes("gpt2_fp4");
}

TEST(BnbWeights, ASavedFourBitModelComputesTheDequantizedModelsLoss) {
  for (const auto& [name, base] :
       {std::pair{"llama_nf4", "llama_tiny"}, {"gpt2_fp4", "gpt2_tiny"}}) {
    SCOPED_TRACE(name);
    TempDir out("bnb_fb");
    const std::string folder = fixture(std::string("qlora/") + name);
    const CliRun r = run_brisk("forward-backward --config " + folder + " --weights " + folder +
                               "/model.safetensors --batch " + fixture(base) +
                               "/batch.safetensors --output " + (out / "fb.safetensors"));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const SafetensorsFile got(out / "fb.safetensors");
    const SafetensorsFile want(folder + "/expected.safetensors");
    EXPECT_NEAR(got.get("loss").f32()[0], want.get("loss").f32()[0], 1e-5);
    const Tensor& logits = want.get("logits");
    EXPECT_LE(rel_error(got.get("logits").f32(), logits.f32(), logits.numel()), 1e-5);
  }
}

// llama_nf4's file with one tensor replaced (`value`: JSON text for a quant_state, or float32
// values), in `dir`; returns its path.
std::string altered(const TempDir& dir, const std::string& key, const std::string& json,
                    float map_value = 0) {
  const SafetensorsFile f(fixture("qlora/llama_nf4/model.safetensors"));
  std::vector<std::pair<std::string, Tensor>> tensors;
  std::vector<uint8_t> text(json.begin(), json.end());
  std::vector<float> map;
  for (const std::string& n : f.names()) {
    Tensor t = f.get(n);
    if (n == key && !json.empty()) {
      t = Tensor(text.data(), Shape{static_cast<int64_t>(text.size())}, DType::u8);
    } else if (n == key) {
      map.assign(t.f32(), t.f32() + t.numel());
      map[3] = map_value;
      t = Tensor(map.data(), t.shape(), DType::f32);
    }
    tensors.emplace_back(n, t);
  }
  const std::string path = dir / "model.safetensors";
  write_safetensors(path, tensors);
  return path;
}

// brisk merge into a base saved 4-bit is refused: the merged weight would have no 4-bit codes.
TEST(BnbWeights, MergingIntoAFourBitBaseIsRefused) {
  TempDir out("bnb_merge");
  expect_refused("merge --model_name_or_path " + fixture("qlora/llama_nf4") +
                     " --adapter_name_or_path " + fixture("lora/merge_llama") + " --output_dir " +
                     (out / "m"),
                 "' is saved 4-bit; merge into the full-precision base");
}

TEST(BnbWeights, AStateBriskCannotReadIsRefusedByName) {
  TempDir dir("bnb_bad");
  const std::string w = "model.layers.0.mlp.down_proj.weight";
  const std::string state = w + ".quant_state.bitsandbytes__nf4";
  const std::string shape = R"("shape": [30, 37], "dtype": "float32")";
  const std::string nested = R"(, "nested_blocksize": 256, "nested_offset": 0.5)";
  auto refused = [&](const std::string& path, const std::string& needle) {
    expect_error([&] { WeightFiles{path}; }, needle);
  };
  refused(altered(dir, state, R"({"quant_type": "fp4", "blocksize": 64, )" + shape + nested + "}"),
          "quant_type \"fp4\" where its name says nf4");
  refused(altered(dir, state, R"({"quant_type": "nf4", "blocksize": 48, )" + shape + nested + "}"),
          "blocksize 48 is not a power of two");
  refused(altered(dir, state,
                  R"({"quant_type": "nf4", "blocksize": 64, )" + shape +
                      R"(, "nested_blocksize": 128, "nested_offset": 0.5})"),
          "nested_blocksize 128 where bitsandbytes uses 256");
  refused(altered(dir, state,
                  R"({"quant_type": "nf4", "blocksize": 64, "shape": [30, 38], )"
                  R"("dtype": "float32")" +
                      nested + "}"),
          "where uint8 of 570 values is expected");
  refused(altered(dir, state,
                  R"({"quant_type": "nf4", "blocksize": 64, "shape": [30, 37], "dtype": "int8")" +
                      nested + "}"),
          "dtype \"int8\" is not float32, bfloat16 or float16");
  refused(altered(dir, state, "not json"), "is not a JSON object");
  refused(altered(dir, w + ".quant_map", "", 0.25f),
          "value 3 is 0.25 where bitsandbytes' is -0.394917");
}

}  // namespace
}  // namespace brisk::testing
