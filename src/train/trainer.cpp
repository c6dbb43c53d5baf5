// The training loop.
#include "train/trainer.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <optional>

#include "adapters/attach.h"
#include "backend/backend.h"
#include "backend/device_traits.h"
#include "backend/held_weights.h"
#include "core/clock.h"
#include "core/json_file.h"
#include "core/process_memory.h"
#include "core/step_control.h"
#include "data/loader.h"
#include "models/model.h"
#include "models/step_recorder.h"
#include "optim/optimizer.h"
#include "parallel/agreement.h"
#include "parallel/communicator.h"
#include "parallel/launch.h"
#include "parallel/layout.h"
#include "parallel/mesh.h"
#include "parallel/policy.h"
#include "precision/mixed_precision.h"
#include "train/assembly.h"
#include "train/checkpoint.h"
#include "train/deepspeed.h"
#include "train/fit.h"
#include "train/run_log.h"
#include "train/run_outputs.h"
#include "train/schedule.h"

namespace brisk {

namespace fs = std::filesystem;

namespace {
int64_t non_embedding_params(const ParameterSet& ps) {
  int64_t n = 0;
  for (const auto& p : ps.list())
    if (!p.embedding) n += p.full_shape().numel();  // a tensor rank counts the whole model's
  return n;
}

// The update after an optimizer step's micro-steps, decided on the device: the gradients' sum of
// squares, then skip (non-finite loss or gradient) or the multiplier that folds clipping and
// fp16 unscaling into the optimizer pass, then the compute weights refreshed from the master copy.
// The host waits once, for the step's loss and norm: logging and the stop on a non-finite loss
// need them.
struct Update {
  double loss_sum = 0;
  double grad_norm = std::numeric_limits<double>::quiet_NaN();  // NaN when skipped
  bool skipped = false;
  double gather_seconds = 0;  // ZeRO: broadcasting the updated shards from their owners
};

// Whether the step just finished ends with a checkpoint, as TrainingArguments' save_strategy:
// "steps" saves every save_steps and after the last step, "epoch" when the step completed an
// epoch (the last step too), "no" never.
bool checkpoint_due(const TrainOptions& o, int64_t global_step, int64_t total_steps,
                    bool epoch_ended) {
  if (o.save_strategy == "no") return false;
  if (global_step == total_steps) return true;
  if (o.save_strategy == "epoch") return epoch_ended;
  return o.save_steps > 0 && global_step % o.save_steps == 0;
}

// Whether the step just finished logs its window (logging_strategy "steps": every logging_steps
// and after the last step; "epoch": when it completed an epoch, and after the last; "no": never).
bool log_due(const TrainOptions& o, int64_t global_step, int64_t total_steps, bool epoch_ended) {
  if (o.logging_strategy == "no") return false;
  if (global_step == total_steps) return true;
  if (o.logging_strategy == "epoch") return epoch_ended;
  return global_step % o.logging_steps == 0;
}

// Whether the step just finished is followed by an evaluation (eval_strategy "steps": every
// eval_steps, which default to logging_steps; "epoch": when it completed an epoch).
bool eval_due(const TrainOptions& o, int64_t global_step, bool epoch_ended) {
  if (o.eval_strategy == "no") return false;
  if (o.eval_strategy == "epoch") return epoch_ended;
  return global_step % (o.eval_steps > 0 ? o.eval_steps : o.logging_steps) == 0;
}

// The global micro-batch a run starts from: its checkpoint's data position, in samples (or, in a
// checkpoint from before sample positions, in micro-batches of this run's size).
int64_t first_micro_batch(const TrainerState& state, const DataLoader& loader) {
  if (state.legacy_micro_batches >= 0) return state.legacy_micro_batches;
  try {
    return loader.micro_batch_at(state.sample_position);
  } catch (const Error& e) {
    throw Error(std::string("--resume_from_checkpoint: ") + e.what());
  }
}

// The RNG site of the stochastic rounding of bf16 weights without a master copy (dropout sites
// stay below 2^31).
constexpr uint32_t kWeightRoundingSite = 0x80000000u;

// The update: the gradients' norm and the step's decision (skip, clip), the optimizer's step on
// this rank's share and the weights shared by the run's parallel policy, the loss scaler told.
Update apply_update(Backend& be, RunAssembly& run, ParallelPolicy& parallel, double lr,
                    double loss_scale, int64_t step, int64_t overflow_at_step) {
  Model& model = *run.model;
  MixedPrecision& precision = *run.precision;
  const Tensor& grads = parallel.gradients();
  if (step == overflow_at_step)
    be.fill(Tensor(grads.data(), Shape{1}, DType::f32, grads.device()),
            std::numeric_limits<float>::infinity());
  const Tensor& stats = model.step_stats();
  const Tensor grad_sumsq(stats.as<double>() + kStatGradSumSq, Shape{1}, DType::f64,
                          stats.device());
  double gather_seconds = parallel.gradient_sum_squares(grad_sumsq);
  be.decide_step(stats, loss_scale, run.options.max_grad_norm, model.step_control());
  const RngKey rounding{run.options.seed, static_cast<uint64_t>(step), kWeightRoundingSite};
  gather_seconds += parallel.step_weights(static_cast<float>(lr), rounding);
  const auto [loss_sum, sumsq] = model.read_step_stats(be);
  Update u;
  u.gather_seconds = gather_seconds;
  u.loss_sum = loss_sum;
  u.skipped = !std::isfinite(loss_sum) || !std::isfinite(sumsq);
  BRISK_CHECK(!u.skipped || precision.uses_loss_scaling(), "the ",
              std::isfinite(loss_sum) ? "gradient norm" : "loss", " became ",
              std::isfinite(loss_sum) ? sumsq : loss_sum, " at step ", step + 1,
              "; stopping (lower the learning rate or check the data)");
  if (u.skipped)
    run.optimizer->undo_step();
  else
    u.grad_norm = std::sqrt(sumsq) / loss_scale;
  if (precision.uses_loss_scaling()) precision.scaler().update(u.skipped);
  return u;
}

// Averages over the steps between two log lines.
struct LogWindow {
  double loss = 0;
  int64_t steps = 0, samples = 0;
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();

