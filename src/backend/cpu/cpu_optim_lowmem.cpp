// SGD, Adafactor and 8-bit AdamW on the CPU, and stochastic rounding of bf16 weights.
#include <algorithm>
#include <cmath>
#include <limits>

#include "backend/cpu/cpu_avx512.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_sum.h"
#include "core/quantization.h"
#include "core/step_control.h"

namespace brisk {

namespace {
constexpr int64_t kRun = 1024;  // Adafactor's updates go through a stack buffer this long
constexpr float kInfinity = std::numeric_limits<float>::infinity();

void check_flat(const Tensor& t, int64_t n, const char* op, const char* what) {
  BRISK_CHECK(t.dtype() == DType::f32 && t.numel() == n, op, ": ", what, " must be float32 [", n,
              "], got ", dtype_name(t.dtype()), " ", t.shape().str());
}

#ifdef BRISK_PACK_AVX512
// (GCC 12 reports the gathers' "undefined" starting vectors as -Wuninitialized, the false alarm
// cpu_avx512.h describes.)
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
// quantize_nearest's binary search run on 16 lanes at once. Its first five halving steps probe
// codes that are multiples of 4 (16 t for steps 128-16, 16 t + 8, 8 t + 4), read from registers
// holding those map values; the last two gather from the map. One value at a time, the
// search's dependent loads and mispredicted branches made 8-bit AdamW's step several times slower
// than AdamW's.
struct QuantizeTables {
  __m512 sixteenths, eights, fours_low, fours_high;
  explicit QuantizeTables(const float* map) {
    const __m512i k = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i by16 = _mm512_slli_epi32(k, 4), by8 = _mm512_slli_epi32(k, 3);
    sixteenths = _mm512_i32gather_ps(by16, map, 4);  // map[16 t]
    eights = _mm512_i32gather_ps(_mm512_add_epi32(by16, _mm512_set1_epi32(8)), map, 4);
    fours_low = _mm512_i32gather_ps(_mm512_add_epi32(by8, _mm512_set1_epi32(4)), map, 4);
    fours_high = _mm512_i32gather_ps(_mm512_add_epi32(by8, _mm512_set1_epi32(132)), map, 4);
  }
};

inline __m128i quantize16(const float* map, const QuantizeTables& t, __m512 x) {
  // The search keeps map[lo] <= x < map[hi], hi - lo halving from 256 to 1, and the two values
  // as it goes: each probe's value becomes `below` where taken, `above` where not.
  __m512i lo = _mm512_setzero_si512();
  __m512 below = _mm512_set1_ps(map[0]), above = _mm512_set1_ps(kInfinity);
  auto take = [&](__m512i probe, __m512 value) {
    const __mmask16 le = _mm512_cmp_ps_mask(value, x, _CMP_LE_OQ);
    lo = _mm512_mask_mov_epi32(lo, le, probe);
    below = _mm512_mask_mov_ps(below, le, value);
    above = _mm512_mask_mov_ps(value, le, above);
  };
  for (int step = 128; step >= 16; step /= 2) {
    const __m512i probe = _mm512_add_epi32(lo, _mm512_set1_epi32(step));
    take(probe, _mm512_permutexvar_ps(_mm512_srli_epi32(probe, 4), t.sixteenths));
  }
  __m512i probe = _mm512_add_epi32(lo, _mm512_set1_epi32(8));
  take(probe, _mm512_permutexvar_ps(_mm512_srli_epi32(probe, 4), t.eights));
  probe = _mm512_add_epi32(lo, _mm512_set1_epi32(4));
  take(probe, _mm512_permutex2var_ps(t.fours_low, _mm512_srli_epi32(probe, 3), t.fours_high));
  for (int step = 2; step >= 1; step /= 2) {
    probe = _mm512_add_epi32(lo, _mm512_set1_epi32(step));
    take(probe, _mm512_i32gather_ps(probe, map, 4));
  }
  // lo is now the last code with map[lo] <= x where map[0] < x < map[255], below = map[lo] and
  // above = map[lo + 1]; the lanes outside that range take their code below.
  const __mmask16 nearer_below =
      _mm512_cmp_ps_mask(_mm512_sub_ps(x, below), _mm512_sub_ps(above, x), _CMP_LE_OQ);
  __m512i code =
      _mm512_mask_mov_epi32(_mm512_add_epi32(lo, _mm512_set1_epi32(1)), nearer_below, lo);
  code = _mm512_mask_mov_epi32(code, _mm512_cmp_ps_mask(x, _mm512_set1_ps(map[255]), _CMP_GE_OQ),
                               _mm512_set1_epi32(255));
  code = _mm512_maskz_mov_epi32(_mm512_cmp_ps_mask(x, _mm512_set1_ps(map[0]), _CMP_GT_OQ), code);
  return _mm512_cvtepi32_epi8(code);
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif
}  // namespace

void quantize_row(const float* map, const float* x, float scale, int64_t n, uint8_t* codes) {
  int64_t j = 0;
#ifdef BRISK_PACK_AVX512
  const QuantizeTables tables(map);
  const __m512 s = _mm512_set1_ps(scale);
  for (; j + 16 <= n; j += 16)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + j),
                     quantize16(map, tables, _mm512_mul_ps(_mm512_loadu_ps(x + j), s)));
#endif
  for (; j < n; ++j) codes[j] = quantize_nearest(map, x[j] * scale);
}

