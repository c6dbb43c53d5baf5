// brisk merge against PEFT's merge_and_unload (tests/fixtures/lora/merge_*, written by
// scripts/make_lora_fixtures.py): every tensor of the merged model equals PEFT's (the adapted
// linears within float32 rounding: brisk sums the rank's products in double; GPT-2's Conv1D
// weights transposed; rsLoRA's scale; BERT's classifier replaced by the adapter's copy), the
// others are the base's bytes; and the refusals of an adapter that does not fit the base.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <regex>
#include <tuple>

#include "adapters/merge.h"
#include "cli_support.h"
#include "core/safetensors.h"
#include "test_support.h"

namespace brisk::testing {
namespace {

void expect_merged_as_peft(const std::string& model, const std::string& adapter) {
  TempDir out("merge_" + adapter);
  merge_adapter({fixture(model), fixture("lora/merge_" + adapter), out.path.string()});
  const SafetensorsFile got(out / "model.safetensors");
  const SafetensorsFile base(fixture(model + "/model.safetensors"));
  const SafetensorsFile peft(fixture("lora/merge_" + adapter + "/merged.safetensors"));
  EXPECT_EQ(got.names(), base.names());
  int changed = 0;
  for (const std::string& name : base.names()) {
    SCOPED_TRACE(name);
    const Tensor& g = got.get(name);
    const Tensor& want = peft.has(name) ? peft.get(name) : base.get(name);
    ASSERT_EQ(g.shape(), want.shape());
    ASSERT_EQ(g.dtype(), DType::f32);
    const float* a = g.f32();
    const float* b = want.f32();
    double worst = 0, scale = 1e-30;
    for (int64_t i = 0; i < g.numel(); ++i) {
      worst = std::max(worst, std::abs(static_cast<double>(a[i]) - b[i]));
      scale = std::max(scale, std::abs(static_cast<double>(b[i])));
    }
    if (peft.has(name)) {
      ++changed;
      EXPECT_LE(worst / scale, 1e-6);
    } else {
      EXPECT_EQ(worst, 0.0);  // the base's bytes
    }
  }
  EXPECT_EQ(changed, static_cast<int>(peft.names().size()));
  EXPECT_TRUE(std::filesystem::exists(out / "config.json"));
}

TEST(LoraMerge, LlamaAsPeftMergesIt) {
  expect_merged_as_peft("llama_tiny", "llama");
}

TEST(LoraMerge, Gpt2sConv1DWithRsLoraAsPeftMergesIt) {
  expect_merged_as_peft("gpt2_tiny", "gpt2");
}

TEST(LoraMerge, BertWithItsClassifierSavedAsPeftMergesIt) {
  expect_merged_as_peft("bert_tiny", "bert");
}

// PEFT's merge_and_unload() of a mixture's experts' adapter (target_parameters) holds the
// fused gate_up_proj [E, 2F, C] and down_proj [E, C, F]; a base that holds its experts one by
// one (Mixtral's w1 (gate), w3 (up), w2 (down); OLMoE's gate_proj, up_proj, down_proj) gets each
// expert's rows of them, in its own tensors; Mixtral's router (transformers 4's
// block_sparse_moe.gate) PEFT's mlp.gate.
void expect_experts_merged_as_peft(const std::string& model, const std::string& adapter,
                                   const std::string& kind = "experts_") {
  SCOPED_TRACE(model);
  TempDir out("merge_experts");
  merge_adapter({fixture(model), fixture("lora/" + kind + adapter), out.path.string()});
  const SafetensorsFile got(out / "model.safetensors");
  const SafetensorsFile base(fixture(model + "/model.safetensors"));
  const SafetensorsFile peft(fixture("lora/" + kind + adapter + "/merged.safetensors"));
  const std::regex router(R"(block_sparse_moe\.gate\.)");
  EXPECT_EQ(got.names(), base.names());
  const std::regex expert(R"(model\.layers\.(\d+)\.\w+\.experts\.(\d+)\.(\w+)\.weight)");
  int changed = 0;
  for (const std::string& name : base.names()) {
    SCOPED_TRACE(name);
    const Tensor& g = got.get(name);
    const float* want = base.get(name).f32();
    std::smatch m;
    const bool down = std::regex_match(name, m, expert) && (m[3] == "w2" || m[3] == "down_proj");
    const std::string fused_name = m.empty()
                                       ? ""
                                       : "model.layers." + std::string(m[1]) + ".mlp.experts." +
                                             (down ? "down_proj" : "gate_up_proj");
    if (!m.empty() && peft.has(fused_name)) {  // (Qwen2-MoE's all-linear leaves them)
      const std::string proj = m[3];
      const int64_t e = std::stoll(m[2]);
      const Tensor& fused = peft.get(fused_name);
      const bool up = proj == "w3" || proj == "up_proj";
      want = fused.f32() + e * fused.dim(1) * fused.dim(2) + (up ? g.numel() : 0);
      ++changed;
    } else if (const std::string v5 = std::regex_replace(name, router, "mlp.gate."); peft.has(v5)) {
      want = peft.get(v5).f32();
      ++changed;
    }
    double worst = 0, scale = 1e-30;
    for (int64_t i = 0; i < g.numel(); ++i) {
      worst = std::max(worst, std::abs(static_cast<double>(g.f32()[i]) - want[i]));
      scale = std::max(scale, std::abs(static_cast<double>(want[i])));
    }
    EXPECT_LE(worst / scale, 1e-6);
  }
  EXPECT_GT(changed, 2);
}

// all-linear on a mixture (lora/all_linear_*): the router's and the shared expert's adapters
// merged too.
TEST(LoraMerge, AMixturesAllLinearAsPeftMergesIt) {
  expect_experts_merged_as_peft("moe/mixtral_tiny", "mixtral", "all_linear_");
  expect_experts_merged_as_peft("moe/olmoe_tiny", "olmoe", "all_linear_");
  expect_experts_merged_as_peft("moe/qwen2_moe_tiny", "qwen2_moe", "all_linear_");
}

TEST(LoraMerge, AMixturesExpertsAsPeftMergesThem) {
  expect_experts_merged_as_peft("moe/mixtral_tiny", "mixtral");
  expect_experts_merged_as_peft("moe/olmoe_tiny", "olmoe");
  // A base that holds them packed (transformers 5's layout, in shards): PEFT's tensors as they are.
  TempDir dir("merge_packed");
  const std::string packed = dir / "base";
  std::filesystem::copy(fixture("moe/mixtral_tiny/packed"), packed);
  std::filesystem::copy_file(fixture("moe/mixtral_tiny/config.json"), packed + "/config.json");
  merge_adapter({packed, fixture("lora/experts_mixtral"), dir / "merged"});
  const SafetensorsFile got(dir / "merged/model.safetensors");
  const SafetensorsFile peft(fixture("lora/experts_mixtral/merged.safetensors"));
  for (const std::string& name : peft.names()) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(got.has(name));
    const Tensor& g = got.get(name);
    const Tensor& w = peft.get(name);
    ASSERT_EQ(g.shape(), w.shape());
    double worst = 0, scale = 1e-30;
    for (int64_t i = 0; i < g.numel(); ++i) {
      worst = std::max(worst, std::abs(static_cast<double>(g.f32()[i]) - w.f32()[i]));
      scale = std::max(scale, std::abs(static_cast<double>(w.f32()[i])));
    }
    EXPECT_LE(worst / scale, 1e-6);
  }
}

TEST(LoraMerge, AnAdapterThatDoesNotFitItsBaseIsRefused) {
  TempDir out("merge_refused");
  const std::string o = " --output_dir " + (out / "m");
  // Another architecture's module names.
  expect_refused("merge --model_name_or_path " + fixture("gpt2_tiny") + " --adapter_name_or_path " +
                     fixture("lora/merge_llama") + o,
                 "matches no linear of the model");
  // The same names, other shapes.
  expect_refused("merge --model_name_or_path " + fixture("qwen2_tiny") +
                     " --adapter_name_or_path " + fixture("lora/merge_llama") + o,
                 "do not fit its");
  // An expert's tensor of another shape than the experts' adapter takes.
  {
    const std::string odd = out / "odd";
    std::filesystem::create_directories(odd);
    std::filesystem::copy_file(fixture("moe/mixtral_tiny/config.json"), odd + "/config.json");
    const SafetensorsFile f(fixture("moe/mixtral_tiny/model.safetensors"));
    std::vector<std::pair<std::string, Tensor>> tensors;
    for (const std::string& n : f.names()) {
      const Tensor& t = f.get(n);
      const bool cut = n == "model.layers.0.block_sparse_moe.experts.0.w1.weight";
      tensors.emplace_back(
          n,
          Tensor(t.data(), cut ? Shape{t.numel() / t.dim(1) - 1, t.dim(1)} : t.shape(), t.dtype()));
    }
    write_safetensors(odd + "/model.safetensors", tensors);
    expect_refused("merge --model_name_or_path " + odd + " --adapter_name_or_path " +
                       fixture("lora/experts_mixtral") + o,
                   "where model.layers.0.mlp.experts.gate_up_proj takes");
  }
  // A weights file cut short, and one missing.
  const std::string cut = out / "cut";
  std::filesystem::create_directories(cut);
  std::filesystem::copy_file(fixture("lora/merge_llama/adapter_config.json"),
                             cut + "/adapter_config.json");
  expect_refused(
      "merge --model_name_or_path " + fixture("llama_tiny") + " --adapter_name_or_path " + cut + o,
      "adapter_model.safetensors");
  {
    std::ifstream in(fixture("lora/merge_llama/adapter_model.safetensors"), std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::ofstream(cut + "/adapter_model.safetensors", std::ios::binary)
        << bytes.substr(0, bytes.size() / 2);
  }
  const CliRun r = run_brisk("merge --model_name_or_path " + fixture("llama_tiny") +
                             " --adapter_name_or_path " + cut + o);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_FALSE(r.signaled);
  EXPECT_FALSE(std::filesystem::exists(out / "m/model.safetensors"));
  expect_refused("merge --model_name_or_path " + fixture("llama_tiny") + o,
                 "--adapter_name_or_path is required");
}

// forward-backward with an adapter: the conformance path reports the adapter's gradients only.
// forward-backward --adapter_name_or_path: the adapters' gradients under PEFT's keys and in its
// layouts (an expert adapter's B interleaved), as PEFT computes them: Llama's q_proj and v_proj,
// and Mixtral's experts (target_parameters) beside its q_proj.
TEST(LoraForwardBackward, ReportsTheAdaptersGradientsAsPeft) {
  for (const auto& [model, adapter, count] :
       {std::tuple{"llama_tiny", "merge_llama", 8},
        std::tuple{"moe/mixtral_tiny", "experts_mixtral", 12}}) {
    SCOPED_TRACE(model);
    TempDir out("lora_fb");
    const std::string m = fixture(model);
    const CliRun r = run_brisk(
        "forward-backward --config " + m + " --weights " + m + "/model.safetensors --batch " + m +
        "/batch.safetensors" + " --adapter_name_or_path " +
        fixture(std::string("lora/") + adapter) + " --output " + (out / "fb.safetensors"));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const SafetensorsFile got(out / "fb.safetensors");
    const SafetensorsFile want(fixture(std::string("lora/") + adapter + "/expected.safetensors"));
    int grads = 0;
    for (const std::string& name : got.names()) {
      if (name.rfind("grad.", 0) != 0) continue;
      ++grads;
      const Tensor& g = got.get(name);
      const Tensor& w = want.get("grad.base_model.model." + name.substr(5));
      ASSERT_EQ(g.shape(), w.shape()) << name;
      double diff = 0, norm = 0;
      for (int64_t i = 0; i < w.numel(); ++i) {
        diff += (g.f32()[i] - w.f32()[i]) * (g.f32()[i] - w.f32()[i]);
        norm += w.f32()[i] * w.f32()[i];
      }
      EXPECT_LE(std::sqrt(diff / norm), 1e-4) << name;
    }
    EXPECT_EQ(grads, count);  // A and B of each adapted linear or experts' weight in 2 layers
    EXPECT_NEAR(got.get("loss").f32()[0], want.get("loss").f32()[0], 1e-5);
  }
}

}  // namespace
}  // namespace brisk::testing
