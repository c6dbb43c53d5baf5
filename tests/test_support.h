// Helpers shared by the model-level tests: build a model from a fixture folder and compare
// tensors with a norm-wise relative error.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <memory>
#include <random>
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "core/safetensors.h"
#include "core/switches.h"
#include "models/batch.h"
#include "models/model.h"

namespace brisk::testing {

// Heap allocations made through operator new so far (test_alloc_counter.cpp).
size_t heap_allocations();

// Sets (or, with nullptr, unsets) a measurement switch for the next read_switches.
inline void set_switch(const char* name, const char* value) {
  if (value)
    ::setenv(name, value, 1);
  else
    ::unsetenv(name);
}

inline std::string fixture(const std::string& rel) {
  return std::string(BRISK_FIXTURES_DIR) + "/" + rel;
}

// ||a - b|| / max(||b||, floor)
inline double rel_error(const float* a, const float* b, int64_t n, double floor = 1e-30) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; ++i) {
    num += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    den += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(num) / std::max(std::sqrt(den), floor);
}

// Runs f and expects a brisk::Error whose message contains `needle`.
template <typename F>
void expect_error(F&& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one mentioning \"" << needle << "\"";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
        << "message \"" << e.what() << "\" does not mention \"" << needle << "\"";
  }
}

// A host copy of a float32 tensor in a backend's memory (waits for the device).
inline std::vector<float> to_host(Backend& be, const Tensor& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  be.download(t, Tensor(v.data(), t.shape(), DType::f32, Device::cpu));
  return v;
}

// A model with its plan and arena, loaded from a fixture folder holding config.json,
// model.safetensors and batch.safetensors, on the backend of options.device (the arena in that
// backend's memory, with its matmul workspace; matmul_dtype as set_matmul_dtype takes it).
// plan_seq > the batch's length plans the buffers for that length and computes the batch at its
// own (Model::use_seq, as dynamic padding does).
struct LoadedModel {
  std::unique_ptr<Backend> be;
  std::unique_ptr<Model> model;
  MemoryPlan plan;
  BufferBinder binder;  // the backend's workspace
  std::unique_ptr<Arena> arena;

  // masked_lm: the folder's BERT as BertForMaskedLM (what --mlm asks for).
  // `configure` changes the config before the model is made; init_seed > 0 initializes the
  // weights from that seed instead of loading the folder's (a config of another shape).
  // `backend`: the one to run on instead of options.device's own; `prepare` changes the model
  // before it is planned.
  LoadedModel(const std::string& folder, PlanOptions options = {}, bool dropout = false,
              DType matmul_dtype = DType::f32, int64_t plan_seq = 0, bool masked_lm = false,
              const std::function<void(ModelConfig&)>& configure = nullptr, uint64_t init_seed = 0,
              std::unique_ptr<Backend> backend = nullptr,
              const std::function<void(Model&)>& prepare = nullptr)
      : be(backend ? std::move(backend) : make_backend(options.device, read_switches())) {
    ModelConfig c = resolve_config(folder);
    if (masked_lm) use_masked_lm(c);
    if (configure) configure(c);
    if (!dropout) disable_dropout(c);
    model = Model::create(c);
    if (prepare) prepare(*model);  // before the plan (e.g. parameters frozen)
    SafetensorsFile batch(folder + "/batch.safetensors");
    be->set_matmul_dtype(matmul_dtype);
    const BatchShape shape = batch_shape_of(batch);
    model->plan(plan, {shape.batch, std::max(shape.seq, plan_seq)}, options);
    be->plan_workspace(plan, binder, model->matmul_operands());
    plan.finalize();
    arena = std::make_unique<Arena>(plan, be->device_memory(), be->staging_memory());
    model->bind(*arena);
    binder.bind(*arena);
    if (init_seed > 0)
      model->init_weights(*be, init_seed);
    else
      model->load_weights(*be, WeightFiles(folder + "/model.safetensors"));
    model->use_seq(shape.seq);
    load_batch(batch, *model, *be);
  }

  // One training micro-step, an optimizer step's first as the trainer runs it (the product
  // weights' gradients written, only the others zeroed) or, `first` false, one that adds to
  // zeroed gradients; returns the mean loss.
  double step(bool training, uint64_t seed = 7, uint64_t micro_step = 3, bool first = true) {
    StepOptions so;
    so.training = training;
    so.first_micro_batch = first;
    so.rng = RngKey{seed, micro_step, 0};
    const int64_t n = model->count_targets();
    so.loss_grad_scale = 1.0f / static_cast<float>(n);
    if (first)
      model->zero_accumulated_grads(*be);
    else
      model->zero_grads(*be);
    const double loss = model->forward(*be, so) / n;
    model->backward(*be, so);
    return loss;
  }

  std::vector<float> grads() const { return to_host(*be, model->params().flat_grads()); }
};

