// A weights file's expert tensors against the config: what the config does not have (experts
// beyond its count, expert tensors on a dense layer, a layer in two layouts) is refused by name
// before anything is read; a packed layer lacking its down_proj is named in the packed spelling;
// Mixtral's experts under mlp. (the spelling of transformers 5's converter) load as
// block_sparse_moe's.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/safetensors.h"
#include "core/weight_files.h"
#include "test_support.h"

namespace brisk::testing {
namespace {

using Entries = std::vector<std::pair<std::string, Tensor>>;

// The fixture folder's weights, each name passed through `rename` ("" drops the tensor), with
// `extra` added; written to dir/model.safetensors, whose path is returned.
std::string rewritten(const TempDir& dir, const std::string& folder,
                      const std::function<std::string(const std::string&)>& rename,
                      const Entries& extra = {}) {
  SafetensorsFile file(folder + "/model.safetensors");
  Entries entries;
  for (const std::string& n : file.names()) {
    const std::string to = rename(n);
    if (!to.empty()) entries.emplace_back(to, file.get(n));
  }
  entries.insert(entries.end(), extra.begin(), extra.end());
  write_safetensors(dir / "model.safetensors", entries);
  return dir / "model.safetensors";
}

std::string same(const std::string& n) {
  return n;
}

TEST(ExpertWeights, TensorsTheConfigDoesNotHaveAreRefusedByName) {
  TempDir dir("expert_weights");
  std::vector<float> values(7 * 12, 0.5f);
  const Tensor w(values.data(), Shape{7, 12}, DType::f32);
  const std::string mixtral = fixture("moe/mixtral_tiny"), qwen = fixture("moe/qwen2_moe_tiny");
  struct Case {
    std::string folder;
    Entries extra;
    std::string message;
  };
  const std::vector<Case> cases = {
      {mixtral,
       {{"model.layers.0.block_sparse_moe.experts.5.w1.weight", w}},
       "holds 1 expert tensor the mixtral config does not have: "
       "'model.layers.0.block_sparse_moe.experts.5.w1.weight' (the config has 5 experts)"},
      {mixtral,
       {{"model.layers.2.block_sparse_moe.experts.0.w1.weight", w}},
       "(the config has 2 layers)"},
      {qwen,  // mlp_only_layers [1]
       {{"model.layers.1.mlp.experts.0.gate_proj.weight", w},
        {"model.layers.1.mlp.experts.1.gate_proj.weight", w}},
       "holds 2 expert tensors the qwen2_moe config does not have: "
       "'model.layers.1.mlp.experts.0.gate_proj.weight' (layer 1 is dense in the config) and 1 "
       "more"},
      {qwen, {{"model.layers.0.mlp.experts.0.w1.weight", w}}, "not a projection of the"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.message);
    LoadedModel m(c.folder);
    const std::string path = rewritten(dir, c.folder, same, c.extra);
    expect_error([&] { m.model->load_weights(*m.be, WeightFiles(path)); }, c.message);
  }
  // Both layouts of one layer: its experts one by one and packed.
  std::vector<float> gate_up(5 * 14 * 12, 0.5f), down(5 * 12 * 7, 0.5f);
  LoadedModel m(mixtral);
  const std::string both = rewritten(
      dir, mixtral, same,
      {{"model.layers.0.mlp.experts.gate_up_proj",
        Tensor(gate_up.data(), Shape{5, 14, 12}, DType::f32)},
       {"model.layers.0.mlp.experts.down_proj", Tensor(down.data(), Shape{5, 12, 7}, DType::f32)}});
  expect_error([&] { m.model->load_weights(*m.be, WeightFiles(both)); },
               "gives layer 0's experts in two layouts, one by one and packed");
}

// transformers 5's packed file without layer 0's down_proj: named as the file spells it.
TEST(ExpertWeights, APackedLayerLackingItsDownProjectionIsNamedAsPacked) {
  TempDir dir("packed_down");
  const std::string folder = fixture("moe/mixtral_tiny");
  const WeightFiles packed(folder + "/packed/model.safetensors.index.json");
  Entries entries;
  for (const std::string& n : packed.names())
    if (n != "model.layers.0.mlp.experts.down_proj") entries.emplace_back(n, packed.get(n));
  write_safetensors(dir / "model.safetensors", entries);
  LoadedModel m(folder);
  expect_error([&] { m.model->load_weights(*m.be, WeightFiles(dir / "model.safetensors")); },
               "lacks tensor 'model.layers.0.mlp.experts.down_proj' of layer 0's packed experts");
}

// Mixtral's experts spelled model.layers.N.mlp.experts.E.w1/w2/w3 (as transformers 5's
// converter reads them) load into the weights block_sparse_moe's spelling gives.
TEST(ExpertWeights, MixtralExpertsUnderMlpLoadAsUnderBlockSparseMoe) {
  TempDir dir("mixtral_mlp_experts");
  const std::string folder = fixture("moe/mixtral_tiny");
  const std::string path = rewritten(dir, folder, [](const std::string& n) {
    const size_t at = n.find("block_sparse_moe.experts.");
    return at == std::string::npos ? n : n.substr(0, at) + "mlp." + n.substr(at + 17);
  });
  ASSERT_TRUE(WeightFiles(path).has("model.layers.0.mlp.experts.4.w2.weight"));
  LoadedModel original(folder), renamed(folder);
  renamed.model->init_weights(*renamed.be, 5);
  renamed.model->load_weights(*renamed.be, WeightFiles(path));
  EXPECT_EQ(to_host(*renamed.be, renamed.model->params().flat_weights()),
            to_host(*original.be, original.model->params().flat_weights()));
}

}  // namespace
}  // namespace brisk::testing
