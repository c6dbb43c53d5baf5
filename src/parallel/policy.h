// A run's parallel policy: how the ranks of a launch share the work of one model, behind one
// interface the training loop calls the same way whatever the layout. The innermost is data
// parallel (data_parallel.cpp: one process alone, DDP's gradient buckets, ZeRO stages 1 to 3,
// each with or without the optimizer offloaded to the host, as the run's assembly planned its
// buffers); tensor, expert and pipeline parallelism wrap it in layers (layered_policy.h), which
// parallel/layout.h's make_parallel stacks as the run's layout asks. docs/architecture.md shows
// how a new layer plugs in.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/memory_plan.h"
#include "core/parameters.h"
#include "core/rng.h"
#include "core/tensor.h"
#include "models/model.h"
#include "models/step_recorder.h"
#include "parallel/gradient_sync.h"
#include "parallel/mesh.h"
#include "parallel/zero.h"

namespace brisk {

class Backend;
class Communicator;
class MixedPrecision;
class Optimizer;

// What a run's plan holds for its parallel layout, bound by the arena before the policy is made.
struct ParallelBuffers {
  // ZeRO in a run of several ranks: every rank's run of the parameters (shards[rank] is this
  // rank's). Empty: every rank steps the whole parameters.
  std::vector<ParamShard> shards;
  // ZeRO stage 2: this rank's shard of the summed gradients, and the slot its sums arrive in.
  Tensor grad_shard, grad_receive;
  // ZeRO stage 3: this rank's run of the compute weights (the model's buffer holds the
  // embeddings, the head and slots for gathered blocks).
  Tensor weight_shard;
  // ZeRO stage 3 with a frozen base (LoRA): every rank's run of the blocks' frozen weights, and
  // this rank's, gathered into the model's two slots as a pass needs a block (the trained
  // parameters, resident beside the head, partitioned as under stage 2). Empty: none.
  std::vector<ParamShard> base_shards;
  Tensor base_shard;
  // offload_optimizer on a GPU: the optimizer's state and the float32 master copy (of this
  // rank's run) in host memory, stepped there by the CPU's backend from host copies of the
  // step's gradients (this rank's run of them) and decision.
  bool offload = false;
  Tensor offload_grads, offload_control;
};

// What a run's parallel layout is planned from (TrainingArguments' and DeepSpeed's names).
struct ParallelPlanOptions {
  int rank = 0, ranks = 1;
  int64_t zero_stage = 0;                    // ZeRO when above 0 in a run of several ranks
  int64_t stage3_prefetch_bucket_size = -1;  // elements; negative: no bound
  double bucket_cap_mb = 25;                 // ddp_bucket_cap_mb
};

// Before the model's plan: ZeRO's partition of the parameters into `buffers.shards` (refused
// where a rank would get none) and the slots the model stages its gradients (stage 2) and
// weights (stage 3) in, into `model_options`; under stage 3 with frozen parameters, the frozen
// blocks' partition into `buffers.base_shards` (where the blocks can be staged). Nothing without
// ZeRO.
void partition_parameters(const Model& model, const Optimizer& optimizer,
                          const ParallelPlanOptions& o, ParallelBuffers& buffers,
                          PlanOptions& model_options);
// After the model's and the precision's plans, ZeRO's buffers (stage 3's weight shard or frozen
// base shard, stage 2's gradient shard and the slot its sums arrive in) and, into `stepped`, the
// parameters of this rank's run, which its optimizer is planned for. Nothing without ZeRO.
void plan_zero_buffers(const Model& model, const ParallelPlanOptions& o, ParallelBuffers& buffers,
                       ParameterSet& stepped, MemoryPlan& plan, BufferBinder& binder);
// offload_optimizer: host copies of the step's gradients (this rank's run) and decision.
// Nothing without offloading.
void plan_offload_buffers(const Model& model, const MixedPrecision& precision,
                          ParallelBuffers& buffers, MemoryPlan& plan, BufferBinder& binder);

// A pipeline stage's part in evaluation and prediction: each batch's forward pass, its input
// received from the stage before and its output sent to the next; the last stage adds the loss
// and holds the logits.
class StagedForward {
 public:
  virtual ~StagedForward() = default;
  virtual void forward(Backend& be, Model& model, const StepOptions& options) = 0;
  // The stages of this rank's pipeline, in order.
  virtual Communicator& stages() = 0;
};
// The caller's side of a step's micro-batches (the trainer's loader and step options).
class MicroBatches {
 public:
  virtual void load(int i) = 0;                  // writes micro-batch i into the model's batch
  virtual StepOptions options(int i) const = 0;  // its options, the same on every call

 protected:
  ~MicroBatches() = default;
};

class ParallelPolicy {
 public:
  virtual ~ParallelPolicy() = default;