  nlohmann::json close(const TrainerState& state, double lr, const Update& u, double loss_scale) {
    const auto now = std::chrono::steady_clock::now();
    const double secs = std::chrono::duration<double>(now - start).count();
    nlohmann::json rec = {{"step", state.global_step},
                          {"epoch", state.epoch},
                          {"loss", loss / std::max<int64_t>(steps, 1)},
                          {"learning_rate", lr},
                          {"grad_norm", u.grad_norm},
                          {"loss_scale", loss_scale},
                          {"skipped", u.skipped},
                          {"samples_per_second", secs > 0 ? samples / secs : 0.0}};
    *this = LogWindow();
    return rec;
  }
};
// A plan larger than the memory there is ends here, naming both, before anything is allocated.
void check_plan_fits(const Backend& be, const MemoryPlan& plan) {
  const int64_t device_free = be.device_memory_free();
  const size_t host_plan =
      device_free >= 0 ? plan.total_bytes(Placement::host) : plan.total_bytes();
  const size_t host_free = available_host_bytes();
  BRISK_CHECK(host_free == 0 || host_plan <= host_free, "the run's plan needs ",
              format_mib(host_plan), " of host memory but only ", format_mib(host_free),
              " are available: lower the batch size, turn on gradient checkpointing, or see "
              "brisk estimate --fit");
  if (device_free >= 0)
    BRISK_CHECK(plan.total_bytes(Placement::device) <= static_cast<size_t>(device_free),
                "the run's plan needs ", format_mib(plan.total_bytes(Placement::device)),
                " of GPU memory but only ", format_mib(static_cast<size_t>(device_free)),
                " are free: lower the batch size, turn on gradient checkpointing, or see "
                "brisk estimate --fit");
}

// Stage 1: with auto_find_batch_size, the options reshaped to the memory budget (logged and
// recorded in the summary); otherwise the options as given.
TrainOptions shape_to_memory(const TrainOptions& options, Device device, const Backend& be,
                             GivenData dataset, const LogSink& on_log, TrainSummary& s) {
  TrainOptions shaped = options;
  if (!options.auto_find_batch_size) return shaped;
  const BatchFit f = fit_batch(options, device, memory_budget(options, device, &be), dataset);
  shaped.per_device_train_batch_size = f.batch;
  shaped.gradient_accumulation_steps = f.accumulation;
  s.auto_fit = f.reason;
  on_log({{"auto_find_batch_size",
           {{"per_device_train_batch_size", f.batch},
            {"gradient_accumulation_steps", f.accumulation},
            {"needed_bytes", f.needed},
            {"reason", f.reason}}}});
  return shaped;
}

// The base model's weights: a model folder's (model.safetensors or its shards), or fresh.
void load_base_weights(Backend& be, RunAssembly& run, const LogSink& on_log) {
  const TrainOptions& o = run.options;
  const std::string weights = fs::is_directory(o.model_name_or_path)
                                  ? WeightFiles::find_in_folder(o.model_name_or_path)
                                  : std::string();
  if (weights.empty()) {                  // (a run that does not train has trained weights:
    run.model->init_weights(be, o.seed);  // check_weights_to_evaluate)
    return;
  }
  const WeightFiles files(weights);
  if (run.quantized) run.quantized->adopt(&files);  // a 4-bit checkpoint's codes kept as saved
  if (!o.load_in_4bit && files.has_bnb_4bit() && on_log)
    on_log({{"warning", "'" + weights +
                            "' is saved 4-bit: its weights are dequantized into this run's "
                            "precision; add --load_in_4bit (with --use_peft) to keep them "
                            "4-bit"}});
  const std::vector<std::string> fresh =
      run.model->load_pretrained(be, files, o.seed, o.ignore_mismatched_sizes);
  if (run.quantized) run.quantized->adopt(nullptr);
  if (fresh.empty() || !on_log) return;
  // transformers' words, so users recognize the situation.
  std::string names;
  for (const std::string& n : fresh) names += (names.empty() ? "'" : ", '") + n + "'";
  on_log({{"newly_initialized", fresh},
          {"warning", std::string("Some weights of ") + run.model->class_name() +
                          " were not initialized from the model checkpoint at " +
                          o.model_name_or_path + " and are newly initialized: [" + names +
                          "]. You should probably TRAIN this model on a down-stream task to "
                          "be able to use it for predictions and inference."}});
}

// Stage 3: the weights (a checkpoint's, a model folder's, or fresh; with adapters, the base's
// and then the checkpoint's or --adapter_name_or_path's adapter) and, when resuming, the
// optimizer state, the data position and the loss scaler.
TrainerState load_state(Backend& be, RunAssembly& run, const LogSink& on_log,
                        ParallelPolicy& parallel) {
  const TrainOptions& o = run.options;
  TrainerState state;
  const bool resuming = !o.resume_from_checkpoint.empty();
  if (run.adapter || !resuming) load_base_weights(be, run, on_log);
  for (const std::string& name : run.unmatched_targets)
    if (on_log)
      on_log({{"warning", "--lora_target_modules: no linear of the model is named '" + name +
                              "'; it is skipped (as PEFT skips it), the other targets adapted"}});
  if (resuming) {
    load_checkpoint(be, o.resume_from_checkpoint, o, *run.model, *run.optimizer, state,
                    parallel.state_share());
  } else if (!o.adapter_name_or_path.empty()) {
    load_adapter(
        be, *run.model,
        SafetensorsFile(adapter_weights_path(o.adapter_name_or_path, "--adapter_name_or_path")));
  }
  parallel.weights_written();
  if (resuming && run.precision->uses_loss_scaling())
    run.precision->scaler().restore(state.loss_scale, state.growth_tracker);
  return state;
}

}  // namespace

namespace {

// What the stages after assembly share (train() makes it).
struct RunContext {
  const TrainOptions& o;
  Communicator& dist;      // every rank: the lead, the saves
  Communicator& data;      // the data-parallel replicas (dist itself without tensor parallelism)
  Communicator* sequence;  // sequence parallelism: the ranks that split the sequences; else null
  Backend& be;
  RunAssembly& run;
  ParallelPolicy& parallel;
  TrainerState& state;
  TrainSummary& s;
  PeakPhases& peaks;
  RunLog& log;
  FaultHooks& faults;
  const StepEvents& events;
  bool lead() const { return dist.rank() == 0; }
  int ranks() const { return data.size(); }  // the replicas, each on its share of the data
};

// The optimizer steps' bounds: as Trainer, an epoch's last optimizer step takes the micro-batches
// left in it (fewer than the accumulation steps when they do not divide the epoch); no step spans
// two epochs.
struct StepBounds {
  int64_t micro_per_epoch, steps_per_epoch, total_steps;
};
StepBounds step_bounds(const TrainOptions& o, const DataLoader& loader) {
  StepBounds b;
  b.micro_per_epoch = loader.batches_per_epoch();
  b.steps_per_epoch =
      (b.micro_per_epoch + o.gradient_accumulation_steps - 1) / o.gradient_accumulation_steps;
  const double epoch_steps = std::ceil(o.num_train_epochs * static_cast<double>(b.steps_per_epoch));
  BRISK_CHECK(o.max_steps > 0 || epoch_steps < 9e15, "num_train_epochs ", o.num_train_epochs, " x ",
              b.steps_per_epoch, " steps per epoch is too many steps");
  b.total_steps = o.max_steps > 0 ? o.max_steps : static_cast<int64_t>(epoch_steps);
  return b;
}

// The training loop's running totals.
struct LoopTotals {
  double loss_sum = 0.0;
  int64_t samples = 0;
  LogWindow window;
};

// The steps' speed and loss, and where they ended, into the summary.
void record_steps(TrainSummary& s, const TrainerState& state, const LoopTotals& totals,
                  int64_t steps_run, double seconds) {
  s.global_step = state.global_step;
  s.epoch = state.epoch;
  s.train_runtime = seconds;
  s.train_samples_per_second = seconds > 0 ? totals.samples / seconds : 0;
  s.train_steps_per_second = seconds > 0 ? steps_run / seconds : 0;
  s.train_loss = steps_run > 0 ? totals.loss_sum / steps_run : 0;
  s.total_flos = state.total_flos;
}

// What an optimizer step did: its update, its loss (the accumulated batch's token loss over its
// target count), and the learning rate and loss scale it ran with.
struct StepResult {
  Update update;
  double loss = 0, lr = 0, loss_scale = 1;
};

// A step's micro-batches as the parallel policy takes them: the loader's next batch (counted in
// the totals), and training options with the step's loss scale and each micro-batch's dropout
// key.
class StepBatches final : public MicroBatches {
 public:
  StepBatches(RunContext& c, DataLoader& loader, Model& model, LoopTotals& totals,
              int64_t first_micro_batch, float grad_scale)
      : c_(c),
        loader_(loader),
        model_(model),
        totals_(totals),
        first_(first_micro_batch),
        grad_scale_(grad_scale) {}