void CpuBackend::sgd_update(const SgdUpdate& u) {
  const int64_t n = u.weights.numel();
  check_flat(u.weights, n, "sgd_update", "weights");
  check_flat(u.grads, n, "sgd_update", "gradients");
  const bool momentum = !u.momentum_buffer.empty();
  if (momentum) check_flat(u.momentum_buffer, n, "sgd_update", "the momentum buffer");
  float multiplier = 0;
  if (!read_step_control(u.control, "sgd_update control", &multiplier)) return;
  float* __restrict w = u.weights.f32();
  const float* __restrict g = u.grads.f32();
  float* __restrict buf = momentum ? u.momentum_buffer.f32() : nullptr;
  const float lr = u.lr, mu = u.momentum, keep = 1.0f - u.dampening;
  const bool first = u.first_step, nesterov = u.nesterov;
  for_each_decay_range(u.decay_ranges, n, [&](int64_t begin, int64_t end, bool decayed) {
    const float wd = decayed ? u.weight_decay : 0.0f;
#pragma omp parallel for simd schedule(static) if (end - begin > 32768)
    for (int64_t i = begin; i < end; ++i) {
      float d = g[i] * multiplier + wd * w[i];
      if (buf) {
        const float b = first ? d : mu * buf[i] + keep * d;
        buf[i] = b;
        d = nesterov ? d + mu * b : b;
      }
      w[i] -= lr * d;
    }
  });
}

