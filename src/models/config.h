// Model configuration read from a Hugging Face config.json (same keys as transformers), plus the
// built-in configurations with the published sizes.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/rope.h"

namespace brisk {

// llama, mistral and qwen2 share one implementation (models/llama.cpp): their configs differ in
// which keys they have and in their defaults. mixtral, qwen2_moe and olmoe are that decoder with
// mixture-of-experts MLPs (MoeConfig).
enum class ModelType { bert, distilbert, gpt2, llama, mistral, qwen2, mixtral, qwen2_moe, olmoe };
// What a model learns, which decides its head and how data files are prepared (run_glue,
// run_clm or run_mlm).
enum class ModelTask { sequence_classification, causal_lm, masked_lm };

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
// Loss coefficients and the router's capacity factor (config keys and options): float32 scales
// losses and gradients by them; the published configs use 0.001 to 2.
inline constexpr double kMaxCoefficient = 1000;

// Mixture of experts (models/moe_layer.h): a sparse layer's MLP is `experts` SwiGLU experts of
// width `inner`, each token routed to its top `top_k` by a router's softmax, and Qwen2-MoE's shared
// expert of width shared_inner (0: none) besides. experts == 0: every layer dense.
struct MoeConfig {
  int64_t experts = 0, top_k = 0, inner = 0, shared_inner = 0;
  bool normalize = false;  // norm_topk_prob: the top-k weights rescaled to sum to 1 (Mixtral's)
  // transformers' load-balancing loss times router_aux_loss_coef, added to the loss only where the
  // config asks for the router logits (output_router_logits), as transformers adds it.
  bool aux_loss = false;
  double aux_loss_coef = 0;
  // ST-MoE's router z-loss, coef x the mean over the sparse layers and unmasked tokens of
  // logsumexp(router logits)^2: brisk's opt-in (--router_z_loss_coef), 0 (none) by default.
  double z_loss_coef = 0;
  // Switch Transformer's capacity factor (--moe_capacity_factor): each expert computes at most
  // ceil(factor x tokens x top_k / experts) of a micro-batch's routed pairs, the rest dropped. 0:
  // dropless, as the architectures define them.
  double capacity_factor = 0;
  // Qwen2-MoE: layer l is sparse where (l + 1) % sparse_step == 0 and l is not in dense_layers
  // (decoder_sparse_step, mlp_only_layers); its dense layers' MLP is intermediate_size wide.
  int64_t sparse_step = 1;
  std::vector<int64_t> dense_layers;
  // Expert parallelism: this config is rank `expert_rank`'s of `expert_ranks`, which holds experts
  // [first_expert(), first_expert() + local_experts()) (named by their index in the whole).
  int expert_rank = 0, expert_ranks = 1;
  bool sparse(int64_t layer) const;
  int64_t local_experts() const { return experts / expert_ranks; }
  int64_t first_expert() const { return local_experts() * expert_rank; }
};

struct ModelConfig {
  ModelType model_type = ModelType::bert;
  // The architecture's usual task (bert, distilbert: sequence classification; gpt2: causal LM),
  // the masked-LM head when the config's `architectures` names it (as transformers' pipelines
  // choose), or masked LM when asked for (use_masked_lm).
  ModelTask task = ModelTask::sequence_classification;
  // The task was taken from `architectures`, not asked for: labelled files still make a
  // classification run, as run_glue loads any checkpoint as a classifier (train/file_data).
  bool task_from_architectures = false;
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t num_layers = 0;
  int64_t num_heads = 0;
  // Key/value heads of grouped-query attention (llama family's num_key_value_heads); 0: as many
  // as the query heads.
  int64_t num_kv_heads = 0;
  // The llama family's explicit head_dim (heads * head_dim may differ from hidden_size); 0:
  // hidden_size / num_heads.
  int64_t explicit_head_dim = 0;
  int64_t intermediate_size = 0;
  int64_t max_position_embeddings = 0;
  int64_t type_vocab_size = 0;  // bert
  // The word embedding's padding_idx (bert, distilbert): that row gets no gradient from the
  // embedding and starts at zero, as nn.Embedding(padding_idx=pad_token_id). -1: none.
  int64_t pad_token_id = -1;
  bool causal = false;                // gpt2; bert with is_decoder
  bool sinusoidal_positions = false;  // distilbert sinusoidal_pos_embds: the initial table
  bool tied_lm_head = true;           // gpt2 tie_word_embeddings
  // gpt2: scores scaled by 1/sqrt(head_dim) (scale_attn_weights) and by 1/(layer+1)
  // (scale_attn_by_inverse_layer_idx).
  bool scale_by_head_dim = true;
  bool scale_by_inverse_layer = false;
  // The llama family: rotary positions and which linear layers have biases (layer_norm_eps is
  // rms_norm_eps there).
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  bool qkv_bias = true;       // llama attention_bias; qwen2: always
  bool attn_out_bias = true;  // llama attention_bias; qwen2: never
  bool mlp_bias = true;       // llama mlp_bias; mistral, qwen2: never
  // Mistral's sliding_window (Qwen2's with use_sliding_window): attention reaches back at most
  // this many tokens; 0: no window. Sequences longer than it are refused.
  int64_t sliding_window = 0;
  int64_t num_labels = 0;  // bert sequence classification
  // bert: one output trained with the squared error (transformers' problem_type "regression",
  // which num_labels 1 implies), instead of classes under cross-entropy.
  bool regression = false;
  float layer_norm_eps = 1e-12f;
  float hidden_dropout = 0.1f;  // bert hidden_dropout_prob, gpt2 resid_pdrop, distilbert dropout
  // After the attention sublayer's output projection (distilbert has none there).
  float attention_output_dropout = 0.1f;
  float attention_dropout = 0.1f;   // attention_probs_dropout_prob / attn_pdrop
  float embedding_dropout = 0.1f;   // bert hidden_dropout_prob, gpt2 embd_pdrop
  float classifier_dropout = 0.1f;  // distilbert seq_classif_dropout
  Activation activation = Activation::gelu;
  MoeConfig moe;
  // OLMoE: an RMSNorm over the whole query projection and one over the key projection, before
  // the rotary embedding.
  bool qk_norm = false;
  // Tensor parallelism: this config is rank `tensor_rank`'s share of `tensor_ranks`
  // (tensor_parallel_share): num_heads, num_kv_heads and intermediate_size are the share's.
  int tensor_rank = 0, tensor_ranks = 1;
  // Key/value heads fewer than the tensor ranks: each is held by this many tensor ranks in a row
  // (Megatron's replication; the share's num_kv_heads is 1). 1 when the ranks split them.
  int kv_head_copies = 1;
  // Megatron's sequence parallelism (--tp_sequence_parallel): between the blocks' tensor-parallel
  // products the residual stream holds this tensor rank's slice of the tokens.
  bool tensor_slices_tokens = false;
  // Pipeline parallelism: this config is stage `pipeline_stage`'s of `pipeline_stages`
  // (pipeline_share): its model holds blocks [first_layer(), end_layer()) of num_layers, the
  // embeddings on the first stage and the head on the last (a tied head's embeddings there too).
  int pipeline_stage = 0, pipeline_stages = 1;
  // Sequence parallelism: this config is rank `sequence_rank`'s of `sequence_ranks`
  // (sequence_parallel_share): its model holds that rank's tokens of every sequence.
  int sequence_rank = 0, sequence_ranks = 1;
  nlohmann::json source;  // the JSON it was read from, written back into checkpoints