// Language-model heads computed a few rows at a time (PlanOptions::logits_rows, here 5: chunks
// that do not divide the rows) equal the head computed whole: eval loss, training loss and every
// gradient, within the summation order's rounding; the chunked plan holds 5 rows of logits and
// refuses to hand out logits it did not keep. With bf16 activations and products on the CPU the
// chunks' gradients are rounded into 10 rows (two chunks) that the weight gradient's product reads
// at once; the same values as unchunked, so only summation order differs there too (measured
// 2e-8). But in bf16 a float32 difference of summation order in the head's input gradient can
// carry a value across a bf16 rounding boundary further down (the rounded inputs of the products
// below), which moves it by a bf16 step: distilbert_mlm's gradients measured 7.9e-4 apart on an
// Intel host (the portable build, OpenBLAS, any thread count) and 2e-8 here. bf16 runs are
// therefore held to 2e-3, a bf16 step's scale; a wrong chunk is far outside either bound. On a
// GPU in bf16, every head here is padded (logits_width()), the masked LMs' with their biases.
inline void expect_chunked_lm_heads_equal_whole_ones(Device device,
                                                     DType activations = DType::f32) {
  const bool bf16 = activations == DType::bf16;
  for (const auto& [name, masked_lm] :
       std::vector<std::pair<const char*, bool>>{{"gpt2_tiny", false},
                                                 {"llama_tiny", false},
                                                 {"bert_mlm", true},
                                                 {"distilbert_mlm", true}}) {
    SCOPED_TRACE(name);
    PlanOptions whole_options, chunked_options;
    whole_options.device = chunked_options.device = device;
    whole_options.activation_dtype = chunked_options.activation_dtype = activations;
    chunked_options.logits_rows = 5;
    LoadedModel whole(fixture(name), whole_options, false, activations, 0, masked_lm);
    LoadedModel chunked(fixture(name), chunked_options, false, activations, 0, masked_lm);
    const BatchShape s = chunked.model->batch_shape();
    // The logits' rows: the vocabulary, or padded past it (bf16 on a GPU, for products on sm90
    // kernels: Model::declare_lm_logits).
    const int64_t V = chunked.model->logits_width();
    EXPECT_GE(V, chunked.model->config().vocab_size);
    ASSERT_GT(s.batch * s.seq, 10);
    EXPECT_EQ(chunked.plan.buffer(chunked.plan.find("logits")).shape, (Shape{5, V}));
    EXPECT_EQ(whole.plan.buffer(whole.plan.find("logits")).shape, (Shape{s.batch, s.seq, V}));
    const int grouped = chunked.plan.find("lm_head.dlogits");
    EXPECT_EQ(grouped >= 0, bf16 && device == Device::cpu);
    if (grouped >= 0) EXPECT_EQ(chunked.plan.buffer(grouped).shape, (Shape{10, V}));
    EXPECT_LT(whole.plan.find("lm_head.dlogits"), 0);  // one chunk: nothing to group
    StepOptions eval;
    eval.training = false;
    eval.compute_grad = false;
    const double want_eval = whole.model->forward(*whole.be, eval);
    EXPECT_NEAR(chunked.model->forward(*chunked.be, eval), want_eval, 1e-6 * std::abs(want_eval));
    EXPECT_THROW(chunked.model->logits(), Error);
    const double want = whole.step(true);
    EXPECT_NEAR(chunked.step(true), want, 1e-6 * std::abs(want));
    const std::vector<float> want_grads = whole.grads(), got = chunked.grads();
    ASSERT_EQ(got.size(), want_grads.size());
    EXPECT_LE(rel_error(got.data(), want_grads.data(), static_cast<int64_t>(got.size())),
              bf16 ? 2e-3 : 1e-5);
  }
}

// A fresh folder under the temp directory, removed at the end of the test.
struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& name) {
    path = std::filesystem::temp_directory_path() /
           (std::string("brisk_") + name + "_" + std::to_string(::getpid()));
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  std::string operator/(const std::string& rel) const { return (path / rel).string(); }
};

// Fixture `name` (a BERT or DistilBERT) copied into `folder` with a batch of `batch` x `seq`
// tokens drawn from `seed`, `percent` of them labelled (about), as a masked LM's, in `file`.
inline void write_masked_lm_folder(const std::string& name, const std::string& folder,
                                   int64_t batch, int64_t seq, uint64_t seed, int percent = 15,
                                   const std::string& file = "batch.safetensors") {
  namespace fs = std::filesystem;
  fs::create_directories(folder);
  for (const char* part : {"config.json", "model.safetensors"})
    fs::copy_file(fs::path(fixture(name)) / part, fs::path(folder) / part,
                  fs::copy_options::overwrite_existing);
  const ModelConfig c = resolve_config(folder);
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::vector<int32_t> ids(batch * seq), mask(batch * seq, 1), types(batch * seq, 0),
      labels(batch * seq, kIgnoreIndex);
  std::uniform_int_distribution<int32_t> token(1, static_cast<int32_t>(c.vocab_size) - 1);
  for (size_t i = 0; i < ids.size(); ++i) {
    ids[i] = token(rng);
    if (static_cast<int>(rng() % 100) < percent) labels[i] = token(rng);
  }
  auto t = [&](std::vector<int32_t>& v) {
    return Tensor(v.data(), Shape{batch, seq}, DType::i32, Device::cpu);
  };
  std::vector<std::pair<std::string, Tensor>> tensors = {
      {"input_ids", t(ids)}, {"attention_mask", t(mask)}, {"labels", t(labels)}};
  if (c.type_vocab_size > 0) tensors.emplace_back("token_type_ids", t(types));
  write_safetensors(folder + "/" + file, tensors);
}

