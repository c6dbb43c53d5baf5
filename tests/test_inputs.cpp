// Bad input ends in a brisk::Error naming the problem, never a crash: configs, batches, weights.
// Also the core pieces those paths rely on (safetensors round trip, 16-bit conversions, plans).
#include <gtest/gtest.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <utility>

#include "core/dtype.h"
#include "core/memory_plan.h"
#include "test_support.h"
#include "trainer_support.h"

namespace brisk::testing {
namespace {

TEST(Inputs, MalformedConfigsAreRefusedWithAClearMessage) {
  expect_error([] { load_config(fixture("bad/not_json.json")); }, "is not valid JSON");
  expect_error([] { load_config(fixture("bad/missing_size.json")); },
               "missing required key \"hidden_size\"");
  expect_error([] { load_config(fixture("bad/negative_size.json")); },
               "\"num_hidden_layers\" must be positive, got -2");
  expect_error([] { load_config(fixture("bad/unknown_type.json")); },
               "unknown model_type \"mamba\"");
  expect_error([] { load_config(fixture("bad/heads_not_dividing.json")); },
               "hidden size 30 is not divisible by the number of attention heads 4");
  expect_error([] { load_config(fixture("bad/does_not_exist.json")); }, "cannot open");
  expect_error([] { resolve_config("no-such-model"); }, "is no folder or config.json here");
  expect_error([] { config_from_json(nlohmann::json::array(), "x"); }, "JSON object");
  expect_error(
      [] {
        config_from_json({{"model_type", "gpt2"}, {"vocab_size", 10.5}}, "x");
      },
      "\"vocab_size\" must be an integer");
}

// A config padded with whitespace past 1 MiB loads: the JSON files' limit is a generous 16 MiB.
TEST(Inputs, AConfigPaddedWithWhitespaceLoads) {
  TempDir dir("padded_config");
  const std::string path = dir / "config.json";
  std::ofstream(path) << R"({"model_type": "gpt2", "vocab_size": 64, "n_embd": 8, "n_layer": 1,)"
                      << std::string(size_t{3} << 20, ' ') << R"("n_head": 2, "n_positions": 16})";
  EXPECT_EQ(load_config(path).vocab_size, 64);
}

// transformers' activation names (hidden_act, activation_function) choose the backend's kinds; an
// unknown one is refused with the list of those brisk accepts.
TEST(Inputs, ActivationNamesAreTransformers) {
  const std::pair<const char*, Activation> names[] = {
      {"gelu", Activation::gelu},           {"gelu_new", Activation::gelu_tanh},
      {"gelu_fast", Activation::gelu_tanh}, {"gelu_pytorch_tanh", Activation::gelu_tanh},
      {"relu", Activation::relu},           {"silu", Activation::silu},
      {"swish", Activation::silu},          {"quick_gelu", Activation::quick_gelu}};
  for (const auto& [name, want] : names) {
    nlohmann::json bert = resolve_config("bert-tiny").source;
    nlohmann::json gpt2 = resolve_config("gpt2-tiny").source;
    bert["hidden_act"] = name;
    gpt2["activation_function"] = name;
    EXPECT_EQ(config_from_json(bert, "bert").activation, want) << name;
    EXPECT_EQ(config_from_json(gpt2, "gpt2").activation, want) << name;
  }
  nlohmann::json gpt2 = resolve_config("gpt2-tiny").source;
  gpt2["activation_function"] = "tanh";
  expect_error([&] { config_from_json(gpt2, "x"); },
               "unsupported activation \"tanh\" (supported: gelu, gelu_new, gelu_pytorch_tanh, "
               "gelu_fast, relu, silu, swish, quick_gelu)");
}

// Config keys transformers honors that brisk does not implement are refused by name; values
// outside what transformers accepts are refused too.
TEST(Inputs, ConfigKeysBriskDoesNotImplementAreRefusedByName) {
  const nlohmann::json bert = load_config(fixture("bert_tiny/config.json")).source;
  const nlohmann::json gpt2 = load_config(fixture("gpt2_tiny/config.json")).source;
  const nlohmann::json distil = load_config(fixture("distilbert_tiny/config.json")).source;
  auto refused = [](nlohmann::json j, const char* key, nlohmann::json value, const char* needle) {
    j[key] = value;
    expect_error([&] { config_from_json(j, "cfg"); }, needle);
  };
  refused(bert, "add_cross_attention", true, "\"add_cross_attention\": true is not supported");
  refused(gpt2, "add_cross_attention", true, "\"add_cross_attention\": true is not supported");
  refused(bert, "position_embedding_type", "relative_key", "position_embedding_type");
  refused(bert, "problem_type", "multi_label_classification", "problem_type");
  refused(distil, "problem_type", "multi_label_classification", "problem_type");
  refused(bert, "pad_token_id", 97, "pad_token_id 97 is not a token id in [0, 97)");
  refused(distil, "pad_token_id", -1, "pad_token_id -1 is not a token id");
  refused(bert, "hidden_act", "mish", "unsupported activation \"mish\"");
  refused(distil, "activation", "tanh", "unsupported activation \"tanh\"");
  refused(gpt2, "scale_attn_by_inverse_layer_idx", "yes", "must be true or false");
  // What they do honor, read as transformers reads it.
  nlohmann::json j = bert;
  j["is_decoder"] = true;
  j["pad_token_id"] = nullptr;
  ModelConfig c = config_from_json(j, "cfg");
  EXPECT_TRUE(c.causal);
  EXPECT_EQ(c.pad_token_id, -1);
  j = distil;
  j.erase("dim");
  j["hidden_size"] = 30;  // transformers' attribute_map alias
  c = config_from_json(j, "cfg");
  EXPECT_EQ(c.hidden_size, 30);
  EXPECT_EQ(c.attention_output_dropout, 0.0f);
  EXPECT_FLOAT_EQ(c.classifier_dropout, 0.2f);
  j = gpt2;
  j["tie_word_embeddings"] = false;
  j["scale_attn_weights"] = false;
  c = config_from_json(j, "cfg");
  EXPECT_FALSE(c.tied_lm_head);
  EXPECT_FALSE(c.scale_by_head_dim);
  EXPECT_EQ(c.task, ModelTask::causal_lm);
}

// The llama family's keys: read in both transformers 4's and 5's spelling, refused by name where
// brisk does not implement them.
TEST(Inputs, LlamaFamilyConfigKeysAreHonoredOrRefused) {
  const nlohmann::json llama = load_config(fixture("llama_tiny/config.json")).source;
  const nlohmann::json qwen2 = load_config(fixture("qwen2_tiny/config.json")).source;
  const nlohmann::json mistral = load_config(fixture("mistral_tiny/config.json")).source;
  auto refused = [](nlohmann::json j, const char* key, nlohmann::json value, const char* needle) {
    if (value.is_null())
      j.erase(key);
    else
      j[key] = value;
    expect_error([&] { config_from_json(j, "cfg"); }, needle);
  };
  refused(llama, "hidden_act", "gelu", "hidden_act \"gelu\" is not supported for llama");
  refused(llama, "num_key_value_heads", 4, "not a multiple of num_key_value_heads 4");
  refused(llama, "head_dim", 7, "head_dim 7 is odd");
  refused(llama, "rope_parameters", {{"rope_type", "yarn"}, {"factor", 2.0}},
          "rope_parameters: rope_type \"yarn\" is not supported");
  refused(llama, "rope_parameters", {{"rope_type", "linear"}}, "needs \"factor\"");
  refused(llama, "rope_parameters",
          {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0}},
          "needs \"high_freq_factor\"");
  refused(llama, "rope_parameters", {{"full_attention", {{"rope_type", "default"}}}},
          "names no rope_type");
  refused(llama, "rope_parameters", {{"rope_type", "default"}, {"rope_theta", -1}},
          "must be a positive number");
  refused(llama, "rope_parameters", {{"rope_type", "default"}, {"rope_theta", 1e300}},
          "\"rope_theta\" must be a positive number float32 holds, got 1e+300");
  refused(qwen2, "hidden_size", 30, "not divisible by the number of attention heads 4");
  // transformers 4's spelling: rope_theta at the top level, rope_scaling with "type".
  nlohmann::json j = llama;
  j.erase("rope_parameters");
  j["rope_theta"] = 250.0;
  j["rope_scaling"] = {{"type", "linear"}, {"factor", 3.0}};
  ModelConfig c = config_from_json(j, "cfg");
  EXPECT_EQ(c.rope_theta, 250.0);
  EXPECT_EQ(c.rope_scaling.type, RopeScaling::Type::linear);
  EXPECT_EQ(c.rope_scaling.factor, 3.0);
  c = config_from_json(llama, "cfg");
  EXPECT_EQ(c.kv_heads(), 2);
  EXPECT_EQ(c.head_dim(), 6);
  EXPECT_EQ(c.qkv_width(), (6 + 2 * 2) * 6);
  EXPECT_TRUE(c.qkv_bias && c.attn_out_bias && c.mlp_bias);
  EXPECT_EQ(c.rope_scaling.type, RopeScaling::Type::llama3);
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 64);
  c = config_from_json(qwen2, "cfg");
  EXPECT_TRUE(c.qkv_bias);
  EXPECT_FALSE(c.attn_out_bias || c.mlp_bias);
  EXPECT_EQ(c.sliding_window, 0);  // use_sliding_window false
  c = config_from_json(mistral, "cfg");
  EXPECT_EQ(c.sliding_window, 64);
  EXPECT_FALSE(c.qkv_bias || c.attn_out_bias || c.mlp_bias);
}

