// Fused softmax + cross-entropy on CUDA: the loss of each row and, in place of the logits or in a
// float32 or bf16 tensor of their shape, their gradient; probabilities are never stored.
#include <algorithm>
#include <cmath>

#include "backend/cuda/cuda_elements.cuh"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_launch.h"

namespace brisk::cuda {

namespace {

// The block's maximum of z[0, n) (mx) and the sum of e^(z - mx) there (total, in double), on
// every thread: each thread keeps a running maximum and a sum relative to it (rescaled when the
// maximum grows), so the row is read once.
__device__ void row_max_and_sum(const float* z, int64_t n, float* shared_max, double* shared_sum,
                                float& mx, double& total) {
  float m = -INFINITY, sum = 0.0f;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    const float v = z[j];
    if (v > m) {
      sum = sum * expf(m - v) + 1.0f;  // m == -inf at first: expf(-inf) = 0
      m = v;
    } else {
      // -inf - -inf would be NaN; such a logit contributes exp(-inf) = 0 on the CPU. NaN
      // logits fall through to expf(NaN) and propagate, as on the CPU.
      sum += v == -INFINITY ? 0.0f : expf(v - m);
    }
  }
  mx = block_reduce(m, shared_max, MaxOp{});
  // A thread that saw no finite logit has sum 0 and m -inf, and contributes 0 (not 0 * NaN).
  // A +inf logit makes expf(inf - inf) NaN here, as exp(inf - inf) is NaN on the CPU.
  const double part = sum == 0.0f ? 0.0 : static_cast<double>(sum) * expf(m - mx);
  total = block_reduce(part, shared_sum, SumOp{});
}

// One block per row. The first pass keeps a running maximum and a sum of exponentials relative
// to it per thread (rescaled when the maximum grows), so the row is read twice in all rather
// than three times: vocabulary rows are large and rarely still in cache. The threads' sums meet
// in double, as the CPU sums in double. Rows whose label is kIgnoreIndex, or (never after the
// host's validation) outside [0, V), count no loss and get a zero gradient row. The gradient goes
// to `grad` (the logits themselves, or apart: G bf16 rounds it to nearest even).
template <typename G>
__global__ void softmax_cross_entropy_kernel(const float* logits, G* grad, const int32_t* labels,
                                             int64_t N, int64_t V, bool write_grad, GradScale scale,
                                             double* loss_sum) {
  const float grad_scale = applied(scale);
  __shared__ float shared_max[32];
  __shared__ double shared_sum[32];
  for (int64_t row = blockIdx.x; row < N; row += gridDim.x) {
    const float* z = logits + row * V;
    G* gz = grad + row * V;
    const int32_t label = labels[row];
    if (label < 0 || label >= V) {  // the branch is uniform across the block
      if (write_grad)
        for (int64_t j = threadIdx.x; j < V; j += blockDim.x) put(gz + j, 0.0f);
      continue;
    }
    // Read before the barriers in block_reduce; the gradient pass overwrites it afterwards.
    const float target = z[label];
    float mx;
    double total;
    row_max_and_sum(z, V, shared_max, shared_sum, mx, total);
    if (threadIdx.x == 0 && loss_sum)
      atomicAdd(loss_sum, log(total) - static_cast<double>(target - mx));
    if (write_grad) {
      const float f = static_cast<float>(grad_scale / total);
      for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
        const float g = expf(z[j] - mx) * f;
        put(gz + j, j == label ? g - grad_scale : g);
      }
    }
  }
}

// One block per row: the row's maximum over its `held` columns, the sum of e^(z - maximum)
// there (as softmax_cross_entropy_kernel's first pass) and the label's logit where held.
__global__ void cross_entropy_stats_kernel(const float* logits, const int32_t* labels, int64_t N,
                                           int64_t V, int64_t first, int64_t held, float* stats) {
  __shared__ float shared_max[32];
  __shared__ double shared_sum[32];
  for (int64_t row = blockIdx.x; row < N; row += gridDim.x) {
    const float* z = logits + row * V;
    float* st = stats + row * 3;
    if (labels[row] < 0 || held <= 0) {  // uniform across the block
      if (threadIdx.x == 0) st[0] = st[1] = st[2] = 0.0f;
      continue;
    }
    float mx;
    double total;
    row_max_and_sum(z, held, shared_max, shared_sum, mx, total);
    if (threadIdx.x == 0) {
      const int64_t label = labels[row] - first;
      st[0] = mx;
      st[1] = static_cast<float>(total);
      st[2] = label >= 0 && label < held ? z[label] : 0.0f;
    }
  }
}

