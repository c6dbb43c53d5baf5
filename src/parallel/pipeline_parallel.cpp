// Pipeline parallelism's policy (pipeline_parallel.h): the 1F1B step through the stages, the
// step's statistics and tied embeddings summed across them, and saves of the whole model.
#include "parallel/pipeline_parallel.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <utility>

#include "backend/backend.h"
#include "core/clock.h"
#include "optim/optimizer.h"
#include "parallel/communicator.h"
#include "parallel/layered_policy.h"
#include "parallel/part_reads.h"
#include "parallel/pipeline_schedule.h"
#include "parallel/zero.h"
#include "precision/mixed_precision.h"

namespace brisk {

int pipeline_stashed_inputs(const ModelConfig& c) {
  const bool middle = c.pipeline_stages > 1 && !c.first_stage() && !c.last_stage();
  return middle ? c.pipeline_stages - c.pipeline_stage : 0;
}

namespace {

using Clock = std::chrono::steady_clock;

// `t` (a [B, T, C] float32 buffer of `model`'s) at the planned length: activations and gradients
// go whole, a shorter micro-batch's filling them from the start, so that a stage may receive a
// micro-batch's before it has loaded the batch.
Tensor planned_buffer(const Model& model, const Tensor& t) {
  const BatchShape planned = model.planned_shape();
  return Tensor(t.data(),
                Shape{planned.batch * model.planned_tokens() * model.config().hidden_size},
                DType::f32, t.device());
}

class PipelineParallel final : public LayeredPolicy, public StagedForward {
 public:
  PipelineParallel(const ParallelContext& c, std::unique_ptr<ParallelPolicy> inner)
      : LayeredPolicy(c, std::move(inner)),
        pipe_(c.mesh.group(MeshDim::pipeline)),
        full_(Model::create(c.full)),
        scratch_(c.buffers.grad_receive) {
    const ModelConfig& full = c.full;
    place_parameters(full);
    state_ = state_layout(optimizer_, full_->params());
    const int stage = pipe_.rank(), last = pipe_.size() - 1;
    // The first and last stages sum their tied embeddings' gradients; the others take no part.
    embedding_group_ = pipe_.split(stage == 0 || stage == last ? 0 : stage, stage);
    for (size_t i = 0; i < model_.params().list().size(); ++i) {
      const ParamInfo& p = model_.params().list()[i];
      if (p.embedding && p.product && (stage == 0 || stage == last)) tied_ = static_cast<int>(i);
    }
    if (sharded_gradients() && ties_embeddings()) join_tied_replicas(stage == 0 || stage == last);
    // Where this rank's optimizer state (its run's: ZeRO's partition of the stage's parameters,
    // or the whole stage) lies in a checkpoint's, laid out as the whole model's parameters.
    share_ = whole_layout_share(optimizer_, model_.params(), full_->params(), run_, state_);
    stash_batches();
  }

  void begin_step() override {
    inner().begin_step();
    // The first stage's tied embeddings: the head does not start their gradient here.
    if (tied_ >= 0 && pipe_.rank() == 0) be_.fill(model_.params().grad(tied_), 0.0f);
  }
  void run_micro_batches(Backend& be, Model& model, int count, MicroBatches& batches) override;

  // The data replicas' sums, then the loss summed over the stages (the last adds it) and the
  // tied embeddings' gradients between the first and last.
  SyncSeconds finish_gradients() override {
    return finish_then([&] {
      pipe_.all_reduce_sum(model_.step_stats());
      if (tied_ >= 0) sum_tied_gradients();
    });
  }
  double sum_over_gradients(const Tensor& sums) override {
    return sum_over_gradients_then(sums, pipe_);
  }

  // Each stage counts its own parameters; the last stage's copy of tied embeddings is the
  // first's.
  double gradient_sum_squares(const Tensor& acc, int skip) override {
    BRISK_CHECK(skip < 0, "internal error: a pipeline inside another layout");
    const double seconds =
        inner().gradient_sum_squares(acc, tied_ >= 0 && pipe_.rank() != 0 ? tied_ : -1);
    const Clock::time_point start = Clock::now();
    pipe_.all_reduce_sum(acc);
    return seconds + seconds_since(start);
  }