// The mixture-of-experts configs (transformers 5.24's, tests/fixtures/moe): the experts read as
// transformers reads them, its defaults where a key is left out, and what brisk does not
// implement, or cannot mean anything, refused by name. Their models are refused until built.
TEST(Inputs, MixtureOfExpertsConfigsAreReadAsTransformersReadsThem) {
  const nlohmann::json mixtral = load_config(fixture("moe/mixtral_tiny/config.json")).source;
  const nlohmann::json qwen = load_config(fixture("moe/qwen2_moe_tiny/config.json")).source;
  const nlohmann::json olmoe = load_config(fixture("moe/olmoe_tiny/config.json")).source;
  ModelConfig c = config_from_json(mixtral, "cfg");
  EXPECT_EQ(c.model_type, ModelType::mixtral);
  EXPECT_EQ(c.moe.experts, 5);
  EXPECT_EQ(c.moe.top_k, 2);
  EXPECT_EQ(c.moe.inner, 7);
  EXPECT_EQ(c.moe.shared_inner, 0);
  EXPECT_TRUE(c.moe.normalize);  // Mixtral always rescales
  EXPECT_TRUE(c.moe.aux_loss);
  EXPECT_EQ(c.moe.aux_loss_coef, 0.05);
  EXPECT_TRUE(c.moe.sparse(0) && c.moe.sparse(1));
  EXPECT_EQ(c.kv_heads(), 1);
  EXPECT_EQ(c.sliding_window, 0);  // null
  EXPECT_FALSE(c.qkv_bias || c.attn_out_bias || c.mlp_bias || c.qk_norm || c.tied_lm_head);
  c = config_from_json(qwen, "cfg");
  EXPECT_EQ(c.model_type, ModelType::qwen2_moe);
  EXPECT_EQ(c.moe.experts, 6);
  EXPECT_EQ(c.moe.inner, 7);  // moe_intermediate_size; the dense layers' MLP is 11 wide
  EXPECT_EQ(c.intermediate_size, 11);
  EXPECT_EQ(c.moe.shared_inner, 9);
  EXPECT_FALSE(c.moe.normalize);
  EXPECT_TRUE(c.moe.sparse(0));
  EXPECT_FALSE(c.moe.sparse(1));  // mlp_only_layers [1]
  EXPECT_TRUE(c.qkv_bias && c.tied_lm_head);
  EXPECT_FALSE(c.attn_out_bias || c.mlp_bias);
  c = config_from_json(olmoe, "cfg");
  EXPECT_EQ(c.model_type, ModelType::olmoe);
  EXPECT_EQ(c.moe.top_k, 3);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_EQ(c.pad_token_id, -1);  // null in the file
  // decoder_sparse_step 2: every second layer sparse.
  nlohmann::json j = qwen;
  j["decoder_sparse_step"] = 2;
  j["mlp_only_layers"] = nlohmann::json::array();
  c = config_from_json(j, "cfg");
  EXPECT_FALSE(c.moe.sparse(0));
  EXPECT_TRUE(c.moe.sparse(1));
  // transformers' defaults (Mixtral-8x7B's, Qwen1.5-MoE-A2.7B's, OLMoE-1B-7B's sizes).
  c = config_from_json({{"model_type", "mixtral"}}, "cfg");
  EXPECT_EQ(c.moe.experts, 8);
  EXPECT_EQ(c.moe.top_k, 2);
  EXPECT_EQ(c.moe.inner, 14336);
  EXPECT_EQ(c.kv_heads(), 8);
  EXPECT_EQ(c.max_position_embeddings, 131072);
  EXPECT_EQ(c.moe.aux_loss_coef, 0.001);
  EXPECT_FALSE(c.moe.aux_loss);
  EXPECT_FLOAT_EQ(c.layer_norm_eps, 1e-5f);
  c = config_from_json({{"model_type", "qwen2_moe"}}, "cfg");
  EXPECT_EQ(c.moe.experts, 60);
  EXPECT_EQ(c.moe.top_k, 4);
  EXPECT_EQ(c.moe.inner, 1408);
  EXPECT_EQ(c.moe.shared_inner, 5632);
  EXPECT_EQ(c.vocab_size, 151936);
  c = config_from_json({{"model_type", "olmoe"}}, "cfg");
  EXPECT_EQ(c.moe.experts, 64);
  EXPECT_EQ(c.moe.top_k, 8);
  EXPECT_EQ(c.moe.inner, 2048);
  EXPECT_EQ(c.moe.aux_loss_coef, 0.01);
  EXPECT_EQ(c.pad_token_id, 1);
  EXPECT_EQ(c.vocab_size, 50304);
  auto refused = [](nlohmann::json j, const char* key, nlohmann::json value, const char* needle) {
    j[key] = value;
    expect_error([&] { config_from_json(j, "cfg"); }, needle);
  };
  refused(mixtral, "num_experts_per_tok", 6, "num_experts_per_tok 6 exceeds the 5 experts");
  refused(mixtral, "num_local_experts", 0, "\"num_local_experts\" must be positive");
  refused(qwen, "num_experts", 0, "\"num_experts\" must be positive");
  refused(olmoe, "num_experts_per_tok", 0, "\"num_experts_per_tok\" must be positive");
  refused(mixtral, "router_jitter_noise", 0.1, "router_jitter_noise");
  refused(olmoe, "clip_qkv", 8.0, "\"clip_qkv\" is not supported");
  refused(qwen, "mlp_only_layers", {2}, "not a layer index in [0, 2)");
  refused(qwen, "router_aux_loss_coef", -1,
          "\"router_aux_loss_coef\" must be a number in [0, 1000]");
  // Finite in double, not in float32's sums of the loss: bounded where read.
  refused(olmoe, "router_aux_loss_coef", 1e300, "must be a number in [0, 1000], got 1e+300");
  // No sparse layer left: refused, not met at the first step's load-balancing loss.
  refused(qwen, "decoder_sparse_step", 3,
          "decoder_sparse_step 3 and mlp_only_layers leave none of "
          "the 2 layers sparse");
  refused(qwen, "mlp_only_layers", {0, 1}, "leave none of the 2 layers sparse");
  expect_error(
      [] {
        ModelConfig c = config_from_json({{"model_type", "olmoe"}}, "cfg");
        use_router_options(c, 1e300);
      },
      "router_z_loss_coef must be a number in [0, 1000], got 1e+300");
}

