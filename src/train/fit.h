// Choosing a run's shape from its plan, without trial runs: what a run needs of a memory budget,
// and the largest per-device batch that fits (--auto_find_batch_size), keeping the global batch.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/device_traits.h"
#include "core/memory_plan.h"
#include "data/dataset.h"
#include "train/options.h"
#include "train/tokenized_data.h"

namespace brisk {
struct RunAssembly;
}

namespace brisk {

// Bytes from a size with an optional unit: decimal kB/KB, MB, GB, TB; binary KiB, MiB, GiB,
// TiB (K, M, G, T alone are binary too); a fraction is allowed ("1.5GB"). Refuses the rest.
size_t parse_memory_size(const std::string& text);

// The memory a run may use and what it needs beyond its plan. On the CPU the budget is the
// process's resident memory; on a GPU, "GPU memory occupied".
struct MemoryBudget {
  Device device = kHostDevice;
  size_t budget = 0;   // bytes the run may use
  size_t fixed = 0;    // bytes the run takes besides its plan within that budget
  std::string source;  // where the budget came from, for messages
};

// --max_memory when given (then the fixed part is the process's resident memory now, or the
// GPU's context as measured or, without a GPU, kCudaContextBytes); else what is free now: the
// host's MemAvailable or the GPU's free memory, of which nothing is taken yet.
MemoryBudget memory_budget(const TrainOptions& o, Device device, const Backend* backend);

// What a planned run needs of the budget: its bytes in the budgeted memory (on a GPU the device
// block; pinned staging is the host's), the fixed part, and a margin of max(2%, 32 MiB).
size_t needed_bytes(const MemoryPlan& plan, const MemoryBudget& budget);

struct BatchFit {
  int64_t batch = 0;         // per-device batch chosen
  int64_t accumulation = 0;  // gradient accumulation steps chosen (batch x accumulation kept)
  size_t needed = 0;         // what that run needs of the budget
  std::string reason;        // one line saying what was chosen and why
};

// The largest per-device batch dividing the global batch (per_device_train_batch_size x
// gradient_accumulation_steps, and no larger than the data) whose run (with pipeline stages, its
// largest stage) fits the budget, with the accumulation raised or lowered to keep the global
// batch. Refuses, naming the smallest need (batch 1 with gradient checkpointing), when even
// batch 1 does not fit.
BatchFit fit_batch(const TrainOptions& o, Device device, const MemoryBudget& budget,
                   GivenData dataset = nullptr);

}  // namespace brisk