  int64_t head_dim() const {
    return explicit_head_dim > 0 ? explicit_head_dim : hidden_size / num_heads;
  }
  int64_t kv_heads() const { return num_kv_heads > 0 ? num_kv_heads : num_heads; }
  // Width of the packed query/key/value projection, (H + 2K) * D, and of the attention output.
  int64_t qkv_width() const { return (num_heads + 2 * kv_heads()) * head_dim(); }
  int64_t attention_width() const { return num_heads * head_dim(); }
  int64_t first_layer() const { return num_layers / pipeline_stages * pipeline_stage; }
  int64_t end_layer() const { return first_layer() + num_layers / pipeline_stages; }
  bool first_stage() const { return pipeline_stage == 0; }
  bool last_stage() const { return pipeline_stage == pipeline_stages - 1; }
  std::string type_name() const;  // config.json's model_type
};

// Validates and converts; `origin` names the source in error messages.
ModelConfig config_from_json(const nlohmann::json& j, const std::string& origin);
ModelConfig load_config(const std::string& path);
// A built-in name ("bert-base-uncased", "bert-large-uncased", "gpt2", "gpt2-medium", the llama
// family's "smollm2-135m", "llama-2-7b", "mistral-7b", "qwen2-0.5b",
// "bert-tiny", "gpt2-tiny"), or a path to a config.json or to a folder holding one; an existing
// path wins over a built-in name.
ModelConfig resolve_config(const std::string& name_or_path);
std::vector<std::string> builtin_config_names();
// Whether resolve_config takes `name_or_path` for a built-in configuration (no such path exists).
bool is_builtin_config(const std::string& name_or_path);
// Whether the architecture has a masked-LM head in brisk (BertForMaskedLM, DistilBertForMaskedLM).
bool has_masked_lm_head(const ModelConfig& c);
// Makes `c` a masked language model (BertForMaskedLM or DistilBertForMaskedLM, as run_mlm loads
// AutoModelForMaskedLM); throws for architectures without one.
void use_masked_lm(ModelConfig& c);
// A mixture of experts' opt-in routing options: ST-MoE's router z-loss at `z_loss_coef`
// (--router_z_loss_coef) and Switch's `capacity_factor` (--moe_capacity_factor); each >= 0, 0:
// none. Throws for a dense model given either.
void use_router_options(ModelConfig& c, double z_loss_coef, double capacity_factor = 0);
// Makes a bert or distilbert `c` a sequence classifier again (its usual task), as run_glue loads
// any checkpoint; throws for other architectures.
void use_sequence_classification(ModelConfig& c);
// Tensor parallelism (--tp_size): rank `rank` of `ranks`'s share of `c`: its query heads, key/value
// heads and MLP width (a 1/ranks part of each; head_dim kept). Refuses, naming the count and the
// config key, a count that `ranks` does not divide.
ModelConfig tensor_parallel_share(const ModelConfig& c, int rank, int ranks);
// Pipeline parallelism (--pp_size): stage `stage` of `stages`'s share of `c`, an equal run of its
// blocks. Refuses, naming the config key, a block count that `stages` does not divide.
ModelConfig pipeline_share(const ModelConfig& c, int stage, int stages);
// Sequence parallelism (--sp_size): rank `rank` of `ranks`'s share of `c` (its tokens of every
// sequence; attention on every token of heads / ranks; a sequence classifier's head and loss on
// the rank holding the first token). Refuses, naming the config key, head counts (of this tensor
// rank's share) that `ranks` does not divide.
ModelConfig sequence_parallel_share(const ModelConfig& c, int rank, int ranks);
// Expert parallelism (--ep_size): rank `rank` of `ranks`'s share of `c`, an equal run of every
// sparse layer's experts. Refuses a dense model, and an expert count that `ranks` does not divide
// (naming the config key).
ModelConfig expert_parallel_share(const ModelConfig& c, int rank, int ranks);
// Sets every dropout probability to zero (for tests and exact comparisons).
void disable_dropout(ModelConfig& c);

}  // namespace brisk