namespace {
// The step size for a slot of weights w (len of them): u.step_size, times the parameter's RMS
// before this update (at least eps2) where u.scale_parameter.
double adafactor_step(const AdafactorUpdate& u, const float* __restrict w, int64_t len, bool par) {
  double step = u.step_size;
  if (u.scale_parameter) {  // the parameter's RMS before this update
    const double sq = ordered_sum(len, 4096, par, [w](int64_t begin, int64_t end) {
      return sum_of_squares(w + begin, end - begin);
    });
    step *= std::max(static_cast<double>(u.eps2), std::sqrt(sq / static_cast<double>(len)));
  }
  return step;
}

// The factored second moment's update from gradients g [R, C] (times multiplier): row means into
// v[0, R), column means into v[R, R + C); returns the mean of the new row values.
double factored_moment(const float* __restrict g, float* __restrict v, int64_t R, int64_t C,
                       float multiplier, float b2, float eps1, bool par) {
  float* __restrict row = v;
  float* __restrict col = v + R;
#pragma omp parallel for schedule(static) if (par)
  for (int64_t r = 0; r < R; ++r) {
    double acc = 0;
    const float* __restrict gr = g + r * C;
#pragma omp simd reduction(+ : acc)
    for (int64_t c = 0; c < C; ++c) {
      const float gi = gr[c] * multiplier;
      acc += static_cast<double>(gi * gi + eps1);
    }
    row[r] = b2 * row[r] + (1.0f - b2) * static_cast<float>(acc / C);
  }
  constexpr int64_t kCols = 64;
#pragma omp parallel for schedule(static) if (par)
  for (int64_t c0 = 0; c0 < C; c0 += kCols) {
    const int64_t c1 = std::min(C, c0 + kCols);
    double acc[kCols] = {};
    for (int64_t r = 0; r < R; ++r)
      for (int64_t c = c0; c < c1; ++c) {
        const float gi = g[r * C + c] * multiplier;
        acc[c - c0] += static_cast<double>(gi * gi + eps1);
      }
    for (int64_t c = c0; c < c1; ++c)
      col[c] = b2 * col[c] + (1.0f - b2) * static_cast<float>(acc[c - c0] / R);
  }
  double sum = 0;
  for (int64_t r = 0; r < R; ++r) sum += row[r];
  return sum / static_cast<double>(R);
}

// The update before clipping and scaling, g * scale(i) for a per-element factor: of elements
// [begin, end) (at most kRun) into out, row by row where the moment is factored, so that the
// loops vectorize (one element at a time, with a division for its row and column, they made
// Adafactor's step several times slower than AdamW's).
struct RawUpdate {
  const float* g;
  const float* v;  // the second moment: full, or R row values then C column values
  int64_t R, C;
  float multiplier, rm;  // rm: the row values' mean
  bool factored;
  void operator()(int64_t begin, int64_t end, float* __restrict out) const {
    const float* __restrict g = this->g;
    const float* __restrict v = this->v;
    if (!factored) {
#pragma omp simd
      for (int64_t i = begin; i < end; ++i) out[i - begin] = g[i] * multiplier / std::sqrt(v[i]);
      return;
    }
    for (int64_t i = begin; i < end;) {
      const int64_t r = i / C, count = std::min(end, (r + 1) * C) - i;
      const float row_factor = std::sqrt(v[r] / rm);
      const float* __restrict gi = g + i;
      const float* __restrict col = v + R + (i - r * C);  // the columns of elements i, i + 1, ...
      float* __restrict o = out + (i - begin);
#pragma omp simd
      for (int64_t k = 0; k < count; ++k)
        o[k] = gi[k] * multiplier / row_factor / std::sqrt(col[k]);
      i += count;
    }
  }
};

// The sum of squares of the raw updates of len elements.
double raw_sum_of_squares(const RawUpdate& raw, int64_t len, bool par) {
  return ordered_sum(len, 4096, par, [&raw](int64_t begin, int64_t end) {
    double part = 0;
    float x[kRun];
    for (int64_t i = begin; i < end; i += kRun) {
      const int64_t n = std::min(kRun, end - i);
      raw(i, i + n, x);
      part += sum_of_squares(x, n);
    }
    return part;
  });
}

// w -= decay * w + the scaled raw update (through the first moment m with b1, where m is not
// null), kRun elements at a time.
void apply_adafactor(const RawUpdate& raw, float* __restrict w, float* __restrict m, int64_t len,
                     bool par, float scale, float decay, float b1) {
#pragma omp parallel for schedule(static) if (par)
  for (int64_t i = 0; i < len; i += kRun) {
    const int64_t n = std::min(kRun, len - i);
    float x[kRun];
    raw(i, i + n, x);
    // Scaled in a pass of its own, so that the product is rounded before it is used, as
    // transformers' Adafactor rounds it (the compiler would fuse it into the subtraction).
#pragma omp simd
    for (int64_t k = 0; k < n; ++k) x[k] *= scale;
    float* __restrict wi = w + i;
    float* __restrict mi = m ? m + i : nullptr;
    if (mi) {
#pragma omp simd
      for (int64_t k = 0; k < n; ++k) {
        mi[k] = b1 * mi[k] + (1.0f - b1) * x[k];
        wi[k] = (wi[k] - decay * wi[k]) - mi[k];
      }
    } else {
#pragma omp simd
      for (int64_t k = 0; k < n; ++k) wi[k] = (wi[k] - decay * wi[k]) - x[k];
    }
  }
}

// One slot's Adafactor step (gradients times multiplier): second moment, clipped and scaled
// update, weight decay.
void adafactor_slot(const AdafactorUpdate& u, const ParamSlot& s, float multiplier) {
  const int64_t R = s.rows, C = s.cols, len = s.numel;
  const float b2 = u.beta2t, eps1 = u.eps1;
  float* __restrict w = u.weights.f32() + s.offset;
  const float* __restrict g = u.grads.f32() + s.offset;
  float* __restrict v = u.second_moment.f32() + s.state;
  float* __restrict m = !u.exp_avg.empty() ? u.exp_avg.f32() + s.offset : nullptr;
  const bool par = len > 32768;
  const double step = adafactor_step(u, w, len, par);
  double row_mean = 1;
  if (s.factored) {
    row_mean = factored_moment(g, v, R, C, multiplier, b2, eps1, par);
  } else {
#pragma omp parallel for simd schedule(static) if (par)
    for (int64_t i = 0; i < len; ++i) {
      const float gi = g[i] * multiplier;
      v[i] = b2 * v[i] + (1.0f - b2) * (gi * gi + eps1);
    }
  }
  const RawUpdate raw{g, v, R, C, multiplier, static_cast<float>(row_mean), s.factored};
  const double update_sq = raw_sum_of_squares(raw, len, par);
  const double rms = std::sqrt(update_sq / static_cast<double>(len));
  const float scale = static_cast<float>(step / std::max(1.0, rms / u.clip_threshold));
  const float decay = s.decay ? static_cast<float>(u.weight_decay * step) : 0.0f;
  apply_adafactor(raw, w, m, len, par, scale, decay, u.beta1);
}

// Tensor parallelism's shares (AdafactorUpdate::split, AdamW8bitUpdate::split). Throws naming
// `op` unless x maps every row and column of slot s.
void check_share(const ParamSlot& s, const SplitSlot& x, const char* op) {
  BRISK_CHECK(x.row.size() == static_cast<size_t>(s.rows) &&
                  x.col.size() == static_cast<size_t>(s.cols) && x.whole_rows >= 0 &&
                  x.whole_cols >= 0,
              op, ": a split slot's rows and columns are not its slot's");
}

// The elements of share x of slot s that have a place in the whole parameter, as f(local
// element, whole row, whole column).
template <typename F>
void for_each_placed(const ParamSlot& s, const SplitSlot& x, F f) {
  for (int64_t r = 0; r < s.rows; ++r) {
    const int64_t wr = x.row[static_cast<size_t>(r)];
    if (wr < 0) continue;
    for (int64_t c = 0; c < s.cols; ++c) {
      const int64_t wc = x.col[static_cast<size_t>(c)];
      if (wc >= 0) f(r * s.cols + c, wr, wc);
    }
  }
}

// The share's partial sums: of g^2 + eps1 by whole row and column (factored) or element, and of
// the weights' squares.
void split_gradient_sums(const AdafactorUpdate& u, const ParamSlot& s, const SplitSlot& x,
                         float multiplier, double* sums) {
  const float* g = u.grads.f32() + s.offset;
  const float* w = u.weights.f32() + s.offset;
  const int64_t WR = x.whole_rows, WC = x.whole_cols;
  double* weight_sq = sums + (s.factored ? WR + WC : WR * WC);
  for_each_placed(s, x, [&](int64_t i, int64_t wr, int64_t wc) {
    const float gi = g[i] * multiplier;
    const float q = gi * gi + u.eps1;
    if (s.factored) {
      sums[wr] += q;
      sums[WR + wc] += q;
    } else {
      sums[wr * WC + wc] = q;
    }
    *weight_sq += static_cast<double>(w[i]) * w[i];
  });
}

// The whole second moment from the group's sums (alike on every rank).
void split_moment(const AdafactorUpdate& u, const ParamSlot& s, const SplitSlot& x,
                  const double* sums) {
  const float b2 = u.beta2t;
  float* v = u.second_moment.f32() + s.state;
  const int64_t WR = x.whole_rows, WC = x.whole_cols;
  if (!s.factored) {
    for (int64_t i = 0; i < WR * WC; ++i)
      v[i] = b2 * v[i] + (1.0f - b2) * static_cast<float>(sums[i]);
    return;
  }
  for (int64_t r = 0; r < WR; ++r)
    v[r] = b2 * v[r] + (1.0f - b2) * static_cast<float>(sums[r] / static_cast<double>(WC));
  for (int64_t c = 0; c < WC; ++c)
    v[WR + c] =
        b2 * v[WR + c] + (1.0f - b2) * static_cast<float>(sums[WR + c] / static_cast<double>(WR));
}

// The mean of a factored whole moment's row values (1 unfactored), as adafactor_slot takes it.
float split_row_mean(const ParamSlot& s, const SplitSlot& x, const float* v) {
  if (!s.factored) return 1.0f;
  double row_sum = 0;
  for (int64_t r = 0; r < x.whole_rows; ++r) row_sum += v[r];
  return static_cast<float>(row_sum / static_cast<double>(x.whole_rows));
}

// Element i's update before clipping and scaling (RawUpdate's arithmetic at whole places).
float split_raw(const ParamSlot& s, const SplitSlot& x, const float* v, const float* g, float rm,
                float multiplier, int64_t i, int64_t wr, int64_t wc) {
  if (!s.factored) return g[i] * multiplier / std::sqrt(v[wr * x.whole_cols + wc]);
  const float row_factor = std::sqrt(v[wr] / rm);
  return g[i] * multiplier / row_factor / std::sqrt(v[x.whole_rows + wc]);
}

// Share k's step from the group's sums (own: its moment's and weights' sums; update_sq: the
// update's squares): clipped, scaled and decayed as adafactor_slot steps a whole parameter.
void split_apply(const AdafactorUpdate& u, const SplitSlot& x, const double* own, double update_sq,
                 float multiplier) {
  const ParamSlot& s = (*u.slots)[x.slot];
  const int64_t len = s.factored ? x.whole_rows + x.whole_cols : x.whole_rows * x.whole_cols;
  const auto whole = static_cast<double>(x.whole_rows * x.whole_cols);
  double step = u.step_size;
  if (u.scale_parameter) step *= std::max(static_cast<double>(u.eps2), std::sqrt(own[len] / whole));
  const double rms = std::sqrt(update_sq / whole);
  const float scale = static_cast<float>(step / std::max(1.0, rms / u.clip_threshold));
  const float decay = s.decay ? static_cast<float>(u.weight_decay * step) : 0.0f;
  const float b1 = u.beta1;
  const float* v = u.second_moment.f32() + s.state;
  const float* g = u.grads.f32() + s.offset;
  const float row_mean = split_row_mean(s, x, v);
  float* w = u.weights.f32() + s.offset;
  float* m = !u.exp_avg.empty() ? u.exp_avg.f32() + s.offset : nullptr;
  for_each_placed(s, x, [&](int64_t i, int64_t wr, int64_t wc) {
    const float step_i = split_raw(s, x, v, g, row_mean, multiplier, i, wr, wc) * scale;
    if (m) {
      m[i] = b1 * m[i] + (1.0f - b1) * step_i;
      w[i] = (w[i] - decay * w[i]) - m[i];
    } else {
      w[i] = (w[i] - decay * w[i]) - step_i;
    }
  });
}

// Each share's partial sums of its gradient statistics and weights (after checking it against
// its slot and state), into sums.
void split_statistics(const AdafactorUpdate& u, float multiplier, double* sums, int64_t tail) {
  for (const SplitSlot& x : *u.split) {
    const ParamSlot& s = (*u.slots).at(x.slot);
    const int64_t len = s.factored ? x.whole_rows + x.whole_cols : x.whole_rows * x.whole_cols;
    check_share(s, x, "adafactor_update");
    BRISK_CHECK(
        x.sums_at >= 0 && x.sums_at + len + 1 <= tail && s.state + len <= u.second_moment.numel(),
        "adafactor_update: a split slot does not match its sums or state");
    if (x.counted) split_gradient_sums(u, s, x, multiplier, sums + x.sums_at);
  }
}

// Three phases, the group's sums between them: the statistics' partial sums; the whole moments
// and the update's squares; the step.
void adafactor_split_slots(const AdafactorUpdate& u, float multiplier) {
  const std::vector<SplitSlot>& split = *u.split;
  const auto n = static_cast<int64_t>(split.size());
  BRISK_CHECK(u.sums.dtype() == DType::f64 && u.sums.numel() >= n && u.group_sum,
              "adafactor_update: split slots need float64 sums and a group to add them over");
  double* sums = u.sums.as<double>();
  const int64_t tail = u.sums.numel() - n;  // the updates' sums of squares
  std::fill_n(sums, u.sums.numel(), 0.0);
  split_statistics(u, multiplier, sums, tail);
  u.group_sum(element_range(u.sums, 0, tail));
  for (size_t k = 0; k < split.size(); ++k) {
    const SplitSlot& x = split[k];
    const ParamSlot& s = (*u.slots)[x.slot];
    split_moment(u, s, x, sums + x.sums_at);
    if (!x.counted) continue;
    const float* v = u.second_moment.f32() + s.state;
    const float* g = u.grads.f32() + s.offset;
    const float row_mean = split_row_mean(s, x, v);
    double sq = 0;
    for_each_placed(s, x, [&](int64_t i, int64_t wr, int64_t wc) {
      const double r = split_raw(s, x, v, g, row_mean, multiplier, i, wr, wc);
      sq += r * r;
    });
    sums[tail + static_cast<int64_t>(k)] = sq;
  }
  u.group_sum(element_range(u.sums, tail, n));
  for (size_t k = 0; k < split.size(); ++k)
    split_apply(u, split[k], sums + split[k].sums_at, sums[tail + static_cast<int64_t>(k)],
                multiplier);
}
}  // namespace