  // The share of the stages' time spent waiting for each other: over the steps so far, and in
  // the last.
  std::vector<std::pair<std::string, double>> statistics() const override {
    std::vector<std::pair<std::string, double>> out = inner().statistics();
    out.emplace_back("pipeline_bubble_share",
                     steps_ > 0 ? bubble_sum_ / static_cast<double>(steps_) : 0);
    return out;
  }
  // The last step's bubble, and the bytes of activations and gradients this rank sent in it.
  std::vector<std::pair<std::string, double>> step_statistics() const override {
    return {{"pipeline_bubble_share", last_bubble_}, {"pipeline_sent_bytes", last_sent_}};
  }
  const StateShare* state_share() const override { return &share_; }
  const Model* saved_model() const override { return full_.get(); }
  StagedForward* staged_forward() override { return this; }

  // Evaluation's forward pass: batch after batch down the stages.
  void forward(Backend& be, Model& model, const StepOptions& options) override {
    const int s = pipe_.rank();
    if (s > 0) pipe_.receive(planned_buffer(model, model.stage_input()), s - 1);
    model.forward_step(be, options);
    if (s < pipe_.size() - 1) pipe_.send(planned_buffer(model, model.stage_output()), s + 1);
  }
  Communicator& stages() override { return pipe_; }

  // Each stage's share comes from its replicas (data and sequence ranks): under ZeRO their runs
  // in order, else the first replica's whole.
  std::unique_ptr<GatheredReads> gather_for_save(bool checkpoint) override {
    return std::make_unique<PartReads>(world_, saved_parts(checkpoint), full_->params(), placed_,
                                       holders_, held_elements_, state_);
  }

 private:
  Communicator& pipe_;
  std::unique_ptr<Model> full_;  // the whole model's parameters (no buffers)
  std::unique_ptr<Communicator> embedding_group_;
  int tied_ = -1;  // a tied embedding the first and last stages both hold
  // ZeRO 2 and 3: every replica of the first and last stages (of this tensor rank), the slot their
  // sums of tied embeddings' gradients pass through, and the elements of it each sum takes.
  std::unique_ptr<Communicator> tied_replicas_;
  Tensor scratch_;
  int64_t tied_chunk_ = 0;
  std::vector<std::vector<Placed>> placed_;  // by whole parameter, then tensor rank
  std::vector<std::vector<int>> holders_;    // each stage's share's replicas
  int64_t held_elements_ = 0;
  StateLayout state_;  // the whole model's optimizer state
  StateShare share_;
  // The batches of micro-batches in flight, by slot and by field of Batch.
  std::vector<std::vector<std::vector<char>>> batches_;
  std::vector<int64_t> lengths_;
  std::vector<PipeStep> ops_;  // the stage's 1F1B order for ops_count_ micro-batches
  int ops_count_ = -1;
  double bubble_sum_ = 0, last_bubble_ = 0, last_sent_ = 0;
  int64_t steps_ = 0;

  // ZeRO 2 and 3: the data policy's gradients are this rank's run of the stage's.
  bool sharded_gradients() const {
    return inner().gradients().numel() < model_.params().total_elements();
  }

  // Whether the whole model's head reads its embedding table (the first and last stages both
  // hold it): known alike on every rank.
  bool ties_embeddings() const {
    const std::vector<ParamInfo>& params = full_->params().list();
    return std::any_of(params.begin(), params.end(),
                       [](const ParamInfo& p) { return p.embedding && p.product; });
  }

  // Every rank, a collective: the replicas of the first and last stages (`ends`) with this
  // tensor rank as a group of their own, and the chunk their sums take (the smallest slot's).
  void join_tied_replicas(bool ends) {
    const int tensors = mesh_.shape()[MeshDim::tensor];
    const int color = ends ? mesh_.coordinate(MeshDim::tensor) : tensors + world_.rank();
    tied_replicas_ = world_.split(color, world_.rank());
    std::vector<double> slots(static_cast<size_t>(tied_replicas_->size()), 0.0);
    slots[static_cast<size_t>(tied_replicas_->rank())] = static_cast<double>(scratch_.numel());
    tied_replicas_->all_reduce_sum(
        Tensor(slots.data(), Shape{static_cast<int64_t>(slots.size())}, DType::f64));
    tied_chunk_ = static_cast<int64_t>(*std::min_element(slots.begin(), slots.end()));
    BRISK_CHECK(!ends || tied_chunk_ > 0, "internal error: no slot for the tied embeddings' sums");
  }