// A sliding window shorter than the sequence would change attention: refused when planned.
TEST(Inputs, SequencesLongerThanTheSlidingWindowAreRefused) {
  nlohmann::json j = load_config(fixture("mistral_tiny/config.json")).source;
  j["sliding_window"] = 8;
  auto m = Model::create(config_from_json(j, "cfg"));
  MemoryPlan ok;
  m->plan(ok, {2, 8}, {});
  MemoryPlan plan;
  expect_error(
      [&] {
        m->plan(plan, {2, 9}, {});
      },
      "sequences of 9 tokens are longer than the mistral config's sliding_window = 8");
}

// transformers' GPT-2 adds token_type_ids through wte; brisk refuses a batch carrying them
// rather than compute another model.
TEST(Inputs, Gpt2BatchesWithTokenTypesAreRefused) {
  auto be = make_cpu_backend();
  auto m = Model::create(resolve_config(fixture("gpt2_tiny")));
  SafetensorsFile given(fixture("gpt2_tiny/batch.safetensors"));
  const BatchShape shape = batch_shape_of(given);
  MemoryPlan plan;
  m->plan(plan, shape, {});
  plan.finalize();
  Arena arena(plan, Device::cpu);
  m->bind(arena);
  std::vector<int32_t> types(static_cast<size_t>(shape.batch * shape.seq), 0);
  const TempDir dir("gpt2_types");
  const std::string path = dir / "batch.safetensors";
  write_safetensors(
      path, {{"input_ids", given.get("input_ids")},
             {"token_type_ids", Tensor(types.data(), {shape.batch, shape.seq}, DType::i32)}});
  SafetensorsFile batch(path);
  expect_error([&] { load_batch(batch, *m, *be); }, "token_type_ids given, but the gpt2 model");
}

