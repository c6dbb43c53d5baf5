// Optimizer-step kernels on CUDA: the gradients' sum of squares, the step decision (skip, clip and
// unscale) and AdamW, all reading and writing device buffers so the step never waits on the host.
#include <cstdint>

#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_launch.h"
#include "optim/step_control.h"

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

// The CPU's AdamW update (optim/adamw.cpp) per element. Elements inside one of the sorted,
// disjoint decay ranges take the weight decay factor. A thread's elements increase with the grid
// stride, so it binary-searches its first range once and then only walks forward.
__global__ void adamw_kernel(float* w, const float* g, float* m, float* v, int64_t n,
                             const int64_t* ranges, int num_ranges, AdamWArgs a, float decay,
                             const float* control) {
  if (control[kControlSkip] != 0.0f) return;  // a non-finite step changes nothing
  const float mult = control[kControlMultiplier];
  int64_t i = global_thread();
  if (i >= n) return;
  // First range whose end lies beyond i (ends ascend since the ranges are sorted and disjoint).
  int lo = 0, hi = num_ranges;
  while (lo < hi) {
    const int mid = lo + (hi - lo) / 2;
    if (ranges[2 * mid + 1] <= i) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  int r = lo;
  int64_t begin = r < num_ranges ? ranges[2 * r] : kNone;
  int64_t end = r < num_ranges ? ranges[2 * r + 1] : kNone;
  const float one_minus_b1 = 1.0f - a.beta1, one_minus_b2 = 1.0f - a.beta2;
  for (; i < n; i += grid_threads()) {
    while (end <= i) {
      ++r;
      begin = r < num_ranges ? ranges[2 * r] : kNone;
      end = r < num_ranges ? ranges[2 * r + 1] : kNone;
    }
    const float d = i >= begin ? decay : 1.0f;
    const float gi = g[i] * mult;
    const float mi = a.beta1 * m[i] + one_minus_b1 * gi;
    const float vi = a.beta2 * v[i] + one_minus_b2 * gi * gi;
    m[i] = mi;
    v[i] = vi;
    w[i] = w[i] * d - a.step_size * mi / (sqrtf(vi) / a.bc2_sqrt + a.eps);
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

}  // namespace brisk::cuda