// One block per row: the row's log-sum-exp from every shard's statistics, its loss added once
// per row, and the gradient of these columns (zero past `held` and on ignored rows) into `grad`
// (as softmax_cross_entropy_kernel's).
template <typename G>
__global__ void cross_entropy_from_stats_kernel(const float* logits, G* grad, const int32_t* labels,
                                                int64_t N, int64_t V, int64_t first, int64_t held,
                                                const float* stats, int64_t slots, bool write_grad,
                                                GradScale scale, double* loss_sum) {
  const float grad_scale = applied(scale);
  for (int64_t row = blockIdx.x; row < N; row += gridDim.x) {
    const float* z = logits + row * V;
    G* gz = grad + row * V;
    if (labels[row] < 0) {
      if (write_grad)
        for (int64_t j = threadIdx.x; j < V; j += blockDim.x) put(gz + j, 0.0f);
      continue;
    }
    float mx = stats[row * 3];
    for (int64_t k = 1; k < slots; ++k) mx = fmaxf(mx, stats[(k * N + row) * 3]);
    double total = 0.0, target = 0.0;
    for (int64_t k = 0; k < slots; ++k) {
      const float* st = stats + (k * N + row) * 3;
      total += static_cast<double>(st[1]) * exp(static_cast<double>(st[0]) - mx);
      target += st[2];
    }
    if (threadIdx.x == 0 && loss_sum) atomicAdd(loss_sum, log(total) - (target - mx));
    if (!write_grad) continue;
    const int64_t label = labels[row] - first;
    const float f = static_cast<float>(grad_scale / total);
    for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
      const float g = j < held ? expf(z[j] - mx) * f : 0.0f;
      put(gz + j, j == label ? g - grad_scale : g);
    }
  }
}

// One block: the rows of a regression head are one per sequence, a few hundred at most.
__global__ void mse_loss_kernel(float* predictions, const float* targets, int64_t N,
                                bool write_grad, GradScale scale, double* loss_sum) {
  const float grad_scale = applied(scale);
  __shared__ double shared_sum[32];
  double part = 0.0;
  for (int64_t r = threadIdx.x; r < N; r += blockDim.x) {
    const float y = targets[r];
    if (isnan(y)) {
      if (write_grad) predictions[r] = 0.0f;
      continue;
    }
    const double d = static_cast<double>(predictions[r]) - y;
    part += d * d;
    if (write_grad) predictions[r] = static_cast<float>(2.0 * d * grad_scale);
  }
  const double total = block_reduce(part, shared_sum, SumOp{});
  if (threadIdx.x == 0 && loss_sum) atomicAdd(loss_sum, total);
}

}  // namespace

void mse_loss(cudaStream_t s, float* predictions, const float* targets, int64_t N, bool write_grad,
              GradScale grad_scale, double* loss_sum) {
  if (N <= 0) return;
  mse_loss_kernel<<<1, 256, 0, s>>>(predictions, targets, N, write_grad, grad_scale, loss_sum);
  check_launch("mse_loss");
}

void softmax_cross_entropy(cudaStream_t s, float* logits, Out grad, const int32_t* labels,
                           int64_t N, int64_t V, bool write_grad, GradScale grad_scale,
                           double* loss_sum) {
  if (N <= 0 || V <= 0) return;
  // Wide blocks for vocabulary-sized rows, narrow ones for classification heads (V of 2 or 3).
  const int threads = V >= 8192 ? 512 : threads_for_row(V);
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>(N, 1 << 30));
  void* out = grad.data ? grad.data : logits;
  with_elements(grad.bf16, [&](auto g) {
    using G = decltype(g);
    softmax_cross_entropy_kernel<<<grid, threads, 0, s>>>(logits, static_cast<G*>(out), labels, N,
                                                          V, write_grad, grad_scale, loss_sum);
  });
  check_launch("softmax_cross_entropy");
}

void cross_entropy_stats(cudaStream_t s, const float* logits, const int32_t* labels, int64_t N,
                         int64_t V, int64_t first, int64_t held, float* stats) {
  if (N <= 0 || V <= 0) return;
  const int threads = held >= 8192 ? 512 : threads_for_row(std::max<int64_t>(held, 1));
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>(N, 1 << 30));
  cross_entropy_stats_kernel<<<grid, threads, 0, s>>>(logits, labels, N, V, first, held, stats);
  check_launch("cross_entropy_stats");
}

void cross_entropy_from_stats(cudaStream_t s, float* logits, Out grad, const int32_t* labels,
                              int64_t N, int64_t V, int64_t first, int64_t held, const float* stats,
                              int64_t slots, bool write_grad, GradScale grad_scale,
                              double* loss_sum) {
  if (N <= 0 || V <= 0) return;
  const int threads = V >= 8192 ? 512 : threads_for_row(V);
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>(N, 1 << 30));
  void* out = grad.data ? grad.data : logits;
  with_elements(grad.bf16, [&](auto g) {
    using G = decltype(g);
    cross_entropy_from_stats_kernel<<<grid, threads, 0, s>>>(logits, static_cast<G*>(out), labels,
                                                             N, V, first, held, stats, slots,
                                                             write_grad, grad_scale, loss_sum);
  });
  check_launch("cross_entropy_from_stats");
}

}  // namespace brisk::cuda