TEST(Inputs, BuiltInConfigsHaveThePublishedSizes) {
  struct Want {
    const char* name;
    int64_t params;
  };
  // Parameter counts of the published models (with the 2-label classifier for BERT).
  for (Want w : {Want{"bert-base-uncased", 109483778}, Want{"bert-large-uncased", 335143938},
                 Want{"gpt2", 124439808}, Want{"gpt2-medium", 354823168},
                 Want{"distilbert-base-uncased", 66955010}, Want{"smollm2-135m", 134515008},
                 Want{"llama-2-7b", 6738415616}, Want{"mistral-7b", 7241732096},
                 Want{"qwen2-0.5b", 494032768}}) {
    auto m = Model::create(resolve_config(w.name));
    EXPECT_EQ(m->params().total_elements(), w.params) << w.name;
  }
  for (const auto& n : builtin_config_names()) EXPECT_NO_THROW(resolve_config(n)) << n;
}

TEST(Inputs, BatchLongerThanPositionsIsRefused) {
  auto m = Model::create(resolve_config(fixture("bert_tiny")));
  MemoryPlan plan;
  SafetensorsFile batch(fixture("bad/batch_too_long.safetensors"));
  expect_error([&] { m->plan(plan, batch_shape_of(batch), {}); },
               "sequence length 24 exceeds max_position_embeddings = 23");
}