  // A step's gradients: before its first micro-batch; what backward calls as it finishes a
  // segment of a micro-batch (`last`: the step's last); after its last backward, the global
  // batch's gradients and step statistics on every rank.
  virtual void begin_step() = 0;
  virtual Model::SegmentDone on_segment(bool last) = 0;
  virtual SyncSeconds finish_gradients() = 0;
  // A step's `count` micro-batches forward and backward on this rank's model, between
  // begin_step and finish_gradients. By default one after another; pipeline stages run theirs in
  // the 1F1B order, exchanging activations and their gradients with the stages beside them.
  virtual void run_micro_batches(Backend& be, Model& model, int count, MicroBatches& batches);

  // The gradients this rank's optimizer steps on: the whole, or this rank's shard.
  virtual const Tensor& gradients() const = 0;
  // A float64 sum each rank took over gradients(), made the sum over the whole gradients.
  // Returns the seconds it took.
  virtual double sum_over_gradients(const Tensor& sums) = 0;
  // acc (float64 [1], in the backend's memory) += the sum of squares of the model's gradients,
  // every element of the whole model counted once whichever ranks hold it, but parameter `skip`
  // of this rank's (-1: none), which another rank counts (a pipeline's second copy of tied
  // embeddings). Returns the seconds spent summing across ranks.
  virtual double gradient_sum_squares(const Tensor& acc, int skip = -1) = 0;
  // The optimizer's step on this rank's share of the parameters (the step's decision in the
  // model's step_control()), then the updated weights on every rank, rounded by `rounding`.
  // Returns the seconds spent sharing them.
  virtual double step_weights(float lr, const RngKey& rounding) = 0;
  // The seconds the model waited for weights held by other ranks, since the last call.
  virtual double take_weight_wait_seconds() = 0;

  // After the model's weights were written alike on every rank (loaded or initialized): the
  // precision's copies and this rank's share taken from them.
  virtual void weights_written() = 0;
  // The weights of a safetensors file on every rank (read by the ranks that hold them).
  virtual void load_weights(const std::string& file) = 0;
  // What the layout measured of the run so far, by name (tensor parallelism: the bytes of
  // activations and their gradients summed over the tensor group); none by default.
  virtual std::vector<std::pair<std::string, double>> statistics() const { return {}; }
  // What it measured of the last step, by name (the pipeline's bubble), for the step's log.
  virtual std::vector<std::pair<std::string, double>> step_statistics() const { return {}; }
  // Where this rank's optimizer state lies in a checkpoint's; null when it holds the whole.
  virtual const StateShare* state_share() const = 0;
  // What a save writes when no rank holds it whole (parallel/zero.h): the weights and, for a
  // checkpoint, the optimizer's state, read from every rank; null when rank 0 holds it all.
  virtual std::unique_ptr<GatheredReads> gather_for_save(bool checkpoint) = 0;
  // The model a save writes when this rank's is a part of it (a pipeline stage's: the whole
  // model's parameters, which gather_for_save reads); null: this rank's own.
  virtual const Model* saved_model() const { return nullptr; }
  // Where evaluation's forward passes go through pipeline stages; null: on this rank's model.
  virtual StagedForward* staged_forward() { return nullptr; }
  // The default run_micro_batches runs a micro-batch whose backward reports no segment through
  // `recorder` (models/step_recorder.h: recorded once, then replayed); null: as it is.
  void record_micro_batches(StepRecorder* recorder) { recorder_ = recorder; }

 protected:
  StepRecorder* recorder_ = nullptr;
};

// acc += the sum of squares of `grads`, which hold the parameters' elements from `base` on, but
// those of parameter `skip` (-1: none).
void sum_squares_except(Backend& be, const ParameterSet& params, const Tensor& grads, int64_t base,
                        int skip, const Tensor& acc);

struct ParallelOptions {
  bool training = true;
  double bucket_cap_mb = 25;  // ddp_bucket_cap_mb
};

// What a policy of a layout is made from: the run's backend, world and mesh, the model (this
// rank's share of the whole model of config `full`), its precision and optimizer, and the
// buffers the run's assembly planned for the layout.
struct ParallelContext {
  Backend& be;
  Communicator& world;
  DeviceMesh& mesh;
  Model& model;
  const ModelConfig& full;
  MixedPrecision& precision;
  Optimizer& optimizer;
  const ParallelBuffers& buffers;
  ParallelOptions options;
};

// Data parallelism (DDP, or ZeRO by the buffers planned) over `replicas`, the ranks that hold the
// same parameters. Resets the optimizer's state (on the host's backend when offloaded) and gives
// the model its weights' slots; with ZeRO a collective.
std::unique_ptr<ParallelPolicy> make_data_parallel(const ParallelContext& c,
                                                   Communicator& replicas);

}  // namespace brisk
