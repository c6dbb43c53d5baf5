// The architectures' table, which Model::create reads: each model type and the factory of its
// architecture (as transformers' auto classes map a config's model_type to a class). The only
// file of models/ that knows every architecture; the model's base knows none of them.
#include <array>
#include <utility>

#include "models/bert.h"
#include "models/distilbert.h"
#include "models/gpt2.h"
#include "models/llama.h"
#include "models/model.h"

namespace brisk {
namespace {

using Factory = std::unique_ptr<Model> (*)(const ModelConfig&);

// The Llama family's decoder serves its relatives (their differences are config fields) and the
// sparse-MLP models built on it.
constexpr std::array<std::pair<ModelType, Factory>, 9> kArchitectures{{
    {ModelType::bert, make_bert},
    {ModelType::distilbert, make_distilbert},
    {ModelType::gpt2, make_gpt2},
    {ModelType::llama, make_llama},
    {ModelType::mistral, make_llama},
    {ModelType::qwen2, make_llama},
    {ModelType::mixtral, make_llama},
    {ModelType::qwen2_moe, make_llama},
    {ModelType::olmoe, make_llama},
}};

}  // namespace

std::unique_ptr<Model> Model::create(const ModelConfig& config) {
  for (const auto& [type, make] : kArchitectures) {
    if (type != config.model_type) continue;
    std::unique_ptr<Model> m = make(config);
    m->declare_params();
    m->find_grad_segments();
    return m;
  }
  BRISK_FAIL("internal error: model type ", static_cast<int>(config.model_type),
             " has no architecture");
}

}  // namespace brisk
