// Model weights split into shards as save_pretrained(max_shard_size=...) writes them
// (model.safetensors.index.json + model-0000k-of-0000n.safetensors), stored in float32 or bf16,
// and the index's malformed forms.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/json_file.h"
#include "test_support.h"
#include "trainer_support.h"

namespace brisk::testing {
namespace {

namespace fs = std::filesystem;

void write_index(const fs::path& path, const nlohmann::json& weight_map) {
  write_file_atomically(
      path.string(),
      nlohmann::json{{"metadata", {{"total_size", 0}}}, {"weight_map", weight_map}}.dump());
}

// The bert_tiny weights in two shards: the first half of the tensors in float32, the rest in
// bf16 (as a bf16 checkpoint stores them).
struct ShardedBert {
  TempDir temp{"sharded"};  // removed with the test
  fs::path dir = temp.path;
  std::vector<std::string> bf16_names;
  std::vector<std::vector<uint16_t>> bf16_data;  // keeps the bf16 copies alive while written

  ShardedBert() {
    SafetensorsFile single(fixture("bert_tiny/model.safetensors"));
    const std::vector<std::string> names = single.names();
    std::vector<std::pair<std::string, Tensor>> first, second;
    nlohmann::json map;
    bf16_data.reserve(names.size());
    for (size_t i = 0; i < names.size(); ++i) {
      const Tensor& t = single.get(names[i]);
      if (i < names.size() / 2) {
        first.emplace_back(names[i], t);
        map[names[i]] = "model-00001-of-00002.safetensors";
        continue;
      }
      std::vector<uint16_t>& h = bf16_data.emplace_back(static_cast<size_t>(t.numel()));
      for (int64_t j = 0; j < t.numel(); ++j) h[j] = float_to_bf16(t.f32()[j]);
      second.emplace_back(names[i], Tensor(h.data(), t.shape(), DType::bf16));
      bf16_names.push_back(names[i]);
      map[names[i]] = "model-00002-of-00002.safetensors";
    }
    write_safetensors((dir / "model-00001-of-00002.safetensors").string(), first);
    write_safetensors((dir / "model-00002-of-00002.safetensors").string(), second);
    write_index(dir / "model.safetensors.index.json", map);
    fs::copy_file(fixture("bert_tiny/config.json"), dir / "config.json");
  }
};

// The model's weights after load_pretrained from `weights`.
std::vector<float> loaded_weights(const std::string& config_folder, const std::string& weights) {
  std::unique_ptr<Backend> be = make_backend(Device::cpu);
  std::unique_ptr<Model> model = Model::create(resolve_config(config_folder));
  MemoryPlan plan;
  model->plan(plan, {1, 4}, {});
  plan.finalize();
  Arena arena(plan, be->device_memory(), be->staging_memory());
  model->bind(arena);
  EXPECT_TRUE(model->load_pretrained(*be, WeightFiles(weights), 1).empty());
  return to_host(*be, model->params().flat_weights());
}

TEST(WeightFiles, ShardedWeightsLoadAsTheSingleFileDoesWithBf16ShardsRounded) {
  ShardedBert sharded;
  const std::string index = WeightFiles::find_in_folder(sharded.dir.string());
  EXPECT_EQ(fs::path(index).filename(), "model.safetensors.index.json");
  const std::vector<float> got = loaded_weights(sharded.dir.string(), index);
  const std::vector<float> want =
      loaded_weights(fixture("bert_tiny"), fixture("bert_tiny/model.safetensors"));
  ASSERT_EQ(got.size(), want.size());
  // Parameters from the float32 shard are bit-equal, those from the bf16 shard are the bf16
  // rounding of the originals (and differ from them somewhere).
  std::unique_ptr<Model> model = Model::create(resolve_config(fixture("bert_tiny")));
  size_t rounded = 0, changed = 0;
  for (const ParamInfo& p : model->params().list()) {
    const bool bf16 = std::find(sharded.bf16_names.begin(), sharded.bf16_names.end(), p.name) !=
                      sharded.bf16_names.end();
    for (int64_t j = 0; j < p.shape.numel(); ++j) {
      const float w = want[p.offset + j], g = got[p.offset + j];
      ASSERT_EQ(g, bf16 ? bf16_to_float(float_to_bf16(w)) : w) << p.name << "[" << j << "]";
      rounded += bf16;
      changed += g != w;
    }
  }
  EXPECT_GT(rounded, 0u);
  EXPECT_GT(changed, 0u);
}

TEST(WeightFiles, AFolderWithBothFormsUsesTheSingleFileAsTransformersDoes) {
  ShardedBert sharded;
  fs::copy_file(fixture("bert_tiny/model.safetensors"), sharded.dir / "model.safetensors");
  EXPECT_EQ(fs::path(WeightFiles::find_in_folder(sharded.dir.string())).filename(),
            "model.safetensors");
  EXPECT_EQ(WeightFiles::find_in_folder(fixture("bad")), "");
}

TEST(WeightFiles, MalformedIndexesAreRefusedByName) {
  ShardedBert sharded;
  const fs::path index = sharded.dir / "model.safetensors.index.json";
  const nlohmann::json good = read_json_file(index.string(), "index")["weight_map"];
  const std::string name = good.begin().key();
  auto refused = [&](const nlohmann::json& map, const std::string& needle) {
    write_index(index, map);
    expect_error([&] { WeightFiles w(index.string()); }, needle);
  };
  refused(nlohmann::json::array(), "weight_map");
  nlohmann::json bad = good;
  bad[name] = "../model-00001-of-00002.safetensors";
  refused(bad, "not a file name in the index's folder");
  bad[name] = "model-00003-of-00002.safetensors";
  refused(bad, "does not exist");
  bad[name] = 7;
  refused(bad, "is not a file name");
  bad = good;
  bad["bert.no.such.weight"] = "model-00001-of-00002.safetensors";
  refused(bad, "which lacks it");
  write_file_atomically(index.string(), "{\"weight_map\": {");
  expect_error([&] { WeightFiles w(index.string()); }, "weights index");
  // A model whose shards lack one of its parameters is refused naming it.
  bad = good;
  bad.erase(name);
  write_index(index, bad);
  expect_error([&] { loaded_weights(sharded.dir.string(), index.string()); }, name);
}

}  // namespace
}  // namespace brisk::testing
