// One assembly of a training run, shared by `brisk train`, `brisk estimate` and the tests: from
// the options and the device, the model, the precision policy, the optimizer, the data loader and
// the finished memory plan. Nothing of the run is allocated here; the plan is a list of buffers,
// so a run can be planned for a device that is not present.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "adapters/lora.h"
#include "adapters/quantized_base.h"
#include "backend/backend.h"
#include "backend/device_traits.h"
#include "backend/workspace.h"
#include "core/memory_plan.h"
#include "data/dataset.h"
#include "data/loader.h"
#include "eval/evaluate.h"
#include "models/model.h"
#include "optim/optimizer.h"
#include "parallel/agreement.h"
#include "parallel/layout.h"
#include "parallel/policy.h"
#include "precision/mixed_precision.h"
#include "train/file_data.h"
#include "train/options.h"
#include "train/tokenized_data.h"

namespace brisk {

// The paths the device takes and the run's measurement switches leave on, into the model's plan
// options (core/switches.h: a masked LM decoding every row in training too, the MLP activation
// kept, ... to compare).
void switch_paths(PlanOptions& p, const DeviceTraits& traits, const Switches& s);

// A run resolved once, in one value every part reads: a DeepSpeed config (--deepspeed, its keys
// without effect in `deepspeed_ignored`) and accelerate's ParallelismConfig applied to the given
// options for `ranks` processes, the result validated (once: the front doors do not); the parallel
// layout of the ranks (each degree checked against them); the device (auto picked as train does).
// The measurement switches travel in options.switches.
struct ResolvedRun {
  TrainOptions options;
  ParallelLayout layout;
  Device device = kHostDevice;
  std::vector<std::string> deepspeed_ignored;
};
ResolvedRun resolve_run(const TrainOptions& given, int ranks);
// The second step, once output_dir is in order: --resume_from_checkpoint "last" (or "true")
// named as the newest complete checkpoint, and that checkpoint's seed taken (a resumed run
// continues it).
TrainOptions resolve_checkpoint(const TrainOptions& options);
// A run that does not train evaluates and predicts trained weights: a model folder without
// model.safetensors (or its shards), or a config.json alone, is refused, as transformers'
// from_pretrained refuses it (brisk's built-in names run on random weights, with a note).
void check_weights_to_evaluate(const TrainOptions& o);
// What every rank of a run must hold alike (parallel/agreement.h): the resolved layout, the
// options that shape a step and the model config's shapes, each named as the user gave it.
std::vector<AgreedValue> agreed_values(const TrainOptions& o);

struct RunAssembly {
  TrainOptions options;  // as given (seq_len: the text files', with --train_file)
  Device device = kHostDevice;
  ModelConfig config;  // the whole model's (the model's own is its share with --tp_size)
  std::unique_ptr<Model> model;
  // LoRA (--use_peft or --adapter_name_or_path): the adapter attached to the model, as a save
  // writes its adapter_config.json. The optimizer then steps the trained parameters alone.
  std::optional<LoraConfig> adapter;
  // Its listed target_modules that name no linear of the model (skipped, as PEFT skips them).
  std::vector<std::string> unmatched_targets;
  // QLoRA (--load_in_4bit): the frozen base's 4-bit store, attached to the model once bound.
  std::unique_ptr<QuantizedBase> quantized;
  std::unique_ptr<Dataset> owned_data;
  const Dataset* data = nullptr;
  std::unique_ptr<DataLoader> loader;  // training's batches: none in a run that does not train
  // Evaluation (--do_eval, --eval_strategy) and prediction (--do_predict) data, when asked for.
  FileData files;  // --train_file and friends: the tokenizer and the datasets read from them
  std::unique_ptr<Dataset> owned_eval, owned_test;
  const Dataset* eval_data = nullptr;
  const Dataset* test_data = nullptr;
  Evaluator evaluator;
  std::unique_ptr<MixedPrecision> precision;
  DType product = DType::f32;  // the dtype of the matrix products
  // The products read a bf16 copy of the float32 weights (Backend::hold_weights) where planned.
  bool weights_copy = false;
  std::unique_ptr<Optimizer> optimizer;
  ParallelLayout layout;  // the run's
  RankPlace place;        // this rank's in it
  // The parallel layout's buffers (ZeRO's shards, the offloaded optimizer's host copies), and
  // the parameters the optimizer is planned for where it steps a run of them: with ZeRO this
  // rank's, with adapters the trained ones.
  ParallelBuffers parallel;
  ParameterSet optimizer_params;
  BackendWorkspace workspace;  // the backend's buffers when planning without one
  MemoryPlan plan;             // finalized
  BufferBinder binder;         // the precision policy's, optimizer's, loader's and backend's views
};

// The option of `layout` (or ZeRO's stage over its replicas) that LoRA adapters cannot train
// under yet, as the user names it ("--pp_size", ...); nullptr where they can (data parallelism,
// with ZeRO stage 1 to 3 (stage 3 over a 16- or 32-bit base), and tensor parallelism, over a
// base not quantized to 4 bits, with ZeRO 1 or 2).
const char* adapters_unbuilt_with(const ParallelLayout& layout, int zero_stage,
                                  bool quantized_base);

// Plans the run on `device` with `options` as resolve_run and resolve_checkpoint return them
// (read, never rewritten: an unresolved "last" is refused), for rank `rank` of `layout`: its
// share of the model (models/config.h's tensor, sequence, pipeline and expert shares) and of the
// data, and with ZeRO its replica's partition. With a backend (for that device) the backend
// declares its own workspace and is set to the run's product dtype and TF32 choice; without one,
// `workspace` receives the same declarations. Trains on `dataset` when given, else on the
// options' dataset.
std::unique_ptr<RunAssembly> assemble_run(const TrainOptions& options, Device device,
                                          Backend* backend, GivenData dataset,
                                          const ParallelLayout& layout, int rank);
// The same for rank `rank` of `world` ranks laid out as the options say (world 0: the fewest
// ranks their degrees take).
std::unique_ptr<RunAssembly> assemble_run(const TrainOptions& options, Device device,
                                          Backend* backend, GivenData dataset = nullptr,
                                          int rank = 0, int world = 0);

}  // namespace brisk
