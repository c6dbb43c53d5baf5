// Checkpoints: output_dir/checkpoint-N/ with model.safetensors (transformers' names, loadable by
// transformers) and config.json, or for LoRA PEFT's adapter_model.safetensors and
// adapter_config.json (loadable by PeftModel.from_pretrained); optimizer.safetensors,
// scheduler.json, trainer_state.json (log history, data position) and training_args.json. A
// checkpoint is written into a temporary folder and renamed into place at the end, so an
// interrupted save never looks complete.
#pragma once

#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "adapters/lora.h"
#include "models/model.h"
#include "optim/optimizer.h"
#include "parallel/zero.h"
#include "train/options.h"
#include "train/schedule.h"

namespace brisk {

// What the trainer needs besides weights and optimizer moments to continue exactly.
struct TrainerState {
  int64_t global_step = 0;  // optimizer steps done
  // The data position: samples of the global order consumed (DataLoader::position_of), the
  // same whatever the batch split, accumulation or number of ranks.
  int64_t sample_position = 0;
  // A checkpoint written before positions were kept in samples holds micro-batches instead,
  // read in the resuming run's micro-batches; -1 otherwise.
  int64_t legacy_micro_batches = -1;
  double epoch = 0;
  double total_flos = 0;
  double loss_scale = 1.0;  // fp16's dynamic loss scaler
  int64_t growth_tracker = 0;
  nlohmann::json log_history = nlohmann::json::array();
  // load_best_model_at_end: the best evaluation so far and the checkpoint saved with it (NaN and
  // empty before the first).
  double best_metric = std::numeric_limits<double>::quiet_NaN();
  std::string best_model_checkpoint;
  // The run's length as Trainer's state records it (written, not read back: a resumed run
  // computes its own).
  int64_t max_steps = 0;
  int64_t num_train_epochs = 0;
};

// trainer_state.json as Trainer writes it (global_step, epoch, max_steps, num_train_epochs,
// logging/eval/save steps, train_batch_size, best_*, log_history, ...) plus what brisk needs to
// continue exactly (sample_position, loss_scale, growth_tracker).
nlohmann::json trainer_state_json(const TrainerState& state, const TrainOptions& options);

// What a save writes of a model: model.safetensors (transformers' names) and config.json from
// `weights` (the flat float32 weights or master copy; with `gathered`, ZeRO's (parallel/zero.h),
// its whole 0, read piece by piece, and `weights` unused), as Trainer.save_model does; or with
// `adapter`, PEFT's adapter_model.safetensors and adapter_config.json from `weights`, the
// trained parameters' run (MixedPrecision::stepped), or from `gathered`'s whole 0 (the trained
// parameters' runs of every rank), as a PEFT model's save_pretrained.
struct SavedModel {
  const Model& model;
  Tensor weights;
  const LoraConfig* adapter = nullptr;
  GatheredReads* gathered = nullptr;
};
void save_model(Backend& be, const std::string& folder, const SavedModel& m);

// Writes output_dir/checkpoint-<global_step> with the model's files (SavedModel), the
// optimizer's state and the trainer's; keeps at most options.save_total_limit checkpoints,
// never deleting state.best_model_checkpoint.
// Returns the folder written.
// `fail_at_point`, for tests: when not null and >= 0, a kill is simulated at that many more points
// of the save sequence (counted down across saves; -1 = never). The points: after each of the six
// files; when the step was saved before, after its old copy is moved aside and after the new one
// is renamed into place; in rotation, after each folder is moved aside for deletion.
// With the model's `gathered`, the optimizer's state tensors are its wholes 1, 2, ... (every
// rank's state laid end to end), read piece by piece as the files are written.
// `tokenizer_path`, when not empty: the tokenizer whose files the checkpoint holds too, so that
// it is a complete model folder as Trainer's are.
std::string save_checkpoint(Backend& be, const TrainOptions& options, const SavedModel& m,
                            const Optimizer& optimizer, const Schedule& schedule,
                            const TrainerState& state, const std::string& tokenizer_path,
                            int* fail_at_point = nullptr);

// Reads a checkpoint folder into model, optimizer and state; a missing or corrupt file is named,
// and so is a checkpoint of another optimizer than `options.optim`. An adapter's checkpoint
// loads into a model with adapters attached (its base loaded before), a whole model's into one
// without. With `share`, the optimizer
// takes its share of the saved state.
void load_checkpoint(Backend& be, const std::string& folder, const TrainOptions& options,
                     Model& model, Optimizer& optimizer, TrainerState& state,
                     const StateShare* share = nullptr);

// trainer_state.json's values, each checked before use (`where` names the file in messages).
TrainerState parse_trainer_state(const nlohmann::json& ts, const std::string& where);

// One run's hold on its output_dir: an advisory lock (flock) on output_dir/.brisk-run.lock, held
// by the process that writes there (rank 0) from the start of the run to its end. The kernel
// releases it when the process ends, however it ends, so a killed run leaves no stale lock.
// The file holds the holder's PID and host, for the message of a run refused.
class OutputDirLock {
 public:
  // Creates output_dir when missing and takes the lock; a second run on the same folder is
  // refused, naming the folder and the PID holding it.
  explicit OutputDirLock(const std::string& output_dir);
  // Removes the lock file, then releases the lock (the folder too, when this run created it and
  // it is empty).
  ~OutputDirLock();
  OutputDirLock(const OutputDirLock&) = delete;
  OutputDirLock& operator=(const OutputDirLock&) = delete;
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_, path_;
  int fd_ = -1;
  bool created_ = false;
};

// What remove_interrupted_saves did: one line per folder removed or put back, and one per folder
// it could not remove (left in place, named with the reason).
struct SaveCleanup {
  std::vector<std::string> done, failed;
};

// Cleans up after interrupted saves of earlier runs in the locked output_dir: removes the
// unfinished checkpoint-N.tmp-PID folders and the checkpoint-N.del-PID ones a rotation was
// deleting, and puts a checkpoint-N.old-PID back as checkpoint-N when no checkpoint-N exists (else
// removes it). The lock proves that no other run writes there, so every such folder is stale
// whatever its PID (which may be reused, be this process's, or another host's). A copy that
// cannot be put back fails the run, naming it: resuming would silently take an older checkpoint.
SaveCleanup remove_interrupted_saves(const OutputDirLock& lock);

// The newest complete checkpoint-N folder in output_dir (every file present); fails naming
// output_dir when there is none.
std::string last_checkpoint(const std::string& output_dir);

// The seed the checkpointed run used (from its training_args.json): a resumed run keeps it, so
// data order, synthetic data and dropout continue exactly as they would have.
uint64_t checkpoint_seed(const std::string& folder);

}  // namespace brisk
