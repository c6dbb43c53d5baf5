// Optimizer-step kernels on CUDA: the gradients' sum of squares, the step decision (skip, clip and
// unscale), AdamW, SGD, Adafactor, 8-bit AdamW and stochastic rounding of bf16 weights, all
// reading and writing device buffers so the step never waits on the host. Each mirrors the CPU's
// arithmetic (cpu_optim_lowmem.cpp, optim/adamw.cpp) operation by operation.
#include <climits>
#include <cstdint>

#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_launch.h"
#include "core/quantization.h"
#include "core/step_control.h"

namespace brisk::cuda {

namespace {

constexpr int64_t kNone = INT64_MAX;  // the bounds of the range past the last one

// Fewer blocks than the elementwise kernels: each block ends in one double atomicAdd.
constexpr int64_t kSumSquaresBlocks = 1024;

// Squares and sums in double, as the CPU's grad_l2_norm; inf and NaN propagate through the sum.
// The blocks' partials are combined by atomicAdd, so the last bits can vary between runs.
__global__ void sum_squares_kernel(const float* x, int64_t n, double* acc) {
  __shared__ double shared[32];
  double local = 0.0;
  for (int64_t i = global_thread(); i < n; i += grid_threads()) {
    const double v = x[i];
    local += v * v;
  }
  const double total = block_reduce(local, shared, SumOp{});
  if (threadIdx.x == 0) atomicAdd(acc, total);
}

__global__ void decide_step_kernel(const double* stats, double loss_scale, double max_norm,
                                   float* control) {
  ::brisk::decide_step(stats, loss_scale, max_norm, control);
}

// Walks the sorted, disjoint decay ranges alongside a thread's increasing element indices (a
// grid-stride loop): one binary search for the first element, then only forward steps.
struct DecayCursor {
  const int64_t* ranges;
  int count, r;
  int64_t begin, end;

