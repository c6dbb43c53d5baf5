// LoRA adapters attached to a model against PEFT + transformers (tests/fixtures/lora/merge_*,
// scripts/make_lora_fixtures.py): the adapted model's loss and logits, and the gradients of every
// adapter's A and B (and of a module to save), with the base frozen; on Llama (q_proj and v_proj
// inside the packed query/key/value product), GPT-2 (Conv1D's c_attn and c_proj, rsLoRA) and
// BERT (query and value, its classifier trained in full).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>

#include "adapters/attach.h"
#include "adapters/merge.h"
#include "core/json_file.h"
#include "test_support.h"

namespace brisk::testing {
namespace {

double normwise(const std::vector<float>& got, const Tensor& want) {
  double diff = 0, norm = 0;
  for (int64_t i = 0; i < want.numel(); ++i) {
    const double w = want.f32()[i];
    diff += (got[i] - w) * (got[i] - w);
    norm += w * w;
  }
  return std::sqrt(diff / std::max(norm, 1e-30));
}

// `grads`: the gradients' tolerance (normwise); `trained`: the most of the model's elements the
// adapters may hold.
void expect_as_peft(const std::string& model, const std::string& adapter,
                    const std::string& kind = "merge_", double grads = 1e-4,
                    double trained = 0.25) {
  SCOPED_TRACE(model);
  const std::string dir = fixture("lora/" + kind + adapter);
  const LoraConfig c =
      read_adapter_config(read_json_file(dir + "/adapter_config.json", "adapter"), "adapter");
  LoadedModel lm(fixture(model), {}, false, DType::f32, 0, false, nullptr, 0, nullptr,
                 [&](Model& m) { attach_lora(m, c); });
  load_adapter(*lm.be, *lm.model, SafetensorsFile(dir + "/adapter_model.safetensors"));
  const SafetensorsFile want(dir + "/expected.safetensors");
  const ParameterSet& ps = lm.model->params();
  EXPECT_LT(static_cast<double>(ps.trainable_elements()),
            trained * static_cast<double>(ps.total_elements()));
  StepOptions so;
  so.compute_grad = false;
  lm.model->forward(*lm.be, so);
  const std::vector<float> logits = to_host(*lm.be, lm.model->logits());
  EXPECT_LE(normwise(logits, want.get("logits")), 1e-5);
  const double loss = lm.step(false);
  EXPECT_NEAR(loss, want.get("loss").f32()[0], 1e-5);
  int compared = 0;
  for (size_t i = 0; i < ps.list().size(); ++i) {
    const ParamInfo& p = ps.list()[i];
    if (p.frozen) continue;
    const std::string key = "grad.base_model.model." + p.name;
    ASSERT_TRUE(want.has(key)) << key;
    const int id = static_cast<int>(i);
    const std::vector<float> g = to_host(*lm.be, ps.grad(id));
    std::vector<float> laid(g.size());
    EXPECT_EQ(to_peft_layout(*lm.model, id, g.data(), laid.data()), want.get(key).shape());
    EXPECT_LE(normwise(laid, want.get(key)), grads) << p.name;
    ++compared;
  }
  EXPECT_EQ(compared + 2, static_cast<int>(want.names().size()));  // and loss, logits
  // Saved again, the adapter is PEFT's file tensor for tensor (an expert's B interleaved back).
  TempDir out("lora_saved");
  const ParameterSet::Run run = ps.trained_run();
  const std::vector<float> trained =
      to_host(*lm.be, element_range(ps.flat_weights(), run.elements.offset, run.elements.count));
  save_adapter(out.path.string(), *lm.model, c,
               [&](const ParamInfo& p, size_t at, size_t n, void* dst) {
                 const auto start = static_cast<size_t>(p.offset - run.elements.offset) * 4;
                 std::memcpy(dst, reinterpret_cast<const char*>(trained.data()) + start + at, n);
               });
  const SafetensorsFile a(out / "adapter_model.safetensors"), b(dir + "/adapter_model.safetensors");
  for (const std::string& name : b.names()) {
    ASSERT_TRUE(a.has(name)) << name;
    ASSERT_EQ(a.get(name).shape(), b.get(name).shape()) << name;
    const std::vector<float> x(a.get(name).f32(), a.get(name).f32() + a.get(name).numel());
    EXPECT_EQ(normwise(x, b.get(name)), 0.0) << name;
  }
}

TEST(LoraModel, LlamaAsPeft) {
  expect_as_peft("llama_tiny", "llama");
}

TEST(LoraModel, Gpt2sConv1DWithRsLoraAsPeft) {
  expect_as_peft("gpt2_tiny", "gpt2");
}

TEST(LoraModel, BertWithItsClassifierTrainedAsPeft) {
  expect_as_peft("bert_tiny", "bert");
}

// A mixture's routed experts adapted through PEFT's target_parameters (each expert its own A
// and B on the fused gate_up_proj and down_proj) beside q_proj: Mixtral and OLMoE.
TEST(LoraModel, MixturesExpertsAsPeftsTargetParameters) {
  expect_as_peft("moe/mixtral_tiny", "mixtral", "experts_");
  expect_as_peft("moe/olmoe_tiny", "olmoe", "experts_");
}

// The experts named by their per-expert linears (Mixtral's w1, w3, w2; OLMoE's gate_proj,
// up_proj, down_proj), as PEFT converts them: its saved config's target_parameters, with
// rank_pattern and alpha_pattern doubling gate_up_proj's rank and alpha.
TEST(LoraModel, MixturesListedExpertLinearsAsPeftConvertsThem) {
  expect_as_peft("moe/mixtral_tiny", "mixtral", "listed_");
  expect_as_peft("moe/olmoe_tiny", "olmoe", "listed_");
}

// all-linear on a mixture as PEFT resolves it (its saved config): on Mixtral and OLMoE the
// attention's linears, the router (target_parameters gate.weight, added to its logits before the
// routing) and the experts; on Qwen2-MoE the attention's, the shared expert's and its gate's
// linears and the dense layer's MLP.
// The reference is PEFT's in float64: the query and key adapters' gradients are ill-conditioned
// here (PEFT's own in float32 differ from it by up to 4e-4 on Mixtral, 7e-5 on Qwen2-MoE;
// brisk's by up to 6e-4 and 2e-4 there, the median adapter's by 2e-6). On these tiny models the
// adapters of every linear hold about half the elements.
TEST(LoraModel, MixturesAllLinearAsPeft) {
  expect_as_peft("moe/mixtral_tiny", "mixtral", "all_linear_", 1e-3, 0.6);
  expect_as_peft("moe/olmoe_tiny", "olmoe", "all_linear_", 1e-4, 0.6);
  expect_as_peft("moe/qwen2_moe_tiny", "qwen2_moe", "all_linear_", 3e-4, 0.6);
}

// A router named as a module: refused, as PEFT refuses it (no nn.Linear in transformers 5).
TEST(LoraModel, AMixturesRouterAsAModuleIsRefusedByName) {
  for (const std::string f : {"mixtral", "qwen2_moe"}) {
    LoraConfig c;
    c.r = 4;
    c.target_modules = {"q_proj", "gate"};
    expect_error(
        [&] {
          LoadedModel(fixture("moe/" + f + "_tiny"), {}, false, DType::f32, 0, false, nullptr, 0,
                      nullptr, [&](Model& m) { attach_lora(m, c); });
        },
        "--lora_target_modules gate: model.layers.0.mlp.gate is a mixture's router");
  }
  LoraConfig all;
  all.all_linear = true;
  all.dropout = 0.05;  // PEFT adapts the router and the experts without dropout
  expect_error([&] { with_fused_experts(all, "olmoe"); },
               "all-linear on olmoe adapts its router and experts as parameters");
}

TEST(LoraModel, FreshAdaptersLeaveTheBaseModelsOutput) {
  // B zero: the adapted model computes the base's logits exactly; A drawn within 1/sqrt(in).
  LoraConfig c;
  c.r = 4;
  c.all_linear = true;
  LoadedModel base(fixture("llama_tiny"));
  LoadedModel lm(fixture("llama_tiny"), {}, false, DType::f32, 0, false, nullptr, 0, nullptr,
                 [&](Model& m) { attach_lora(m, c); });
  lm.model->init_weights(*lm.be, 5);
  lm.model->load_weights(*lm.be, WeightFiles(fixture("llama_tiny/model.safetensors")));
  StepOptions so;
  so.compute_grad = false;
  base.model->forward(*base.be, so);
  lm.model->forward(*lm.be, so);
  EXPECT_EQ(to_host(*lm.be, lm.model->logits()), to_host(*base.be, base.model->logits()));
  const ParameterSet& ps = lm.model->params();
  for (const ModelAdapters::Entry& e : lm.model->adapters()->entries()) {
    const std::vector<float> a = to_host(*lm.be, ps.weight(e.a)),
                             b = to_host(*lm.be, ps.weight(e.b));
    const float bound = 1.0f / std::sqrt(static_cast<float>(e.decl.in));
    float most = 0;
    for (float v : a) most = std::max(most, std::abs(v));
    EXPECT_LE(most, bound);
    EXPECT_GT(most, 0.5f * bound);
    for (float v : b) ASSERT_EQ(v, 0.0f);
  }
  EXPECT_EQ(lm.model->adapters()->entries().size(), 14u);  // 7 linears in each of 2 blocks
}

// An adapter's B gradient is what the merged model's weight gradient implies (the same function
// of the inputs at the merge point): dB = scale dW^T A^T for GPT-2's Conv1D weights [in, out],
// brisk's merge and brisk's base model the reference, PEFT not involved.
TEST(LoraModel, AdaptersGradientsAsTheMergedModelsImplies) {
  const std::string dir = fixture("lora/merge_gpt2");
  TempDir out("lora_vs_merged");
  std::filesystem::copy_file(fixture("gpt2_tiny/batch.safetensors"), out / "batch.safetensors");
  merge_adapter({fixture("gpt2_tiny"), dir, out.path.string()});
  LoadedModel merged(out.path.string());
  merged.step(false);
  const LoraConfig c =
      read_adapter_config(read_json_file(dir + "/adapter_config.json", "adapter"), "adapter");
  LoadedModel lm(fixture("gpt2_tiny"), {}, false, DType::f32, 0, false, nullptr, 0, nullptr,
                 [&](Model& m) { attach_lora(m, c); });
  load_adapter(*lm.be, *lm.model, SafetensorsFile(dir + "/adapter_model.safetensors"));
  lm.step(false);
  const ParameterSet& ps = lm.model->params();
  const ParameterSet& ms = merged.model->params();
  for (const ModelAdapters::Entry& e : lm.model->adapters()->entries()) {
    const std::vector<float> dw = to_host(*merged.be, ms.grad(ms.index(e.decl.module + ".weight")));
    const std::vector<float> a = to_host(*lm.be, ps.weight(e.a));
    const int64_t in = e.decl.in, outs = e.decl.out, r = e.decl.r;
    std::vector<float> implied(static_cast<size_t>(outs * r));
    for (int64_t o = 0; o < outs; ++o)
      for (int64_t j = 0; j < r; ++j) {
        double sum = 0;
        for (int64_t i = 0; i < in; ++i) sum += dw[i * outs + o] * a[j * in + i];
        implied[o * r + j] = static_cast<float>(e.decl.scale * sum);
      }
    EXPECT_LE(
        normwise(to_host(*lm.be, ps.grad(e.b)), Tensor(implied.data(), Shape{outs, r}, DType::f32)),
        1e-4)
        << e.decl.module;
  }
}

// The adapters' dropout (PEFT's lora_dropout on each adapter's input, its own mask per adapter):
// with the step's key fixed, the masks are a fixed function, so the gradients of A and B must be
// the central differences of the training loss; the masks change the gradients, and evaluation
// (no key) computes without them.
TEST(LoraModel, DropoutOnTheAdaptersInputHasTheGradientsOfItsMasks) {
  const std::string dir = fixture("lora/merge_llama");
  LoraConfig c =
      read_adapter_config(read_json_file(dir + "/adapter_config.json", "adapter"), "adapter");
  auto adapted = [&](double dropout) {
    c.dropout = dropout;
    auto lm = std::make_unique<LoadedModel>(fixture("llama_tiny"), PlanOptions{}, false, DType::f32,
                                            0, false, nullptr, 0, nullptr,
                                            [&](Model& m) { attach_lora(m, c); });
    load_adapter(*lm->be, *lm->model, SafetensorsFile(dir + "/adapter_model.safetensors"));
    return lm;
  };
  const auto plain = adapted(0.0);
  const auto dropped = adapted(0.3);
  const double plain_loss = plain->step(true);
  const double loss = dropped->step(true);
  EXPECT_GT(std::abs(loss - plain_loss), 1e-4);
  EXPECT_EQ(dropped->step(false), plain->step(false));  // evaluation: no dropout
  dropped->step(true);
  const ParameterSet& ps = dropped->model->params();
  Backend& be = *dropped->be;
  auto training_loss = [&] {
    StepOptions so;
    so.training = true;
    so.compute_grad = false;
    so.rng = RngKey{7, 3, 0};
    return dropped->model->forward(be, so) / static_cast<double>(dropped->model->count_targets());
  };
  int checked = 0;
  for (const ModelAdapters::Entry& e : dropped->model->adapters()->entries()) {
    for (const int param : {e.a, e.b}) {
      const std::vector<float> g = to_host(be, ps.grad(param));
      std::vector<float> w = to_host(be, ps.weight(param));
      const auto at = static_cast<size_t>(
          std::max_element(g.begin(), g.end(),
                           [](float x, float y) { return std::abs(x) < std::abs(y); }) -
          g.begin());
      const float h = 1e-2f, w0 = w[at];
      const Tensor host(w.data(), ps.weight(param).shape(), DType::f32);
      w[at] = w0 + h;
      be.upload(host, ps.weight(param));
      const double up = training_loss();
      w[at] = w0 - h;
      be.upload(host, ps.weight(param));
      const double down = training_loss();
      w[at] = w0;
      be.upload(host, ps.weight(param));
      const double fd = (up - down) / (2.0 * h);
      EXPECT_NEAR(fd, g[at], 2e-2 * std::abs(g[at]) + 1e-5) << ps.list()[param].name;
      ++checked;
    }
  }
  EXPECT_EQ(checked, 8);  // q_proj and v_proj in 2 blocks, A and B each
}

}  // namespace
}  // namespace brisk::testing