// A masked LM's decoder over the labelled rows alone (PlanOptions::labelled_rows_only: sparse
// prediction, the default) equals it over every row: the training loss and every gradient,
// within summation order (bf16 held to a bf16 step's scale, as the chunked heads are above).
// 8 x 16 tokens, 15% labelled: the decoder takes 64 rows of 128, the rest of its input gradient
// zeros, though a step before (of a batch 60% labelled: 128 rows) left them written. Evaluation
// computes every row, and its logits can be read; a training step's cannot.
inline void expect_labelled_rows_equal_every_row(Device device, DType activations = DType::f32) {
  const TempDir root("labelled_rows");
  for (const char* name : {"bert_mlm", "distilbert_mlm"}) {
    SCOPED_TRACE(name);
    const std::string folder = root / name;
    write_masked_lm_folder(name, folder, 8, 16, 5);
    write_masked_lm_folder(name, folder, 8, 16, 6, 60, "dense.safetensors");
    PlanOptions every, labelled;
    every.device = labelled.device = device;
    every.activation_dtype = labelled.activation_dtype = activations;
    every.labelled_rows_only = false;
    LoadedModel want(folder, every, false, activations, 0, true);
    LoadedModel got(folder, labelled, false, activations, 0, true);
    EXPECT_LT(want.plan.find("batch.mlm_rows"), 0);
    EXPECT_GE(got.plan.find("batch.mlm_rows"), 0);
    for (const bool dense : {true, false}) {
      const std::string file = dense ? "dense.safetensors" : "batch.safetensors";
      SCOPED_TRACE(file);
      for (LoadedModel* m : {&want, &got})
        load_batch(SafetensorsFile(folder + "/" + file), *m->model, *m->be);
      const int64_t targets = got.model->count_targets();
      EXPECT_TRUE(dense ? targets > 64 : targets > 0 && targets < 64) << targets;
      const double want_loss = want.step(true);
      EXPECT_NEAR(got.step(true), want_loss, 1e-6 * std::abs(want_loss));
      if (!dense) EXPECT_THROW(got.model->logits(), Error);  // 64 rows of 128
      const std::vector<float> want_grads = want.grads(), got_grads = got.grads();
      ASSERT_EQ(got_grads.size(), want_grads.size());
      EXPECT_LE(
          rel_error(got_grads.data(), want_grads.data(), static_cast<int64_t>(got_grads.size())),
          activations == DType::bf16 ? 2e-3 : 1e-5);
    }
    StepOptions eval;
    eval.training = false;
    eval.compute_grad = false;
    const double want_eval = want.model->forward(*want.be, eval);
    EXPECT_NEAR(got.model->forward(*got.be, eval), want_eval, 1e-6 * std::abs(want_eval));
    EXPECT_EQ(got.model->logits().numel(), want.model->logits().numel());
  }
}

// A mixture-of-experts fixture's values (tests/fixtures/moe) for brisk's parameter `name` under
// `prefix` ("grad.", "final."): transformers 5 names the experts packed (mlp.experts.gate_up_proj
// [E, 2F, C], each expert's gate rows then its up rows; mlp.experts.down_proj [E, C, F]) and
// Mixtral's router mlp.gate, where brisk holds the experts one by one under the file's names.
inline std::vector<float> moe_fixture_values(const SafetensorsFile& f, const std::string& prefix,
                                             const std::string& name, const ModelConfig& c) {
  static const std::regex expert(
      R"(model\.layers\.(\d+)\.(block_sparse_moe|mlp)\.experts\.(\d+)\.(\w+)\.weight)");
  auto values = [&](const std::string& n, int64_t at, int64_t count) {
    const Tensor& t = f.get(n);
    EXPECT_LE(at + count, t.numel()) << n;
    return std::vector<float>(t.f32() + at, t.f32() + at + count);
  };
  std::smatch m;
  if (std::regex_match(name, m, expert)) {
    const std::string base = prefix + "model.layers." + m[1].str() + ".mlp.experts.";
    const int64_t e = std::stoll(m[3].str()), C = c.hidden_size, F = c.moe.inner;
    const std::string which = m[4].str();
    if (which == "w2" || which == "down_proj") return values(base + "down_proj", e * C * F, C * F);
    const bool up = which == "w3" || which == "up_proj";
    return values(base + "gate_up_proj", e * 2 * F * C + (up ? F * C : 0), F * C);
  }
  std::string n = name;
  const size_t moe = n.find("block_sparse_moe.gate.");
  if (moe != std::string::npos) n.replace(moe, 17, "mlp.");  // "block_sparse_moe."
  return values(prefix + n, 0, f.get(prefix + n).numel());
}

}  // namespace brisk::testing