  __device__ DecayCursor(const int64_t* ranges_, int count_, int64_t first)
      : ranges(ranges_), count(count_) {
    // First range whose end lies beyond `first` (ends ascend since the ranges are sorted).
    int lo = 0, hi = count;
    while (lo < hi) {
      const int mid = lo + (hi - lo) / 2;
      if (ranges[2 * mid + 1] <= first) {
        lo = mid + 1;
      } else {
        hi = mid;
      }
    }
    r = lo;
    load();
  }
  __device__ void load() {
    begin = r < count ? ranges[2 * r] : kNone;
    end = r < count ? ranges[2 * r + 1] : kNone;
  }
  // Whether element i (not below any earlier query) takes weight decay.
  __device__ bool covers(int64_t i) {
    while (end <= i) {
      ++r;
      load();
    }
    return i >= begin;
  }
};

// The AdamW weight update from an element's new moments, written as the CPU writes it.
__device__ __forceinline__ float adamw_weight(float w, float m, float v, float decay,
                                              const AdamWArgs& a) {
  return w * decay - a.step_size * m / (sqrtf(v) / a.bc2_sqrt + a.eps);
}

__device__ __forceinline__ void adamw_element(float* w, const float* g, float* m, float* v,
                                              int64_t i, float mult, float decay,
                                              const AdamWArgs& a) {
  const float gi = g[i] * mult;
  const float mi = a.beta1 * m[i] + (1.0f - a.beta1) * gi;
  const float vi = a.beta2 * v[i] + (1.0f - a.beta2) * gi * gi;
  m[i] = mi;
  v[i] = vi;
  w[i] = adamw_weight(w[i], mi, vi, decay, a);
}

// The CPU's AdamW update (optim/adamw.cpp) per element. Elements inside one of the decay ranges
// take the weight decay factor.
__global__ void adamw_kernel(float* w, const float* g, float* m, float* v, int64_t n,
                             const int64_t* ranges, int num_ranges, AdamWArgs a, float decay,
                             const float* control) {
  if (control[kControlSkip] != 0.0f) return;  // a non-finite step changes nothing
  const float mult = control[kControlMultiplier];
  int64_t i = global_thread();
  if (i >= n) return;
  DecayCursor decayed(ranges, num_ranges, i);
  for (; i < n; i += grid_threads())
    adamw_element(w, g, m, v, i, mult, decayed.covers(i) ? decay : 1.0f, a);
}

// AdamW on one tensor whose elements share a decay factor: 8-bit AdamW's tensors that keep
// float32 moments (small ones and embeddings).
__global__ void adamw_dense_kernel(float* w, const float* g, float* m, float* v, int64_t n,
                                   AdamWArgs a, float decay, const float* control) {
  if (control[kControlSkip] != 0.0f) return;
  const float mult = control[kControlMultiplier];
  for (int64_t i = global_thread(); i < n; i += grid_threads())
    adamw_element(w, g, m, v, i, mult, decay, a);
}

// ---- 8-bit AdamW ----
// One CUDA block per quantization block: the block's absolute maxima are a reduction over its
// new moments, which must all exist before any of them is re-quantized, so a block of threads
// holding one moment pair each does it without a second pass over memory. The maps are read by
// data-dependent index, hence copied to shared memory first.
static_assert(kQuantBlock == kThreads, "one thread per quantized value");

__global__ void __launch_bounds__(kThreads)
    adamw_8bit_kernel(float* w, const float* g, uint8_t* codes1, uint8_t* codes2, float* absmax1,
                      float* absmax2, const float* qmap_signed, const float* qmap_unsigned,
                      int64_t n, AdamWArgs a, float decay, const float* control) {
  if (control[kControlSkip] != 0.0f) return;
  __shared__ float qs[256], qu[256];
  __shared__ float shared[32];
  const int t = static_cast<int>(threadIdx.x);
  qs[t] = qmap_signed[t];
  qu[t] = qmap_unsigned[t];
  __syncthreads();
  const float mult = control[kControlMultiplier];
  const int64_t b = blockIdx.x, i = b * kQuantBlock + t;
  const bool active = i < n;
  float m = 0.0f, v = 0.0f;  // the reductions' identities for the threads past the end
  if (active) {
    const float gi = g[i] * mult;
    m = a.beta1 * (qs[codes1[i]] * absmax1[b]) + (1.0f - a.beta1) * gi;
    v = a.beta2 * (qu[codes2[i]] * absmax2[b]) + (1.0f - a.beta2) * gi * gi;
    w[i] = adamw_weight(w[i], m, v, decay, a);
  }
  // Every thread read the old maxima above, before the reductions' barriers.
  const float max1 = block_reduce(fabsf(m), shared, MaxOp{});
  const float max2 = block_reduce(v, shared, MaxOp{});
  if (t == 0) {
    absmax1[b] = max1;
    absmax2[b] = max2;
  }
  if (active) {
    const float inv1 = max1 > 0 ? 1.0f / max1 : 0.0f, inv2 = max2 > 0 ? 1.0f / max2 : 0.0f;
    codes1[i] = quantize_nearest(qs, m * inv1);
    codes2[i] = quantize_nearest(qu, v * inv2);
  }
}

// ---- SGD ----
// torch.optim.SGD per element: L2 weight decay on the decay ranges, optional momentum.
__global__ void sgd_kernel(float* w, const float* g, float* buf, int64_t n, const int64_t* ranges,
                           int num_ranges, SgdArgs a, const float* control) {
  if (control[kControlSkip] != 0.0f) return;
  const float mult = control[kControlMultiplier];
  int64_t i = global_thread();
  if (i >= n) return;
  DecayCursor decayed(ranges, num_ranges, i);
  const float keep = 1.0f - a.dampening;
  for (; i < n; i += grid_threads()) {
    const float wd = decayed.covers(i) ? a.weight_decay : 0.0f;
    float d = g[i] * mult + wd * w[i];
    if (buf) {
      const float b = a.first_step ? d : a.momentum * buf[i] + keep * d;
      buf[i] = b;
      d = a.nesterov ? d + a.momentum * b : b;
    }
    w[i] -= a.lr * d;
  }
}

// ---- Adafactor ----
// Per tensor, a chain of kernels on one stream: the factored statistics (rows, columns, the
// rows' mean), then the sums of squares of the unclipped update and of the weights, then the
// update itself. Every scalar that depends on a reduction stays in the device scratch, where the
// next kernel reads it, so the host never waits. Sums are in double as on the CPU; only their
// order differs.
enum AdafactorScratch : int { kWeightSumSq = 0, kRowMean = 1, kUpdateSumSq = 2 };
static_assert(kUpdateSumSq < kAdafactorScratch, "the scratch holds every slot");

// Row r's statistic: the mean over columns of (g*mult)^2 + eps1, averaged in with beta2t. One
// block per row (grid-stride over rows).
__global__ void adafactor_rows_kernel(const float* g, float* row, int64_t R, int64_t C, float b2,
                                      float eps1, const float* control) {
  if (control[kControlSkip] != 0.0f) return;
  __shared__ double shared[32];
  const float mult = control[kControlMultiplier];
  for (int64_t r = blockIdx.x; r < R; r += gridDim.x) {
    const float* gr = g + r * C;
    double acc = 0;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
      const float gi = gr[c] * mult;
      acc += static_cast<double>(gi * gi + eps1);
    }
    const double total = block_reduce(acc, shared, SumOp{});
    if (threadIdx.x == 0) row[r] = b2 * row[r] + (1.0f - b2) * static_cast<float>(total / C);
  }
}

// Column statistics: a block covers kColLanes adjacent columns (coalesced reads along a row) with
// kColGroups threads per column taking every kColGroups-th row; their partial sums are added in
// a fixed order.
constexpr int kColLanes = 32, kColGroups = 8;
__global__ void adafactor_cols_kernel(const float* g, float* col, int64_t R, int64_t C, float b2,
                                      float eps1, const float* control) {
  if (control[kControlSkip] != 0.0f) return;
  __shared__ double partial[kColGroups][kColLanes];
  const float mult = control[kControlMultiplier];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kColLanes + threadIdx.x;
  double acc = 0;
  if (c < C)
    for (int64_t r = threadIdx.y; r < R; r += kColGroups) {
      const float gi = g[r * C + c] * mult;
      acc += static_cast<double>(gi * gi + eps1);
    }
  partial[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    double total = 0;
    for (int y = 0; y < kColGroups; ++y) total += partial[y][threadIdx.x];
    col[c] = b2 * col[c] + (1.0f - b2) * static_cast<float>(total / R);
  }
}

// The mean of the new row statistics, which normalizes them in the update. One block.
__global__ void adafactor_row_mean_kernel(const float* row, int64_t R, double* scratch,
                                          const float* control) {
  if (control[kControlSkip] != 0.0f) return;
  __shared__ double shared[32];
  double acc = 0;
  for (int64_t r = threadIdx.x; r < R; r += blockDim.x) acc += row[r];
  const double total = block_reduce(acc, shared, SumOp{});
  if (threadIdx.x == 0) scratch[kRowMean] = total / static_cast<double>(R);
}

// Element i's update before clipping and scaling, from the new second-moment statistics.
__device__ __forceinline__ float adafactor_raw(const AdafactorTensor& t, int64_t i, float mult,
                                               float row_mean) {
  const float gi = t.g[i] * mult;
  if (!t.factored) return gi / sqrtf(t.v[i]);
  const int64_t r = i / t.cols, c = i - r * t.cols;
  return gi / sqrtf(t.v[r] / row_mean) / sqrtf(t.v[t.rows + c]);
}

// The sums of squares of the unclipped update and (scale_parameter) of the weights before the
// update. For a vector it first updates the element's full second moment, which only this
// thread reads.
__global__ void adafactor_sums_kernel(AdafactorTensor t, float b2, float eps1, bool weight_sum,
                                      double* scratch, const float* control) {
  if (control[kControlSkip] != 0.0f) return;
  __shared__ double shared[32];
  const float mult = control[kControlMultiplier];
  const float row_mean = t.factored ? static_cast<float>(scratch[kRowMean]) : 1.0f;
  const int64_t n = t.rows * t.cols;
  double update_sq = 0, weight_sq = 0;
  for (int64_t i = global_thread(); i < n; i += grid_threads()) {
    if (!t.factored) {
      const float gi = t.g[i] * mult;
      t.v[i] = b2 * t.v[i] + (1.0f - b2) * (gi * gi + eps1);
    }
    const double x = adafactor_raw(t, i, mult, row_mean);
    update_sq += x * x;
    if (weight_sum) {
      const double wi = t.w[i];
      weight_sq += wi * wi;
    }
  }
  update_sq = block_reduce(update_sq, shared, SumOp{});
  if (threadIdx.x == 0) atomicAdd(&scratch[kUpdateSumSq], update_sq);
  if (weight_sum) {
    weight_sq = block_reduce(weight_sq, shared, SumOp{});
    if (threadIdx.x == 0) atomicAdd(&scratch[kWeightSumSq], weight_sq);
  }
}

// The update: clipped by the update's RMS, scaled by the step size (and the weights' RMS), through
// the first moment when there is one, after decoupled weight decay.
__global__ void adafactor_apply_kernel(AdafactorTensor t, AdafactorArgs a, const double* scratch,
                                       const float* control) {
  if (control[kControlSkip] != 0.0f) return;
  __shared__ float scale_decay[2];
  const int64_t n = t.rows * t.cols;
  if (threadIdx.x == 0) {  // in double, as the CPU
    double step = a.step_size;
    if (a.scale_parameter)
      step *= fmax(static_cast<double>(a.eps2), sqrt(scratch[kWeightSumSq] / n));
    const double rms = sqrt(scratch[kUpdateSumSq] / n);
    scale_decay[0] = static_cast<float>(step / fmax(1.0, rms / a.clip_threshold));
    scale_decay[1] = t.decay ? static_cast<float>(a.weight_decay * step) : 0.0f;
  }
  __syncthreads();
  const float scale = scale_decay[0], decay = scale_decay[1];
  const float mult = control[kControlMultiplier];
  const float row_mean = t.factored ? static_cast<float>(scratch[kRowMean]) : 1.0f;
  for (int64_t i = global_thread(); i < n; i += grid_threads()) {
    float x = adafactor_raw(t, i, mult, row_mean) * scale;
    if (t.m) {
      const float mi = a.beta1 * t.m[i] + (1.0f - a.beta1) * x;
      t.m[i] = mi;
      x = mi;
    }
    const float wi = t.w[i];
    t.w[i] = (wi - decay * wi) - x;
  }
}

// ---- stochastic rounding ----
// Element i's word is rng_block(key, i / 4).v[i % 4], as on the CPU (rng_blocks), so both
// backends round every element the same way. With 16-byte aligned data a group of four moves
// as one float4.
__global__ void stochastic_round_kernel(float* x, int64_t n, RngKey key, bool vec4) {
  const int64_t groups = (n + 3) / 4;
  for (int64_t g = global_thread(); g < groups; g += grid_threads()) {
    const Philox4 words = rng_block(key, static_cast<uint64_t>(g));
    if (vec4 && 4 * g + 4 <= n) {
      float4 v = reinterpret_cast<float4*>(x)[g];
      v.x = stochastic_round_bf16(v.x, words.v[0]);
      v.y = stochastic_round_bf16(v.y, words.v[1]);
      v.z = stochastic_round_bf16(v.z, words.v[2]);
      v.w = stochastic_round_bf16(v.w, words.v[3]);
      reinterpret_cast<float4*>(x)[g] = v;
      continue;
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t i = 4 * g + j;
      if (i < n) x[i] = stochastic_round_bf16(x[i], words.v[j]);
    }
  }
}

}  // namespace