TEST(Inputs, TokenOutsideVocabularyIsRefused) {
  auto be = make_cpu_backend();
  auto m = Model::create(resolve_config(fixture("bert_tiny")));
  SafetensorsFile batch(fixture("bad/batch_bad_token.safetensors"));
  MemoryPlan plan;
  m->plan(plan, batch_shape_of(batch), {});
  plan.finalize();
  Arena arena(plan, Device::cpu);
  m->bind(arena);
  m->init_weights(*be, 1);
  load_batch(batch, *m, *be);
  StepOptions so;
  expect_error([&] { m->forward(*be, so); },
               "token id 97 (sequence 1, position 3) is outside [0, 97)");
}

TEST(Inputs, CorruptOrMismatchedWeightsAreRefused) {
  expect_error([] { SafetensorsFile f(fixture("bad/truncated.safetensors")); }, "is corrupt");
  expect_error([] { SafetensorsFile f(fixture("bad/not_json.json")); }, "header length");
  // Weights of another model: the first missing parameter is named.
  auto be = make_cpu_backend();
  auto m = Model::create(resolve_config(fixture("gpt2_tiny")));
  MemoryPlan plan;
  m->plan(plan, {1, 4}, {});
  plan.finalize();
  Arena arena(plan, Device::cpu);
  m->bind(arena);
  expect_error([&] { m->load_weights(*be, WeightFiles(fixture("bert_tiny/model.safetensors"))); },
               "lacks parameter 'transformer.wte.weight'");
  // A NaN or an infinity in a weight is refused naming the tensor, before any step routes or
  // sums with it.
  TempDir dir("nan_weights");
  for (const float bad : {std::nanf(""), -INFINITY}) {
    std::vector<std::vector<float>> values;
    std::vector<std::pair<std::string, Tensor>> tensors;
    {
      SafetensorsFile f(fixture("gpt2_tiny/model.safetensors"));
      for (const std::string& name : f.names()) {
        const Tensor& t = f.get(name);
        ASSERT_EQ(t.dtype(), DType::f32) << name;
        std::vector<float>& v = values.emplace_back(t.f32(), t.f32() + t.numel());
        if (name == "transformer.h.0.mlp.c_fc.weight") v[3] = bad;
        tensors.emplace_back(name, Tensor(v.data(), t.shape(), DType::f32));
      }
      write_safetensors(dir / "model.safetensors", tensors);
    }
    expect_error([&] { m->load_weights(*be, WeightFiles(dir / "model.safetensors")); },
                 "parameter 'transformer.h.0.mlp.c_fc.weight' in '" + dir / "model.safetensors" +
                     "' holds NaN or infinite values");
  }
}

TEST(Inputs, SafetensorsRoundTripIsAtomic) {
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("brisk_rt_" + std::to_string(::getpid()) + ".safetensors"))
                               .string();
  std::vector<float> a{1.5f, -2.0f, 3.25f, 0.0f, 7.0f, 1e-3f};
  std::vector<int32_t> b{4, -100, 9};
  write_safetensors(path, {{"a", Tensor(a.data(), Shape{2, 3}, DType::f32)},
                           {"b", Tensor(b.data(), Shape{3}, DType::i32)}});
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  SafetensorsFile f(path);
  ASSERT_EQ(f.get("a").shape(), (Shape{2, 3}));
  EXPECT_EQ(std::vector<float>(f.get("a").f32(), f.get("a").f32() + 6), a);
  EXPECT_EQ(std::vector<int32_t>(f.get("b").i32(), f.get("b").i32() + 3), b);
  expect_error([&] { f.get("c"); }, "has no tensor named 'c'");
  expect_error([] { write_safetensors("/nonexistent-dir/x.safetensors", {}); }, "cannot write");
  std::remove(path.c_str());
}

