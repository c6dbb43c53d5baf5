// Fused softmax + cross-entropy on the CPU: the loss of each row and, in place of the logits,
// their gradient; probabilities are never stored.
#include <algorithm>
#include <cmath>

#include "backend/cpu/cpu_avx512.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_exp.h"
#include "backend/cpu/cpu_sum.h"

namespace brisk {

namespace {
// out[j] = e^(in[j] - mx) for j < n (in place where out is in); returns their sum.
float exponentials(const float* in, int64_t n, float mx, float* out) {
#ifdef BRISK_PACK_AVX512
  // in * 1 - mx in one fused step: the same rounding as the subtraction.
  return avx512::exp_sum(in, n, 1.0f, mx, out,
                         [n](int64_t j) { return avx512::lanes_before(j, n); });
#else
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) out[j] = vector_expf(in[j] - mx);
  float part = 0.0f;
#pragma omp simd reduction(+ : part)
  for (int64_t j = 0; j < n; ++j) part += out[j];
  return part;
#endif
}

// out[j] = in[j] * f rounded to bf16, for j < n.
void scaled_to_bf16(const float* in, int64_t n, float f, uint16_t* out) {
  int64_t j = 0;
#ifdef BRISK_PACK_AVX512
  const __m512 vf = _mm512_set1_ps(f);
  for (; j + 16 <= n; j += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + j),
                        avx512::round16_packed(_mm512_mul_ps(_mm512_loadu_ps(in + j), vf)));
#endif
#pragma omp simd
  for (int64_t i = j; i < n; ++i) out[i] = float_to_bf16(in[i] * f);
}
// A row's maximum over its n values (exact in any order; a NaN reaches the sum whichever maximum
// it leaves) and the sum of e^(z - maximum), in float per chunk and double across chunks; the
// exponentials are written over the row where `in_place`. A row of -inf only sums to 0.
struct RowExponentials {
  float max;
  double sum;
};
RowExponentials row_exponentials(float* row, int64_t n, bool in_place) {
  float mx = row[0];
#pragma omp simd reduction(max : mx)
  for (int64_t j = 1; j < n; ++j) mx = mx > row[j] ? mx : row[j];
  constexpr int64_t kChunk = 512;
  float chunk[kChunk];
  double sum = 0.0;
  for (int64_t j0 = 0; j0 < n && mx != -INFINITY; j0 += kChunk)
    sum += exponentials(row + j0, std::min(kChunk, n - j0), mx, in_place ? row + j0 : chunk);
  return {mx, sum};
}

// Throws unless every label is kIgnoreIndex or lies in [0, V).
void check_labels(const Tensor& labels, int64_t V) {
  const int32_t* y = labels.i32();
  for (int64_t r = 0; r < labels.numel(); ++r)
    BRISK_CHECK(y[r] == kIgnoreIndex || (y[r] >= 0 && y[r] < V), "label ", y[r], " at row ", r,
                " is outside [0, ", V, ")");
}

// The gradient's row r of V columns zeroed where it is written: bf16 apart, or float32.
void clear_gradient_row(uint16_t* g16_rows, float* g32, int64_t r, int64_t V) {
  if (g16_rows != nullptr)
    std::fill(g16_rows + r * V, g16_rows + (r + 1) * V, uint16_t{0});
  else if (g32 != nullptr)
    std::fill(g32 + r * V, g32 + (r + 1) * V, 0.0f);
}
}  // namespace

void CpuBackend::softmax_cross_entropy(const Tensor& logits, const Tensor& labels, bool write_grad,
                                       const GradScale& scale, const Tensor& loss_sum,
                                       const Tensor& grad) {
  const float grad_scale = applied(scale);
  expect(loss_sum, DType::f64, Shape{1}, "softmax_cross_entropy loss_sum");
  const int64_t V = cols_of(logits), N = rows_of(logits);
  BRISK_CHECK(labels.numel() == N, "softmax_cross_entropy: ", labels.numel(), " labels for ", N,
              " rows of logits");
  const bool apart = check_loss_grad(logits, write_grad, grad);
  // The gradient's row r: in place, or apart in float32 or bf16.
  const bool g16 = apart && grad.dtype() == DType::bf16;
  float* g32 = !write_grad ? nullptr : apart && !g16 ? grad.f32() : logits.f32();
  uint16_t* g16_rows = g16 ? grad.as<uint16_t>() : nullptr;
  check_labels(labels, V);
  const int32_t* y = labels.i32();
  float* z = logits.f32();
  // Row r's loss; its gradient written as it goes.
  auto row_loss = [&](int64_t r) -> double {
    float* row = z + r * V;
    if (y[r] == kIgnoreIndex) {
      clear_gradient_row(g16_rows, g32, r, V);
      return 0.0;
    }
    const float target = row[y[r]];
    // exp in place (training: the row becomes its gradient) or into a chunk buffer.
    const auto [mx, sum] = row_exponentials(row, V, write_grad);
    const double loss = std::log(sum) - static_cast<double>(target - mx);
    if (write_grad) {
      // row holds the exponentials: scaled, less grad_scale at the label, and (bf16) rounded.
      const float f = static_cast<float>(grad_scale / sum);
      const int64_t label = y[r];
      if (g16) {
        uint16_t* out = g16_rows + r * V;
        scaled_to_bf16(row, V, f, out);
        out[label] = float_to_bf16(row[label] * f - grad_scale);
      } else {
        float* out = g32 + r * V;
#pragma omp simd
        for (int64_t j = 0; j < V; ++j) out[j] = row[j] * f;
        out[label] -= grad_scale;
      }
    }
    return loss;
  };
  loss_sum.as<double>()[0] += ordered_sum(N, 1, true, [&](int64_t begin, int64_t end) {
    double part = 0.0;
    for (int64_t r = begin; r < end; ++r) part += row_loss(r);
    return part;
  });
}

