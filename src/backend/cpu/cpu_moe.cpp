// Mixture of experts on the CPU: the routing of each token (moe_route.h), rows in parallel; the
// dispatch of the routed pairs into rows grouped by expert, one pass in order; the gather into
// those rows and the weighted combine out of them (and its backward), tokens or rows in parallel.
#include <cstring>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/moe_route.h"

namespace brisk {

namespace {
// Throws unless t is float32 [N, E] (`what` names it).
void check_rows(const Tensor& t, int64_t N, int64_t E, const char* op, const char* what) {
  BRISK_CHECK(t.dtype() == DType::f32 && t.numel() == N * E, op, ": ", what, " ", t.shape().str(),
              " ", dtype_name(t.dtype()), " is not float32 [", N, ", ", E, "]");
}

// Pair i's row: positions[i], or i itself where there are none.
inline int64_t row_of(const int32_t* pos, int64_t i) {
  return pos ? pos[i] : i;
}

// Throws unless every position is a row of `rows` routed rows (none: each pair's own row).
void check_positions(const int32_t* pos, int64_t n, int64_t rows, const char* op) {
  for (int64_t i = 0; pos != nullptr && i < n; ++i)
    BRISK_CHECK(pos[i] >= 0 && pos[i] < rows, op, ": position ", pos[i], " is not one of ", rows,
                " routed rows");
}
}  // namespace

// (Shapes as plain variables, not structured bindings: clang 14's OpenMP regions cannot capture
// those.)
void CpuBackend::moe_route_forward(const Tensor& logits, bool normalize, const Tensor& probs,
                                   const Tensor& weights, const Tensor& experts) {
  const std::pair<int64_t, int64_t> shape =
      check_moe_route(probs, weights, experts, "moe_route_forward");
  const int64_t E = shape.first, k = shape.second;
  const int64_t N = probs.dim(0);
  check_rows(logits, N, E, "moe_route_forward", "logits");
  const float* z = logits.f32();
  float *p = probs.f32(), *w = weights.f32();
  int32_t* x = experts.i32();
#pragma omp parallel for schedule(static) if (N * E > 16384)
  for (int64_t n = 0; n < N; ++n)
    moe_route_row(z + n * E, static_cast<int>(E), static_cast<int>(k), normalize, p + n * E,
                  w + n * k, x + n * k);
}

void CpuBackend::moe_route_backward(const Tensor& probs, const Tensor& weights,
                                    const Tensor& experts, const Tensor& dweights,
                                    const Tensor& dprobs, bool normalize, const Tensor& dlogits) {
  const std::pair<int64_t, int64_t> shape =
      check_moe_route(probs, weights, experts, "moe_route_backward");
  const int64_t E = shape.first, k = shape.second;
  const int64_t N = probs.dim(0);
  check_rows(dweights, N, k, "moe_route_backward", "dweights");
  check_rows(dlogits, N, E, "moe_route_backward", "dlogits");
  if (!dprobs.empty()) check_rows(dprobs, N, E, "moe_route_backward", "dprobs");
  const int32_t* x = experts.i32();
  for (int64_t i = 0; i < N * k; ++i)
    BRISK_CHECK(x[i] >= 0 && x[i] < E, "moe_route_backward: expert ", x[i], " of ", E);
  const float *p = probs.f32(), *w = weights.f32(), *dw = dweights.f32();
  const float* dp = dprobs.empty() ? nullptr : dprobs.f32();
  float* dz = dlogits.f32();
#pragma omp parallel for schedule(static) if (N * E > 16384)
  for (int64_t n = 0; n < N; ++n)
    moe_route_row_backward(p + n * E, w + n * k, x + n * k, dw + n * k, dp ? dp + n * E : nullptr,
                           static_cast<int>(E), static_cast<int>(k), normalize, dz + n * E);
}

void CpuBackend::moe_dispatch(const Tensor& experts, int64_t num_experts, const Tensor& counts,
                              const Tensor& positions) {
  const int64_t pairs = check_moe_dispatch(experts, num_experts, counts, positions);
  const int32_t* x = experts.i32();
  int32_t *count = counts.i32(), *pos = positions.i32();
  std::vector<int32_t> next(num_experts, 0);
  for (int64_t i = 0; i < pairs; ++i) {
    // The router picks no expert (-1) only where its probabilities are NaN.
    BRISK_CHECK(x[i] >= 0,
                "the router's probabilities are NaN (the activations reaching it "
                "are not finite): the run diverged; try a lower learning_rate");
    BRISK_CHECK(x[i] < num_experts, "moe_dispatch: expert ", x[i], " of ", num_experts);
    ++next[x[i]];
  }
  int32_t offset = 0;
  for (int64_t e = 0; e < num_experts; ++e) {
    count[e] = next[e];
    next[e] = offset;
    offset += count[e];
  }
  for (int64_t i = 0; i < pairs; ++i) pos[i] = next[x[i]]++;
}

void CpuBackend::moe_gather(const Tensor& x, const Tensor& positions, const Tensor& rows) {
  const auto shape = check_moe_gather(x, positions, rows);
  const int64_t N = shape.N, k = shape.k, C = shape.C;
  const int32_t* pos = positions.i32();
  check_positions(pos, N * k, N * k, "moe_gather");
  const float* in = x.f32();
  float* out = rows.f32();
#pragma omp parallel for schedule(static) if (N * k * C > 65536)
  for (int64_t i = 0; i < N * k; ++i)
    std::memcpy(out + pos[i] * C, in + (i / k) * C, C * sizeof(float));
}

void CpuBackend::moe_combine(const Tensor& rows, const Tensor& positions, const Tensor& weights,
                             const Tensor& y, bool accumulate) {
  const auto shape = check_moe_rows(positions, rows, y, weights, "moe_combine");
  const int64_t N = shape.N, k = shape.k, C = shape.C;
  const int32_t* pos = positions.empty() ? nullptr : positions.i32();
  check_positions(pos, N * k, N * k, "moe_combine");
  const float* r = rows.f32();
  const float* w = weights.empty() ? nullptr : weights.f32();
  float* out = y.f32();
#pragma omp parallel for schedule(static) if (N * k * C > 65536)
  for (int64_t n = 0; n < N; ++n) {
    float* yn = out + n * C;
    if (!accumulate) std::fill(yn, yn + C, 0.0f);
    for (int64_t j = 0; j < k; ++j) {
      const float* rj = r + row_of(pos, n * k + j) * C;
      const float wj = w ? w[n * k + j] : 1.0f;
      for (int64_t c = 0; c < C; ++c) yn[c] += wj * rj[c];
    }
  }
}

void CpuBackend::moe_combine_backward(const Tensor& dy, const Tensor& rows, const Tensor& positions,
                                      const Tensor& weights, const Tensor& drows,
                                      const Tensor& dweights) {
  const auto shape = check_moe_combine_backward(dy, rows, positions, weights, drows, dweights);
  const int64_t N = shape.N, k = shape.k, C = shape.C;
  const int32_t* pos = positions.empty() ? nullptr : positions.i32();
  check_positions(pos, N * k, N * k, "moe_combine_backward");
  const float *g = dy.f32(), *r = rows.f32(), *w = weights.f32();
  float *dr = drows.f32(), *dw = dweights.f32();
#pragma omp parallel for schedule(static) if (N * k * C > 65536)
  for (int64_t i = 0; i < N * k; ++i) {
    const float* gn = g + (i / k) * C;
    const float* ri = r + row_of(pos, i) * C;
    float* dri = dr + row_of(pos, i) * C;
    float dot = 0.0f;
    for (int64_t c = 0; c < C; ++c) {
      dri[c] = w[i] * gn[c];
      dot += gn[c] * ri[c];
    }
    dw[i] = dot;
  }
}

void CpuBackend::moe_balance_stats(const Tensor& probs, const Tensor& experts, const Tensor& mask,
                                   const Tensor& stats) {
  const auto shape = check_moe_balance_stats(probs, experts, mask, stats);
  const int64_t N = shape.N, E = shape.E, k = shape.k;
  const float* p = probs.f32();
  const int32_t* x = experts.i32();
  const int32_t* m = mask.empty() ? nullptr : mask.i32();
  float *count = stats.f32(), *sum = stats.f32() + E;
  std::fill(count, count + 2 * E, 0.0f);
  for (int64_t n = 0; n < N; ++n) {
    if (m && m[n] == 0) continue;
    for (int64_t j = 0; j < k; ++j) {
      BRISK_CHECK(x[n * k + j] >= 0 && x[n * k + j] < E, "moe_balance_stats: expert ", x[n * k + j],
                  " of ", E);
      count[x[n * k + j]] += 1.0f;
    }
    for (int64_t e = 0; e < E; ++e) sum[e] += p[n * E + e];
  }
}

void CpuBackend::moe_balance_backward(const Tensor& mask, const Tensor& scale,
                                      const Tensor& dprobs) {
  const MoeBalance b = check_moe_balance_backward(mask, scale, dprobs);
  const int64_t N = b.N, E = b.E;
  const int32_t* m = mask.empty() ? nullptr : mask.i32();
  const float* s = scale.f32();
  float* d = dprobs.f32();
  for (int64_t n = 0; n < N; ++n)
    for (int64_t e = 0; e < E; ++e) d[n * E + e] = (m && m[n] == 0) ? 0.0f : s[e];
}

void CpuBackend::moe_z_stats(const Tensor& logits, const Tensor& mask, const Tensor& z,
                             const Tensor& sum) {
  const MoeBalance b = check_moe_z(logits, mask, z, sum, false);
  const int32_t* m = mask.empty() ? nullptr : mask.i32();
  float total = 0.0f;
  for (int64_t n = 0; n < b.N; ++n) {
    const bool kept = !m || m[n] != 0;
    const float lse = kept ? moe_logsumexp(logits.f32() + n * b.E, static_cast<int>(b.E)) : 0.0f;
    z.f32()[n] = lse;
    total += lse * lse;
  }
  sum.f32()[0] = total;
}

void CpuBackend::moe_z_backward(const Tensor& probs, const Tensor& z, float scale,
                                const Tensor& dlogits) {
  const MoeBalance b = check_moe_z(probs, Tensor(), z, dlogits, true);
  for (int64_t n = 0; n < b.N; ++n) {
    const float g = 2.0f * scale * z.f32()[n];
    for (int64_t e = 0; e < b.E; ++e) dlogits.f32()[n * b.E + e] += g * probs.f32()[n * b.E + e];
  }
}

}  // namespace brisk