// Entries read piece by piece (what ZeRO's saves gather): asked in order, in pieces of at most
// the stated bound, written to the same bytes; a read that fails leaves no file behind.
TEST(Inputs, StreamedSafetensorsAreReadInBoundedPiecesInOrder) {
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("brisk_streamed_" + std::to_string(::getpid()) + ".safetensors"))
                               .string();
  const int64_t n = static_cast<int64_t>(kSafetensorsStagingBytes / 4) * 2 + 1001;  // 3 pieces
  std::vector<float> big(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) big[static_cast<size_t>(i)] = static_cast<float>(i % 977) - 0.5f;
  int64_t step = 42;
  std::vector<std::pair<size_t, size_t>> asked;
  auto reader = [&](const void* src) {
    return [&asked, src](size_t offset, size_t bytes, void* dst) {
      asked.emplace_back(offset, bytes);
      std::memcpy(dst, static_cast<const char*>(src) + offset, bytes);
    };
  };
  write_streamed_safetensors(path,
                             {{"big", DType::f32, Shape{n}, reader(big.data())},
                              {"step", DType::i64, Shape{}, reader(&step)}},
                             {{"format", "pt"}});
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  size_t next = 0;
  for (size_t i = 0; i + 1 < asked.size(); ++i) {
    EXPECT_EQ(asked[i].first, next) << "piece " << i;
    EXPECT_LE(asked[i].second, kSafetensorsStagingBytes) << "piece " << i;
    next += asked[i].second;
  }
  EXPECT_EQ(next, big.size() * 4);
  EXPECT_EQ(asked.back(), (std::pair<size_t, size_t>{0, 8}));
  {
    SafetensorsFile f(path);
    ASSERT_EQ(f.get("big").shape(), (Shape{n}));
    EXPECT_EQ(std::memcmp(f.get("big").f32(), big.data(), big.size() * 4), 0);
    EXPECT_EQ(f.get("step").as<int64_t>()[0], 42);
  }
  std::remove(path.c_str());
  int reads = 0;
  auto failing = [&reads](size_t, size_t, void*) {
    if (++reads == 2) throw Error("the other rank is gone");
  };
  expect_error(
      [&] {
        write_streamed_safetensors(path, {{"big", DType::f32, Shape{n}, failing}});
      },
      "the other rank is gone");
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
}

// A safetensors file from a raw header and data section, as an attacker or a buggy writer makes.
std::string raw_safetensors(const std::string& name, const std::string& header,
                            const std::string& data, int64_t header_len = -1) {
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("brisk_raw_" + std::to_string(::getpid()) + "_" + name))
                               .string();
  const uint64_t n = header_len < 0 ? header.size() : static_cast<uint64_t>(header_len);
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>(n >> (8 * i));
  std::FILE* f = std::fopen(path.c_str(), "wb");
  std::fwrite(bytes.data(), 1, 8, f);
  std::fwrite(header.data(), 1, header.size(), f);
  std::fwrite(data.data(), 1, data.size(), f);
  std::fclose(f);
  return path;
}

