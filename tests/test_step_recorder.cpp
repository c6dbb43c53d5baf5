// Recorded micro-batches (models/step_recorder.h) against the same micro-batches run as usual: the
// same losses and gradients, bit for bit, through an optimizer step's first micro-batch and the
// ones that add to it, dropout drawing each micro-batch's own masks from the step held in memory.
// On the CPU a recording is its closure (what a graph is: the ops with the arguments they were
// recorded with, run again); on a GPU, CUDA graphs.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend_support.h"
#include "models/batch.h"
#include "models/step_recorder.h"
#include "test_support.h"

namespace brisk::testing {
namespace {

// The CPU backend, recording work as its closure.
class ClosureRecordingCpu final : public CpuBackend {
 public:
  bool records_work() const override { return true; }
  std::unique_ptr<RecordedWork> record(const std::function<void()>& work) override {
    struct Closure final : RecordedWork {
      explicit Closure(std::function<void()> f) : work(std::move(f)) {}
      void run() override { work(); }
      std::function<void()> work;
    };
    return std::make_unique<Closure>(work);
  }
};

struct MicroBatch {
  bool first;
  uint64_t step;
};

// A recorded pass's loss and values against the usual pass's: bit for bit where `tol` is 0, else
// the loss to tol relative and the values normwise.
void expect_as_usual(double got, double want, const std::vector<float>& values,
                     const std::vector<float>& usual, double tol) {
  if (tol == 0) {
    EXPECT_EQ(got, want);
    EXPECT_EQ(values, usual);
  } else {
    EXPECT_NEAR(got, want, tol * want);
    EXPECT_LT(rel_error(values.data(), usual.data(), static_cast<int64_t>(usual.size())), tol);
  }
}

// One micro-batch (loaded on both) on `usual` as the trainer runs it and through `recorder` on
// `recorded`: the same summed loss and gradients.
void expect_step_as_usual(LoadedModel& usual, LoadedModel& recorded, StepRecorder& recorder,
                          const StepOptions& so, double tol) {
  usual.model->forward_step(*usual.be, so);
  usual.model->backward(*usual.be, so);
  recorder.run(so);
  expect_as_usual(recorded.model->read_step_stats(*recorded.be)[kStatLoss],
                  usual.model->read_step_stats(*usual.be)[kStatLoss], recorded.grads(),
                  usual.grads(), tol);
}

void expect_counts(const StepRecorder& recorder, int64_t ran, int64_t recorded, int64_t replayed) {
  const StepRecorder::Counts& n = recorder.counts();
  EXPECT_EQ(n.ran, ran);
  EXPECT_EQ(n.recorded, recorded);
  EXPECT_EQ(n.replayed, replayed);
}

// Six micro-batches, two optimizer steps of three (the first of each writes the gradients the
// others add to), each its own micro-step: on `usual` as the trainer runs them, on `recorded`
// through a StepRecorder; the summed losses and the gradients after each compared, bit for bit
// where `tol` is 0, else the gradients normwise to `tol` and the losses to 1e-9 (a GPU adds its
// embedding gradients, loss sums and, in cuDNN's attention backward, dq by atomics, in varying
// order, which bf16 roundings further down carry; a wrong mask or a gradient written instead of
// added is off by tens of percent).
void expect_recorded_as_run(LoadedModel& usual, LoadedModel& recorded, double tol) {
  ASSERT_TRUE(StepRecorder::possible(*recorded.be, *recorded.model));
  StepRecorder recorder(*recorded.be, *recorded.model);
  const MicroBatch batches[] = {{true, 40}, {false, 41}, {false, 42},
                                {true, 43}, {false, 44}, {false, 45}};
  std::vector<double> losses;
  for (const MicroBatch& mb : batches) {
    SCOPED_TRACE("micro-step " + std::to_string(mb.step));
    StepOptions so;
    so.first_micro_batch = mb.first;
    so.rng = RngKey{11, mb.step, 0};
    so.loss_grad_scale = 1.0f / static_cast<float>(usual.model->count_targets());
    for (LoadedModel* m : {&usual, &recorded}) {
      if (mb.first) m->model->zero_accumulated_grads(*m->be);
      m->model->reset_step_stats(*m->be);
    }
    usual.model->forward_step(*usual.be, so);
    usual.model->backward(*usual.be, so);
    recorder.run(so);
    const double loss = usual.model->read_step_stats(*usual.be)[kStatLoss];
    const double got = recorded.model->read_step_stats(*recorded.be)[kStatLoss];
    const std::vector<float> want = usual.grads(), grads = recorded.grads();
    if (tol == 0) {
      EXPECT_EQ(got, loss);
      EXPECT_EQ(grads, want);
    } else {
      EXPECT_NEAR(got, loss, 1e-9 * std::abs(loss));
      EXPECT_LT(rel_error(grads.data(), want.data(), static_cast<int64_t>(want.size())), tol);
    }
    losses.push_back(loss);
  }
  // Not vacuous: every micro-step drew its own dropout masks (the batch is the same each time).
  for (size_t i = 1; i < losses.size(); ++i) EXPECT_NE(losses[i], losses[i - 1]);
  // Each signature (first or not) ran once, was recorded the second time, then replayed.
  expect_counts(recorder, 2, 2, 2);
}

TEST(StepRecorder, ReplaysGiveWhatTheMicroBatchesGaveOnTheCpu) {
  const std::vector<std::pair<const char*, bool>> models{
      {"bert_tiny", false}, {"bert_mlm", true}, {"gpt2_tiny", false}, {"llama_tiny", false}};
  for (const auto& [name, masked_lm] : models)
    for (DType type : {DType::f32, DType::bf16}) {
      SCOPED_TRACE(std::string(name) + " " + dtype_name(type));
      PlanOptions options;
      options.activation_dtype = type;
      // Llama's config has no dropout: its attention's, as the others have.
      auto attention_dropout = [](ModelConfig& c) { c.attention_dropout = 0.1f; };
      LoadedModel usual(fixture(name), options, /*dropout=*/true, type, 0, masked_lm,
                        attention_dropout);
      options.held_step = true;
      LoadedModel recorded(fixture(name), options, /*dropout=*/true, type, 0, masked_lm,
                           attention_dropout, 0, std::make_unique<ClosureRecordingCpu>());
      expect_recorded_as_run(usual, recorded, 0.0);
    }
}

// A batch of `seq` tokens a row, its ids and labels drawn from `salt`: labels per token (a
// language model's, the ids themselves) or per row.
void fill_batch(Model& model, int64_t seq, int salt) {
  model.use_seq(seq);
  model.reset_batch();
  const Batch& b = model.batch();
  const int64_t n = b.input_ids.numel();
  for (int64_t i = 0; i < n; ++i)
    b.input_ids.i32()[i] = static_cast<int32_t>((i * 7 + salt * 13 + 1) % 50);
  const int64_t labels = b.labels.numel();
  for (int64_t i = 0; i < labels; ++i)
    b.labels.i32()[i] = labels == n ? b.input_ids.i32()[i] : static_cast<int32_t>((i + salt) % 2);
}

// An evaluation's forward passes (no dropout, no gradients) through the recorder: the same losses
// and logits as the usual forward, over lengths that take their own recordings (dynamic padding:
// each length its own signature), on `device`'s backend or, given, on `backend`; to `tol` (0: bit
// for bit; a GPU's loss sums add by atomics). A recorded closure reads the model's views as they
// are when it runs, so on the CPU a signature that missed the length would pass: the GPU's graphs,
// which keep the views they were recorded with, check that.
void expect_recorded_forward(Device device, std::function<std::unique_ptr<Backend>()> backend,
                             double tol) {
  for (const char* name : {"bert_tiny", "gpt2_tiny"}) {
    SCOPED_TRACE(name);
    const int64_t T = batch_shape_of(SafetensorsFile(fixture(name) + "/batch.safetensors")).seq;
    PlanOptions options;
    options.device = device;
    LoadedModel usual(fixture(name), options, false, DType::f32, T + 3);
    options.held_step = true;
    LoadedModel recorded(fixture(name), options, false, DType::f32, T + 3, false, nullptr, 0,
                         backend ? backend() : nullptr);
    StepRecorder recorder(*recorded.be, *recorded.model);
    StepOptions so;
    so.training = false;
    so.compute_grad = false;
    int salt = 0;
    for (const int64_t seq : {T, T + 3, T, T + 3, T, T + 3}) {
      SCOPED_TRACE("length " + std::to_string(seq));
      for (LoadedModel* m : {&usual, &recorded}) fill_batch(*m->model, seq, salt);
      ++salt;
      const double loss = usual.model->forward(*usual.be, so);
      EXPECT_GT(loss, 0.0);
      recorded.model->reset_step_stats(*recorded.be);
      recorder.forward(so);
      expect_as_usual(recorded.model->read_step_stats(*recorded.be)[kStatLoss], loss,
                      to_host(*recorded.be, recorded.model->logits()),
                      to_host(*usual.be, usual.model->logits()), tol);
    }
    expect_counts(recorder, 2, 2, 2);
  }
}

TEST(StepRecorder, RecordedForwardPassesGiveTheUsualLossesAndLogits) {
  expect_recorded_forward(
      Device::cpu, [] { return std::make_unique<ClosureRecordingCpu>(); }, 0.0);
}

TEST(StepRecorder, RecordedForwardPassesGiveTheUsualLossesAndLogitsOnTheGpu) {
  REQUIRE_GPU();
  expect_recorded_forward(Device::cuda, nullptr, 1e-6);
}

// Micro-batches of one shape whose label counts differ (the first labels ignored): each scales its
// loss's gradient by its own 1 / targets, which a replay reads from memory. On `device`'s backend
// or, given, on `backend`; to `tol` (0: bit for bit). A recorded closure keeps the options it was
// recorded with, so a scale taken from them would give the recording's batch's: off by the ratio
// of the counts.
void expect_scales_from_memory(Device device, std::function<std::unique_ptr<Backend>()> backend,
                               double tol) {
  for (const char* name : {"bert_tiny", "gpt2_tiny", "llama_tiny"}) {
    SCOPED_TRACE(name);
    PlanOptions options;
    options.device = device;
    LoadedModel usual(fixture(name), options);
    options.held_step = true;
    LoadedModel recorded(fixture(name), options, false, DType::f32, 0, false, nullptr, 0,
                         backend ? backend() : nullptr);
    const int64_t T = usual.model->batch().input_ids.dim(1);
    StepRecorder recorder(*recorded.be, *recorded.model);
    std::vector<int64_t> targets;
    for (int salt = 0; salt < 4; ++salt) {
      SCOPED_TRACE("micro-batch " + std::to_string(salt));
      for (LoadedModel* m : {&usual, &recorded}) {
        fill_batch(*m->model, T, salt);
        const Tensor& y = m->model->batch().labels;
        for (int64_t i = 0; i < salt * (y.numel() / 8 + 1); ++i) y.i32()[i] = kIgnoreIndex;
        m->model->zero_accumulated_grads(*m->be);
        m->model->reset_step_stats(*m->be);
      }
      targets.push_back(usual.model->count_targets());
      StepOptions so;
      so.first_micro_batch = true;
      so.loss_grad_scale = 1.0f / static_cast<float>(targets.back());
      expect_step_as_usual(usual, recorded, recorder, so, tol);
    }
    // Not vacuous: the counts differ, and one signature ran, was recorded, then replayed twice.
    for (size_t i = 1; i < targets.size(); ++i) EXPECT_NE(targets[i], targets[i - 1]);
    expect_counts(recorder, 1, 1, 2);
  }
}

TEST(StepRecorder, ReplaysScaleEachMicroBatchsGradientByItsOwnTargets) {
  expect_scales_from_memory(
      Device::cpu, [] { return std::make_unique<ClosureRecordingCpu>(); }, 0.0);
}

TEST(StepRecorder, ReplaysScaleEachMicroBatchsGradientByItsOwnTargetsOnTheGpu) {
  REQUIRE_GPU();
  expect_scales_from_memory(Device::cuda, nullptr, 1e-6);
}

// The CPU backend recording closures, its packed attention reading the samples' starts from
// memory (PackedSamples::at) as the GPU's ragged call does, so that its packed calls follow the
// samples' count alone. Hooks run as it records and around each replay (the test makes the
// model's host starts stale there).
class LayoutFromMemoryCpu final : public CpuBackend {
 public:
  std::function<void()> before_record, before_replay, after_replay;
  bool records_work() const override { return true; }
  std::unique_ptr<RecordedWork> record(const std::function<void()>& work) override {
    if (before_record) before_record();
    struct Closure final : RecordedWork {
      Closure(std::function<void()> f, LayoutFromMemoryCpu* be) : work(std::move(f)), be(be) {}
      void run() override {
        if (be->before_replay) be->before_replay();
        work();
        if (be->after_replay) be->after_replay();
      }
      std::function<void()> work;
      LayoutFromMemoryCpu* be;
    };
    return std::make_unique<Closure>(work, this);
  }
  void add_packed_signature(const PackedSamples& samples, const AttentionDims&, bool, float, float,
                            std::vector<int64_t>& out) const override {
    out.push_back(samples.count());
  }
  void packed_attention_forward(const Tensor& qkv, const PackedSamples& samples, bool causal,
                                int heads, int kv_heads, float scale, float dropout_p,
                                const RngKey& key, const Tensor& stats, const Tensor& scratch,
                                const Tensor& out) override {
    CpuBackend::packed_attention_forward(qkv, from_memory(samples), causal, heads, kv_heads, scale,
                                         dropout_p, key, stats, scratch, out);
  }
  Tensor packed_attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& out,
                                   const Tensor& stats, const PackedSamples& samples, bool causal,
                                   int heads, int kv_heads, float scale, float dropout_p,
                                   const RngKey& key, const Tensor& scratch, const Tensor& dqkv,
                                   DType round_dout, DType round_dqkv) override {
    return CpuBackend::packed_attention_backward(dout, qkv, out, stats, from_memory(samples),
                                                 causal, heads, kv_heads, scale, dropout_p, key,
                                                 scratch, dqkv, round_dout, round_dqkv);
  }