void CpuBackend::cross_entropy_stats(const Tensor& logits, const Tensor& labels,
                                     const VocabShard& shard, const Tensor& stats) {
  const int64_t held =
      check_cross_entropy_shard(logits, labels, shard, stats, 1, "cross_entropy_stats");
  check_labels(labels, shard.vocab == 0 ? held : shard.vocab);
  const int64_t V = cols_of(logits), N = rows_of(logits);
  const int32_t* y = labels.i32();
  float* z = logits.f32();
  float* out = stats.f32();
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < N; ++r) {
    float* row = z + r * V;
    float* st = out + r * 3;
    if (y[r] == kIgnoreIndex || held == 0) {
      st[0] = st[1] = st[2] = 0.0f;
      continue;
    }
    const auto [mx, sum] = row_exponentials(row, held, false);
    const int64_t label = y[r] - shard.first;
    st[0] = mx;
    st[1] = static_cast<float>(sum);
    st[2] = label >= 0 && label < held ? row[label] : 0.0f;
  }
}

void CpuBackend::cross_entropy_from_stats(const Tensor& logits, const Tensor& labels,
                                          const VocabShard& shard, const Tensor& stats,
                                          bool write_grad, const GradScale& scale,
                                          const Tensor& loss_sum, const Tensor& grad) {
  const float grad_scale = applied(scale);
  expect(loss_sum, DType::f64, Shape{1}, "cross_entropy_from_stats loss_sum");
  const int64_t slots = stats.rank() == 3 ? stats.dim(0) : 0;
  const int64_t held =
      check_cross_entropy_shard(logits, labels, shard, stats, slots, "cross_entropy_from_stats");
  check_labels(labels, shard.vocab == 0 ? held : shard.vocab);
  const bool apart = check_loss_grad(logits, write_grad, grad);
  const bool g16 = apart && grad.dtype() == DType::bf16;
  const int64_t V = cols_of(logits), N = rows_of(logits);
  float* g32 = !write_grad ? nullptr : apart && !g16 ? grad.f32() : logits.f32();
  uint16_t* g16_rows = g16 ? grad.as<uint16_t>() : nullptr;
  const int32_t* y = labels.i32();
  const float* st = stats.f32();
  // Row r's loss from every shard's statistics; its gradient on these columns written.
  auto row_loss = [&](int64_t r) -> double {
    float* row = logits.f32() + r * V;
    const int64_t label = y[r] - shard.first;
    const bool owned = label >= 0 && label < held;
    if (y[r] == kIgnoreIndex) {
      clear_gradient_row(g16_rows, g32, r, V);
      return 0.0;
    }
    float mx = st[r * 3];
    for (int64_t k = 1; k < slots; ++k) mx = std::max(mx, st[(k * N + r) * 3]);
    double sum = 0.0, target = 0.0;
    for (int64_t k = 0; k < slots; ++k) {
      const float* s = st + (k * N + r) * 3;
      sum += static_cast<double>(s[1]) * std::exp(static_cast<double>(s[0]) - mx);
      target += s[2];
    }
    if (write_grad) {
      const float f = static_cast<float>(grad_scale / sum);
      if (held > 0) exponentials(row, held, mx, row);
      if (g16) {
        uint16_t* out = g16_rows + r * V;
        scaled_to_bf16(row, held, f, out);
        std::fill(out + held, out + V, uint16_t{0});
        if (owned) out[label] = float_to_bf16(row[label] * f - grad_scale);
      } else {
        float* out = g32 + r * V;
#pragma omp simd
        for (int64_t j = 0; j < held; ++j) out[j] = row[j] * f;
        std::fill(out + held, out + V, 0.0f);
        if (owned) out[label] -= grad_scale;
      }
    }
    return std::log(sum) - (target - static_cast<double>(mx));
  };
  loss_sum.as<double>()[0] += ordered_sum(N, 1, true, [&](int64_t begin, int64_t end) {
    double part = 0.0;
    for (int64_t r = begin; r < end; ++r) part += row_loss(r);
    return part;
  });
}

void CpuBackend::mse_loss(const Tensor& predictions, const Tensor& targets, bool write_grad,
                          const GradScale& scale, const Tensor& loss_sum) {
  const float grad_scale = applied(scale);
  expect(loss_sum, DType::f64, Shape{1}, "mse_loss loss_sum");
  const int64_t N = targets.numel();
  BRISK_CHECK(targets.dtype() == DType::f32 && predictions.dtype() == DType::f32 &&
                  predictions.numel() == N,
              "mse_loss: ", predictions.numel(), " float32 predictions for ", N,
              " float32 targets");
  float* p = predictions.f32();
  const float* y = targets.f32();
  double total = 0.0;
  for (int64_t r = 0; r < N; ++r) {
    if (std::isnan(y[r])) {
      if (write_grad) p[r] = 0.0f;
      continue;
    }
    const double d = static_cast<double>(p[r]) - y[r];
    total += d * d;
    if (write_grad) p[r] = static_cast<float>(2.0 * d * grad_scale);
  }
  loss_sum.as<double>()[0] += total;
}

}  // namespace brisk