// Checked as strictly as the reference safetensors library: every malformed header is refused
// naming the problem, never read past the data or through a wrapped size.
TEST(Inputs, SafetensorsHeadersAreCheckedStrictly) {
  const std::string d16(16, '\x01');
  struct Case {
    const char* name;
    std::string header, data;
    const char* needle;
  };
  const Case cases[] = {
      {"overlap",
       R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
       R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
       std::string(12, '\0'), "where the previous tensor's data ends at 8"},
      {"gap", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})", d16, "a gap begins"},
      {"trailing", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", d16,
       "covers 8 bytes of the data section's 16"},
      {"huge_shape",
       R"({"a":{"dtype":"F32","shape":[2305843009213693952,8],"data_offsets":[0,0]}})", "",
       "too large"},
      {"negative_dim", R"({"a":{"dtype":"F32","shape":[-4],"data_offsets":[0,0]}})", "",
       "shape must be a list of non-negative whole numbers"},
      {"wrong_size", R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})",
       std::string(8, '\0'), "holds 8 bytes but shape [3] needs 12"},
      {"bad_offsets", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", d16,
       "outside the data section"},
      {"offsets_type", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":"0-8"}})", d16,
       "data_offsets must be two"},
      {"dtype_type", R"({"a":{"dtype":4,"shape":[2],"data_offsets":[0,8]}})", d16,
       "dtype must be a string"},
      {"dtype_name", R"({"a":{"dtype":"F31","shape":[2],"data_offsets":[0,8]}})", d16,
       "unsupported safetensors dtype 'F31'"},
      {"metadata", R"({"__metadata__":{"format":4}})", "", "__metadata__ must map names"},
      {"not_object", R"([1,2])", "", "header is not a JSON object"},
      {"deep", std::string(5000, '[') + std::string(5000, ']'), "", "not a JSON object"},
      {"deep_object", "{\"a\":" + std::string(5000, '[') + std::string(5000, ']') + "}", "",
       "nested deeper than 8 levels"},
  };
  for (const Case& c : cases) {
    const std::string path = raw_safetensors(c.name, c.header, c.data);
    expect_error([&] { SafetensorsFile f(path); }, c.needle);
    std::remove(path.c_str());
  }
  // A header length one byte short: the last byte of the header becomes data and nothing lines
  // up; refused instead of loading every tensor shifted.
  const std::string good = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}} )";
  const std::string short_by_one =
      raw_safetensors("short", good, std::string(8, '\0'), static_cast<int64_t>(good.size()) - 1);
  expect_error([&] { SafetensorsFile f(short_by_one); }, "covers 8 bytes of the data section's 9");
  std::remove(short_by_one.c_str());
  // A 10 MB tensor name is shown as a short excerpt.
  const std::string long_name =
      raw_safetensors("long", "{\"" + std::string(10 << 20, 'x') + "\":{\"dtype\":\"F32\"}}", "");
  try {
    SafetensorsFile f(long_name);
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_LT(std::string(e.what()).size(), 300u);
  }
  std::remove(long_name.c_str());
  // Data misaligned for its dtype (a 5-byte header) is copied, not read through a misaligned
  // pointer: the values come out right.
  const float v[2] = {1.5f, -3.25f};
  const std::string unaligned = raw_safetensors(
      "unaligned",
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})" + std::string(1, ' '),
      std::string(reinterpret_cast<const char*>(v), 8));
  SafetensorsFile f(unaligned);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(f.get("a").data()) % alignof(float), 0u);
  EXPECT_EQ(f.get("a").f32()[0], 1.5f);
  EXPECT_EQ(f.get("a").f32()[1], -3.25f);
  std::remove(unaligned.c_str());
}

TEST(Inputs, SixteenBitConversionsRoundToNearestEven) {
  EXPECT_EQ(float_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(bf16_to_float(0x3f80), 1.0f);
  EXPECT_EQ(float_to_bf16(1.00390625f), 0x3f80);  // halfway: ties to even
  EXPECT_EQ(float_to_bf16(1.01171875f), 0x3f82);  // halfway, odd below: rounds up
  EXPECT_EQ(float_to_fp16(1.0f), 0x3c00);
  EXPECT_EQ(float_to_fp16(65504.0f), 0x7bff);
  EXPECT_EQ(float_to_fp16(65520.0f), 0x7c00);                // overflows to inf
  EXPECT_EQ(float_to_fp16(5.960464477539063e-08f), 0x0001);  // smallest subnormal
  EXPECT_EQ(fp16_to_float(0x0001), 5.960464477539063e-08f);
  EXPECT_EQ(fp16_to_float(0xc000), -2.0f);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::nanf("")))));
  EXPECT_TRUE(std::isnan(fp16_to_float(float_to_fp16(std::nanf("")))));
  // Every fp16 value survives the round trip through float.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) continue;  // NaN payloads
    EXPECT_EQ(float_to_fp16(fp16_to_float(static_cast<uint16_t>(h))), h) << std::hex << h;
  }
}

TEST(Inputs, MemoryPlanAlignsAndCountsByCategory) {
  MemoryPlan plan;
  plan.add("w", Category::weights, DType::f32, Shape{3});
  plan.add("ids", Category::data, DType::i32, Shape{2, 5});
  plan.add("h", Category::activations, DType::bf16, Shape{7});
  expect_error([&] { plan.add("w", Category::weights, DType::f32, Shape{1}); }, "already has");
  plan.finalize();
  for (const auto& b : plan.buffers()) EXPECT_EQ(b.offset % MemoryPlan::kAlignment, 0u);
  const auto by = plan.bytes_by_category();
  EXPECT_EQ(by[static_cast<int>(Category::weights)], 12u);
  EXPECT_EQ(by[static_cast<int>(Category::data)], 40u);
  EXPECT_EQ(by[static_cast<int>(Category::activations)], 14u);
  EXPECT_EQ(plan.total_bytes(), 3 * MemoryPlan::kAlignment);
  Arena arena(plan, Device::cpu);
  EXPECT_EQ(arena.high_water(), 0u);
  Tensor ids = arena.tensor(plan.find("ids"));
  EXPECT_EQ(arena.high_water(), MemoryPlan::kAlignment + 40u);
  EXPECT_EQ(ids.shape(), (Shape{2, 5}));
}