void sum_squares(cudaStream_t s, const float* x, int64_t n, double* acc) {
  if (n <= 0) return;
  sum_squares_kernel<<<grid_for(n, kThreads, kSumSquaresBlocks), kThreads, 0, s>>>(x, n, acc);
  check_launch("sum_squares");
}

void decide_step(cudaStream_t s, const double* stats, double loss_scale, double max_norm,
                 float* control) {
  decide_step_kernel<<<1, 1, 0, s>>>(stats, loss_scale, max_norm, control);
  check_launch("decide_step");
}

void adamw(cudaStream_t s, float* w, const float* g, float* m, float* v, int64_t n,
           const int64_t* decay_ranges, int num_ranges, AdamWArgs args, const float* control) {
  if (n <= 0) return;
  if (!decay_ranges || num_ranges < 0) num_ranges = 0;
  // Computed as on the CPU, in float on the host.
  const float decay = 1.0f - args.lr * args.weight_decay;
  adamw_kernel<<<grid_for(n), kThreads, 0, s>>>(w, g, m, v, n, decay_ranges, num_ranges, args,
                                                decay, control);
  check_launch("adamw");
}

void adamw_dense(cudaStream_t s, float* w, const float* g, float* m, float* v, int64_t n,
                 AdamWArgs args, float decay, const float* control) {
  if (n <= 0) return;
  adamw_dense_kernel<<<grid_for(n), kThreads, 0, s>>>(w, g, m, v, n, args, decay, control);
  check_launch("adamw_dense");
}

