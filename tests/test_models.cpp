// Whole models against PyTorch + transformers: loss, logits and the gradient of every parameter
// on the same weights and batch (fixtures from scripts/make_fixtures.py), dropout off.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>

#include "backend/cpu/cpu_matmul_dnnl.h"
#include "test_support.h"
#include "tokenizer/tokenizer.h"
#include "trainer_support.h"

namespace brisk::testing {
namespace {

constexpr double kTolerance = 1e-4;

// The logits of an evaluation pass (a training pass overwrites them with their gradient), its
// loss and a training step's against the fixture's; the step's gradients are then in place.
void compare_logits_and_losses(LoadedModel& m, const SafetensorsFile& expected) {
  StepOptions eval;
  eval.training = false;
  eval.compute_grad = false;
  const int64_t targets = m.model->count_targets();
  const double eval_loss = m.model->forward(*m.be, eval) / targets;
  const Tensor& want_logits = expected.get("logits");
  ASSERT_EQ(m.model->logits().numel(), want_logits.numel());
  EXPECT_LE(rel_error(m.model->logits().f32(), want_logits.f32(), want_logits.numel()), kTolerance)
      << "logits";
  const double loss = m.step(false);
  const float want_loss = expected.get("loss").f32()[0];
  EXPECT_NEAR(loss, want_loss, kTolerance * std::abs(want_loss));
  EXPECT_NEAR(eval_loss, want_loss, kTolerance * std::abs(want_loss));
}

void compare_with_transformers(const std::string& name, bool masked_lm = false) {
  const std::string folder = fixture(name);
  LoadedModel m(folder, {}, false, DType::f32, 0, masked_lm);
  SafetensorsFile expected(folder + "/expected.safetensors");
  compare_logits_and_losses(m, expected);

  int compared = 0;
  for (const ParamInfo& p : m.model->params().list()) {
    const Tensor& want = expected.get("grad." + p.name);
    const Tensor got = m.model->params().grad(m.model->params().index(p.name));
    ASSERT_EQ(got.shape(), want.shape()) << p.name;
    // The key bias gets an exactly-zero gradient in exact arithmetic (softmax ignores a constant
    // per row), so both sides are rounding noise: its floor makes the bound absolute, 1e-6
    // (the regression fixture's larger loss leaves noise of ~3e-7). So do gradients transformers
    // computes as exact zeros: a causal BERT classifying its first token, which attends to
    // itself alone, gives its queries and keys none (brisk's rounding noise: 1.2e-7 with
    // OpenBLAS's Sapphire Rapids kernels). Every other gradient here has a norm above 0.05, and
    // its floor of 1e-3 never applies.
    const bool zero_in_exact_arithmetic =
        p.name.find("attention.self.key.bias") != std::string::npos ||
        p.name.find("attention.k_lin.bias") != std::string::npos ||
        std::all_of(want.f32(), want.f32() + want.numel(), [](float v) { return v == 0.f; });
    EXPECT_LE(
        rel_error(got.f32(), want.f32(), want.numel(), zero_in_exact_arithmetic ? 1e-2 : 1e-3),
        kTolerance)
        << "gradient of " << p.name;
    ++compared;
  }
  // Every gradient transformers reports is one of ours, and the other way round.
  int expected_grads = 0;
  for (const auto& n : expected.names()) expected_grads += n.rfind("grad.", 0) == 0;
  EXPECT_EQ(compared, expected_grads);
}

TEST(Models, BertForSequenceClassificationMatchesTransformers) {
  compare_with_transformers("bert_tiny");
}

// num_labels 1: transformers' regression (MSELoss over float labels).
TEST(Models, BertRegressionMatchesTransformers) {
  compare_with_transformers("bert_regression");
}

TEST(Models, Gpt2LMHeadModelMatchesTransformers) {
  compare_with_transformers("gpt2_tiny");
}

// DistilBertForSequenceClassification: no token types, no dropout after the attention output, a
// pre_classifier + ReLU head; pad ids inside the attended text (the word embedding's padding_idx
// keeps their row's gradient at zero).
TEST(Models, DistilBertForSequenceClassificationMatchesTransformers) {
  compare_with_transformers("distilbert_tiny");
}

// sinusoidal_pos_embds with the relu activation.
TEST(Models, DistilBertWithSinusoidalPositionsAndReluMatchesTransformers) {
  compare_with_transformers("distilbert_sinusoidal");
}

// BertForMaskedLM: the prediction head over every position, its decoder tied to the word
// embeddings (their gradient sums the embedding's and the decoder's), loss at the chosen tokens.
TEST(Models, BertForMaskedLMMatchesTransformers) {
  compare_with_transformers("bert_mlm", /*masked_lm=*/true);
}

// DistilBertForMaskedLM: the same head under other names (vocab_transform, vocab_layer_norm,
// vocab_projector tied to the word embeddings with its bias), no token types.
TEST(Models, DistilBertForMaskedLMMatchesTransformers) {
  compare_with_transformers("distilbert_mlm", /*masked_lm=*/true);
}

// is_decoder: BertModel masks its self-attention causally; hidden_act relu; pad ids attended.
TEST(Models, BertAsADecoderMatchesTransformers) {
  compare_with_transformers("bert_decoder");
}

// LlamaForCausalLM: RMSNorm, llama3-scaled rotary positions, grouped-query attention (6 query
// heads over 2 key/value heads), an explicit head_dim (6 heads x 6 = 36 channels in a hidden
// size of 30), attention_bias (q, k, v and o) and mlp_bias, an untied head, pad_token_id 0 on
// attended tokens.
TEST(Models, LlamaForCausalLMMatchesTransformers) {
  compare_with_transformers("llama_tiny");
}

// Qwen2ForCausalLM: q/k/v biases without an o_proj bias, 4 query heads over 2 key/value heads,
// default rotary positions, the head tied to the embeddings.
TEST(Models, Qwen2ForCausalLMMatchesTransformers) {
  compare_with_transformers("qwen2_tiny");
}

// MistralForCausalLM: no biases, multi-head (3 over 3), head_dim 10 in a hidden size of 30,
// linear rope scaling, a sliding window longer than the sequence.
TEST(Models, MistralForCausalLMMatchesTransformers) {
  compare_with_transformers("mistral_tiny");
}

// The real SmolLM2-135M (a Llama: 30 layers, 9 heads over 3 key/value heads, tied head) from
// scripts/get_data.sh: brisk's tokenizer gives transformers' ids for Psalm 23, and its loss and
// last logits on the first 64 tokens equal transformers' (tests/fixtures/smollm2_kjv, from
// scripts/smollm2_folder.py). Skipped when the folder has not been made.
TEST(Models, RealSmolLM2LossEqualsTransformers) {
  const std::string data = fixture("../../data/smollm2-135m");
  if (!std::filesystem::exists(data + "/model.safetensors"))
    GTEST_SKIP() << "data/smollm2-135m is missing: run scripts/get_data.sh with the Python venv "
                    "(scripts/setup_python.sh) to make it";
  SafetensorsFile expected(fixture("smollm2_kjv/expected.safetensors"));
  std::ifstream f(fixture("smollm2_kjv/psalm23.txt"));
  const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const Tensor& want_ids = expected.get("text_ids");
  EXPECT_EQ(Tokenizer::load(data)->tokenize(text),
            std::vector<int32_t>(want_ids.i32(), want_ids.i32() + want_ids.numel()));

  const TempDir dir("smollm2");
  for (const char* file : {"config.json", "model.safetensors"})
    std::filesystem::create_symlink(std::filesystem::absolute(data + "/" + file), dir / file);
  const Tensor& ids = expected.get("input_ids");
  std::vector<int32_t> mask(static_cast<size_t>(ids.numel()), 1);
  write_safetensors(dir / "batch.safetensors",
                    {{"input_ids", ids},
                     {"attention_mask", Tensor(mask.data(), ids.shape(), DType::i32)},
                     {"labels", ids}});
  LoadedModel m(dir.path.string());
  StepOptions eval;
  eval.training = false;
  eval.compute_grad = false;
  const double loss = m.model->forward(*m.be, eval) / m.model->count_targets();
  const float want_loss = expected.get("loss").f32()[0];
  EXPECT_NEAR(loss, want_loss, kTolerance * want_loss);
  const Tensor& want_last = expected.get("last_logits");
  const std::vector<float> logits = to_host(*m.be, m.model->logits());
  EXPECT_LE(rel_error(logits.data() + logits.size() - want_last.numel(), want_last.f32(),
                      want_last.numel()),
            kTolerance);
}

// tie_word_embeddings false (its own lm_head.weight), scale_attn_by_inverse_layer_idx,
// reorder_and_upcast_attn, quick_gelu, n_inner, five heads.
TEST(Models, Gpt2WithUntiedHeadAndLayerScaledAttentionMatchesTransformers) {
  compare_with_transformers("gpt2_variant");
}

// The word embedding's padding row: zero at initialization (as transformers' _init_weights), no
// gradient from the embedding even where the pad id is attended, while the other rows get one.
TEST(Models, ThePaddingRowStartsAtZeroAndGetsNoGradient) {
  const std::map<std::string, std::string> word_table{
      {"bert_decoder", "bert.embeddings.word_embeddings.weight"},
      {"distilbert_tiny", "distilbert.embeddings.word_embeddings.weight"},
      {"llama_tiny", "model.embed_tokens.weight"}};
  for (const auto& [name, table_name] : word_table) {
    SCOPED_TRACE(name);
    LoadedModel m(fixture(name));
    const ModelConfig& c = m.model->config();
    ASSERT_EQ(c.pad_token_id, 0);
    const int word = m.model->params().find(table_name);
    ASSERT_GE(word, 0);
    m.step(false);
    const std::vector<float> grad = to_host(*m.be, m.model->params().grad(word));
    const int64_t C = c.hidden_size;
    double pad_row = 0, others = 0;
    for (int64_t j = 0; j < C; ++j) pad_row += std::abs(grad[j]);
    for (size_t i = C; i < grad.size(); ++i) others += std::abs(grad[i]);
    EXPECT_EQ(pad_row, 0.0);
    EXPECT_GT(others, 0.0);
    m.model->init_weights(*m.be, 5);
    const std::vector<float> table = to_host(*m.be, m.model->params().weight(word));
    for (int64_t j = 0; j < C; ++j) EXPECT_EQ(table[j], 0.0f) << j;
    double rest = 0;
    for (size_t i = C; i < table.size(); ++i) rest += std::abs(table[i]);
    EXPECT_GT(rest, 0.0);
  }
}

// A mixture-of-experts causal LM (tests/fixtures/moe, scripts/make_moe_fixtures.py: transformers'
// eager experts, output_router_logits with router_aux_loss_coef 0.05, a padded sequence): logits,
// the loss with the load-balancing loss added, and every gradient, as transformers gives them.
// Every gradient of a mixture-of-experts model against a fixture's (grad.<transformers' name>).
void compare_moe_gradients(const LoadedModel& m, const SafetensorsFile& expected) {
  const ModelConfig& c = m.model->config();
  for (const ParamInfo& p : m.model->params().list()) {
    const std::vector<float> want = moe_fixture_values(expected, "grad.", p.name, c);
    const Tensor got = m.model->params().grad(m.model->params().index(p.name));
    ASSERT_EQ(static_cast<size_t>(got.numel()), want.size()) << p.name;
    EXPECT_LE(rel_error(got.f32(), want.data(), got.numel(), 1e-3), kTolerance)
        << "gradient of " << p.name;
  }
}

void compare_moe_with_transformers(const std::string& name) {
  SCOPED_TRACE(name);
  const std::string folder = fixture("moe/" + name);
  LoadedModel m(folder);
  SafetensorsFile expected(folder + "/expected.safetensors");
  compare_logits_and_losses(m, expected);
  compare_moe_gradients(m, expected);
}

// ST-MoE's router z-loss (--router_z_loss_coef 0.1): coef x the mean over the sparse layers
// (Qwen2-MoE's one) and the unmasked tokens of logsumexp(router logits)^2, added to the loss with
// its gradient: the loss and every gradient are PyTorch's autograd of the same sum
// (z_loss.safetensors). A dense model or a negative coef is refused.
TEST(Models, TheRouterZLossIsAddedWithItsGradient) {
  for (const char* name : {"moe/mixtral_tiny", "moe/qwen2_moe_tiny"}) {
    SCOPED_TRACE(name);
    const std::string folder = fixture(name);
    LoadedModel plain(folder);
    LoadedModel m(folder, {}, false, DType::f32, 0, false,
                  [](ModelConfig& c) { use_router_options(c, 0.1); });
    SafetensorsFile expected(folder + "/z_loss.safetensors");
    const double loss = m.step(false), want = expected.get("loss").f32()[0];
    EXPECT_NEAR(loss, want, kTolerance * want);
    EXPECT_NEAR(loss - plain.step(false), expected.get("z_loss").f32()[0], 1e-5);
    compare_moe_gradients(m, expected);
  }
  ModelConfig gpt2 = resolve_config(fixture("gpt2_tiny"));
  expect_error([&] { use_router_options(gpt2, 0.1); },
               "--router_z_loss_coef needs a mixture-of-experts model");
  expect_error([&] { use_router_options(gpt2, 0, 1.5); },
               "--moe_capacity_factor needs a mixture-of-experts model");
  ModelConfig mixtral = resolve_config(fixture("moe/mixtral_tiny"));
  expect_error([&] { use_router_options(mixtral, -1); }, "must be a number in [0, 1000]");
  expect_error([&] { use_router_options(mixtral, 0, std::nan("")); },
               "moe_capacity_factor must be a number in [0, 1000]");
}

TEST(Models, MixtralForCausalLMMatchesTransformers) {
  compare_moe_with_transformers("mixtral_tiny");
}

// Gradient checkpointing runs the experts' forward again in backward: the loss and every
// gradient (the load-balancing loss's included) are the same bits.
// (OLMoE: the query/key norms' inputs saved again.)
TEST(Models, MixtureOfExpertsRecomputeExactly) {
  for (const char* name : {"moe/mixtral_tiny", "moe/olmoe_tiny"}) {
    SCOPED_TRACE(name);
    const std::string folder = fixture(name);
    LoadedModel plain(folder);
    PlanOptions checkpointed;
    checkpointed.gradient_checkpointing = true;
    LoadedModel recomputed(folder, checkpointed);
    EXPECT_EQ(recomputed.step(false), plain.step(false));
    EXPECT_EQ(recomputed.grads(), plain.grads());
  }
}

// A shared expert under its sigmoid gate, a dense layer (mlp_only_layers), a tied head.
TEST(Models, Qwen2MoeForCausalLMMatchesTransformers) {
  compare_moe_with_transformers("qwen2_moe_tiny");
}

// In mixed precision the blocks hand the experts their 16-bit stored inputs, which each layer
// widens and keeps: bf16 activations and products stay close to float32 (the loss within 1%, every
// gradient within 5% normwise, what bf16's 8-bit mantissa leaves of these sums), and gradient
// checkpointing recomputes them bit for bit.
TEST(Models, MixturesOfExpertsTrainInBf16) {
  for (const char* name : {"moe/mixtral_tiny", "moe/qwen2_moe_tiny", "moe/olmoe_tiny"}) {
    SCOPED_TRACE(name);
    const std::string folder = fixture(name);
    LoadedModel f32(folder);
    PlanOptions bf16;
    bf16.activation_dtype = DType::bf16;
    LoadedModel half(folder, bf16, false, DType::bf16);
    ASSERT_GE(half.plan.find("moe.0.input"), 0);
    const double want = f32.step(false), got = half.step(false);
    EXPECT_NEAR(got, want, 1e-2 * want);
    const std::vector<float> want_grads = f32.grads(), got_grads = half.grads();
    EXPECT_LE(
        rel_error(got_grads.data(), want_grads.data(), static_cast<int64_t>(want_grads.size())),
        5e-2);
    PlanOptions elementwise = bf16;
    elementwise.recompute_norms = elementwise.recompute_activation = true;
    bf16.gradient_checkpointing = true;
    for (const PlanOptions& o : {bf16, elementwise}) {
      LoadedModel recomputed(folder, o, false, DType::bf16);
      EXPECT_EQ(recomputed.step(false), got);
      EXPECT_EQ(recomputed.grads(), got_grads);
    }
  }
}

// A sparse layer plans no dense MLP buffers (fc_pre, fc_act), in float32 and in bf16's stored
// copies: Qwen2-MoE's layer 0 is sparse, its layer 1 dense.
TEST(Models, SparseLayersPlanNoDenseMlpBuffers) {
  for (const DType dtype : {DType::f32, DType::bf16}) {
    PlanOptions o;
    o.activation_dtype = dtype;
    LoadedModel m(fixture("moe/qwen2_moe_tiny"), o, false, dtype);
    for (const char* name : {"fc_pre", "fc_act"}) {
      EXPECT_LT(m.plan.find(std::string("block.0.") + name), 0) << name;
      EXPECT_GE(m.plan.find(std::string("block.1.") + name), 0) << name;
    }
  }
}

// OLMoE: RMSNorms over the query and the key projections before the rotary positions, top 3 of 6
// experts without renormalizing, no pad token.
TEST(Models, OlmoeForCausalLMMatchesTransformers) {
  compare_moe_with_transformers("olmoe_tiny");
}

// transformers 5 saves the experts as it holds them where asked (save_pretrained with
// save_original_format=False: each layer's gate_up_proj [E, 2F, C] and down_proj [E, C, F],
// Mixtral's router as mlp.gate), here in shards: they load into the weights the per-expert file
// gives. A packed tensor of another shape is refused by name.
TEST(Models, PackedExpertsLoadAsThePerExpertFile) {
  auto weights = [](const LoadedModel& m) {
    return to_host(*m.be, m.model->params().flat_weights());
  };
  for (const char* name : {"moe/mixtral_tiny", "moe/qwen2_moe_tiny"}) {
    SCOPED_TRACE(name);
    const std::string folder = fixture(name);
    LoadedModel per_expert(folder), packed(folder);
    packed.model->init_weights(*packed.be, 5);
    ASSERT_NE(weights(packed), weights(per_expert));
    packed.model->load_weights(*packed.be,
                               WeightFiles(folder + "/packed/model.safetensors.index.json"));
    EXPECT_EQ(weights(packed), weights(per_expert));
  }
  // Layer 0's experts' gate and up projections packed one row too short.
  const std::string folder = fixture("moe/mixtral_tiny");
  const WeightFiles file(folder + "/packed/model.safetensors.index.json");
  std::vector<std::pair<std::string, Tensor>> entries;
  for (const std::string& n : file.names())
    if (n != "model.layers.0.mlp.experts.gate_up_proj") entries.emplace_back(n, file.get(n));
  std::vector<float> short_rows(5 * 13 * 12);
  entries.emplace_back("model.layers.0.mlp.experts.gate_up_proj",
                       Tensor(short_rows.data(), Shape{5, 13, 12}, DType::f32, Device::cpu));
  TempDir dir("packed_experts");
  write_safetensors(dir / "model.safetensors", entries);
  LoadedModel m(folder);
  expect_error([&] { m.model->load_weights(*m.be, WeightFiles(dir / "model.safetensors")); },
               "tensor 'model.layers.0.mlp.experts.gate_up_proj' in '" +
                   (dir / "model.safetensors") +
                   "': shape [5, 13, 12] where [5, 14, 12] is expected");
}

// Active parameters per token: all but the experts a token is not routed to, in the sparse
// layers only (Qwen2-MoE's layer 1 is dense); a dense model's are all of them.
TEST(Models, AMixtureOfExpertsCountsItsActiveParameters) {
  struct Case {
    const char* folder;
    int64_t inactive;
  };
  for (const Case& c : {Case{"moe/mixtral_tiny", 2 * 3 * 7 * 12 * (5 - 2)},
                        Case{"moe/qwen2_moe_tiny", 1 * 3 * 7 * 12 * (6 - 2)},
                        Case{"moe/olmoe_tiny", 2 * 3 * 7 * 12 * (6 - 3)}, Case{"gpt2_tiny", 0}}) {
    SCOPED_TRACE(c.folder);
    auto model = Model::create(resolve_config(fixture(c.folder)));
    EXPECT_EQ(model->active_parameters(), model->params().total_elements() - c.inactive);
  }
}

// A language-model head's logits rows are padded where the device asks it of bf16 runs
// (DeviceTraits::bf16_head_row_multiple: a GPU's, for sm90 product kernels); the held operand
// (the weight's padded copy) and A's room (the logits' gradient) follow, and a head's bias is
// copied into a buffer of the padded width (Model::head_bias). Planned here for a GPU without
// one: the plan alone decides. The CPU refuses a padded weight.
TEST(Models, TheHeadIsPaddedOnlyWhereTheDeviceAsksForBf16) {
  struct Case {
    const char* name;
    Device device;
    DType act;
    int64_t width;
  };
  for (const Case& c : {Case{"gpt2_tiny", Device::cuda, DType::bf16, 128},
                        Case{"llama_tiny", Device::cuda, DType::bf16, 128},
                        Case{"gpt2_tiny", Device::cuda, DType::f32, 89},
                        Case{"gpt2_tiny", Device::cpu, DType::bf16, 89},
                        Case{"bert_mlm", Device::cuda, DType::f32, 97},  // a biased head
                        Case{"bert_mlm", Device::cuda, DType::bf16, 128}}) {
    SCOPED_TRACE(std::string(c.name) + " " + device_name(c.device) + " " + dtype_name(c.act));
    ModelConfig config = load_config(fixture(std::string(c.name) + "/config.json"));
    if (std::string(c.name) == "bert_mlm") use_masked_lm(config);
    auto model = Model::create(config);
    MemoryPlan plan;
    PlanOptions options;
    options.device = c.device;
    options.activation_dtype = c.act;
    model->plan(plan, BatchShape{2, 8}, options);
    EXPECT_EQ(model->logits_width(), c.width);
    EXPECT_EQ(plan.buffer(plan.find("logits")).shape, (Shape{2, 8, c.width}));
    const int bias = plan.find("lm_head.padded_bias");
    EXPECT_EQ(bias >= 0, std::string(c.name) == "bert_mlm" && c.width == 128);
    if (bias >= 0) EXPECT_EQ(plan.buffer(bias).shape, (Shape{c.width}));
    const MatmulOperands operands = model->matmul_operands();
    EXPECT_EQ(operands.held, c.width * config.hidden_size);
    EXPECT_GE(operands.a, 16 * c.width);
  }
  auto cpu = make_cpu_backend();
  std::vector<float> w(12);
  expect_error(
      [&] {
        cpu->hold_padded_weight(Tensor(w.data(), Shape{3, 4}, DType::f32), 8);
      },
      "does not pad held weights");
}

// sinusoidal_pos_embds: a fresh model's position table equals transformers' initial one.
TEST(Models, DistilBertSinusoidalPositionsStartAsTransformersInitializesThem) {
  LoadedModel m(fixture("distilbert_sinusoidal"));
  m.model->init_weights(*m.be, 3);
  const SafetensorsFile init(fixture("distilbert_sinusoidal/init.safetensors"));
  const Tensor& want = init.get("position_embeddings");
  const int pos = m.model->params().index("distilbert.embeddings.position_embeddings.weight");
  const std::vector<float> got = to_host(*m.be, m.model->params().weight(pos));
  ASSERT_EQ(static_cast<int64_t>(got.size()), want.numel());
  EXPECT_LE(rel_error(got.data(), want.f32(), want.numel()), 1e-6);
}

// Dynamic padding: a batch computed at its own length inside buffers planned for a longer one is
// bit-identical to a model planned for exactly that length (so it matches transformers as that
// one does), also after a pass at the full length in between.
TEST(Models, AShorterBatchInALongerPlanIsExact) {
  for (const char* name : {"bert_tiny", "gpt2_tiny", "distilbert_tiny"}) {
    SCOPED_TRACE(name);
    LoadedModel exact(fixture(name));
    const int64_t T = exact.model->batch_shape().seq;
    const int64_t longest = exact.model->config().max_position_embeddings;
    ASSERT_GT(longest, T);
    LoadedModel longer(fixture(name), {}, false, DType::f32, longest);
    EXPECT_EQ(longer.model->planned_shape().seq, longest);
    EXPECT_EQ(longer.model->batch_shape().seq, T);
    auto logits = [](LoadedModel& m) {
      StepOptions eval;
      eval.training = false;
      eval.compute_grad = false;
      m.model->forward(*m.be, eval);
      return to_host(*m.be, m.model->logits());
    };
    const std::vector<float> want_logits = logits(exact);
    const double want_loss = exact.step(true);
    const std::vector<float> want_grads = exact.grads();
    for (int round = 0; round < 2; ++round) {
      EXPECT_EQ(logits(longer), want_logits);
      EXPECT_EQ(longer.step(true), want_loss);
      EXPECT_EQ(longer.grads(), want_grads);
      // A pass at the full length, then back: the views follow, the batch is refilled.
      longer.model->use_seq(longest);
      EXPECT_EQ(longer.model->batch().input_ids.dim(1), longest);
      longer.model->reset_batch();
      logits(longer);
      longer.model->use_seq(T);
      load_batch(SafetensorsFile(fixture(name) + "/batch.safetensors"), *longer.model, *longer.be);
    }
    EXPECT_THROW(longer.model->use_seq(longest + 1), Error);
    EXPECT_THROW(longer.model->use_seq(0), Error);
  }
}

TEST(Models, LanguageModelHeadsInChunksEqualTheWholeHead) {
  expect_chunked_lm_heads_equal_whole_ones(Device::cpu);
}

TEST(Models, LanguageModelHeadsInChunksEqualTheWholeHeadInBf16) {
  expect_chunked_lm_heads_equal_whole_ones(Device::cpu, DType::bf16);
}

TEST(Models, AMaskedLmDecodesItsLabelledRowsAloneAsEveryRow) {
  expect_labelled_rows_equal_every_row(Device::cpu);
  expect_labelled_rows_equal_every_row(Device::cpu, DType::bf16);
}

// A bf16 head planned in chunks (so with its rounded logit gradients, lm_head.dlogits) runs a
// shorter batch whose rows fit one chunk in the same buffers (use_seq declares what the full
// length did): the loss and gradients of a model planned for that length, which has no such
// buffer, within float32 summation.
TEST(Models, AShorterBatchFitsTheBf16HeadsGroupedGradients) {
  LoadedModel probe(fixture("gpt2_tiny"));
  const BatchShape s = probe.model->batch_shape();
  const int64_t longest = probe.model->config().max_position_embeddings;
  ASSERT_GT(longest, s.seq);
  PlanOptions options;
  options.activation_dtype = DType::bf16;
  options.logits_rows = s.batch * s.seq;  // the short batch is one chunk, the long one more
  LoadedModel exact(fixture("gpt2_tiny"), options, false, DType::bf16);
  LoadedModel longer(fixture("gpt2_tiny"), options, false, DType::bf16, longest);
  EXPECT_LT(exact.plan.find("lm_head.dlogits"), 0);
  ASSERT_GE(longer.plan.find("lm_head.dlogits"), 0);
  EXPECT_EQ(longer.model->batch_shape().seq, s.seq);
  const double want = exact.step(true);
  EXPECT_NEAR(longer.step(true), want, 1e-6 * std::abs(want));
  const std::vector<float> want_grads = exact.grads(), got = longer.grads();
  EXPECT_LE(rel_error(got.data(), want_grads.data(), static_cast<int64_t>(got.size())), 1e-6);
}

// Data parallelism starts a gradient segment's sum once backward reports it final: what a segment
// holds when reported is what it holds when backward ends. The segments run down the buffer (the
// head, the blocks last to first, the embeddings) and cover it.
TEST(Models, GradientSegmentsAreFinalWhenReported) {
  const std::vector<std::pair<const char*, bool>> models{
      {"bert_tiny", false},     {"bert_regression", false}, {"bert_mlm", true},
      {"gpt2_tiny", false},     {"gpt2_variant", false},    {"distilbert_tiny", false},
      {"distilbert_mlm", true}, {"llama_tiny", false},      {"qwen2_tiny", false},
      {"mistral_tiny", false},  {"bert_decoder", false}};
  for (const auto& [name, masked_lm] : models) {
    SCOPED_TRACE(name);
    LoadedModel m(fixture(name), {}, /*dropout=*/true, DType::f32, 0, masked_lm);
    const std::vector<ElementRange>& segments = m.model->grad_segments();
    ASSERT_EQ(segments.size(), static_cast<size_t>(m.model->config().num_layers + 2));
    int64_t end = m.model->params().total_elements();
    for (const ElementRange& r : segments) {
      EXPECT_EQ(r.offset + r.count, end);
      end = r.offset;
    }
    EXPECT_EQ(end, 0);
    for (size_t i = 1; i + 1 < segments.size(); ++i) EXPECT_GT(segments[i].count, 0) << i;
    StepOptions so;
    so.rng = RngKey{7, 3, 0};
    so.loss_grad_scale = 1.0f / static_cast<float>(m.model->count_targets());
    m.model->zero_grads(*m.be);
    m.model->forward(*m.be, so);
    std::vector<int> order;
    std::vector<std::vector<float>> when_reported(segments.size());
    m.model->backward(*m.be, so, [&](int i) {
      order.push_back(i);
      const ElementRange r = segments[static_cast<size_t>(i)];
      when_reported[static_cast<size_t>(i)] =
          to_host(*m.be, element_range(m.model->params().flat_grads(), r.offset, r.count));
    });
    std::vector<int> want_order(segments.size());
    for (size_t i = 0; i < want_order.size(); ++i) want_order[i] = static_cast<int>(i);
    EXPECT_EQ(order, want_order);
    const std::vector<float> final_grads = m.grads();
    for (size_t i = 0; i < segments.size(); ++i) {
      const auto first = final_grads.begin() + segments[i].offset;
      EXPECT_EQ(when_reported[i], std::vector<float>(first, first + segments[i].count))
          << "segment " << i << " changed after it was reported";
    }
  }
}

// An optimizer step's first micro-batch writes each matrix product's weight gradient (and its
// bias's) instead of adding it to zeros: the same bits as adding, on every model, in float32 and
// bf16, and with the language-model head in chunks (the head's weight written by the first chunk
// or, bf16, group of two, added to by the others and, tied, by the embedding), so the trainer
// zeroes only the others' gradients before it (Model::zero_accumulated_grads). Run again over the
// gradients it left, every product weight's gradient is written over (it stays G) and every other
// parameter's gradient is written over too (a product's bias) or still accumulates (it becomes 2G,
// exactly but for the embeddings' rows, which add token by token).
TEST(Models, TheFirstMicroBatchWritesWeightGradients) {
  const std::vector<std::pair<const char*, bool>> models{
      {"bert_tiny", false},     {"bert_regression", false}, {"bert_mlm", true},
      {"gpt2_tiny", false},     {"gpt2_variant", false},    {"distilbert_tiny", false},
      {"distilbert_mlm", true}, {"llama_tiny", false},      {"bert_decoder", false}};
  for (const auto& [name, masked_lm] : models)
    for (int64_t logits_rows : {0, 5})
      for (DType type : {DType::f32, DType::bf16}) {  // bf16: the head's gradient in groups
        SCOPED_TRACE(std::string(name) + " logits_rows " + std::to_string(logits_rows) + " " +
                     dtype_name(type));
        PlanOptions options;
        options.logits_rows = logits_rows;
        options.activation_dtype = type;
        LoadedModel m(fixture(name), options, /*dropout=*/true, type, 0, masked_lm);
        m.step(true, 7, 3, /*first=*/false);
        const std::vector<float> added = m.grads();
        m.step(true, 7, 3, /*first=*/true);
        const std::vector<float> written = m.grads();
        EXPECT_EQ(written, added);
        auto first_micro_batch = [&] {  // the same micro-batch again, not zeroing the gradients
          StepOptions so;
          so.rng = RngKey{7, 3, 0};
          so.first_micro_batch = true;
          so.loss_grad_scale = 1.0f / static_cast<float>(m.model->count_targets());
          m.model->forward(*m.be, so);
          m.model->backward(*m.be, so);
          return m.grads();
        };
        // Over gradients holding NaN, zeroing only those it adds to (as the trainer does) is
        // enough: every product weight's gradient is written.
        m.be->fill(m.model->params().flat_grads(), std::nanf(""));
        m.model->zero_accumulated_grads(*m.be);
        EXPECT_EQ(first_micro_batch(), written);
        const std::vector<float> again = first_micro_batch();
        int products = 0;
        size_t nonzero = 0;
        for (const ParamInfo& p : m.model->params().list()) {
          const auto first = static_cast<size_t>(p.offset), last = first + p.shape.numel();
          const std::vector<float> g(written.begin() + first, written.begin() + last);
          const std::vector<float> got(again.begin() + first, again.begin() + last);
          std::vector<float> doubled = g;
          for (float& v : doubled) v *= 2.0f;
          if (p.product) {
            EXPECT_EQ(got, g) << p.name << " was added to, not written";
            ++products;
          } else {
            EXPECT_TRUE(got == g || rel_error(got.data(), doubled.data(), p.shape.numel()) < 1e-6)
                << p.name;
          }
          nonzero += std::any_of(g.begin(), g.end(), [](float v) { return v != 0.0f; });
        }
        // Not vacuous: product weights were seen, and most gradients are not all zeros (causal
        // BERT classifying its first token, which sees only itself, leaves its last layer's query
        // and key without one, as transformers does).
        EXPECT_GT(products, 0);
        EXPECT_GT(nonzero, m.model->params().list().size() * 3 / 4);
      }
}

// ZeRO stage 2's staged gradients: the blocks' gradients share the slots of two blocks (or one),
// used in turn, and the head's and the embeddings' gradients lie over the same space (a tied
// head's embeddings' gradients apart, before it). As the sums do, each report here moves the
// segment out, then empties the places the next segment writes over (and those reported before
// them): with two slots the slot of the segment reported before, with one this segment's, and
// before the embeddings' backward whatever lies under them. Every segment holds exactly the
// gradients of the whole-gradient plan, over two accumulated micro-batches, and the plan's
// gradient buffer is the slots' length (or the embeddings' and head's) instead of every block's.
TEST(Models, StagedGradientsEqualWholeOnes) {
  struct Case {
    const char* name;
    bool masked_lm, tied;
  };
  // Two slots on the three blocks of gpt2_variant; one on the others' two.
  for (const Case& c : {Case{"bert_tiny", false, false}, Case{"bert_mlm", true, true},
                        Case{"gpt2_tiny", false, true}, Case{"gpt2_variant", false, false},
                        Case{"distilbert_tiny", false, false}, Case{"llama_tiny", false, false}}) {
    SCOPED_TRACE(c.name);
    const int requested = std::string(c.name) == "gpt2_variant" ? 2 : 1;
    LoadedModel whole(fixture(c.name), {}, /*dropout=*/true, DType::f32, 0, c.masked_lm);
    PlanOptions staged_options;
    staged_options.gradient_slots = requested;
    LoadedModel staged(fixture(c.name), staged_options, /*dropout=*/true, DType::f32, 0,
                       c.masked_lm);
    ASSERT_TRUE(staged.model->staged_gradients());
    EXPECT_FALSE(whole.model->staged_gradients());
    const std::vector<ElementRange>& segments = staged.model->grad_segments();
    const int64_t total = staged.model->params().total_elements();
    const int64_t slots = staged.model->grad_layout().slots();
    EXPECT_EQ(slots, requested);
    const int64_t E = segments.back().count, H = segments.front().count, B = segments[1].count;
    const int64_t staged_elements =
        c.tied ? E + std::max(slots * B, H) : std::max(slots * B, E + H);
    EXPECT_EQ(staged.model->params().flat_grads().numel(), staged_elements);
    const auto gradient_bytes = [](const MemoryPlan& p) {
      return p.bytes_by_category()[static_cast<size_t>(Category::gradients)];
    };
    EXPECT_EQ(gradient_bytes(staged.plan), static_cast<size_t>(staged_elements) * sizeof(float));
    EXPECT_LT(gradient_bytes(staged.plan), gradient_bytes(whole.plan));
    const int last = static_cast<int>(segments.size()) - 1;
    bool over_slots = false;  // the head's (or embeddings') gradients share a block's slot
    for (int b = 1; b < last; ++b)
      over_slots = over_slots || staged.model->grad_layout().overlap(0, b) ||
                   (!c.tied && staged.model->grad_layout().overlap(last, b));
    EXPECT_TRUE(over_slots);
    if (c.tied)
      for (int b = 0; b < last; ++b)
        EXPECT_FALSE(staged.model->grad_layout().overlap(last, b)) << b;
    std::vector<float> collected(static_cast<size_t>(total), 0.0f);
    for (uint64_t micro = 0; micro < 2; ++micro) {
      StepOptions so;
      so.rng = RngKey{7, micro, 0};
      so.first_micro_batch = micro == 0;
      so.loss_grad_scale = 1.0f / static_cast<float>(whole.model->count_targets());
      if (micro == 0) {
        whole.model->zero_grads(*whole.be);
        staged.model->zero_grads(*staged.be);
      }
      whole.model->forward(*whole.be, so);
      whole.model->backward(*whole.be, so);
      staged.model->forward(*staged.be, so);
      std::vector<int> pending;  // reported, not yet emptied, in report order
      staged.model->backward(*staged.be, so, [&](int i) {
        const ElementRange r = segments[static_cast<size_t>(i)];
        const std::vector<float> got = to_host(*staged.be, staged.model->grad_segment(i));
        for (int64_t j = 0; j < r.count; ++j)
          collected[static_cast<size_t>(r.offset + j)] += got[static_cast<size_t>(j)];
        pending.push_back(i);
        const bool last = i + 1 == static_cast<int>(segments.size());
        size_t upto = 0;  // empties pending[0, upto)
        for (size_t k = 0; k < pending.size(); ++k)
          if (last || staged.model->grad_layout().overlap(pending[k], i + 1)) upto = k + 1;
        for (size_t k = 0; k < upto; ++k)
          staged.be->fill(staged.model->grad_segment(pending[k]), 0.0f);
        pending.erase(pending.begin(), pending.begin() + static_cast<std::ptrdiff_t>(upto));
      });
      const std::vector<float> want = whole.grads();
      if (micro == 0) {
        EXPECT_EQ(collected, want);
      } else {  // the whole plan's products add into the gradients: another rounding order
        EXPECT_LE(rel_error(collected.data(), want.data(), total), 1e-6);
      }
    }
  }
}

// Recomputing each block inside backward (gradient checkpointing) gives bit-identical gradients,
// with dropout on, and plans fewer activation bytes.
void checkpointing_is_exact(const std::string& name, DType act_dtype = DType::f32,
                            bool masked_lm = false) {
  LoadedModel plain(fixture(name), {false, act_dtype}, /*dropout=*/true, DType::f32, 0, masked_lm);
  LoadedModel ckpt(fixture(name), {true, act_dtype}, /*dropout=*/true, DType::f32, 0, masked_lm);
  const double a = plain.step(true);
  const double b = ckpt.step(true);
  EXPECT_EQ(a, b);
  EXPECT_EQ(plain.grads(), ckpt.grads());
  const auto pa = plain.plan.bytes_by_category(), pb = ckpt.plan.bytes_by_category();
  const int act = static_cast<int>(Category::activations);
  EXPECT_LT(pb[act], pa[act]);
}

// Selective recomputation (only the attention core's statistics rebuilt in backward) gives
// bit-identical gradients with dropout on and plans fewer activation bytes. (Full recomputation's
// single float32 set can outweigh the kept 16-bit tensors of a tiny model; at real sizes the
// plan lies strictly between, tested in test_trainer.cpp.)
void selective_recompute_is_exact(const std::string& name, DType act_dtype = DType::f32) {
  SCOPED_TRACE(name + " " + dtype_name(act_dtype));
  PlanOptions sel{false, act_dtype};
  sel.selective_recompute = true;
  LoadedModel plain(fixture(name), {false, act_dtype}, /*dropout=*/true);
  LoadedModel selective(fixture(name), sel, /*dropout=*/true);
  EXPECT_EQ(plain.step(true), selective.step(true));
  EXPECT_EQ(plain.grads(), selective.grads());
  const int act = static_cast<int>(Category::activations);
  EXPECT_LT(selective.plan.bytes_by_category()[act], plain.plan.bytes_by_category()[act]);
}

TEST(Models, SelectiveRecomputationIsBitIdentical) {
  selective_recompute_is_exact("bert_tiny");
  selective_recompute_is_exact("gpt2_tiny");
  selective_recompute_is_exact("bert_tiny", DType::bf16);
  selective_recompute_is_exact("gpt2_tiny", DType::f16);
  selective_recompute_is_exact("distilbert_tiny", DType::bf16);
}

// The norms' and the MLP activation's outputs rebuilt per block in backward instead of kept
// (PlanOptions::recompute_norms, recompute_activation: both, or the activation's alone) give the
// same loss and gradients bit for bit, with dropout on, where the CPU reads the stored bf16
// copies as they are (bf16 products) and where it widens them into the float32 working set
// (fp16, bf16 on float32 products); with selective recomputation too. The plan keeps fewer
// activation bytes: no per-block a_in or m_in of a pre-norm block where the norms are rebuilt,
// no per-block fc_act where the activation's output is.
void elementwise_recompute_is_exact(const std::string& name, DType act_dtype, DType matmul_dtype,
                                    bool norms = true, bool selective = false) {
  SCOPED_TRACE(name + " " + dtype_name(act_dtype) + " on " + dtype_name(matmul_dtype) +
               " products" + (norms ? "" : ", the activation alone") +
               (selective ? ", selective" : ""));
  PlanOptions kept{false, act_dtype};
  kept.selective_recompute = selective;
  PlanOptions rebuilt = kept;
  rebuilt.recompute_norms = norms;
  rebuilt.recompute_activation = true;
  LoadedModel a(fixture(name), kept, /*dropout=*/true, matmul_dtype);
  LoadedModel b(fixture(name), rebuilt, /*dropout=*/true, matmul_dtype);
  // Two micro-batches (the second adds to the first's gradients), each backward over every block.
  EXPECT_EQ(a.step(true, 7, 3), b.step(true, 7, 3));
  EXPECT_EQ(a.step(true, 7, 4, /*first=*/false), b.step(true, 7, 4, /*first=*/false));
  EXPECT_EQ(a.grads(), b.grads());
  const int act = static_cast<int>(Category::activations);
  EXPECT_LT(b.plan.bytes_by_category()[act], a.plan.bytes_by_category()[act]);
  auto kept_per_block = [&](const std::string& per_block) {
    for (const auto& buffer : b.plan.buffers())
      if (buffer.name.starts_with("block.1.") && buffer.name.ends_with(per_block)) return true;
    return false;
  };
  EXPECT_FALSE(kept_per_block(".fc_act"));
  // (A post-norm block's m_in is its residual too: kept.)
  const bool pre_norm = !name.starts_with("bert");
  EXPECT_EQ(kept_per_block(".a_in"), pre_norm && !norms);
  EXPECT_EQ(kept_per_block(".m_in"), !pre_norm || !norms);
}

TEST(Models, ElementwiseRecomputationIsBitIdentical) {
  for (const char* name : {"gpt2_tiny", "llama_tiny", "gpt2_variant"})
    for (DType products : {DType::bf16, DType::f32}) {
      elementwise_recompute_is_exact(name, DType::bf16, products);
      if (products == DType::f32) elementwise_recompute_is_exact(name, DType::f16, products);
    }
  elementwise_recompute_is_exact("qwen2_tiny", DType::bf16, DType::bf16, true, /*selective=*/true);
  // The activation's output alone (a GPU's choice); a post-norm block (BERT's) has no norm
  // output to rebuild, its GELU's.
  for (const char* name : {"gpt2_tiny", "llama_tiny", "bert_tiny"}) {
    elementwise_recompute_is_exact(name, DType::bf16, DType::bf16, /*norms=*/false);
    elementwise_recompute_is_exact(name, DType::f16, DType::f32, /*norms=*/false);
  }
  elementwise_recompute_is_exact("bert_tiny", DType::bf16, DType::bf16, true, /*selective=*/true);
}

// Post-norm blocks' inputs in two buffers in turn, each rebuilt in backward from the block
// before's res2 (PlanOptions::recompute_block_inputs), give the same loss and gradients bit for
// bit, with dropout on: six blocks (inputs 1 to 3 rebuilt), two micro-batches; the plan keeps
// inputs 0, 1, 2 and 6 only. A pre-norm model's plan keeps them all.
void block_inputs_rebuilt_exactly(const std::string& name, DType act_dtype, bool masked_lm,
                                  bool selective = false) {
  SCOPED_TRACE(name + " " + dtype_name(act_dtype) + (selective ? ", selective" : ""));
  PlanOptions kept{false, act_dtype};
  kept.selective_recompute = selective;
  PlanOptions rebuilt = kept;
  rebuilt.recompute_block_inputs = true;
  auto six = [](ModelConfig& c) { c.num_layers = 6; };
  LoadedModel a(fixture(name), kept, /*dropout=*/true, DType::f32, 0, masked_lm, six, 11);
  LoadedModel b(fixture(name), rebuilt, /*dropout=*/true, DType::f32, 0, masked_lm, six, 11);
  EXPECT_EQ(a.step(true, 7, 3), b.step(true, 7, 3));
  EXPECT_EQ(a.step(true, 7, 4, /*first=*/false), b.step(true, 7, 4, /*first=*/false));
  EXPECT_EQ(a.grads(), b.grads());
  auto hidden = [](const MemoryPlan& plan) {
    std::vector<std::string> names;
    for (const auto& buffer : plan.buffers())
      if (buffer.name.starts_with("hidden.")) names.push_back(buffer.name);
    return names;
  };
  EXPECT_EQ(hidden(a.plan).size(), 7u);
  const std::vector<std::string> in_turn{"hidden.0", "hidden.1", "hidden.2", "hidden.6"};
  EXPECT_EQ(hidden(b.plan), in_turn);
}

TEST(Models, RebuiltBlockInputsAreBitIdentical) {
  block_inputs_rebuilt_exactly("bert_tiny", DType::f32, false);
  block_inputs_rebuilt_exactly("bert_tiny", DType::bf16, false, /*selective=*/true);
  block_inputs_rebuilt_exactly("distilbert_tiny", DType::f16, false);
  block_inputs_rebuilt_exactly("bert_mlm", DType::bf16, /*masked_lm=*/true);
  PlanOptions pre_norm{false, DType::bf16};
  pre_norm.recompute_block_inputs = true;
  LoadedModel gpt2(
      fixture("gpt2_tiny"), pre_norm, false, DType::f32, 0, false,
      [](ModelConfig& c) { c.num_layers = 6; }, 11);
  EXPECT_NE(gpt2.plan.find("hidden.3"), -1);
}

// A plan without gradients (a run that only evaluates: gradient checkpointing's one set of block
// internals, as train's assembly plans it) takes every model's block inputs in turn: the same
// loss as a training plan's, inputs 0, 1, 2 and 6 of six blocks planned (OLMoE: query/key norms,
// whose forward takes backward's d_ctx as scratch).
TEST(Models, AnEvaluationOnlyPlanTakesTheBlockInputsInTurn) {
  for (const char* name : {"gpt2_tiny", "bert_tiny", "moe/olmoe_tiny"}) {
    SCOPED_TRACE(name);
    PlanOptions eval_only{true, DType::bf16};
    eval_only.gradients = false;
    auto six = [](ModelConfig& c) { c.num_layers = 6; };
    LoadedModel train(fixture(name), {false, DType::bf16}, false, DType::f32, 0, false, six, 11);
    LoadedModel eval(fixture(name), eval_only, false, DType::f32, 0, false, six, 11);
    StepOptions so;
    so.training = false;
    so.compute_grad = false;
    EXPECT_EQ(train.model->forward(*train.be, so), eval.model->forward(*eval.be, so));
    EXPECT_NE(train.plan.find("hidden.3"), -1);
    for (const char* kept : {"hidden.0", "hidden.1", "hidden.2", "hidden.6"})
      EXPECT_NE(eval.plan.find(kept), -1) << kept;
    for (const char* shared : {"hidden.3", "hidden.4", "hidden.5"})
      EXPECT_EQ(eval.plan.find(shared), -1) << shared;
  }
}

// A buffer laid over others starts `back` bytes (rounded down to the alignment) before the end of
// those declared before it, in its placement only; the next starts after it; its overlap is
// counted once in the total.
TEST(MemoryPlan, ABufferLaidOverOthersStartsWhereItReachesBack) {
  MemoryPlan plan;
  plan.add("a", Category::activations, DType::u8, Shape{1000});
  plan.add("b", Category::activations, DType::u8, Shape{1000});
  plan.add("pinned", Category::data, DType::u8, Shape{100}, Placement::host);
  EXPECT_EQ(plan.end(Placement::device), 2048u);
  const BufferId c = plan.add_over("c", Category::gradients, DType::u8, Shape{3000}, 600);
  const BufferId d = plan.add("d", Category::temporaries, DType::u8, Shape{10});
  EXPECT_EQ(plan.end(Placement::device), 4864u);
  EXPECT_EQ(plan.overlaid_bytes(), 512u);
  plan.finalize();
  EXPECT_EQ(plan.buffer(c).offset, 1536u);
  EXPECT_EQ(plan.buffer(d).offset, 4608u);
  EXPECT_EQ(plan.total_bytes(Placement::device), 4864u);
  EXPECT_EQ(plan.total_bytes(Placement::host), 256u);
  MemoryPlan early;
  early.add_over("first", Category::gradients, DType::u8, Shape{10}, 256);
  expect_error([&] { early.finalize(); }, "reaches back before the plan's start");
}

// The gradients laid over the blocks' consumed activations (PlanOptions::gradients_over_
// activations) are the same bit for bit after a step of one micro-batch, with dropout on (the
// first micro-batch zeroes each segment's added-to gradients as backward reaches it), and the
// plan is smaller by what they overlay (every segment but the last block's and the head's) less
// what a tied head's weight gradient apart takes.
// `vocab` > 0: the model with that many tokens (random weights either way). `apart_pays`: a tied
// head's weight gradient goes apart (else its table is too large against what it frees).
// `plan_seq`: planned for that length, run at the batch's (shorter) one.
void gradients_over_activations_are_exact(const std::string& name, PlanOptions whole,
                                          bool masked_lm = false, int64_t vocab = 0,
                                          bool apart_pays = true, int64_t plan_seq = 0) {
  SCOPED_TRACE(name + " " + dtype_name(whole.activation_dtype) +
               (whole.gradient_checkpointing ? ", checkpointed" : "") +
               (vocab > 0 ? ", vocabulary " + std::to_string(vocab) : "") +
               (plan_seq > 0 ? ", planned for " + std::to_string(plan_seq) : ""));
  PlanOptions over = whole;
  over.gradients_over_activations = true;
  auto six = [vocab](ModelConfig& c) {
    c.num_layers = 6;
    if (vocab > 0) c.vocab_size = vocab;
  };
  LoadedModel a(fixture(name), whole, /*dropout=*/true, DType::f32, plan_seq, masked_lm, six, 11);
  LoadedModel b(fixture(name), over, /*dropout=*/true, DType::f32, plan_seq, masked_lm, six, 11);
  for (uint64_t micro_step : {3, 4}) {  // a forward over the last step's gradients, a backward
    EXPECT_EQ(a.step(true, 7, micro_step), b.step(true, 7, micro_step));
    EXPECT_EQ(a.grads(), b.grads());
  }
  const Model& m = *b.model;
  const int64_t total = m.params().total_elements();
  const size_t over_bytes = b.plan.overlaid_bytes();
  // A tied head's weight gradient apart (a buffer of its own) where the gradients then lie over
  // more than it takes, by as much again.
  size_t apart = 0;
  for (const auto& buffer : b.plan.buffers())
    if (buffer.name == "lm_head.tied_gradient")
      apart = (buffer.bytes + MemoryPlan::kAlignment - 1) / MemoryPlan::kAlignment *
              MemoryPlan::kAlignment;
  EXPECT_EQ(a.plan.overlaid_bytes(), 0u);
  EXPECT_EQ(a.plan.total_bytes() - b.plan.total_bytes(), over_bytes - apart);
  const bool tied = masked_lm || name.starts_with("gpt2");
  if (tied && !apart_pays) {  // nothing overlaid
    EXPECT_EQ(over_bytes, 0u);
    EXPECT_EQ(apart, 0u);
    return;
  }
  EXPECT_EQ(apart > 0, tied);
  EXPECT_GE(over_bytes, 2 * apart);
  EXPECT_LT(over_bytes, static_cast<size_t>(total) * 4);
}

TEST(Models, GradientsOverConsumedActivationsAreBitIdentical) {
  gradients_over_activations_are_exact("bert_tiny", {false, DType::f32});
  gradients_over_activations_are_exact("bert_tiny", {false, DType::bf16});
  PlanOptions selective{false, DType::bf16};
  selective.selective_recompute = true;
  selective.recompute_block_inputs = true;
  gradients_over_activations_are_exact("distilbert_tiny", selective);
  PlanOptions elementwise{false, DType::bf16};
  elementwise.recompute_norms = elementwise.recompute_activation = true;
  gradients_over_activations_are_exact("llama_tiny", elementwise);
  // Tied heads: their weight gradient apart, or with a large table none laid over.
  gradients_over_activations_are_exact("gpt2_tiny", {false, DType::f16});
  gradients_over_activations_are_exact("gpt2_tiny", {false, DType::f32}, false, 20000, false);
  // Decided for the planned length: run at a shorter one, whose own plan would not take it.
  gradients_over_activations_are_exact("gpt2_tiny", {false, DType::f32}, false, 1500, true, 19);
  gradients_over_activations_are_exact("bert_mlm", {false, DType::bf16}, /*masked_lm=*/true);
  // Under gradient checkpointing, over the blocks' inputs.
  gradients_over_activations_are_exact("bert_tiny", {true, DType::f32});
  gradients_over_activations_are_exact("llama_tiny", {true, DType::bf16});
  // (Its blocks' inputs hold less than twice the table.)
  gradients_over_activations_are_exact("gpt2_tiny", {true, DType::bf16}, false, 0, false);
}

TEST(Models, BertGradientCheckpointingIsBitIdentical) {
  checkpointing_is_exact("bert_tiny");
}
TEST(Models, Gpt2GradientCheckpointingIsBitIdentical) {
  checkpointing_is_exact("gpt2_tiny");
}

TEST(Models, CheckpointingIsBitIdenticalWith16BitActivations) {
  checkpointing_is_exact("bert_tiny", DType::bf16);
  checkpointing_is_exact("gpt2_tiny", DType::f16);
}

TEST(Models, DistilBertGpt2VariantAndMaskedLmCheckpointingIsBitIdentical) {
  checkpointing_is_exact("distilbert_tiny");
  checkpointing_is_exact("gpt2_variant", DType::bf16);
  checkpointing_is_exact("bert_mlm", DType::f32, /*masked_lm=*/true);
  checkpointing_is_exact("distilbert_mlm", DType::bf16, /*masked_lm=*/true);
}

// The llama family's blocks (rotary positions, SwiGLU writing its gradient over the saved
// [gate | up], RMSNorm) recompute bit for bit, in float32 and with 16-bit activations.
TEST(Models, LlamaFamilyRecomputationIsBitIdentical) {
  checkpointing_is_exact("llama_tiny");
  checkpointing_is_exact("qwen2_tiny", DType::bf16);
  checkpointing_is_exact("mistral_tiny", DType::f16);
  selective_recompute_is_exact("llama_tiny");
  selective_recompute_is_exact("qwen2_tiny", DType::bf16);
}

// Dropout: the same (seed, step) gives the same masks, another step other masks.
TEST(Models, DropoutIsReproducibleFromSeedAndStep) {
  for (const char* name : {"bert_tiny", "gpt2_tiny", "distilbert_tiny", "gpt2_variant"}) {
    LoadedModel m(fixture(name), {}, /*dropout=*/true);
    const double a = m.step(true, 11, 5);
    const auto ga = m.grads();
    const double b = m.step(true, 11, 5);
    EXPECT_EQ(a, b) << name;
    EXPECT_EQ(ga, m.grads()) << name;
    const double c = m.step(true, 11, 6);
    EXPECT_NE(a, c) << name;
    const double d = m.step(true, 12, 5);
    EXPECT_NE(a, d) << name;
    const double off = m.step(false);
    EXPECT_NE(a, off) << name;
  }
}

// The plan knows every byte: the arena hands out exactly the planned buffers, and a training
// step allocates nothing on the heap (counted by the operator new of test_alloc_counter.cpp) with
// OpenBLAS's products. With oneDNN's (BRISK_CPU_PRODUCTS=onednn; by default float32 where
// OpenBLAS's kernel is narrower than the CPU) only its per-call bookkeeping inside the library,
// the known exception that
// Precision/CpuProducts.MatchTheReferenceOnRoundedOperands bounds per product: the same
// count every step, at most 16 per product run (DnnlMatmul::calls: the linear layers' and, per
// (batch, head) and block of rows, attention's).
TEST(Models, TrainingStepAllocatesNothing) {
  const size_t probe = heap_allocations();
  delete new std::vector<int>(10);
  ASSERT_GT(heap_allocations(), probe) << "the allocation counter is not in effect";
  for (const bool openblas : {true, false})
    for (const char* name : {"bert_tiny", "gpt2_tiny"})
      for (DType act : {DType::f32, DType::bf16}) {
        set_switch("BRISK_CPU_PRODUCTS", openblas ? "openblas" : "onednn");
        LoadedModel m(fixture(name), {false, act}, /*dropout=*/true);
        set_switch("BRISK_CPU_PRODUCTS", nullptr);
        m.step(true);  // warm-up: thread pools start and primitives are made on first use
        // Every buffer was used: each block's high-water mark is the end of its last buffer.
        std::array<size_t, kNumPlacements> end{};
        for (const auto& b : m.plan.buffers())
          end[static_cast<int>(b.placement)] = b.offset + b.bytes;
        EXPECT_EQ(m.arena->high_water(Placement::device), end[0]) << name;
        EXPECT_EQ(m.arena->high_water(Placement::host), end[1]) << name;
        size_t sum = 0;
        for (size_t b : m.plan.bytes_by_category()) sum += b;
        size_t listed = 0;
        for (const auto& b : m.plan.buffers()) listed += b.bytes;
        EXPECT_EQ(sum, listed) << name;
        const size_t before = heap_allocations();
        const uint64_t calls = DnnlMatmul::calls();
        m.step(true);
        const size_t first = heap_allocations() - before;
        if (openblas || !DnnlMatmul::available(DType::f32)) {
          EXPECT_EQ(first, 0u) << name << ": the step allocated";
          continue;
        }
        // oneDNN's per-call bookkeeping (13 small objects with oneDNN 2.6), and nothing else.
        EXPECT_LE(first, 16u * (DnnlMatmul::calls() - calls)) << name;
        const size_t again = heap_allocations();
        m.step(true);
        EXPECT_EQ(heap_allocations() - again, first) << name << ": the allocations grew";
      }
}

}  // namespace
}  // namespace brisk::testing
