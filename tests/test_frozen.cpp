// Frozen parameters (a LoRA's base): no gradient and no place in the gradient buffer, which
// holds the trained parameters alone; the trained ones' gradients and the loss are exactly those
// of the model trained in full, on every architecture; ZeRO partitions the trained ones alone.
#include <gtest/gtest.h>

#include <string>

#include "parallel/zero.h"
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

// ZeRO's runs, some parameters frozen: equal runs of the trained run's elements alone (the
// optimizer steps nothing else), at their places in the flat buffers, whose gradients start at
// the first trained element.
TEST(Frozen, ZeroPartitionsTheTrainedParametersAlone) {
  ParameterSet p;
  for (int64_t n : {40, 30, 10, 20})
    p.add("p" + std::to_string(p.list().size()), Shape{n}, kBiasOrNorm);
  EXPECT_EQ(p.gradient_origin(), 0);
  p.freeze(0);
  p.freeze(1);
  EXPECT_EQ(p.gradient_origin(), 70);
  const ShardGranule anywhere = [](const ParamInfo&) { return int64_t{1}; };
  const ShardGranule whole = [](const ParamInfo& q) { return q.shape.numel(); };
  std::vector<ParamShard> shards = partition_params(p, 2, anywhere);
  ASSERT_EQ(shards.size(), 2u);
  EXPECT_EQ(shards[0].elements, (ElementRange{70, 15}));
  EXPECT_EQ(shards[1].elements, (ElementRange{85, 15}));
  EXPECT_EQ(shards[0].first, 2);
  EXPECT_EQ(shards[0].last, 4);
  EXPECT_EQ(shards[1].first, 3);
  const ParameterSet mine = shard_params(p, shards[1]);
  ASSERT_EQ(mine.list().size(), 1u);
  EXPECT_EQ(mine.list()[0].name, "p3");
  EXPECT_EQ(mine.total_elements(), 15);
  shards = partition_params(p, 3, whole);  // whole parameters: one rank gets none
  EXPECT_EQ(shards[0].elements, (ElementRange{70, 10}));
  EXPECT_EQ(shards[1].elements, (ElementRange{80, 20}));
  EXPECT_EQ(shards[2].elements.count, 0);
}

}  // namespace
}  // namespace brisk::testing
