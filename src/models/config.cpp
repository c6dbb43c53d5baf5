// config.json parsing with one clear message per problem, and the built-in configurations.
#include "models/config.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>

#include "core/error.h"
#include "core/json_file.h"

namespace brisk {

namespace {
using json = nlohmann::json;

struct Reader {
  const json& j;
  const std::string& origin;

  bool has(const char* key) const { return j.contains(key) && !j[key].is_null(); }

  // A whole number in [1, max]; the bounds (config.h) sit far above any real model and keep every
  // size derived from them inside checked 64-bit arithmetic.
  int64_t size(const char* key, int64_t max) const {
    BRISK_CHECK(has(key), origin, ": missing required key \"", key, "\"");
    const json& v = j[key];
    BRISK_CHECK(v.is_number_integer(), origin, ": \"", key, "\" must be an integer, got ",
                excerpt(v.dump()));
    BRISK_CHECK(v.is_number_unsigned() || v.get<int64_t>() > 0, origin, ": \"", key,
                "\" must be positive, got ", v.get<int64_t>());
    BRISK_CHECK(v.get<uint64_t>() > 0 && v.get<uint64_t>() <= static_cast<uint64_t>(max), origin,
                ": \"", key, "\" = ", excerpt(v.dump()), " is outside [1, ", max,
                "], brisk's limit");
    return v.get<int64_t>();
  }
  int64_t size_or(const char* key, int64_t fallback, int64_t max) const {
    return has(key) ? size(key, max) : fallback;
  }
  float prob_or(const char* key, float fallback) const {
    if (!has(key)) return fallback;
    BRISK_CHECK(j[key].is_number(), origin, ": \"", key, "\" must be a number");
    const double p = j[key].get<double>();
    BRISK_CHECK(p >= 0.0 && p < 1.0, origin, ": \"", key, "\" = ", p, " is outside [0, 1)");
    return static_cast<float>(p);
  }
  // Layer-norm epsilons: in (0, 1].
  float epsilon_or(const char* key, float fallback) const {
    if (!has(key)) return fallback;
    BRISK_CHECK(j[key].is_number() && j[key].get<double>() > 0 && j[key].get<double>() <= 1, origin,
                ": \"", key, "\" must be a number in (0, 1]");
    return j[key].get<float>();
  }
  std::string string_or(const char* key, const std::string& fallback) const {
    if (!has(key)) return fallback;
    BRISK_CHECK(j[key].is_string(), origin, ": \"", key, "\" must be a string");
    return j[key].get<std::string>();
  }
  // A positive number float32 holds (rope_theta, scaling factors: the rotary tables are
  // float32).
  double positive_or(const char* key, double fallback) const {
    if (!has(key)) return fallback;
    BRISK_CHECK(j[key].is_number() && j[key].get<double>() > 0 &&
                    j[key].get<double>() <= std::numeric_limits<float>::max(),
                origin, ": \"", key, "\" must be a positive number float32 holds, got ",
                excerpt(j[key].dump()));
    return j[key].get<double>();
  }
  // A number in [0, max] (loss coefficients: float32 scales the loss and its gradients by them).
  double nonnegative_or(const char* key, double fallback, double max = kMaxCoefficient) const {
    if (!has(key)) return fallback;
    BRISK_CHECK(j[key].is_number() && j[key].get<double>() >= 0 && j[key].get<double>() <= max,
                origin, ": \"", key, "\" must be a number in [0, ", max, "], got ",
                excerpt(j[key].dump()));
    return j[key].get<double>();
  }
  bool flag_or(const char* key, bool fallback) const {
    if (!has(key)) return fallback;
    BRISK_CHECK(j[key].is_boolean(), origin, ": \"", key, "\" must be true or false");
    return j[key].get<bool>();
  }
};

// transformers' ACT2FN names. gelu_new, gelu_pytorch_tanh and gelu_fast are one function (the
// tanh approximation) written three ways; swish is silu's older name.
Activation activation_from(const std::string& name, const std::string& origin) {
  if (name == "gelu") return Activation::gelu;
  if (name == "gelu_new" || name == "gelu_pytorch_tanh" || name == "gelu_fast")
    return Activation::gelu_tanh;
  if (name == "relu") return Activation::relu;
  if (name == "silu" || name == "swish") return Activation::silu;
  if (name == "quick_gelu") return Activation::quick_gelu;
  BRISK_FAIL(origin, ": unsupported activation \"", excerpt(name),
             "\" (supported: gelu, gelu_new, gelu_pytorch_tanh, gelu_fast, relu, silu, swish, "
             "quick_gelu)");
}

// The label count and loss of a sequence classifier, as transformers chooses them.
void read_labels(const Reader& r, ModelConfig& c) {
  // transformers stores the label count as id2label; num_labels is accepted too.
  if (r.has("num_labels"))
    c.num_labels = r.size("num_labels", kMaxLabels);
  else if (r.has("id2label") && r.j["id2label"].is_object() && !r.j["id2label"].empty())
    c.num_labels = static_cast<int64_t>(r.j["id2label"].size());
  else
    c.num_labels = 2;
  // As transformers chooses the loss: problem_type when given, else regression for one label.
  const std::string problem = r.string_or("problem_type", "");
  BRISK_CHECK(
      problem.empty() || problem == "regression" || problem == "single_label_classification",
      r.origin, ": problem_type \"", excerpt(problem),
      "\" is not supported (supported: regression, single_label_classification)");
  c.regression = problem == "regression" || (problem.empty() && c.num_labels == 1);
  BRISK_CHECK(!c.regression || c.num_labels == 1, r.origin, ": regression needs num_labels 1, not ",
              c.num_labels);
  BRISK_CHECK(c.regression || c.num_labels >= 2, r.origin,
              ": single-label classification needs at least 2 labels, not ", c.num_labels);
}

// pad_token_id as the word embedding's padding_idx: absent or null means none.
void read_pad_token(const Reader& r, ModelConfig& c, int64_t fallback) {
  c.pad_token_id = fallback;
  if (!r.has("pad_token_id")) {
    if (r.j.contains("pad_token_id")) c.pad_token_id = -1;  // explicitly null
    return;
  }
  const json& v = r.j["pad_token_id"];
  BRISK_CHECK(v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() < c.vocab_size,
              r.origin, ": pad_token_id ", excerpt(v.dump()), " is not a token id in [0, ",
              c.vocab_size, ")");
  c.pad_token_id = v.get<int64_t>();
}

// A key transformers honors that brisk does not implement, when it is set to anything but the
// value that means "off".
void refuse_flag(const Reader& r, const char* key, const char* why) {
  BRISK_CHECK(!r.flag_or(key, false), r.origin, ": \"", key, "\": true is not supported (", why,
              ")");
}

void read_bert(const Reader& r, ModelConfig& c) {
  c.vocab_size = r.size("vocab_size", kMaxVocab);
  c.hidden_size = r.size("hidden_size", kMaxHidden);
  c.num_layers = r.size("num_hidden_layers", kMaxLayers);
  c.num_heads = r.size("num_attention_heads", kMaxHeads);
  c.intermediate_size = r.size("intermediate_size", kMaxIntermediate);
  c.max_position_embeddings = r.size("max_position_embeddings", kMaxPositions);
  c.type_vocab_size = r.size_or("type_vocab_size", 2, kMaxTypes);
  c.layer_norm_eps = r.epsilon_or("layer_norm_eps", 1e-12f);
  c.hidden_dropout = r.prob_or("hidden_dropout_prob", 0.1f);
  c.attention_output_dropout = c.hidden_dropout;
  c.attention_dropout = r.prob_or("attention_probs_dropout_prob", 0.1f);
  c.embedding_dropout = c.hidden_dropout;
  c.classifier_dropout = r.prob_or("classifier_dropout", c.hidden_dropout);
  c.activation = activation_from(r.string_or("hidden_act", "gelu"), r.origin);
  const std::string pos = r.string_or("position_embedding_type", "absolute");
  BRISK_CHECK(pos == "absolute", r.origin, ": position_embedding_type \"", excerpt(pos),
              "\" is not supported (only \"absolute\")");
  // BertModel masks its self-attention causally as a decoder.
  c.causal = r.flag_or("is_decoder", false);
  refuse_flag(r, "add_cross_attention", "brisk's BERT has no cross-attention layers");
  read_pad_token(r, c, 0);
  read_labels(r, c);
}

// DistilBertForSequenceClassification: six-layer BERT without token types, with a
// pre_classifier + ReLU head. transformers maps hidden_size/num_attention_heads/
// num_hidden_layers onto dim/n_heads/n_layers, so both spellings are read.
void read_distilbert(const Reader& r, ModelConfig& c) {
  auto either = [&](const char* key, const char* alias, int64_t fallback, int64_t max) {
    return r.has(key) ? r.size(key, max) : r.size_or(alias, fallback, max);
  };
  c.vocab_size = r.size_or("vocab_size", 30522, kMaxVocab);
  c.hidden_size = either("dim", "hidden_size", 768, kMaxHidden);
  c.num_layers = either("n_layers", "num_hidden_layers", 6, kMaxLayers);
  c.num_heads = either("n_heads", "num_attention_heads", 12, kMaxHeads);
  c.intermediate_size = r.size_or("hidden_dim", 4 * c.hidden_size, kMaxIntermediate);
  c.max_position_embeddings = r.size_or("max_position_embeddings", 512, kMaxPositions);
  c.layer_norm_eps = 1e-12f;  // fixed in DistilBERT's code
  c.hidden_dropout = r.prob_or("dropout", 0.1f);
  c.embedding_dropout = c.hidden_dropout;
  c.attention_output_dropout = 0.0f;  // DistilBERT's attention has no dropout after out_lin
  c.attention_dropout = r.prob_or("attention_dropout", 0.1f);
  c.classifier_dropout = r.prob_or("seq_classif_dropout", 0.2f);
  c.activation = activation_from(r.string_or("activation", "gelu"), r.origin);
  c.sinusoidal_positions = r.flag_or("sinusoidal_pos_embds", false);
  read_pad_token(r, c, 0);
  read_labels(r, c);
}

void read_gpt2(const Reader& r, ModelConfig& c) {
  c.vocab_size = r.size("vocab_size", kMaxVocab);
  c.hidden_size = r.size("n_embd", kMaxHidden);
  c.num_layers = r.size("n_layer", kMaxLayers);
  c.num_heads = r.size("n_head", kMaxHeads);
  c.intermediate_size = r.size_or("n_inner", 4 * c.hidden_size, kMaxIntermediate);
  c.max_position_embeddings = r.size("n_positions", kMaxPositions);
  c.layer_norm_eps = r.epsilon_or("layer_norm_epsilon", 1e-5f);
  c.hidden_dropout = r.prob_or("resid_pdrop", 0.1f);
  c.attention_output_dropout = c.hidden_dropout;
  c.attention_dropout = r.prob_or("attn_pdrop", 0.1f);
  c.embedding_dropout = r.prob_or("embd_pdrop", 0.1f);
  c.classifier_dropout = 0.0f;
  c.activation = activation_from(r.string_or("activation_function", "gelu_new"), r.origin);
  c.causal = true;
  c.tied_lm_head = r.flag_or("tie_word_embeddings", true);
  c.scale_by_head_dim = r.flag_or("scale_attn_weights", true);
  c.scale_by_inverse_layer = r.flag_or("scale_attn_by_inverse_layer_idx", false);
  // reorder_and_upcast_attn computes the scores in float32 under autocast: brisk's attention
  // always does, so it is honored as it stands.
  r.flag_or("reorder_and_upcast_attn", false);
  refuse_flag(r, "add_cross_attention", "brisk's GPT-2 has no cross-attention layers");
}

// Rotary embeddings: transformers 5's rope_parameters (rope_theta inside), or transformers 4's
// top-level rope_theta with an optional rope_scaling object.
void read_rope(const Reader& r, ModelConfig& c) {
  c.rope_theta = r.positive_or("rope_theta", 10000.0);
  const char* key = r.has("rope_parameters") ? "rope_parameters" : "rope_scaling";
  if (!r.has(key)) return;
  const json& p = r.j[key];
  const std::string where = r.origin + ": " + key;
  BRISK_CHECK(p.is_object(), where, " must be an object");
  const Reader rope{p, where};
  BRISK_CHECK(rope.has("rope_type") || rope.has("type") || rope.has("rope_theta"), where,
              " names no rope_type (rope parameters per attention type are not supported)");
  c.rope_theta = rope.positive_or("rope_theta", c.rope_theta);
  const std::string type = rope.string_or("rope_type", rope.string_or("type", "default"));
  try {
    c.rope_scaling.type = rope_type_from_name(type);
  } catch (const Error& e) {
    BRISK_FAIL(where, ": ", e.what());
  }
  RopeScaling& s = c.rope_scaling;
  if (s.type == RopeScaling::Type::none) return;
  BRISK_CHECK(rope.has("factor"), where, ": rope_type \"", type, "\" needs \"factor\"");
  s.factor = rope.positive_or("factor", 1.0);
  if (s.type != RopeScaling::Type::llama3) return;
  for (const char* k : {"low_freq_factor", "high_freq_factor", "original_max_position_embeddings"})
    BRISK_CHECK(rope.has(k), where, ": rope_type \"llama3\" needs \"", k, "\"");
  s.low_freq_factor = rope.positive_or("low_freq_factor", 1.0);
  s.high_freq_factor = rope.positive_or("high_freq_factor", 4.0);
  BRISK_CHECK(s.high_freq_factor > s.low_freq_factor, where,
              ": high_freq_factor must exceed low_freq_factor");
  s.original_max_position_embeddings = rope.size("original_max_position_embeddings", kMaxPositions);
}

// The decoder family's defaults where a config leaves a key out (transformers' config classes;
// kv_heads 0: as many as the query heads).
struct DecoderDefaults {
  int64_t vocab, hidden, intermediate, layers, heads, kv_heads, positions;
  float eps;
};
DecoderDefaults decoder_defaults(ModelType t) {
  switch (t) {
    case ModelType::mistral:
      return {32000, 4096, 14336, 32, 32, 0, 4096 * 32, 1e-6f};
    case ModelType::qwen2:
      return {151936, 4096, 11008, 32, 32, 0, 32768, 1e-6f};
    case ModelType::mixtral:
      return {32000, 4096, 14336, 32, 32, 8, 4096 * 32, 1e-5f};
    case ModelType::qwen2_moe:
      return {151936, 2048, 5632, 24, 16, 0, 32768, 1e-6f};
    case ModelType::olmoe:
      return {50304, 2048, 2048, 16, 16, 0, 4096, 1e-5f};
    default:
      return {32000, 4096, 11008, 32, 32, 0, 2048, 1e-6f};
  }
}

// LlamaForCausalLM, MistralForCausalLM and Qwen2ForCausalLM: the same decoder (RMSNorm, rotary
// positions, SwiGLU MLP, grouped-query attention); they differ in biases and defaults. The
// mixture-of-experts decoders share it (read_moe reads their experts).
void read_llama(const Reader& r, ModelConfig& c) {
  const ModelType t = c.model_type;
  const DecoderDefaults d = decoder_defaults(t);
  c.causal = true;
  c.vocab_size = r.size_or("vocab_size", d.vocab, kMaxVocab);
  c.hidden_size = r.size_or("hidden_size", d.hidden, kMaxHidden);
  c.intermediate_size = r.size_or("intermediate_size", d.intermediate, kMaxIntermediate);
  c.num_layers = r.size_or("num_hidden_layers", d.layers, kMaxLayers);
  c.num_heads = r.size_or("num_attention_heads", d.heads, kMaxHeads);
  c.num_kv_heads =
      r.size_or("num_key_value_heads", d.kv_heads > 0 ? d.kv_heads : c.num_heads, kMaxHeads);
  BRISK_CHECK(c.num_heads % c.num_kv_heads == 0, r.origin, ": num_attention_heads ", c.num_heads,
              " is not a multiple of num_key_value_heads ", c.num_kv_heads);
  if (r.has("head_dim")) {
    c.explicit_head_dim = r.size("head_dim", kMaxHidden);
  } else {
    BRISK_CHECK(c.hidden_size % c.num_heads == 0, r.origin, ": hidden size ", c.hidden_size,
                " is not divisible by the number of attention heads ", c.num_heads,
                " (and no head_dim is given)");
  }
  BRISK_CHECK(c.head_dim() % 2 == 0, r.origin, ": head_dim ", c.head_dim(),
              " is odd; rotary embeddings turn pairs of channels");
  c.max_position_embeddings = r.size_or("max_position_embeddings", d.positions, kMaxPositions);
  c.layer_norm_eps = r.epsilon_or("rms_norm_eps", d.eps);
  const std::string act = r.string_or("hidden_act", "silu");
  BRISK_CHECK(activation_from(act, r.origin) == Activation::silu, r.origin, ": hidden_act \"",
              excerpt(act), "\" is not supported for ", c.type_name(),
              " (brisk's gated MLP is SwiGLU: silu)");
  c.activation = Activation::silu;
  c.tied_lm_head = r.flag_or("tie_word_embeddings", false);
  c.hidden_dropout = c.attention_output_dropout = c.embedding_dropout = 0.0f;
  c.classifier_dropout = 0.0f;
  c.attention_dropout = r.prob_or("attention_dropout", 0.0f);
  if (t == ModelType::qwen2 || t == ModelType::qwen2_moe) {
    c.qkv_bias = t == ModelType::qwen2 || r.flag_or("qkv_bias", true);
    c.attn_out_bias = c.mlp_bias = false;
  } else {
    // Mistral's config has neither key; its layers have no biases.
    c.qkv_bias = c.attn_out_bias = r.flag_or("attention_bias", false);
    c.mlp_bias = r.flag_or("mlp_bias", false);
  }
  read_rope(r, c);
  // Sliding-window attention (Mistral; Qwen2 with use_sliding_window) only differs from full
  // attention on sequences longer than the window: the model refuses those when it is planned.
  // Mixtral's window is null by default.
  const bool qwen = t == ModelType::qwen2 || t == ModelType::qwen2_moe;
  const bool windowed = t == ModelType::mistral || t == ModelType::mixtral ||
                        (qwen && r.flag_or("use_sliding_window", false));
  if (windowed && r.has("sliding_window"))
    c.sliding_window = r.size("sliding_window", kMaxPositions);
  else if (windowed && t != ModelType::mixtral && !r.j.contains("sliding_window"))
    c.sliding_window = 4096;  // the configs' default; null means no window
  // Validated only: pretraining_tp is how transformers slices its products, the result the same.
  r.size_or("pretraining_tp", 1, kMaxHeads);
  read_pad_token(r, c, t == ModelType::olmoe ? 1 : -1);
}

// Qwen2-MoE's mlp_only_layers: layer indices in [0, layers).
std::vector<int64_t> read_layer_list(const Reader& r, const char* key, int64_t layers) {
  std::vector<int64_t> out;
  if (!r.has(key)) return out;
  const json& v = r.j[key];
  BRISK_CHECK(v.is_array(), r.origin, ": \"", key, "\" must be a list of layer indices");
  for (const json& e : v) {
    BRISK_CHECK(e.is_number_integer() && e.get<int64_t>() >= 0 && e.get<int64_t>() < layers,
                r.origin, ": \"", key, "\" holds ", excerpt(e.dump()),
                ", not a layer index in [0, ", layers, ")");
    out.push_back(e.get<int64_t>());
  }
  return out;
}

// The experts of MixtralForCausalLM, Qwen2MoeForCausalLM and OlmoeForCausalLM (transformers'
// names and defaults); what brisk does not implement is refused by name.
void read_moe(const Reader& r, ModelConfig& c) {
  const ModelType t = c.model_type;
  MoeConfig& m = c.moe;
  const bool mixtral = t == ModelType::mixtral, qwen = t == ModelType::qwen2_moe;
  m.experts = r.size_or(mixtral ? "num_local_experts" : "num_experts",
                        mixtral ? 8 : (qwen ? 60 : 64), kMaxHeads);
  m.top_k = r.size_or("num_experts_per_tok", mixtral ? 2 : (qwen ? 4 : 8), kMaxHeads);
  BRISK_CHECK(m.top_k <= m.experts, r.origin, ": num_experts_per_tok ", m.top_k, " exceeds the ",
              m.experts, " experts");
  m.inner = qwen ? r.size_or("moe_intermediate_size", 1408, kMaxIntermediate) : c.intermediate_size;
  if (qwen) m.shared_inner = r.size_or("shared_expert_intermediate_size", 5632, kMaxIntermediate);
  m.normalize = mixtral || r.flag_or("norm_topk_prob", false);
  m.aux_loss = r.flag_or("output_router_logits", false);
  m.aux_loss_coef = r.nonnegative_or("router_aux_loss_coef", mixtral || qwen ? 0.001 : 0.01);
  if (qwen) {
    m.sparse_step = r.size_or("decoder_sparse_step", 1, kMaxLayers);
    m.dense_layers = read_layer_list(r, "mlp_only_layers", c.num_layers);
    int64_t sparse = 0;
    for (int64_t l = 0; l < c.num_layers; ++l) sparse += m.sparse(l) ? 1 : 0;
    BRISK_CHECK(sparse > 0, r.origin, ": decoder_sparse_step ", m.sparse_step,
                " and mlp_only_layers leave none of the ", c.num_layers,
                " layers sparse: a mixture of experts without experts (a dense model is a qwen2 "
                "config)");
  }
  if (mixtral)
    BRISK_CHECK(
        r.nonnegative_or("router_jitter_noise", 0.0) == 0.0, r.origin,
        ": \"router_jitter_noise\" above 0 is not supported (brisk's router adds no noise)");
  if (t == ModelType::olmoe) {
    c.qk_norm = true;
    BRISK_CHECK(!r.has("clip_qkv"), r.origin,
                ": \"clip_qkv\" is not supported (brisk does not clip the query/key/value "
                "projections)");
  }
}

// A BERT base-like config.json for sequence classification, at the given sizes.
json bert_json(int64_t vocab, int64_t hidden, int64_t layers, int64_t heads, int64_t inter) {
  return json{{"model_type", "bert"},
              {"architectures", {"BertForSequenceClassification"}},
              {"vocab_size", vocab},
              {"hidden_size", hidden},
              {"num_hidden_layers", layers},
              {"num_attention_heads", heads},
              {"intermediate_size", inter},
              {"hidden_act", "gelu"},
              {"hidden_dropout_prob", 0.1},
              {"attention_probs_dropout_prob", 0.1},
              {"max_position_embeddings", 512},
              {"type_vocab_size", 2},
              {"initializer_range", 0.02},
              {"layer_norm_eps", 1e-12},
              {"pad_token_id", 0},
              {"position_embedding_type", "absolute"},
              {"id2label", {{"0", "LABEL_0"}, {"1", "LABEL_1"}}},
              {"label2id", {{"LABEL_0", 0}, {"LABEL_1", 1}}}};
}

// A GPT-2 config.json (its vocabulary and defaults), at the given sizes.
json gpt2_json(int64_t embd, int64_t layers, int64_t heads, int64_t positions) {
  return json{{"model_type", "gpt2"},
              {"architectures", {"GPT2LMHeadModel"}},
              {"vocab_size", 50257},
              {"n_embd", embd},
              {"n_layer", layers},
              {"n_head", heads},
              {"n_positions", positions},
              {"n_inner", nullptr},
              {"activation_function", "gelu_new"},
              {"resid_pdrop", 0.1},
              {"embd_pdrop", 0.1},
              {"attn_pdrop", 0.1},
              {"layer_norm_epsilon", 1e-5},
              {"initializer_range", 0.02},
              {"bos_token_id", 50256},
              {"eos_token_id", 50256},
              {"tie_word_embeddings", true}};
}

// distilbert-base-uncased's config.json, for sequence classification.
json distilbert_json() {
  return json{{"model_type", "distilbert"},
              {"architectures", {"DistilBertForSequenceClassification"}},
              {"vocab_size", 30522},
              {"dim", 768},
              {"n_layers", 6},
              {"n_heads", 12},
              {"hidden_dim", 3072},
              {"activation", "gelu"},
              {"dropout", 0.1},
              {"attention_dropout", 0.1},
              {"seq_classif_dropout", 0.2},
              {"max_position_embeddings", 512},
              {"sinusoidal_pos_embds", false},
              {"initializer_range", 0.02},
              {"pad_token_id", 0},
              {"id2label", {{"0", "LABEL_0"}, {"1", "LABEL_1"}}},
              {"label2id", {{"LABEL_0", 0}, {"LABEL_1", 1}}}};
}

// The llama family's published configs (their config.json keys and values).
json llama_json(const char* type, const char* cls, int64_t vocab, int64_t hidden, int64_t layers,
                int64_t heads, int64_t kv_heads, int64_t inter, int64_t positions, double theta,
                double eps, bool tied) {
  json j{{"model_type", type},
         {"architectures", {cls}},
         {"vocab_size", vocab},
         {"hidden_size", hidden},
         {"num_hidden_layers", layers},
         {"num_attention_heads", heads},
         {"num_key_value_heads", kv_heads},
         {"intermediate_size", inter},
         {"max_position_embeddings", positions},
         {"rope_theta", theta},
         {"rms_norm_eps", eps},
         {"hidden_act", "silu"},
         {"initializer_range", 0.02},
         {"tie_word_embeddings", tied}};
  return j;
}

// The built-in config.json of `name`, null where there is none.
json builtin_json(const std::string& name) {
  if (name == "distilbert-base-uncased") return distilbert_json();
  if (name == "smollm2-135m")
    return llama_json("llama", "LlamaForCausalLM", 49152, 576, 30, 9, 3, 1536, 8192, 100000.0, 1e-5,
                      true);
  if (name == "llama-2-7b")
    return llama_json("llama", "LlamaForCausalLM", 32000, 4096, 32, 32, 32, 11008, 4096, 10000.0,
                      1e-5, false);
  if (name == "mistral-7b") {
    json j = llama_json("mistral", "MistralForCausalLM", 32000, 4096, 32, 32, 8, 14336, 32768,
                        10000.0, 1e-5, false);
    j["sliding_window"] = 4096;
    return j;
  }
  if (name == "qwen2-0.5b") {
    json j = llama_json("qwen2", "Qwen2ForCausalLM", 151936, 896, 24, 14, 2, 4864, 32768, 1000000.0,
                        1e-6, true);
    j["use_sliding_window"] = false;
    return j;
  }
  if (name == "bert-base-uncased") return bert_json(30522, 768, 12, 12, 3072);
  if (name == "bert-large-uncased") return bert_json(30522, 1024, 24, 16, 4096);
  if (name == "bert-tiny") return bert_json(30522, 64, 2, 2, 128);
  if (name == "gpt2") return gpt2_json(768, 12, 12, 1024);
  if (name == "gpt2-medium") return gpt2_json(1024, 24, 16, 1024);
  if (name == "gpt2-tiny") return gpt2_json(64, 2, 2, 256);
  return json();
}
}  // namespace

std::vector<std::string> builtin_config_names() {
  return {"bert-base-uncased",
          "bert-large-uncased",
          "bert-tiny",
          "distilbert-base-uncased",
          "gpt2",
          "gpt2-medium",
          "gpt2-tiny",
          "smollm2-135m",
          "llama-2-7b",
          "mistral-7b",
          "qwen2-0.5b"};
}

namespace {
// Whether `architectures` (transformers' class names the weights were saved from) names a
// masked-LM head ("...ForMaskedLM"); null or absent names none.
bool names_masked_lm_head(const Reader& r) {
  if (!r.has("architectures")) return false;
  const json& names = r.j["architectures"];
  BRISK_CHECK(names.is_array() && std::all_of(names.begin(), names.end(),
                                              [](const json& n) { return n.is_string(); }),
              r.origin, ": \"architectures\" must be a list of class names");
  const std::string suffix = "ForMaskedLM";
  return std::any_of(names.begin(), names.end(), [&](const json& n) {
    const std::string& s = n.get_ref<const std::string&>();
    return s.size() >= suffix.size() &&
           s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
  });
}
}  // namespace

ModelConfig config_from_json(const json& j, const std::string& origin) {
  BRISK_CHECK(j.is_object(), origin, ": a model config must be a JSON object");
  Reader r{j, origin};
  BRISK_CHECK(r.has("model_type"), origin, ": missing required key \"model_type\"");
  const std::string type = r.string_or("model_type", "");
  ModelConfig c;
  if (type == "bert") {
    c.model_type = ModelType::bert;
    read_bert(r, c);
  } else if (type == "distilbert") {
    c.model_type = ModelType::distilbert;
    read_distilbert(r, c);
  } else if (type == "gpt2") {
    c.model_type = ModelType::gpt2;
    c.task = ModelTask::causal_lm;
    read_gpt2(r, c);
  } else if (type == "llama" || type == "mistral" || type == "qwen2") {
    c.model_type = type == "llama"     ? ModelType::llama
                   : type == "mistral" ? ModelType::mistral
                                       : ModelType::qwen2;
    c.task = ModelTask::causal_lm;
    read_llama(r, c);
  } else if (type == "mixtral" || type == "qwen2_moe" || type == "olmoe") {
    c.model_type = type == "mixtral"     ? ModelType::mixtral
                   : type == "qwen2_moe" ? ModelType::qwen2_moe
                                         : ModelType::olmoe;
    c.task = ModelTask::causal_lm;
    read_llama(r, c);
    read_moe(r, c);
  } else {
    BRISK_FAIL(origin, ": unknown model_type \"", excerpt(type),
               "\" (supported: bert, distilbert, gpt2, llama, mistral, qwen2, mixtral, qwen2_moe, "
               "olmoe)");
  }
  if (has_masked_lm_head(c) && names_masked_lm_head(r)) {
    c.task = ModelTask::masked_lm;
    c.task_from_architectures = true;
  }
  BRISK_CHECK(c.explicit_head_dim > 0 || c.hidden_size % c.num_heads == 0, origin, ": hidden size ",
              c.hidden_size, " is not divisible by the number of attention heads ", c.num_heads);
  c.source = j;
  return c;
}

ModelConfig load_config(const std::string& path) {
  // Real configs are a few KiB and a few levels deep; the bounds keep a hostile file from
  // exhausting the stack (recursive copies) or bloating every checkpoint that copies it.
  return config_from_json(read_json_file(path, "model config"), "model config '" + path + "'");
}

ModelConfig resolve_config(const std::string& name_or_path) {
  namespace fs = std::filesystem;
  // A folder or file of that name wins: a model downloaded into ./gpt2 is the pretrained one.
  if (fs::is_directory(name_or_path))
    return load_config((fs::path(name_or_path) / "config.json").string());
  if (fs::exists(name_or_path)) return load_config(name_or_path);
  json j = builtin_json(name_or_path);
  if (!j.is_null()) return config_from_json(j, "built-in config '" + name_or_path + "'");
  BRISK_FAIL("model '", name_or_path,
             "' is no folder or config.json here, and brisk downloads nothing: run "
             "`huggingface-cli download ",
             name_or_path,
             " --local-dir DIR` where a hub is reachable, then give DIR (or name a built-in "
             "configuration: train --help lists them)");
}

bool is_builtin_config(const std::string& name_or_path) {
  return !std::filesystem::exists(name_or_path) && !builtin_json(name_or_path).is_null();
}

std::string ModelConfig::type_name() const {
  switch (model_type) {
    case ModelType::bert:
      return "bert";
    case ModelType::distilbert:
      return "distilbert";
    case ModelType::gpt2:
      return "gpt2";
    case ModelType::llama:
      return "llama";
    case ModelType::mistral:
      return "mistral";
    case ModelType::qwen2:
      return "qwen2";
    case ModelType::mixtral:
      return "mixtral";
    case ModelType::qwen2_moe:
      return "qwen2_moe";
    case ModelType::olmoe:
      return "olmoe";
  }
  return "?";
}

bool MoeConfig::sparse(int64_t layer) const {
  return experts > 0 && (layer + 1) % sparse_step == 0 &&
         std::find(dense_layers.begin(), dense_layers.end(), layer) == dense_layers.end();
}

bool has_masked_lm_head(const ModelConfig& c) {
  return c.model_type == ModelType::bert || c.model_type == ModelType::distilbert;
}

void use_masked_lm(ModelConfig& c) {
  BRISK_CHECK(has_masked_lm_head(c), "masked language modeling (--mlm) needs a bert or distilbert ",
              "model; ", c.type_name(), " has no masked-LM head in brisk");
  c.task = ModelTask::masked_lm;
  c.task_from_architectures = false;
}

void use_router_options(ModelConfig& c, double z_loss_coef, double capacity_factor) {
  const std::pair<const char*, double> options[] = {{"router_z_loss_coef", z_loss_coef},
                                                    {"moe_capacity_factor", capacity_factor}};
  for (const auto& [name, value] : options) {
    BRISK_CHECK(value >= 0 && value <= kMaxCoefficient, name, " must be a number in [0, ",
                kMaxCoefficient, "], got ", value);
    BRISK_CHECK(value == 0 || c.moe.experts > 0, "--", name, " needs a mixture-of-experts model; ",
                c.type_name(), " has no router");
  }
  c.moe.z_loss_coef = z_loss_coef;
  c.moe.capacity_factor = capacity_factor;
}

void use_sequence_classification(ModelConfig& c) {
  BRISK_CHECK(has_masked_lm_head(c), "sequence classification needs a bert or distilbert model; ",
              c.type_name(), " has no classification head in brisk");
  c.task = ModelTask::sequence_classification;
  c.task_from_architectures = false;
}

namespace {
// The config.json key of the query head count.
const char* head_count_key(const ModelConfig& c) {
  return c.model_type == ModelType::gpt2         ? "n_head"
         : c.model_type == ModelType::distilbert ? "n_heads"
                                                 : "num_attention_heads";
}
}  // namespace

ModelConfig tensor_parallel_share(const ModelConfig& c, int rank, int ranks) {
  BRISK_CHECK(ranks >= 1 && rank >= 0 && rank < ranks, "tensor-parallel rank ", rank, " of ",
              ranks);
  BRISK_CHECK(c.tensor_ranks == 1, "internal error: the config is a tensor-parallel share already");
  auto divides = [&](int64_t count, const char* key) {
    BRISK_CHECK(count % ranks == 0, "--tp_size ", ranks, " does not divide the ", c.type_name(),
                " config's ", key, " = ", count,
                " (tensor parallelism splits them evenly across the ranks)");
  };
  divides(c.num_heads, head_count_key(c));
  // Fewer key/value heads than ranks: each goes to ranks / K ranks in a row (their query heads
  // all read it), which the count must divide.
  const int64_t K = c.kv_heads();
  const bool copied = ranks > K;
  if (copied)
    BRISK_CHECK(ranks % K == 0, "--tp_size ", ranks, " is neither a divisor nor a multiple of the ",
                c.type_name(), " config's num_key_value_heads = ", K,
                " (tensor parallelism splits the key/value heads or gives each to as many ranks)");
  else if (K != c.num_heads)
    divides(K, "num_key_value_heads");
  divides(c.intermediate_size, c.model_type == ModelType::gpt2         ? "n_inner"
                               : c.model_type == ModelType::distilbert ? "hidden_dim"
                                                                       : "intermediate_size");
  ModelConfig share = c;
  share.explicit_head_dim = c.head_dim();
  share.num_heads = c.num_heads / ranks;
  share.num_kv_heads = copied ? 1 : K / ranks;
  share.kv_head_copies = copied ? static_cast<int>(ranks / K) : 1;
  share.intermediate_size = c.intermediate_size / ranks;
  share.tensor_rank = rank;
  share.tensor_ranks = ranks;
  return share;
}

ModelConfig expert_parallel_share(const ModelConfig& c, int rank, int ranks) {
  BRISK_CHECK(ranks >= 1 && rank >= 0 && rank < ranks, "expert-parallel rank ", rank, " of ",
              ranks);
  BRISK_CHECK(c.moe.experts > 0, "--ep_size needs a mixture-of-experts model; ", c.type_name(),
              " has no experts");
  BRISK_CHECK(c.moe.experts % ranks == 0, "--ep_size ", ranks, " does not divide the ",
              c.type_name(), " config's ",
              c.model_type == ModelType::mixtral ? "num_local_experts" : "num_experts", " = ",
              c.moe.experts, " (expert parallelism gives each rank as many experts)");
  ModelConfig share = c;
  share.moe.expert_rank = rank;
  share.moe.expert_ranks = ranks;
  return share;
}

ModelConfig sequence_parallel_share(const ModelConfig& c, int rank, int ranks) {
  BRISK_CHECK(ranks >= 1 && rank >= 0 && rank < ranks, "sequence-parallel rank ", rank, " of ",
              ranks);
  BRISK_CHECK(c.sequence_ranks == 1, "internal error: the config is a sequence share already");
  const char* tp = c.tensor_ranks > 1 ? " (per --tp_size rank)" : "";
  BRISK_CHECK(c.num_heads % ranks == 0, "--sp_size ", ranks, " does not divide the ", c.type_name(),
              " config's ", head_count_key(c), " = ", c.num_heads, tp,
              " (sequence parallelism gives each rank as many heads)");
  const int64_t K = c.kv_heads();
  BRISK_CHECK(K % ranks == 0 || ranks % K == 0, "--sp_size ", ranks,
              " is neither a divisor nor a multiple of the ", c.type_name(),
              " config's num_key_value_heads = ", K, tp,
              " (sequence parallelism gives each rank as many key/value heads, or copies one to "
              "as many ranks)");
  ModelConfig share = c;
  share.sequence_rank = rank;
  share.sequence_ranks = ranks;
  return share;
}

ModelConfig pipeline_share(const ModelConfig& c, int stage, int stages) {
  BRISK_CHECK(stages >= 1 && stage >= 0 && stage < stages, "pipeline stage ", stage, " of ",
              stages);
  BRISK_CHECK(c.pipeline_stages == 1, "internal error: the config is a pipeline stage already");
  const char* key = c.model_type == ModelType::gpt2         ? "n_layer"
                    : c.model_type == ModelType::distilbert ? "n_layers"
                                                            : "num_hidden_layers";
  BRISK_CHECK(c.num_layers % stages == 0, "--pp_size ", stages, " does not divide the ",
              c.type_name(), " config's ", key, " = ", c.num_layers,
              " (pipeline parallelism gives each stage as many blocks)");
  ModelConfig share = c;
  share.pipeline_stage = stage;
  share.pipeline_stages = stages;
  return share;
}

void disable_dropout(ModelConfig& c) {
  c.hidden_dropout = c.attention_dropout = c.embedding_dropout = c.classifier_dropout = 0.0f;
  c.attention_output_dropout = 0.0f;
}

}  // namespace brisk