namespace brisk {

// The cost model that ranks configurations (brisk estimate --fit): seconds of one optimizer step
// of the global batch as
//   tokens x 6 N (x 4/3 with gradient checkpointing: one more forward; with LoRA's frozen base
//   4 N, 6 N with checkpointing: no weight gradients, the adapters' rank-r products left out)
//   / product rate
// + tokens x 12 L C T (x 4/3 with gradient checkpointing or selective recomputation) /
//   attention rate
// + micro-steps x L x per-layer launch cost
// + micro-steps x 3 x activation bytes produced (those a run without recomputation keeps; x 4/3
//   with gradient checkpointing) / elementwise rate (LayerNorm, GELU, dropout, rounding,
//   residuals, forward and backward)
// + 2 x (weights, master weights, gradients, optimizer state) / bandwidth (the optimizer pass;
//   with adapters the trained weights, not the frozen base)
// + micro-steps x 2 x a frozen base's stored linears (QLoRA's 4 bits, a bf16 LoRA run's 16)
//   read and written as float32 / bandwidth (forward and backward; not measured)
// and with offload_optimizer, the host's part of that pass at the host's bandwidth instead, and
// 2 x 4 bytes per stepped parameter (gradients down, master up) / host link.
// N counts the matrices of the blocks (no embeddings), L layers, C hidden size, T sequence.
// Layouts of several ranks add the sums across them (communication_seconds); with p pipeline
// stages over m micro-batches the blocks' terms take x (m + p - 1) / m x 4/3 / p (the first
// stage's share: 1F1B's bubble, each forward run twice before the last stage) and the
// elementwise passes x 4/3, the states being the stage's.
// Rates are measurements of brisk on one machine of each kind, named in fit.cpp (the host link:
// assumed).
// The device's rates and the host's streaming rate (an offloaded optimizer's pass).
struct CostModel : DeviceRates {
  double host_bandwidth = 0;
};
CostModel cost_model(Device device);
// A step's seconds on one rank of the run's layout: its share of the products, the elementwise
// passes over its activations, the optimizer's pass over its model states, and the sums across
// ranks (its replicas', tensor, sequence and pipeline groups'), none hidden behind computation.
double predicted_step_seconds(const RunAssembly& run, const CostModel& m);
// The bytes a rank of the layout's sequence ranks passes to its all-to-alls per step
// (parallel/sequence_parallel.h's sequence_exchange_bytes for the run's precision and
// recomputation); 0 without sequence parallelism.
double sequence_step_bytes(const RunAssembly& run);
// The bytes a rank of the layout's tensor ranks sums over the tensor group per step
// (all-reduces): 4 float32 [B, T, C] sums per block of its stage per micro-batch (2 forward, 2
// backward; T a sequence rank's tokens) and those of the forwards gradient checkpointing runs
// again, unless Megatron's sequence parallelism gathers and reduce-scatters them instead (then
// its norms' gradients, summed once a step: all of them, also where ZeRO 2 or 3 leaves a data
// rank only its run); and vocabulary parallelism's: the embeddings' output on the first stage,
// the head's input gradient and 3 float32 statistics per row and rank on the last. 0 without
// tensor parallelism.
double tensor_step_bytes(const RunAssembly& run);
// Under Megatron's sequence parallelism, the bytes of the whole [B, T, C] tensors a tensor rank
// all-gathers and reduce-scatters per step: per block and micro-batch the norms' outputs (a
// post-norm block's input) gathered before the column-parallel products, forward and again in
// backward (in the activations' 16-bit type where the products read it and nothing is
// recomputed), the row-parallel products' float32 outputs and the column-parallel products' input
// gradients reduce-scattered, the row-parallel products' output gradients gathered, and the
// recomputed forwards'; the embeddings' gradient gathered on the first stage, the head's input
// on the last. 0 otherwise.
double tensor_token_bytes(const RunAssembly& run);

// What --fit may choose besides the batch, recomputation and layout: precisions ("fp32", "bf16",
// "fp16", "tf32"), optimizers, and fine-tuning methods: "full", "lora" (--use_peft: adapters on a
// frozen base) and "qlora" (the same on a 4-bit base: --load_in_4bit). LoRA's candidates keep
// the run's lora_* and bnb_4bit_* options, and take data parallelism alone (the layouts adapters
// train under).
struct FitChoices {
  std::vector<std::string> precisions, optims, methods;
};
// The fine-tuning method of the options: "qlora", "lora" (--use_peft or --adapter_name_or_path)
// or "full".
std::string method_of(const TrainOptions& o);

struct FitCandidate {
  TrainOptions options;  // its tp_size and zero_stage: the layout
  ParallelLayout layout;
  int data_ranks = 1;
  size_t needed = 0;
  double step_seconds = 0;
  std::array<size_t, kNumCategories> planned{};  // bytes by category
  size_t overlaid = 0;                           // of those, laid over others (counted twice)
};

// The global batch of o's options over `world` ranks: per_device_train_batch_size x
// gradient_accumulation_steps x the data replicas (the ranks over tensor, pipeline and sequence
// degrees).
int64_t global_batch(const TrainOptions& o, int world);

// Every configuration of the global batch (per_device_train_batch_size x
// gradient_accumulation_steps x the data replicas of o's layout) over per-device batch,
// recomputation (none, selective, full), and precision, optimizer and method from the choices
// allowed, whose plan (rank 0's; with pipeline stages, the largest stage's) fits
// the budget, fastest predicted first. For a run of `world` processes, over the layouts too:
// every tensor-parallel degree, pipeline depth and sequence-parallel degree dividing the world
// and the model's counts, data parallelism over the rest of the ranks under each ZeRO stage (0
// and 1 with pipelines; ZeRO's partitions over the data and sequence ranks together).
std::vector<FitCandidate> fit_search(const TrainOptions& o, Device device,
                                     const MemoryBudget& budget, const FitChoices& choices,
                                     int* rejected, int world = 1);

}  // namespace brisk
