// Frozen parameters (a LoRA's base): no gradient and no place in the gradient buffer, which
// holds the trained parameters alone; the trained ones' gradients and the loss are exactly those
// of the model trained in full, on every architecture.
#include <gtest/gtest.h>

#include <string>

#include "test_support.h"

namespace brisk::testing {
namespace {

// The norms' parameters and the last parameter (the head's last bias or weight) trained.
bool trained(const ParamInfo& p, const std::string& last) {
  return p.name == last || p.name.find("norm") != std::string::npos ||
         p.name.find("ln_") != std::string::npos || p.name.find("LayerNorm") != std::string::npos;
}

TEST(Frozen, TheTrainedParametersGradientsAsInFullTraining) {
  for (const char* name :
       {"bert_tiny", "distilbert_tiny", "gpt2_tiny", "llama_tiny", "qwen2_tiny"}) {
    SCOPED_TRACE(name);
    LoadedModel full(fixture(name));
    const std::string last = full.model->params().list().back().name;
    LoadedModel part(
        fixture(name), {}, false, DType::f32, 0, false, nullptr, 0, nullptr,
        [&](Model& m) { m.freeze_except([&](const ParamInfo& p) { return trained(p, last); }); });
    const ParameterSet& ps = part.model->params();
    ASSERT_TRUE(ps.frozen());
    EXPECT_EQ(ps.flat_grads().numel(), ps.trainable_elements());
    EXPECT_LT(ps.trainable_elements(), ps.total_elements() / 4);
    EXPECT_EQ(part.step(false), full.step(false));
    const std::vector<float> g = part.grads(), f = full.grads();
    int64_t at = 0, checked = 0;
    for (const ParamInfo& p : ps.list()) {
      if (p.frozen) {
        EXPECT_TRUE(ps.grad(ps.index(p.name)).empty()) << p.name;
        continue;
      }
      for (int64_t i = 0; i < p.shape.numel(); ++i)
        ASSERT_EQ(g[at + i], f[p.offset + i]) << p.name << " element " << i;
      at += p.shape.numel();
      ++checked;
    }
    EXPECT_EQ(at, ps.trainable_elements());
    EXPECT_GT(checked, 2);
  }
}

}  // namespace
}  // namespace brisk::testing