void adamw_8bit(cudaStream_t s, float* w, const float* g, uint8_t* codes1, uint8_t* codes2,
                float* absmax1, float* absmax2, const float* qmap_signed,
                const float* qmap_unsigned, int64_t n, AdamWArgs args, float decay,
                const float* control) {
  if (n <= 0) return;
  const int64_t blocks = (n + kQuantBlock - 1) / kQuantBlock;
  BRISK_CHECK(blocks <= INT_MAX, "adamw_8bit: ", n, " elements exceed one launch");
  adamw_8bit_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, s>>>(
      w, g, codes1, codes2, absmax1, absmax2, qmap_signed, qmap_unsigned, n, args, decay, control);
  check_launch("adamw_8bit");
}

void sgd(cudaStream_t s, float* w, const float* g, float* momentum_buffer, int64_t n,
         const int64_t* decay_ranges, int num_ranges, SgdArgs args, const float* control) {
  if (n <= 0) return;
  if (!decay_ranges || num_ranges < 0) num_ranges = 0;
  sgd_kernel<<<grid_for(n), kThreads, 0, s>>>(w, g, momentum_buffer, n, decay_ranges, num_ranges,
                                              args, control);
  check_launch("sgd");
}

void adafactor(cudaStream_t s, const AdafactorTensor& t, const AdafactorArgs& args,
               const float* control, double* scratch) {
  const int64_t n = t.rows * t.cols;
  if (n <= 0) return;
  // The sums below are accumulated by atomicAdd; the previous tensor's are consumed by now (the
  // stream runs in order).
  check_cuda(cudaMemsetAsync(scratch, 0, kAdafactorScratch * sizeof(double), s),
             "clearing Adafactor's scratch");
  if (t.factored) {
    adafactor_rows_kernel<<<grid_for(t.rows, 1), threads_for_row(t.cols), 0, s>>>(
        t.g, t.v, t.rows, t.cols, args.beta2t, args.eps1, control);
    check_launch("adafactor_rows");
    const int64_t col_blocks = (t.cols + kColLanes - 1) / kColLanes;
    BRISK_CHECK(col_blocks <= INT_MAX, "adafactor: ", t.cols, " columns exceed one launch");
    adafactor_cols_kernel<<<static_cast<unsigned>(col_blocks), dim3(kColLanes, kColGroups), 0, s>>>(
        t.g, t.v + t.rows, t.rows, t.cols, args.beta2t, args.eps1, control);
    check_launch("adafactor_cols");
    adafactor_row_mean_kernel<<<1, threads_for_row(t.rows, 1024), 0, s>>>(t.v, t.rows, scratch,
                                                                          control);
    check_launch("adafactor_row_mean");
  }
  adafactor_sums_kernel<<<grid_for(n, kThreads, kSumSquaresBlocks), kThreads, 0, s>>>(
      t, args.beta2t, args.eps1, args.scale_parameter, scratch, control);
  check_launch("adafactor_sums");
  adafactor_apply_kernel<<<grid_for(n), kThreads, 0, s>>>(t, args, scratch, control);
  check_launch("adafactor_apply");
}

void stochastic_round(cudaStream_t s, float* x, int64_t n, RngKey key) {
  if (n <= 0) return;
  const bool vec4 = reinterpret_cast<uintptr_t>(x) % 16 == 0;
  stochastic_round_kernel<<<grid_for((n + 3) / 4), kThreads, 0, s>>>(x, n, key, vec4);
  check_launch("stochastic_round");
}

}  // namespace brisk::cuda