void CpuBackend::adafactor_update(const AdafactorUpdate& u) {
  const int64_t n = u.weights.numel();
  check_flat(u.weights, n, "adafactor_update", "weights");
  check_flat(u.grads, n, "adafactor_update", "gradients");
  check_param_slots(u.slots, n, "adafactor_update");
  const bool first_moment = !u.exp_avg.empty();
  if (first_moment) check_flat(u.exp_avg, n, "adafactor_update", "exp_avg");
  BRISK_CHECK(u.second_moment.dtype() == DType::f32, "adafactor_update: float32 state expected");
  float multiplier = 0;
  if (!read_step_control(u.control, "adafactor_update control", &multiplier)) return;
  size_t shares = 0;
  for (const ParamSlot& s : *u.slots) {
    if (s.share) {
      ++shares;
      continue;
    }
    const int64_t state_len = s.factored ? s.rows + s.cols : s.numel;
    BRISK_CHECK(s.state >= 0 && s.state + state_len <= u.second_moment.numel(),
                "adafactor_update: a slot's state lies outside the state buffer");
    if (s.numel == 0) continue;
    adafactor_slot(u, s, multiplier);
  }
  BRISK_CHECK(shares == (u.split ? u.split->size() : 0), "adafactor_update: ", shares,
              " slots are shares, but ", u.split ? u.split->size() : 0,
              " split slots describe them");
  if (shares > 0) adafactor_split_slots(u, multiplier);
}