  void load(int) override {
    c_.be.wait_for_uploads();  // the previous micro-batch may still be on its way to the GPU
    const int64_t rows = loader_.next(model_).rows * c_.ranks();  // every rank has as many
    totals_.samples += rows;
    totals_.window.samples += rows;
  }
  StepOptions options(int micro) const override {
    StepOptions so;
    so.training = true;
    so.compute_grad = true;
    so.loss_grad_scale = grad_scale_;
    so.rng = RngKey{c_.o.seed, static_cast<uint64_t>(first_ + micro), 0};
    so.first_micro_batch = micro == 0;
    return so;
  }

 private:
  RunContext& c_;
  DataLoader& loader_;
  Model& model_;
  LoopTotals& totals_;
  int64_t first_;
  float grad_scale_;
};

// One optimizer step: its micro-batches forward and backward, the ranks' gradients summed, the
// update. `micro_batch` advances past the micro-batches taken.
StepResult optimizer_step(RunContext& c, const Schedule& schedule, int64_t micro_steps,
                          int64_t& micro_batch, LoopTotals& totals) {
  Model& model = *c.run.model;
  DataLoader& loader = *c.run.loader;
  MixedPrecision& precision = *c.run.precision;
  const int64_t step = c.state.global_step;
  // The loss of the whole accumulated batch is its summed token loss over its target count.
  const int64_t targets = loader.count_targets(micro_batch, micro_steps);
  const double loss_scale = precision.loss_scale();
  const float grad_scale =
      targets > 0 ? static_cast<float>(loss_scale / static_cast<double>(targets)) : 0.0f;
  model.zero_accumulated_grads(c.be);  // the first micro-batch writes the others
  c.parallel.begin_step();
  model.reset_step_stats(c.be);
  StepBatches batches(c, loader, model, totals, micro_batch, grad_scale);
  {
    // The weights stay as they are until the update: the products may read one copy of them.
    const HeldWeights held(c.be, model.resident_weights());
    c.parallel.run_micro_batches(c.be, model, static_cast<int>(micro_steps), batches);
  }
  micro_batch += micro_steps;
  const SyncSeconds synced =
      c.parallel.finish_gradients();  // the global batch's gradients and loss
  c.s.communication_seconds += synced.ran;
  c.s.communication_wait_seconds += synced.waited;
  // The schedule advances with the updates actually made (a skipped step does not count).
  StepResult r;
  r.lr = c.o.learning_rate * schedule.factor(c.run.optimizer->steps());
  r.loss_scale = loss_scale;
  r.update =
      apply_update(c.be, c.run, c.parallel, r.lr, loss_scale, step, c.faults.overflow_at_step);
  r.loss = r.update.loss_sum / static_cast<double>(std::max<int64_t>(targets, 1));
  // Sharing the updated weights waits as the sums do: nothing overlaps it.
  c.s.communication_seconds += r.update.gather_seconds;
  c.s.communication_wait_seconds += r.update.gather_seconds;
  c.s.communication_wait_seconds += c.parallel.take_weight_wait_seconds();
  return r;
}

// What a save writes of the model (SavedModel): the whole model's weights, or the adapter.
SavedModel saved_model(const RunContext& c, GatheredReads* gathered) {
  const Model& model = *c.run.model;
  const Model* whole = c.parallel.saved_model();
  const ParameterSet& params = model.params();
  if (c.run.adapter) return {model, c.run.precision->stepped(params), &*c.run.adapter, gathered};
  return {whole ? *whole : model, c.run.precision->master(params), nullptr, gathered};
}

// A checkpoint, when one is due. Where the policy partitions them, rank 0 writes every rank's
// weights and optimizer state, read from them piece by piece while the others serve the reads.
void save_if_due(RunContext& c, const Schedule& schedule, const BestModel& best,
                 const nlohmann::json& evaluated, bool due) {
  if (!due) return;
  const TrainOptions& o = c.o;
  c.peaks.enter(PeakPhases::saves);
  std::unique_ptr<GatheredReads> gathered = c.parallel.gather_for_save(true);
  if (gathered && !c.lead()) gathered->serve();
  if (c.lead()) {
    // The best model is decided before the save, so the checkpoint's state names it.
    if (o.load_best_model_at_end && !evaluated.is_null() &&
        best.better(best.value(evaluated), c.state.best_metric)) {
      c.state.best_metric = best.value(evaluated);
      c.state.best_model_checkpoint =
          (fs::path(o.output_dir) / ("checkpoint-" + std::to_string(c.state.global_step))).string();
    }
    c.s.last_checkpoint =
        save_checkpoint(c.be, o, saved_model(c, gathered.get()), *c.run.optimizer, schedule,
                        c.state, c.run.files.tokenizer ? c.run.files.tokenizer_path : std::string(),
                        &c.faults.kill_save_at_point);
    if (gathered) gathered->done();
  }
  gathered.reset();
  c.peaks.enter(PeakPhases::steps);
}

// The evaluation set's metrics, with the front end's metrics of its logits where it asks for them
// (one process).
nlohmann::json evaluate_eval_set(RunContext& c) {
  const auto& extra = c.events.evaluation_metrics;
  const bool collects = extra && c.dist.size() == 1;
  EvaluatedRows rows;
  rows.regression = c.run.config.regression;
  std::function<void(const Prediction&)> collect;
  if (collects) collect = [&](const Prediction& p) { rows.add(p); };
  nlohmann::json m = c.run.evaluator.run(c.be, *c.run.model, *c.run.eval_data, "eval", collect,
                                         &c.data, c.parallel.staged_forward(), c.sequence);
  if (rows.rows() > 0) m.update(extra(std::move(rows)));
  return m;
}

// The front end's events after a step (rank 0's); whether it asks the training to end there.
bool step_events(RunContext& c, bool saved, bool epoch_ended) {
  const StepEvents& e = c.events;
  if (!c.lead()) return false;
  if (saved && e.on_save) e.on_save(c.s.last_checkpoint);
  if (epoch_ended && e.on_epoch_end) e.on_epoch_end(c.state.global_step);
  return e.on_step_end && e.on_step_end(c.state.global_step, c.state.max_steps) &&
         c.dist.size() == 1;
}

// The optimizer steps from the state's step to the last, with their logs, evaluations and saves;
// the run's speed and loss into the summary.
void train_steps(RunContext& c) {
  const TrainOptions& o = c.o;
  DataLoader& loader = *c.run.loader;
  const StepBounds bounds = step_bounds(o, loader);
  const Schedule schedule = learning_rate_schedule(o, bounds.total_steps);
  TrainerState& state = c.state;
  BRISK_CHECK(state.global_step <= bounds.total_steps, "the checkpoint is at step ",
              state.global_step, ", past the run's ", bounds.total_steps, " steps");
  state.max_steps = bounds.total_steps;
  state.num_train_epochs =
      (bounds.total_steps + bounds.steps_per_epoch - 1) / bounds.steps_per_epoch;
  const Model* whole = c.parallel.saved_model();  // a pipeline stage counts the whole model's
  const double flos_per_token =
      6.0 *
      static_cast<double>(non_embedding_params((whole ? whole : c.run.model.get())->params()));
  c.log.progress.start(!c.lead() || o.disable_tqdm ? Progress::Mode::off
                       : ::isatty(STDERR_FILENO)   ? Progress::Mode::bar
                                                   : Progress::Mode::lines,
                       bounds.total_steps, state.global_step);
  int64_t micro_batch = first_micro_batch(state, loader);  // the next global micro-batch
  loader.start(micro_batch);
  LoopTotals totals;
  const int64_t first_step = state.global_step;
  c.peaks.enter(PeakPhases::steps);
  const auto start = std::chrono::steady_clock::now();
  const BestModel best(o);
  while (state.global_step < bounds.total_steps) {
    const int64_t micro_steps =
        std::min(o.gradient_accumulation_steps,
                 bounds.micro_per_epoch - micro_batch % bounds.micro_per_epoch);
    const StepResult r = optimizer_step(c, schedule, micro_steps, micro_batch, totals);
    const double step_loss = r.loss;
    state.loss_scale = c.run.precision->loss_scale();
    state.growth_tracker = c.run.precision->scaler().growth_tracker();
    ++state.global_step;
    state.sample_position = loader.position_of(micro_batch);
    state.legacy_micro_batches = -1;
    state.epoch = static_cast<double>(state.sample_position) / loader.samples_per_epoch();
    const bool epoch_ended = micro_batch % bounds.micro_per_epoch == 0;
    state.total_flos +=
        flos_per_token *
        static_cast<double>(c.ranks() * micro_steps * o.per_device_train_batch_size * o.seq_len);
    totals.loss_sum += step_loss;
    totals.window.loss += step_loss;
    ++totals.window.steps;
    c.log.progress.update(state.global_step, step_loss);
    if (log_due(o, state.global_step, bounds.total_steps, epoch_ended)) {
      nlohmann::json rec = totals.window.close(state, r.lr, r.update, r.loss_scale);
      for (const auto& [name, value] : c.parallel.step_statistics()) rec[name] = value;
      rec.update(c.run.model->take_log_statistics());
      state.log_history.push_back(rec);
      c.log.report(rec, state.global_step);
    }
    nlohmann::json evaluated;
    // Every rank evaluates its share; saves are rank 0's, the others wait for it at the next
    // step's sums.
    if (c.run.eval_data && eval_due(o, state.global_step, epoch_ended)) {
      evaluated = evaluate_eval_set(c);
      evaluated["epoch"] = state.epoch;
      evaluated["step"] = state.global_step;
      state.log_history.push_back(evaluated);
      c.log.report(evaluated, state.global_step);
    }
    const bool save = checkpoint_due(o, state.global_step, bounds.total_steps, epoch_ended);
    save_if_due(c, schedule, best, evaluated, save);
    if (step_events(c, save, epoch_ended)) break;
  }
  record_steps(c.s, state, totals, state.global_step - first_step, seconds_since(start));
}

// load_best_model_at_end: rank 0 knows the best checkpoint; every rank evaluates and predicts with
// its weights, read as the parallel policy shares them.
void load_best_model(RunContext& c) {
  std::string best_folder = c.lead() ? c.state.best_model_checkpoint : std::string();
  if (c.dist.size() > 1) best_folder = broadcast_text(c.dist, best_folder, 0);
  if (best_folder.empty()) return;
  if (c.run.adapter) {  // every rank reads the adapter, small beside the base it keeps
    load_adapter(c.be, *c.run.model,
                 SafetensorsFile(adapter_weights_path(best_folder, "the best checkpoint")));
    c.parallel.weights_written();
  } else {
    c.parallel.load_weights((fs::path(best_folder) / "model.safetensors").string());
  }
  if (c.lead()) {
    c.s.best_model_checkpoint = best_folder;
    c.log.report({{"loaded_best_model", best_folder}, {"best_metric", c.state.best_metric}},
                 c.state.global_step);
  }
}

// After the steps: the run's metrics logged as Trainer's last log, the best model loaded where
// asked, and the final model and state saved into output_dir, as the example scripts'
// trainer.save_model() and save_state().
void finish_training(RunContext& c) {
  const TrainOptions& o = c.o;
  nlohmann::json finished = train_metrics_json(c.s);
  finished["step"] = c.state.global_step;
  c.state.log_history.push_back(finished);
  c.log.event(finished, c.state.global_step);
  if (o.load_best_model_at_end) load_best_model(c);
  c.peaks.enter(PeakPhases::saves);
  std::unique_ptr<GatheredReads> gathered = c.parallel.gather_for_save(false);
  if (gathered && !c.lead()) gathered->serve();
  if (!c.lead()) return;
  save_model(c.be, o.output_dir, saved_model(c, gathered.get()));
  if (gathered) gathered->done();
  if (c.run.files.tokenizer) copy_tokenizer_files(c.run.files.tokenizer_path, o.output_dir);
  write_file_atomically(fs::path(o.output_dir) / "trainer_state.json",
                        trainer_state_json(c.state, o).dump(2) + "\n");
  write_file_atomically(fs::path(o.output_dir) / "training_args.json",
                        options_to_json(o).dump(2) + "\n");
}

// --do_eval and --do_predict after training, then rank 0's result files.
void evaluate_and_write(RunContext& c, const Arena& arena) {
  const TrainOptions& o = c.o;
  TrainSummary& s = c.s;
  c.peaks.enter(PeakPhases::steps);
  nlohmann::json all_results = o.do_train ? train_metrics_json(s) : nlohmann::json::object();
  if (o.do_eval) {
    s.eval_metrics = evaluate_eval_set(c);
    s.eval_metrics["epoch"] = c.state.epoch;
    s.eval_metrics["eval_samples"] = c.run.eval_data->size();
    c.log.report(s.eval_metrics, c.state.global_step);
    if (c.lead())
      write_file_atomically(fs::path(o.output_dir) / "eval_results.json",
                            s.eval_metrics.dump(2) + "\n");
    all_results.update(s.eval_metrics);
  }
  if (o.do_predict) {
    const LogSink report = [&](const nlohmann::json& rec) {
      c.log.report(rec, c.state.global_step);
    };
    s.predict_metrics =
        write_predictions(c.be, c.run, o, report, c.data, c.lead(), c.parallel.staged_forward(),
                          c.events.keep_predictions ? &s.predicted : nullptr);
  }
  c.peaks.enter(PeakPhases::done);
  summarize_memory(c.be, c.run.plan, arena, c.peaks, s);
  if (c.lead()) {  // rank 0 writes the results
    write_anatomy(o, s, (fs::path(o.output_dir) / "memory.html").string());
    if (o.do_train)
      write_file_atomically(fs::path(o.output_dir) / "train_results.json",
                            summary_json(s).dump(2) + "\n");
    write_file_atomically(fs::path(o.output_dir) / "all_results.json", all_results.dump(2) + "\n");
  }
  c.dist.barrier();
}

// Rank 0 holds output_dir, which every run writes into, for the whole run. Before anything reads
// it, a copy an interrupted save moved aside is back in place for --resume_from_checkpoint last.
void hold_output_dir(std::optional<OutputDirLock>& lock, const TrainOptions& o, bool lead,
                     const RunLog& log) {
  if (!lead) return;
  lock.emplace(o.output_dir);
  const SaveCleanup cleanup = remove_interrupted_saves(*lock);
  for (const std::string& done : cleanup.done) log.log({{"removed_interrupted_save", done}});
  for (const std::string& failed : cleanup.failed) log.log({{"warning", failed}});
}

// An exchange the model's layers ran (sequence or expert parallelism's all-to-alls): its bytes and
// seconds, all of them waited for as they ran.
void add_exchanges(TrainSummary& s, const std::string& name, double bytes, double seconds) {
  s.parallel.emplace_back(name + "_all_to_all_bytes", bytes);
  s.parallel.emplace_back(name + "_all_to_all_seconds", seconds);
  s.communication_seconds += seconds;
  s.communication_wait_seconds += seconds;
}

}  // namespace

// The stages: shape to memory, assemble (train/assembly.cpp), load state, the steps
// (train_steps), finish, evaluate and summarize.
TrainSummary train(const TrainOptions& given, const LogSink& all_log, GivenData dataset,
                   FaultHooks faults, Communicator* comm, const StepEvents& events) {
  const int ranks = comm ? comm->size() : launch_info_from_env().size;
  const ResolvedRun resolved = resolve_run(given, ranks);
  const TrainOptions& options = resolved.options;
  const Device device = resolved.device;
  check_weights_to_evaluate(options);
  // Data parallel across the processes of the launch: each rank trains on its share of every
  // global batch; gradients and losses are summed across ranks before the update, which every
  // rank then makes alike. Rank 0 alone logs and writes files. On GPUs the collectives are
  // NCCL's. The launch's ranks must all start within ddp_timeout, as init_process_group's
  // timeout bounds.
  const auto timeout = static_cast<double>(options.ddp_timeout);
  Communicator& dist = comm ? *comm : world_communicator(device, timeout);
  if (dist.size() > 1) dist.set_timeout(timeout);
  if (dist.size() > 1) check_ranks_agree(dist, agreed_values(options));
  const bool lead = dist.rank() == 0;
  RunLog log(all_log, lead);
  if (!resolved.deepspeed_ignored.empty())
    log.log({{"deepspeed_keys_without_effect", resolved.deepspeed_ignored}});
  auto be = make_backend(device, options.switches);
  // GPU collectives run on NCCL's stream, each queued after the work the backend queued.
  struct DeviceWork {
    Communicator& comm;
    ~DeviceWork() { comm.set_device_stream(nullptr); }
  } device_work{dist};
  if (dist.size() > 1 && !device_traits(device).host_memory)
    dist.set_device_stream(be->device_stream());
  std::optional<OutputDirLock> output_lock;
  hold_output_dir(output_lock, options, lead, log);
  // The mesh's tensor ranks, stages, sequence and expert ranks share the model, its data ranks
  // the data; the replicas (data and sequence ranks) sum the gradients.
  const ParallelLayout& layout = resolved.layout;
  BRISK_CHECK(layout.world() == dist.size(), "internal error: a layout of ", layout.world(),
              " ranks for a run of ", dist.size());
  DeviceMesh mesh(dist, layout.mesh());
  dist.barrier();
  TrainSummary s;
  const TrainOptions settled =
      shape_to_memory(resolve_checkpoint(options), device, *be, dataset, log.sink(), s);
  // Rank 0 first: it tokenizes data files into the cache, which the other ranks then read.
  if (!lead) dist.barrier();
  const std::unique_ptr<RunAssembly> run =
      assemble_run(settled, device, be.get(), dataset, layout, dist.rank());
  if (lead) dist.barrier();
  // The notes follow the checks: a refused run prints only why.
  for (const nlohmann::json& note : run_notes(options, dataset.train || dataset.tokenized))
    log.log(note);
  for (const std::string& note : run->files.notes) log.log({{"data_files", note}});
  for (const std::string& note : run->files.cache_notes) log.log({{"tokenized_cache", note}});
  const TrainOptions& o = run->options;
  Model& model = *run->model;
  s.device = be->name();
  s.ranks = dist.size();
  s.memory.device_memory_before_arena = be->device_memory_used();  // the CUDA context and libraries
  check_plan_fits(*be, run->plan);
  PeakPhases peaks;
  s.memory.rss_before_arena = current_rss_bytes();
  Arena arena(run->plan, be->device_memory(), be->staging_memory(o.dataloader_pin_memory));
  model.bind(arena);
  run->binder.bind(arena);
  if (run->quantized) run->quantized->attach(*be, model);  // QLoRA: before the weights load
  // How the ranks share the model's work: the gradients' sums, the update, the saves.
  ParallelRun parallel_run = make_parallel(layout, {*be,
                                                    dist,
                                                    mesh,
                                                    model,
                                                    run->config,
                                                    *run->precision,
                                                    *run->optimizer,
                                                    run->parallel,
                                                    {o.do_train, o.ddp_bucket_cap_mb}});
  ParallelPolicy& parallel = *parallel_run.policy;
  // The micro-batches and evaluation's forward passes recorded and replayed where the device
  // and the model allow it.
  std::unique_ptr<StepRecorder> recorder;
  if (StepRecorder::possible(*be, model)) {
    recorder = std::make_unique<StepRecorder>(*be, model);
    parallel.record_micro_batches(recorder.get());
    run->evaluator.record_forward(recorder.get());
  }
  TrainerState state = load_state(*be, *run, log.sink(), parallel);
  if (lead && reports_to_tensorboard(o)) log.open_events(o, run->config);
  Communicator* sequence_ranks =
      layout.on(MeshDim::sequence) ? &mesh.group(MeshDim::sequence) : nullptr;
  RunContext c{o,
               dist,
               mesh.group(MeshDim::data),
               sequence_ranks,
               *be,
               *run,
               parallel,
               state,
               s,
               peaks,
               log,
               faults,
               events};
  if (o.do_train) train_steps(c);
  s.parallel = parallel.statistics();
  for (const ParallelRun::Exchange& e : parallel_run.exchanges())
    add_exchanges(s, e.name, e.bytes, e.seconds);
  if (o.do_train) finish_training(c);
  evaluate_and_write(c, arena);
  if (recorder) {
    const StepRecorder::Counts& n = recorder->counts();
    log.log({{"recorded_passes",
              {{"ran", n.ran}, {"recorded", n.recorded}, {"replayed", n.replayed}}}});
  }
  return s;
}

}  // namespace brisk
