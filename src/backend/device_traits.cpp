// The devices' descriptions (device_traits.h).
#include "backend/device_traits.h"

#include "backend/backend.h"
#include "core/error.h"

namespace brisk {

namespace {

// Rates measured on 2026-11-22 and before. CPU: the development machine (2 threads of an
// AVX-512/AMX Xeon): OpenBLAS sgemm ~156 GFLOP/s and oneDNN bf16 ~757 GFLOP/s at the BERT
// benchmark's shapes (docs/benchmarks-history.md, bench_matmul), attention in float32 at the sgemm
// rate, ~10 GB/s for the optimizer's streaming pass over two threads, and 1.4 GB/s of planned
// activation bytes through the elementwise passes (calibrated: bert-small bf16, batch 16 x 128,
// 300 ms a step measured by bench/plan_check.py where flops alone predict 126 ms). GPU: an
// H100 80GB running brisk (Nsight Compute, bert-large bf16 batch 4): cuBLASLt ~600 TFLOP/s in
// bf16/fp16 (~350 tf32, ~50 fp32), brisk's float32 flash attention ~13 TFLOP/s, ~3 TB/s for the
// optimizer, elementwise kernels ~21 ms over ~2.5 GB of activations (x 3: ~0.36 TB/s), ~30
// launches of ~5 us per layer; the host link assumed at a PCIe 4.0 x16 link's practical rate,
// not measured.
DeviceTraits cpu_traits() {
  DeviceTraits t;
  t.device = Device::cpu;
  t.host_memory = true;
  // Over 128 rows (GPT-2) the head's products ran ~5% of a step slower than over 256, in float32
  // (the input gradient's above all) and in bf16 on AMX (+62 MiB there; SmolLM2 unchanged; 512
  // rows gave no more).
  t.logits_chunk_bytes = int64_t{64} << 20;
  t.products_round_operands = true;
  t.head_grad_chunks = 2;
  // No measurable time, a third of what a llama block keeps; a GELU's output too (GPT-2 bf16
  // 66 MiB less at the same speed on a Zen 4, bert-small -1.8% within its noise).
  t.recompute_norms = true;
  t.recompute_activation = true;
  t.rates.fp32_flops = t.rates.tf32_flops = t.rates.fp16_flops = 156e9;  // fp16 emulated
  t.rates.bf16_flops = 757e9;
  t.rates.attention_flops = 156e9;
  t.rates.bandwidth = 10e9;
  t.rates.elementwise = 1.4e9;
  t.rates.layer_overhead = 50e-6;
  t.rates.host_link = t.rates.bandwidth;  // offload on the CPU (tests): copies within host memory
  // MPI over shared memory between two single-threaded ranks on a 2-core Zen 4 (bench/tp_plan.py:
  // GPT-2's tensor-parallel sums, waits included).
  t.rates.collective = 0.8e9;
  return t;
}

DeviceTraits cuda_traits() {
  DeviceTraits t;
  t.device = Device::cuda;
  t.host_memory = false;
  // 64 rows times a power of two keeps a product's operands 256-byte aligned. 512 MiB: GPT-2's
  // head in chunks of 2048 rows, so that its weight gradient's product (K = the chunk's rows)
  // reads and writes the float32 dW [V, C] once per 2048 rows, not per 128.
  t.logits_chunk_bytes = int64_t{512} << 20;
  t.products_round_operands = false;
  // GPT-2 batch 32: the cast of 1.6 G logits' gradients a step and half of the loss's writes
  // (about 13 GB of memory traffic), for 206 MB of dlogits (not yet measured on a GPU).
  // BRISK_BF16_HEAD_GRAD=0 keeps the float32 gradient, to compare (PlanOptions::bf16_head_grad).
  t.head_grad_chunks = 1;
  t.bf16_weights_copy = true;
  // cuBLASLt runs a product whose rows or columns are an odd vocabulary (GPT-2's 50257) on sm75
  // kernels: on an H100 the head's three products of 2048 rows took 3.9 ms against 0.8 ms at
  // 50304 (docs/benchmarks.md, "The LM head padded"). BRISK_PAD_HEAD=0 leaves it unpadded, to
  // measure (scripts/gpu_check.sh mlm; PlanOptions::pad_head).
  t.bf16_head_row_multiple = 64;
  // CUDA graphs of the micro-batches and evaluation passes: the backend records them, a run opts
  // in with BRISK_RECORDED_STEPS=1 until measured on a GPU (train's assembly).
  t.records_steps = true;
  // The MLP activation's output rebuilt from fc_pre (one memory-bound pass over B x T x inner
  // bf16 values a block: at an H100's bandwidth ~2 ms of a bert-large batch 32 step; not measured):
  // 384 MiB of bert-large's plan at batch 4, 3 GiB at batch 32. The norms' outputs are kept
  // (rebuilding them reads the float32 residual stream: more time for less memory).
  // BRISK_RECOMPUTE_ACTIVATION=0 keeps it, to measure (scripts/gpu_check.sh rebuild; train's
  // assembly).
  t.recompute_norms = false;
  t.recompute_activation = true;
  t.context_bytes = kCudaContextBytes;
  t.rates.fp32_flops = 50e12;
  t.rates.tf32_flops = 350e12;
  t.rates.bf16_flops = t.rates.fp16_flops = 600e12;
  t.rates.attention_flops = 13e12;
  t.rates.bandwidth = 3e12;
  t.rates.elementwise = 0.36e12;
  t.rates.layer_overhead = 150e-6;
  t.rates.host_link = 25e9;
  // NCCL's ring all-reduce among 8 H100 SXM over NVLink 4, as nccl-tests' bus bandwidth is
  // commonly reported (not measured by brisk: its NCCL paths have run on one GPU only).
  t.rates.collective = 360e9;
  return t;
}

}  // namespace

const DeviceTraits& device_traits(Device device) {
  static const DeviceTraits cpu = cpu_traits(), cuda = cuda_traits();
  return device == Device::cuda ? cuda : cpu;
}

Device device_named(const std::string& name) {
  if (name == "cpu") return Device::cpu;
  if (name == "cuda") return Device::cuda;
  BRISK_CHECK(name == "auto", "unknown device \"", excerpt(name), "\" (valid: cpu, cuda, auto)");
  return cuda_available() ? Device::cuda : Device::cpu;
}

}  // namespace brisk
