// What planning, fitting and the trainer ask of a device, apart from the backend that runs its
// ops: an always-compiled description, so that a run is planned for a device this machine lacks
// (`brisk estimate --device cuda`) from the same facts the run itself uses. Code outside backend/
// asks these questions instead of branching on Device.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/dtype.h"

namespace brisk {

// Measured rates, for the step-time estimate of `estimate --fit` (train/fit.cpp).
struct DeviceRates {
  double fp32_flops = 0, tf32_flops = 0, bf16_flops = 0, fp16_flops = 0;  // products
  double attention_flops = 0;                                             // attention cores
  double bandwidth = 0;       // bytes/s of a streaming pass (the optimizer's)
  double elementwise = 0;     // activation bytes/s through the elementwise passes (calibrated)
  double layer_overhead = 0;  // seconds per layer per micro-step (launches, host work)
  double host_link = 0;       // bytes/s each way between host memory and the device's
  // Bytes/s a rank moves in a ring all-reduce among devices of this kind (its bus bandwidth).
  double collective = 0;
};

struct DeviceTraits {
  Device device = Device::cpu;
  // The device computes in the host's memory: a batch needs no device copy, the host's memory
  // bounds a run, an offloaded optimizer moves nothing, and no device stream orders collectives.
  bool host_memory = true;
  // Bytes of one chunk of a language model's logits (the head runs a chunk of rows at a time).
  int64_t logits_chunk_bytes = 0;
  // Its bf16 products round float32 operands as they pack them: bf16 training needs no 16-bit
  // compute copy of the weights.
  bool products_round_operands = false;
  // bf16 runs: the LM head's products read the logits' gradient as the loss writes it, in bf16,
  // this many chunks of it at a time (Model::lm_head_forward): 2, where a float32 gradient is
  // packed once for both products anyway, gives dW [V, C] half the reads and writes and needs
  // more than a chunk of rows; 1 spares the products' cast of a float32 gradient to bf16, and
  // the loss half its writes, where the head has no bias (a bias's gradient sums the unrounded
  // one). 0: the products read the float32 gradient.
  int64_t head_grad_chunks = 0;
  // bf16 training may compute with the float32 weights too (no 16-bit compute copy), its products
  // reading a bf16 copy of them made once per optimizer step (Backend::hold_weights), as a GPU's
  // tensor cores read their operands from memory (where that holds less: train/assembly.cpp).
  bool bf16_weights_copy = false;
  // Mixed precision: the pre-norm blocks' norm outputs, and the MLP activation's output, rebuilt
  // in backward rather than kept per block (PlanOptions::recompute_norms, recompute_activation).
  bool recompute_norms = false;
  bool recompute_activation = false;
  // bf16 runs: a language-model head without a bias multiplies its weight padded with zero rows
  // to a multiple of this (Backend::hold_padded_weight), and its logits' rows are that wide (the
  // padding columns take no probability and no gradient). 1: never padded.
  int64_t bf16_head_row_multiple = 1;
  // The backend records work: training's micro-batches (forward and backward) and evaluation's
  // forward passes may be recorded once and replayed (models/step_recorder.h), planned as
  // PlanOptions::held_step where the run asks (Switches::recorded_steps).
  bool records_steps = false;
  // Bytes a process holds on the device before its arena, where nothing can be asked (a GPU's
  // context); 0 where the host's resident memory is measured instead.
  size_t context_bytes = 0;
  DeviceRates rates;
};

const DeviceTraits& device_traits(Device device);

// --device: "cpu", "cuda", or "auto" (a usable GPU, else the CPU); throws naming the valid names.
Device device_named(const std::string& name);

// What the GPU holds beyond the plan: "GPU memory occupied" minus the planned device bytes,
// measured on an H100 80GB (driver 580.159.04, CUDA 13.0, 2026-11-22) as 1013 MiB in three
// bert-large runs of different plans (fp32, bf16, Adafactor; within 0.5 MiB of each other): the
// CUDA context, the loaded kernels of brisk and cuBLASLt, and the driver's own allocations.
inline constexpr size_t kCudaContextBytes = size_t{1013} << 20;

}  // namespace brisk