  // The tied embeddings' gradients summed between the first and last stages. Under ZeRO 2 and 3
  // each replica holds its run of them, and the two stages' runs differ: every replica of both
  // adds its part of a chunk of the table into zeros, the chunk is summed over all of them, and
  // each takes its part back.
  void sum_tied_gradients() {
    const ParamInfo& p = model_.params().list()[static_cast<size_t>(tied_)];
    if (!sharded_gradients()) {
      embedding_group_->all_reduce_sum(model_.params().grad(tied_));
      return;
    }
    const Tensor& shard = inner().gradients();
    const int64_t n = p.shape.numel();
    // The table's elements [lo, hi) in this rank's run.
    const int64_t lo = std::clamp(run_.offset - p.offset, int64_t{0}, n);
    const int64_t hi = std::clamp(run_.offset + run_.count - p.offset, int64_t{0}, n);
    for (int64_t at = 0; at < n; at += tied_chunk_) {
      const int64_t len = std::min(tied_chunk_, n - at);
      const Tensor chunk = element_range(scratch_, 0, len);
      const int64_t a = std::max(at, lo), b = std::min(at + len, hi);
      const Tensor mine =
          b > a ? element_range(shard, p.offset + a - run_.offset, b - a) : Tensor();
      be_.fill(chunk, 0.0f);
      if (b > a) be_.copy(mine, element_range(chunk, a - at, b - a));
      tied_replicas_->all_reduce_sum(chunk);
      if (b > a) be_.copy(element_range(chunk, a - at, b - a), mine);
    }
  }

  // Which rank holds each of the whole model's parameters on each tensor rank, and where in its
  // stage's share; the holders, and their parameters' elements together.
  void place_parameters(const ModelConfig& full) {
    const int stages = pipe_.size(), tensors = mesh_.shape()[MeshDim::tensor];
    placed_.assign(full_->params().list().size(),
                   std::vector<Placed>(static_cast<size_t>(tensors)));
    for (int s = 0; s < stages; ++s) {
      for (int t = 0; t < tensors; ++t) {
        const ModelConfig share = tensors > 1 ? tensor_parallel_share(full, t, tensors) : full;
        const std::unique_ptr<Model> stage = Model::create(pipeline_share(share, s, stages));
        const auto holder = static_cast<int>(holders_.size());
        holders_.push_back(replica_ranks(mesh_.shape(), s, t));
        held_elements_ += stage->params().total_elements();
        // A tied embedding: the first stage's.
        place_part(optimizer_, stage->params(), full_->params(), holder, static_cast<size_t>(t),
                   placed_);
      }
    }
  }

