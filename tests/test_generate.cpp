// Generation: the key/value-cache decoder against the full forward pass and transformers' greedy
// generate(), the sampling filters, and brisk generate on a trained folder.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <limits>

#include "adapters/merge.h"
#include "cli_support.h"
#include "eval/generate.h"
#include "models/decoder.h"
#include "test_support.h"
#include "train/trainer.h"
#include "trainer_support.h"

namespace brisk::testing {
namespace {

// The tiny GPT-2 fixture planned for decoding alone: its weights and a cache of `max_tokens`.
struct Decoding {
  std::unique_ptr<Backend> be = make_cpu_backend();
  std::unique_ptr<Model> model;
  std::unique_ptr<Decoder> decoder;
  MemoryPlan plan;
  BufferBinder binder;
  std::unique_ptr<Arena> arena;

  Decoding(const std::string& folder, int64_t max_tokens, int64_t max_chunk) {
    model = Model::create(resolve_config(folder));
    PlanOptions o;
    o.weights_only = true;
    model->plan(plan, {1, max_tokens}, o);  // as brisk generate plans it
    decoder = std::make_unique<Decoder>(*model, max_tokens, max_chunk);
    decoder->plan(plan, binder);
    plan.finalize();
    arena = std::make_unique<Arena>(plan, Device::cpu);
    model->bind(*arena);
    binder.bind(*arena);
    model->load_weights(*be, WeightFiles(folder + "/model.safetensors"));
  }
};

// Fed a prompt and then one token at a time, the decoder's logits at every position are the full
// forward pass's (the training model's, at the fixture batch's rows); also with an untied head
// and attention scaled by 1/(layer+1) (gpt2_variant).
void matches_the_full_forward_at_every_position(const std::string& name) {
  SCOPED_TRACE(name);
  const std::string folder = fixture(name);
  LoadedModel full(folder);
  StepOptions eval;
  eval.training = false;
  eval.compute_grad = false;
  full.model->forward(*full.be, eval);
  const std::vector<float> logits = to_host(*full.be, full.model->logits());
  const Tensor& ids = full.model->batch().input_ids;
  const int64_t T = ids.dim(1), V = full.model->config().vocab_size;
  for (int64_t row : {int64_t{0}, int64_t{1}}) {  // gpt2_tiny: 13 and 8 real tokens
    SCOPED_TRACE(row);
    int64_t n = 0;
    for (int64_t t = 0; t < T; ++t) n += full.model->batch().attention_mask.i32()[row * T + t];
    Decoding d(folder, n, 5);
    std::vector<int32_t> prompt(ids.i32() + row * T, ids.i32() + row * T + 5);
    const float* got = d.decoder->feed(*d.be, prompt);
    for (int64_t t = 4; t < n; ++t) {
      EXPECT_LE(rel_error(got, logits.data() + (row * T + t) * V, V), 1e-5) << "position " << t;
      if (t + 1 < n) got = d.decoder->feed(*d.be, {ids.i32()[row * T + t + 1]});
    }
    EXPECT_EQ(d.decoder->position(), n);
    // The cache is full: one more token is refused.
    EXPECT_THROW(d.decoder->feed(*d.be, {1}), Error);
  }
}

TEST(Decoder, MatchesTheFullForwardAtEveryPosition) {
  matches_the_full_forward_at_every_position("gpt2_tiny");
  matches_the_full_forward_at_every_position("gpt2_variant");
  // Rotary positions from the cache's position on, grouped-query caches, SwiGLU, RMSNorm.
  matches_the_full_forward_at_every_position("llama_tiny");
  matches_the_full_forward_at_every_position("qwen2_tiny");
  // Mixtures of experts: each new token routed through its own top-k experts (and a shared one).
  matches_the_full_forward_at_every_position("moe/mixtral_tiny");
  matches_the_full_forward_at_every_position("moe/qwen2_moe_tiny");
  matches_the_full_forward_at_every_position("moe/olmoe_tiny");  // query/key norms
}

// `adapter`: a LoRA folder merged into the weights, against PEFT's generate() with it unmerged
// (its generate.json; scripts/make_lora_fixtures.py).
void greedy_decoding_equals_transformers_generate(const std::string& name,
                                                  const std::string& adapter = "") {
  SCOPED_TRACE(name + " " + adapter);
  const std::string folder = fixture(name);
  std::ifstream f((adapter.empty() ? folder : fixture(adapter)) + "/generate.json");
  const nlohmann::json want = nlohmann::json::parse(f);
  const auto prompt = want["prompt"].get<std::vector<int32_t>>();
  const auto greedy = want["greedy"].get<std::vector<int32_t>>();
  Decoding d(folder, static_cast<int64_t>(prompt.size() + greedy.size()),
             static_cast<int64_t>(prompt.size()));
  if (!adapter.empty()) merge_adapter_into(*d.be, *d.model, fixture(adapter), "the adapter");
  GenerateOptions o;
  std::vector<std::pair<float, int32_t>> work;
  const float* logits = d.decoder->feed(*d.be, prompt);
  std::vector<int32_t> got;
  for (size_t i = 0; i < greedy.size(); ++i) {
    got.push_back(next_token(logits, d.model->config().vocab_size, o, 0.5, work));
    if (i + 1 < greedy.size()) logits = d.decoder->feed(*d.be, {got.back()});
  }
  EXPECT_EQ(got, greedy);
}

TEST(Decoder, GreedyDecodingEqualsTransformersGenerate) {
  greedy_decoding_equals_transformers_generate("gpt2_tiny");
  greedy_decoding_equals_transformers_generate("llama_tiny");
  greedy_decoding_equals_transformers_generate("moe/mixtral_tiny");
  greedy_decoding_equals_transformers_generate("moe/qwen2_moe_tiny");
  greedy_decoding_equals_transformers_generate("moe/olmoe_tiny");
}

TEST(Decoder, GreedyDecodingWithAMergedAdapterEqualsPeftsUnmergedGenerate) {
  greedy_decoding_equals_transformers_generate("llama_tiny", "lora/merge_llama");
  // GPT-2's Conv1D (fan_in_fan_out), rsLoRA's scale, c_attn and c_proj.
  greedy_decoding_equals_transformers_generate("gpt2_tiny", "lora/merge_gpt2");
  // A mixture's experts adapted (target_parameters), merged into their fused weights.
  greedy_decoding_equals_transformers_generate("moe/mixtral_tiny", "lora/experts_mixtral");
  greedy_decoding_equals_transformers_generate("moe/olmoe_tiny", "lora/experts_olmoe");
}

TEST(Decoder, ABertDoesNotGenerate) {
  const ModelConfig c = resolve_config(fixture("bert_tiny"));
  const std::unique_ptr<Model> bert = Model::create(c);
  expect_error([&] { Decoder(*bert, 8, 4); }, "not a causal language model");
}

// transformers' warpers: temperature, then top-k, then top-p (the most likely token always
// stays), and a draw over what is left.
TEST(Generate, SamplingFollowsTheFiltersInTransformersOrder) {
  std::vector<std::pair<float, int32_t>> work;
  // Probabilities 0.2, 0.5, 0.3 for tokens 0, 1, 2.
  const float logits[] = {std::log(0.2f), std::log(0.5f), std::log(0.3f)};
  GenerateOptions greedy;
  EXPECT_EQ(next_token(logits, 3, greedy, 0.99, work), 1);
  GenerateOptions o;
  o.do_sample = true;
  o.top_k = 0;
  // Draws walk the tokens from the most likely: [0, 0.5) -> 1, [0.5, 0.8) -> 2, [0.8, 1) -> 0.
  EXPECT_EQ(next_token(logits, 3, o, 0.49, work), 1);
  EXPECT_EQ(next_token(logits, 3, o, 0.51, work), 2);
  EXPECT_EQ(next_token(logits, 3, o, 0.81, work), 0);
  o.top_k = 2;  // token 0 goes: the draw is over 0.8
  EXPECT_EQ(next_token(logits, 3, o, 0.99, work), 2);
  EXPECT_EQ(next_token(logits, 3, o, 0.6, work), 1);  // 0.48 of 0.8
  o.top_k = 0;
  o.top_p = 0.6;  // 0.5 < 0.6: the second token stays, the third goes
  EXPECT_EQ(next_token(logits, 3, o, 0.99, work), 2);
  o.top_p = 0.5;  // 0.5 reaches it: only the most likely
  EXPECT_EQ(next_token(logits, 3, o, 0.99, work), 1);
  o.top_p = 1.0;
  o.temperature = 1e-3;  // nearly greedy
  EXPECT_EQ(next_token(logits, 3, o, 0.99, work), 1);
  // Options out of range.
  for (auto bad :
       {+[](GenerateOptions& g) { g.top_p = 0; }, +[](GenerateOptions& g) { g.top_p = 1.5; },
        +[](GenerateOptions& g) { g.temperature = 0; },
        +[](GenerateOptions& g) { g.max_new_tokens = 0; },
        +[](GenerateOptions& g) { g.top_k = -1; }}) {
    GenerateOptions g;
    g.prompt = "x";
    bad(g);
    EXPECT_THROW(validate_generate_options(g), Error);
  }
}

// brisk generate on a folder train saved (weights, config, tokenizer): the prompt decoded back,
// the continuation's length, seeded sampling, top_k 1 as greedy; a BERT folder refused.
// A tiny GPT-2 (context 40) trained `steps` steps on the fixture text with the BPE tokenizer,
// saved in dir/`out`: the run's options.
TrainOptions trained_gpt2(const TempDir& dir, const std::string& out, int64_t steps) {
  write_fixture_text(dir, "text.txt");
  const std::string model = write_model_folder(
      dir, "gpt2",
      R"({"model_type": "gpt2", "vocab_size": 800, "n_embd": 32, "n_layer": 2, "n_head": 2,
          "n_positions": 40, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0})");
  TrainOptions t = tiny_options(model, dir / out);
  t.tokenizer_name = fixture("tokenizer/bpe");
  t.train_file = dir / "text.txt";
  t.block_size = 32;
  t.max_steps = steps;
  train(t, [](const nlohmann::json&) {});
  return t;
}

TEST(Generate, ContinuesAPromptWithATrainedFolder) {
  TempDir dir("generate");
  const TrainOptions t = trained_gpt2(dir, "out", 5);

  GenerateOptions o;
  o.model_name_or_path = t.output_dir;
  o.prompt = "The quick brown fox";
  o.max_new_tokens = 12;
  o.device = "cpu";
  const Generation greedy = generate(o);
  EXPECT_EQ(greedy.new_ids.size(), 12u);
  EXPECT_EQ(greedy.text.rfind(o.prompt, 0), 0u) << greedy.text;
  EXPECT_GT(greedy.planned_bytes, size_t{0});
  o.do_sample = true;
  const Generation a = generate(o), b = generate(o);
  EXPECT_EQ(a.new_ids, b.new_ids) << "the same seed draws the same tokens";
  o.top_k = 1;
  EXPECT_EQ(generate(o).new_ids, greedy.new_ids) << "top_k 1 is greedy";
  // The context ends the generation: n_positions 40.
  for (const int64_t most : {int64_t{100}, std::numeric_limits<int64_t>::max()}) {
    o.max_new_tokens = most;
    const Generation full = generate(o);
    EXPECT_EQ(full.prompt_ids.size() + full.new_ids.size(), 40u) << most;
  }
  o.model_name_or_path = fixture("bert_tiny");
  expect_error([&] { generate(o); }, "no tokenizer");
}

// brisk generate --adapter_name_or_path with an adapter a LoRA run trained on a saved folder: the
// text of the folder brisk merge writes from the two; another model's adapter refused.
TEST(Generate, WithAnAdapterAsWithTheModelMergedFromIt) {
  TempDir dir("generate_lora");
  const TrainOptions t = trained_gpt2(dir, "base", 2);
  TrainOptions lora = t;
  lora.model_name_or_path = t.output_dir;
  lora.output_dir = dir / "lora";
  lora.max_steps = 4;
  lora.learning_rate = 0.05;
  lora.use_peft = true;
  lora.lora_target_modules = "c_attn,c_proj";
  train(lora, [](const nlohmann::json&) {});

  const std::string opts = " --device cpu --max_new_tokens 12 --prompt 'The quick brown fox'";
  const std::string base = "generate --model " + t.output_dir + opts;
  const CliRun with = run_brisk(base + " --adapter_name_or_path " + lora.output_dir);
  ASSERT_EQ(with.exit_code, 0) << with.err;
  merge_adapter({t.output_dir, lora.output_dir, dir / "merged"});
  const CliRun merged = run_brisk("generate --model " + (dir / "merged") + opts);
  ASSERT_EQ(merged.exit_code, 0) << merged.err;
  EXPECT_EQ(with.out, merged.out);
  EXPECT_NE(with.out, run_brisk(base).out) << "the adapter changed nothing";
  expect_refused(base + " --adapter_name_or_path " + fixture("lora/merge_llama"),
                 "matches no linear of the model");
}

}  // namespace
}  // namespace brisk::testing