namespace {
// The quantization blocks of share x's whole parameter.
int64_t whole_blocks(const SplitSlot& x) {
  return (x.whole_rows * x.whole_cols + kQuantBlock - 1) / kQuantBlock;
}

// 8-bit AdamW on tensor parallelism's shares (AdamW8bitUpdate::split): the moments dequantized
// under the full parameter's blocks, the weights stepped and each block's new maxima taken over
// the group; then the new moments (computed again from the old codes) quantized under them.
void adamw_8bit_split_slots(const AdamW8bitUpdate& u, const AdamWStep& adam, float multiplier) {
  const std::vector<SplitSlot>& split = *u.split;
  BRISK_CHECK(u.maxima.dtype() == DType::f32 && u.maxima.numel() % 2 == 0 && u.group_max,
              "adamw_8bit_update: split slots need float32 maxima and a group to take them over");
  const int64_t half = u.maxima.numel() / 2;
  float* max1 = u.maxima.f32();
  float* max2 = max1 + half;
  std::fill_n(max1, u.maxima.numel(), 0.0f);
  const float* qs = u.qmap_signed.f32();
  const float* qu = u.qmap_unsigned.f32();
  // Element i's moments moved by its gradient; the weight too where w is not null.
  auto moments = [&](const ParamSlot& s, int64_t i, int64_t b, float* w, float& m, float& v) {
    m = qs[u.exp_avg8.as<uint8_t>()[s.state + i]] * u.absmax1.f32()[s.blocks + b];
    v = qu[u.exp_avg_sq8.as<uint8_t>()[s.state + i]] * u.absmax2.f32()[s.blocks + b];
    const float g = u.grads.f32()[s.offset + i] * multiplier;
    const float decay = s.decay ? 1.0f - u.lr * u.weight_decay : 1.0f;
    const float stepped = adam.update(w ? *w : 0.0f, g, decay, m, v);
    if (w) *w = stepped;
  };
  for (const SplitSlot& x : split) {
    const ParamSlot& s = (*u.slots).at(x.slot);
    const int64_t blocks = whole_blocks(x);
    check_share(s, x, "adamw_8bit_update");
    BRISK_CHECK(s.blocks >= 0 && s.blocks + blocks <= u.absmax1.numel() && x.sums_at >= 0 &&
                    x.sums_at + blocks <= half && s.state + s.numel <= u.exp_avg8.numel(),
                "adamw_8bit_update: a split slot does not match its state or maxima");
    for_each_placed(s, x, [&](int64_t i, int64_t wr, int64_t wc) {
      const int64_t b = (wr * x.whole_cols + wc) / kQuantBlock;
      float m = 0, v = 0;
      moments(s, i, b, u.weights.f32() + s.offset + i, m, v);
      max1[x.sums_at + b] = std::max(max1[x.sums_at + b], std::fabs(m));
      max2[x.sums_at + b] = std::max(max2[x.sums_at + b], v);
    });
  }
  u.group_max(u.maxima);
  for (const SplitSlot& x : split) {
    const ParamSlot& s = (*u.slots)[x.slot];
    for_each_placed(s, x, [&](int64_t i, int64_t wr, int64_t wc) {
      const int64_t b = (wr * x.whole_cols + wc) / kQuantBlock;
      float m = 0, v = 0;
      moments(s, i, b, nullptr, m, v);
      const float a1 = max1[x.sums_at + b], a2 = max2[x.sums_at + b];
      u.exp_avg8.as<uint8_t>()[s.state + i] = quantize_nearest(qs, m * (a1 > 0 ? 1.0f / a1 : 0.0f));
      u.exp_avg_sq8.as<uint8_t>()[s.state + i] =
          quantize_nearest(qu, v * (a2 > 0 ? 1.0f / a2 : 0.0f));
    });
  }
  for (const SplitSlot& x : split) {
    const ParamSlot& s = (*u.slots)[x.slot];
    std::copy_n(max1 + x.sums_at, whole_blocks(x), u.absmax1.f32() + s.blocks);
    std::copy_n(max2 + x.sums_at, whole_blocks(x), u.absmax2.f32() + s.blocks);
  }
}
}  // namespace