// The smaps line for the mapping holding address p, e.g. "THPeligible:"; empty when absent.
std::string smaps_field(const void* p, const std::string& field) {
  std::FILE* f = std::fopen("/proc/self/smaps", "r");
  if (!f) return {};
  const auto at = reinterpret_cast<uintptr_t>(p);
  char line[512];
  bool inside = false;
  std::string found;
  while (std::fgets(line, sizeof line, f)) {
    unsigned long lo = 0, hi = 0;
    if (std::sscanf(line, "%lx-%lx ", &lo, &hi) == 2) {  // a mapping's first line
      inside = lo <= at && at < hi;
      continue;
    }
    if (inside && std::strncmp(line, field.c_str(), field.size()) == 0) {
      found = line;
      break;
    }
  }
  std::fclose(f);
  return found;
}

// Host blocks of 4 MiB and more are whole 2 MiB pages asked for as transparent huge pages; smaller
// ones keep the plan's alignment. Both come zeroed.
TEST(Inputs, LargeHostBlocksAreHugePageAlignedAndZeroed) {
  MemoryResource& host = host_memory();
  const size_t big = (size_t{5} << 20) + 12345;
  auto* p = static_cast<unsigned char*>(host.allocate(big));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % (size_t{2} << 20), 0u);
  size_t nonzero = 0;
  for (size_t i = 0; i < big; ++i) nonzero += p[i] != 0;
  EXPECT_EQ(nonzero, 0u);
  // Where the kernel offers transparent huge pages at all, the block was advised for them.
  std::FILE* thp = std::fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
  char mode[128] = {};
  if (thp) {
    if (!std::fgets(mode, sizeof mode, thp)) mode[0] = 0;
    std::fclose(thp);
  }
  // (Not where the process has them turned off, as some container runtimes do.)
  if (mode[0] && std::strstr(mode, "[never]") == nullptr && ::prctl(PR_GET_THP_DISABLE) == 0) {
    const std::string eligible = smaps_field(p, "THPeligible:");
    if (!eligible.empty()) EXPECT_NE(eligible.find('1'), std::string::npos) << eligible;
  }
  host.deallocate(p);
  auto* q = static_cast<unsigned char*>(host.allocate(1000));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(q) % MemoryPlan::kAlignment, 0u);
  for (size_t i = 0; i < 1000; ++i) ASSERT_EQ(q[i], 0) << i;
  host.deallocate(q);
  // A size whose rounding up would wrap around is refused, not allocated short.
  expect_error([&] { host.allocate(SIZE_MAX - 100); }, "cannot allocate");
}

}  // namespace
}  // namespace brisk::testing

namespace brisk::testing {
namespace {

// write_in_pieces through its staging path (as for GPU memory) writes every element once, in
// order, in pieces of at most the given size, with the conversion the fill does.
TEST(Inputs, WritingInPiecesEqualsTheWholeCopy) {
  auto be = make_cpu_backend();
  std::vector<uint16_t> bf16(1003);
  for (size_t i = 0; i < bf16.size(); ++i)
    bf16[i] = float_to_bf16(0.37f * static_cast<float>(i) - 91.0f);
  const Tensor src(bf16.data(), Shape{1003}, DType::bf16);
  std::vector<float> whole(1003), staged(1003, -1.0f);
  copy_to_f32(src, Tensor(whole.data(), Shape{1003}, DType::f32), "whole");
  std::vector<std::pair<int64_t, int64_t>> pieces;
  write_in_pieces(
      *be, Tensor(staged.data(), Shape{1003}, DType::f32),
      [&](const Tensor& piece, int64_t first) {
        pieces.emplace_back(first, piece.numel());
        copy_to_f32(element_range(src, first, piece.numel()), piece, "piece");
      },
      /*piece_bytes=*/400, /*staged=*/true);
  EXPECT_EQ(staged, whole);
  ASSERT_EQ(pieces.size(), 11u);  // 100 floats a piece, the last 3
  for (size_t i = 0; i < pieces.size(); ++i) {
    EXPECT_EQ(pieces[i].first, static_cast<int64_t>(100 * i));
    EXPECT_EQ(pieces[i].second, i + 1 < pieces.size() ? 100 : 3);
  }
  EXPECT_THROW(element_range(src, 1000, 4), Error);
}

}  // namespace
}  // namespace brisk::testing