  // The fields of a batch, in a fixed order.
  static std::array<const Tensor*, 5> fields(const Batch& b) {
    return {&b.input_ids, &b.attention_mask, &b.token_type_ids, &b.labels, &b.label_values};
  }
  // Room for the batches a stage before the last recomputes from: one per micro-batch in flight.
  void stash_batches() {
    const int stage = pipe_.rank();
    if (stage == pipe_.size() - 1) return;
    batches_.resize(static_cast<size_t>(pipe_.size() - stage));
    lengths_.assign(batches_.size(), 0);
    for (auto& slot : batches_)
      for (const Tensor* t : fields(model_.batch())) slot.emplace_back(t->empty() ? 0 : t->bytes());
  }
  // A micro-batch's batch and length into `slot`, and back.
  void keep_batch(int slot) {
    lengths_[static_cast<size_t>(slot)] = model_.batch_shape().seq;
    auto& kept = batches_[static_cast<size_t>(slot)];
    const auto f = fields(model_.batch());
    for (size_t i = 0; i < f.size(); ++i)
      if (!f[i]->empty()) std::memcpy(kept[i].data(), f[i]->data(), f[i]->bytes());
  }
  void restore_batch(int slot) {
    model_.use_seq(lengths_[static_cast<size_t>(slot)]);
    const auto& kept = batches_[static_cast<size_t>(slot)];
    const auto f = fields(model_.batch());
    for (size_t i = 0; i < f.size(); ++i)
      if (!f[i]->empty()) std::memcpy(f[i]->data(), kept[i].data(), f[i]->bytes());
  }
  void record_bubble(double busy, double total) {
    double times[2] = {busy, total};
    pipe_.all_reduce_sum(Tensor(times, Shape{2}, DType::f64));
    last_bubble_ = times[1] > 0 ? 1.0 - times[0] / times[1] : 0.0;
    bubble_sum_ += last_bubble_;
    ++steps_;
  }
};

// The stage's 1F1B order (pipeline_schedule.h). A forward's output goes to the next stage, which
// sends back its input's gradient for the backward; where a stage's next step is the other kind,
// its send and the next step's receive are one exchange (Megatron-LM's send_forward_recv_backward
// and send_backward_recv_forward), so that neighbouring stages never both wait to send.
void PipelineParallel::run_micro_batches(Backend& be, Model& model, int count,
                                         MicroBatches& batches) {
  const Clock::time_point began = Clock::now();
  const int s = pipe_.rank(), p = pipe_.size();
  const bool first = s == 0, last = s == p - 1;
  const auto whole = [&](const Tensor& t) { return planned_buffer(model, t); };
  if (ops_count_ != count) {  // once per micro-batch count, not every step
    ops_ = one_forward_one_backward(p, s, count);
    ops_count_ = count;
  }
  const std::vector<PipeStep>& ops = ops_;
  const int slots = p - s;
  bool input_ready = false, gradient_ready = false;
  int resident = -1;  // the micro-batch whose activations the model holds
  double waited = 0;
  last_sent_ = 0;
  // An exchange that `sends` sends one planned buffer.
  auto exchange = [&](const auto& f, bool sends = true) {
    const Clock::time_point start = Clock::now();
    f();
    waited += seconds_since(start);
    if (sends) last_sent_ += static_cast<double>(whole(model.stage_input()).bytes());
  };
  for (size_t i = 0; i < ops.size(); ++i) {
    const int m = ops[i].micro_batch;
    const bool next_backward = i + 1 < ops.size() && ops[i + 1].op == PipeOp::backward;
    const StepOptions o = batches.options(m);
    if (ops[i].op == PipeOp::forward) {
      batches.load(m);
      if (!last) keep_batch(m % slots);
      if (!first && !input_ready)
        exchange([&] { pipe_.receive(whole(model.stage_input()), s - 1); }, false);
      input_ready = false;
      if (!first && !last) be.copy(model.stage_input(), model.stashed_input(m % slots));
      model.forward_step(be, o);
      resident = m;
      if (last) continue;
      if (next_backward) {
        exchange([&] {
          pipe_.send_receive(whole(model.stage_output()), s + 1, whole(model.hidden_gradient()),
                             s + 1);
        });
        gradient_ready = true;
      } else {
        exchange([&] { pipe_.send(whole(model.stage_output()), s + 1); });
      }
      continue;
    }
    if (!last && !gradient_ready)
      exchange([&] { pipe_.receive(whole(model.hidden_gradient()), s + 1); }, false);
    gradient_ready = false;
    if (resident != m) {  // the forward again, from the kept batch and input
      restore_batch(m % slots);
      if (!first) be.copy(model.stashed_input(m % slots), model.stage_input());
      model.forward_step(be, o);
    }
    resident = -1;
    model.backward(be, o, on_segment(m == count - 1));
    if (first) continue;
    if (i + 1 < ops.size() && !next_backward) {
      exchange([&] {
        pipe_.send_receive(whole(model.hidden_gradient()), s - 1, whole(model.stage_input()),
                           s - 1);
      });
      input_ready = true;
    } else {
      exchange([&] { pipe_.send(whole(model.hidden_gradient()), s - 1); });
    }
  }
  be.synchronize();
  const double total = seconds_since(began);
  record_bubble(total - waited, total);
}

}  // namespace

std::unique_ptr<ParallelPolicy> make_pipeline_parallel(const ParallelContext& c,
                                                       std::unique_ptr<ParallelPolicy> inner) {
  return std::make_unique<PipelineParallel>(c, std::move(inner));
}

}  // namespace brisk
