// Model configuration read from a Hugging Face config.json (same keys as transformers), plus the
// built-in configurations with the published sizes.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace brisk {

enum class ModelType { bert, gpt2 };

// Upper bounds on config values, far above any published model (the largest today: vocabulary
// ~256k, hidden 16k-25k, ~130 layers, feed-forward ~53k-100k, context 128k-1M). They keep every
// derived size inside checked 64-bit arithmetic and planning time bounded; above them the config
// is refused by name. Token ids are int32, hence the vocabulary's bound.
inline constexpr int64_t kMaxVocab = (int64_t{1} << 31) - 1;
inline constexpr int64_t kMaxHidden = int64_t{1} << 17;
inline constexpr int64_t kMaxLayers = 4096;
inline constexpr int64_t kMaxHeads = 4096;
inline constexpr int64_t kMaxIntermediate = int64_t{1} << 20;
inline constexpr int64_t kMaxPositions = int64_t{1} << 22;
inline constexpr int64_t kMaxTypes = 1024;
inline constexpr int64_t kMaxLabels = int64_t{1} << 20;

struct ModelConfig {
  ModelType model_type = ModelType::bert;
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t num_layers = 0;
  int64_t num_heads = 0;
  int64_t intermediate_size = 0;
  int64_t max_position_embeddings = 0;
  int64_t type_vocab_size = 0;  // bert
  int64_t num_labels = 0;       // bert sequence classification
  // bert: one output trained with the squared error (transformers' problem_type "regression",
  // which num_labels 1 implies), instead of classes under cross-entropy.
  bool regression = false;
  float layer_norm_eps = 1e-12f;
  float hidden_dropout = 0.1f;     // bert hidden_dropout_prob, gpt2 resid_pdrop
  float attention_dropout = 0.1f;  // attention_probs_dropout_prob / attn_pdrop
  float embedding_dropout = 0.1f;  // bert hidden_dropout_prob, gpt2 embd_pdrop
  float classifier_dropout = 0.1f;
  Activation activation = Activation::gelu;
  nlohmann::json source;  // the JSON it was read from, written back into checkpoints

  int64_t head_dim() const { return hidden_size / num_heads; }
  std::string type_name() const { return model_type == ModelType::bert ? "bert" : "gpt2"; }
};

// Validates and converts; `origin` names the source in error messages.
ModelConfig config_from_json(const nlohmann::json& j, const std::string& origin);
ModelConfig load_config(const std::string& path);
// A built-in name ("bert-base-uncased", "bert-large-uncased", "gpt2", "gpt2-medium",
// "bert-tiny", "gpt2-tiny"), or a path to a config.json or to a folder holding one.
ModelConfig resolve_config(const std::string& name_or_path);
std::vector<std::string> builtin_config_names();
// Sets every dropout probability to zero (for tests and exact comparisons).
void disable_dropout(ModelConfig& c);

}  // namespace brisk