 private:
  static PackedSamples from_memory(const PackedSamples& given) {
    PackedSamples s;
    const int32_t* at = given.at.i32();
    s.starts.assign(at, at + given.at.numel());
    return s;
  }
};

// Packed batches of four samples laid differently (the first sample's length varies), each
// micro-batch run as usual on `usual` and through a StepRecorder on `recorded`: one recording,
// replayed, gives the usual losses and gradients (to `tol`; 0: bit for bit).
void expect_packed_replays(LoadedModel& usual, LoadedModel& recorded, double tol) {
  const int64_t B = usual.model->batch().input_ids.dim(0);
  const int64_t T = usual.model->batch().input_ids.dim(1);
  StepRecorder recorder(*recorded.be, *recorded.model);
  for (int salt = 0; salt < 4; ++salt) {
    SCOPED_TRACE("micro-batch " + std::to_string(salt));
    // None longer than a row: the first two split the first row by `salt`.
    const PackedSamples layout{{0, 2 + salt, T, T + (B * T - T) / 2, B * T}};
    for (LoadedModel* m : {&usual, &recorded}) {
      fill_batch(*m->model, T, salt);
      m->model->use_samples(layout);
      m->model->zero_accumulated_grads(*m->be);
      m->model->reset_step_stats(*m->be);
    }
    StepOptions so;
    so.first_micro_batch = true;
    so.loss_grad_scale = 1.0f / static_cast<float>(usual.model->count_targets());
    expect_step_as_usual(usual, recorded, recorder, so, tol);
  }
  expect_counts(recorder, 1, 1, 2);
}

// The embeddings' positions, rotary positions, pooled first tokens and attention all read the
// layout uploaded with the batch. Each replay runs with the model's host starts made stale (the
// recording's batch's), so a call that still took them from the host would compute the wrong
// samples.
TEST(StepRecorder, PackedBatchesOfOtherLayoutsReplayOneRecording) {
  for (const char* name : {"bert_tiny", "gpt2_tiny", "llama_tiny"}) {
    SCOPED_TRACE(name);
    PlanOptions options;
    options.packed_samples = true;
    LoadedModel usual(fixture(name), options);
    options.held_step = true;
    auto owned = std::make_unique<LayoutFromMemoryCpu>();
    LayoutFromMemoryCpu* be = owned.get();
    LoadedModel recorded(fixture(name), options, false, DType::f32, 0, false, nullptr, 0,
                         std::move(owned));
    PackedSamples recording, fresh;
    be->before_record = [&] { recording = *recorded.model->packed_samples(); };
    be->before_replay = [&] {
      fresh = *recorded.model->packed_samples();
      PackedSamples stale = fresh;
      stale.starts = recording.starts;
      recorded.model->use_samples(stale);
    };
    be->after_replay = [&] { recorded.model->use_samples(fresh); };
    expect_packed_replays(usual, recorded, 0.0);
  }
}

// On a GPU, bf16: the ragged attention's graphs (heads of 8 columns, as cuDNN's need) replay
// across layouts; the models' weights drawn from a seed at that shape.
TEST(StepRecorder, PackedBatchesOfOtherLayoutsReplayOneRecordingOnTheGpu) {
  REQUIRE_GPU();
  auto eight_wide = [](ModelConfig& c) {
    c.hidden_size = 32;
    c.num_heads = 4;
    if (c.num_kv_heads > 0) c.num_kv_heads = 2;
    if (c.explicit_head_dim > 0) c.explicit_head_dim = 8;
  };
  for (const char* name : {"bert_tiny", "gpt2_tiny", "llama_tiny"}) {
    SCOPED_TRACE(name);
    PlanOptions options;
    options.device = Device::cuda;
    options.activation_dtype = DType::bf16;
    options.packed_samples = true;
    LoadedModel usual(fixture(name), options, false, DType::bf16, 0, false, eight_wide, 7);
    options.held_step = true;
    LoadedModel recorded(fixture(name), options, false, DType::bf16, 0, false, eight_wide, 7);
    expect_packed_replays(usual, recorded, 1e-2);
  }
}

TEST(StepRecorder, RecordsOnlyWhereTheBackendRecordsAndTheStepIsHeld) {
  PlanOptions held;
  held.held_step = true;
  LoadedModel plain_backend(fixture("bert_tiny"), held);
  EXPECT_FALSE(StepRecorder::possible(*plain_backend.be, *plain_backend.model));
  LoadedModel unplanned(fixture("bert_tiny"), PlanOptions(), false, DType::f32, 0, false, nullptr,
                        0, std::make_unique<ClosureRecordingCpu>());
  EXPECT_FALSE(StepRecorder::possible(*unplanned.be, *unplanned.model));
  expect_error([&] { StepRecorder r(*unplanned.be, *unplanned.model); }, "internal error");
}

// CUDA graphs: the same micro-batches recorded and replayed on the GPU, float32 and bf16.
TEST(StepRecorder, ReplaysGiveWhatTheMicroBatchesGaveOnTheGpu) {
  REQUIRE_GPU();
  for (const char* name : {"bert_tiny", "gpt2_tiny"})
    for (DType type : {DType::f32, DType::bf16}) {
      SCOPED_TRACE(std::string(name) + " " + dtype_name(type));
      PlanOptions options;
      options.device = Device::cuda;
      options.activation_dtype = type;
      LoadedModel usual(fixture(name), options, /*dropout=*/true, type);
      options.held_step = true;
      LoadedModel recorded(fixture(name), options, /*dropout=*/true, type);
      expect_recorded_as_run(usual, recorded, type == DType::f32 ? 1e-6 : 1e-2);
    }
}

}  // namespace
}  // namespace brisk::testing