void CpuBackend::adamw_8bit_update(const AdamW8bitUpdate& u) {
  const int64_t n = u.weights.numel();
  check_flat(u.weights, n, "adamw_8bit_update", "weights");
  check_flat(u.grads, n, "adamw_8bit_update", "gradients");
  check_param_slots(u.slots, n, "adamw_8bit_update");
  BRISK_CHECK(u.qmap_signed.numel() == 256 && u.qmap_unsigned.numel() == 256 &&
                  u.qmap_signed.dtype() == DType::f32 && u.qmap_unsigned.dtype() == DType::f32,
              "adamw_8bit_update: quantization maps must be float32 [256]");
  BRISK_CHECK(u.exp_avg8.dtype() == DType::u8 && u.exp_avg_sq8.dtype() == DType::u8 &&
                  u.exp_avg8.numel() == u.exp_avg_sq8.numel() &&
                  u.absmax1.numel() == u.absmax2.numel() &&
                  u.exp_avg32.numel() == u.exp_avg_sq32.numel(),
              "adamw_8bit_update: state buffers do not pair up");
  float multiplier = 0;
  if (!read_step_control(u.control, "adamw_8bit_update control", &multiplier)) return;
  const AdamWStep adam(u.lr, u.beta1, u.beta2, u.eps, u.step);
  const float* qs = u.qmap_signed.f32();
  const float* qu = u.qmap_unsigned.f32();
  size_t shares = 0;
  for (const ParamSlot& s : *u.slots) {
    if (s.share) {
      ++shares;
      continue;
    }
    float* __restrict w = u.weights.f32() + s.offset;
    const float* __restrict g = u.grads.f32() + s.offset;
    const float decay = s.decay ? 1.0f - u.lr * u.weight_decay : 1.0f;
    const int64_t len = s.numel;
    if (s.blocks < 0) {  // 32-bit state: AdamW as adamw_update computes it
      BRISK_CHECK(s.state >= 0 && s.state + len <= u.exp_avg32.numel(),
                  "adamw_8bit_update: a slot's 32-bit state lies outside its buffer");
      float* __restrict m = u.exp_avg32.f32() + s.state;
      float* __restrict v = u.exp_avg_sq32.f32() + s.state;
#pragma omp parallel for simd schedule(static) if (len > 32768)
      for (int64_t i = 0; i < len; ++i)
        w[i] = adam.update(w[i], g[i] * multiplier, decay, m[i], v[i]);
      continue;
    }
    const int64_t blocks = (len + kQuantBlock - 1) / kQuantBlock;
    BRISK_CHECK(s.state >= 0 && s.state + len <= u.exp_avg8.numel() &&
                    s.blocks + blocks <= u.absmax1.numel(),
                "adamw_8bit_update: a slot's 8-bit state lies outside its buffers");
    uint8_t* __restrict c1 = u.exp_avg8.as<uint8_t>() + s.state;
    uint8_t* __restrict c2 = u.exp_avg_sq8.as<uint8_t>() + s.state;
    float* __restrict a1 = u.absmax1.f32() + s.blocks;
    float* __restrict a2 = u.absmax2.f32() + s.blocks;
#pragma omp parallel for schedule(static) if (blocks > 16)
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t begin = b * kQuantBlock, count = std::min(kQuantBlock, len - begin);
      float m[kQuantBlock], v[kQuantBlock];
      float max1 = 0, max2 = 0;
      const float scale1 = a1[b], scale2 = a2[b];
#pragma omp simd reduction(max : max1, max2)
      for (int64_t j = 0; j < count; ++j) {
        const int64_t i = begin + j;
        m[j] = qs[c1[i]] * scale1;  // dequantized
        v[j] = qu[c2[i]] * scale2;
        w[i] = adam.update(w[i], g[i] * multiplier, decay, m[j], v[j]);
        max1 = std::max(max1, std::fabs(m[j]));
        max2 = std::max(max2, v[j]);
      }
      a1[b] = max1;
      a2[b] = max2;
      const float inv1 = max1 > 0 ? 1.0f / max1 : 0.0f, inv2 = max2 > 0 ? 1.0f / max2 : 0.0f;
      quantize_row(qs, m, inv1, count, c1 + begin);
      quantize_row(qu, v, inv2, count, c2 + begin);
    }
  }
  BRISK_CHECK(shares == (u.split ? u.split->size() : 0), "adamw_8bit_update: ", shares,
              " slots are shares, but ", u.split ? u.split->size() : 0,
              " split slots describe them");
  if (shares > 0) adamw_8bit_split_slots(u, adam, multiplier);
}

void CpuBackend::stochastic_round(DType dtype, const Tensor& t, const RngKey& key) {
  BRISK_CHECK(dtype == DType::bf16, "stochastic_round: only bf16 is supported, not ",
              dtype_name(dtype));
  BRISK_CHECK(t.dtype() == DType::f32, "stochastic_round: float32 tensor expected");
  float* x = t.f32();
  const int64_t n = t.numel();
  constexpr int64_t kChunk = 4 * kPhiloxLanes;
#pragma omp parallel for schedule(static) if (n > 65536)
  for (int64_t c = 0; c < n; c += kChunk) {
    uint32_t words[kChunk];
    rng_blocks(key, static_cast<uint64_t>(c / 4), words);
    const int64_t end = std::min(n, c + kChunk);
    for (int64_t i = c; i < end; ++i) x[i] = stochastic_round_bf16(x[i], words[i - c]);
  }
}

}  // namespace brisk
