// Checks every op of the CPU backend: forward results against a plain fp64 reference, backward
// results against central finite differences of that reference for the scalar loss
// L = sum(out * G) with a random G (G is the upstream gradient handed to the backward op).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "backend/activation.h"
#include "backend/backend.h"
#include "backend/rope.h"
#include "core/error.h"
#include "core/json_file.h"
#include "core/rng.h"
#include "core/tensor.h"

namespace {

using brisk::Activation;
using brisk::DType;
using brisk::RngKey;
using brisk::Shape;
using brisk::Tensor;
using brisk::WeightLayout;
using Vec = std::vector<double>;
using FVec = std::vector<float>;
using IVec = std::vector<int32_t>;

constexpr double kFwdTol = 1e-5;   // |got - want| / max(1, |want|), element by element
constexpr double kGradTol = 1e-4;  // ||got - want|| / max(||want||, 1e-6)
// Elementwise ops involve no reductions, so their errors stay near fp32 rounding (~1e-7).
constexpr double kElemFwdTol = 2e-6, kElemGradTol = 1e-5;

// ---- helpers ----

Tensor view(FVec& v, Shape s) {
  return Tensor(v.data(), s, DType::f32);
}
Tensor view(IVec& v, Shape s) {
  return Tensor(v.data(), s, DType::i32);
}

FVec randn(size_t n, std::mt19937& rng, float scale = 1.f, float shift = 0.f) {
  std::normal_distribution<float> dist(0.f, 1.f);
  FVec v(n);
  for (float& x : v) x = shift + scale * dist(rng);
  return v;
}

Vec to_d(const FVec& v) {
  return Vec(v.begin(), v.end());
}

// a - b, computed in double.
Vec minus(const FVec& a, const FVec& b) {
  Vec r(a.size());
  for (size_t i = 0; i < a.size(); ++i) r[i] = double(a[i]) - double(b[i]);
  return r;
}

double dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

double rel_error(const Vec& got, const Vec& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-6);
}

// Forward check, element by element: |got - want| <= tol * max(1, |want|).
::testing::AssertionResult close(const FVec& got, const Vec& want, double tol = kFwdTol) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << "size " << got.size() << " vs " << want.size();
  double worst = 0;  // the largest error in units of the allowance
  size_t at = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = std::abs(double(got[i]) - want[i]) / (tol * std::max(1.0, std::abs(want[i])));
    if (std::isnan(d)) return ::testing::AssertionFailure() << "NaN at element " << i;
    if (d > worst) worst = d, at = i;
  }
  if (worst <= 1.0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "element " << at << ": got " << got[at] << ", want " << want[at] << ", error "
         << worst * tol << " relative to max(1, |want|) > " << tol;
}

// Gradient check with the relative-norm metric.
::testing::AssertionResult grad_close(const Vec& got, const Vec& want, double tol = kGradTol) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << "size " << got.size() << " vs " << want.size();
  for (size_t i = 0; i < got.size(); ++i)
    if (std::isnan(got[i])) return ::testing::AssertionFailure() << "NaN at element " << i;
  double e = rel_error(got, want);
  if (e <= tol) return ::testing::AssertionSuccess();
  size_t at = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (std::abs(got[i] - want[i]) > std::abs(got[at] - want[at])) at = i;
  return ::testing::AssertionFailure()
         << "relative error " << e << " > " << tol << "; worst element " << at << ": got "
         << got[at] << ", want " << want[at];
}

// Central finite differences of loss(x) at x, one element at a time.
template <typename Loss>
Vec numeric_grad(Vec x, const Loss& loss, double h = 1e-4) {
  Vec g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double saved = x[i];
    x[i] = saved + h;
    const double lp = loss(x);
    x[i] = saved - h;
    const double lm = loss(x);
    x[i] = saved;
    g[i] = (lp - lm) / (2 * h);
  }
  return g;
}

bool kept(const RngKey& key, uint64_t element, float p) {
  return brisk::dropout_keep(key, element, brisk::dropout_threshold(p));
}

// ---- fp64 references ----

Vec ref_linear(const Vec& x, const Vec& w, const Vec& b, WeightLayout layout, int M, int K, int N) {
  Vec y(size_t(M) * N);
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n) {
      double s = b.empty() ? 0.0 : b[n];
      for (int k = 0; k < K; ++k)
        s += x[m * K + k] * (layout == WeightLayout::out_in ? w[n * K + k] : w[k * N + n]);
      y[m * N + n] = s;
    }
  return y;
}

Vec ref_layernorm(const Vec& x, const Vec& gamma, const Vec& beta, double eps, int M, int C,
                  Vec* mean = nullptr, Vec* rstd = nullptr) {
  Vec y(x.size());
  if (mean) mean->assign(M, 0.0);
  if (rstd) rstd->assign(M, 0.0);
  for (int m = 0; m < M; ++m) {
    const double* r = &x[size_t(m) * C];
    double mu = 0, var = 0;
    for (int c = 0; c < C; ++c) mu += r[c];
    mu /= C;
    for (int c = 0; c < C; ++c) var += (r[c] - mu) * (r[c] - mu);
    var /= C;
    const double rs = 1.0 / std::sqrt(var + eps);
    for (int c = 0; c < C; ++c) y[size_t(m) * C + c] = (r[c] - mu) * rs * gamma[c] + beta[c];
    if (mean) (*mean)[m] = mu;
    if (rstd) (*rstd)[m] = rs;
  }
  return y;
}

// LlamaRMSNorm: y = x / sqrt(mean(x^2) + eps) * gamma.
Vec ref_rmsnorm(const Vec& x, const Vec& gamma, double eps, int M, int C, Vec* rstd = nullptr) {
  Vec y(x.size());
  if (rstd) rstd->assign(M, 0.0);
  for (int m = 0; m < M; ++m) {
    const double* r = &x[size_t(m) * C];
    double ss = 0;
    for (int c = 0; c < C; ++c) ss += r[c] * r[c];
    const double rs = 1.0 / std::sqrt(ss / C + eps);
    for (int c = 0; c < C; ++c) y[size_t(m) * C + c] = r[c] * rs * gamma[c];
    if (rstd) (*rstd)[m] = rs;
  }
  return y;
}

// transformers' apply_rotary_pos_emb on packed qkv [B,T,(H+2K)*D], literally: per query and key
// head, x * cat(cos, cos) + rotate_half(x) * cat(sin, sin) with rotate_half(x) = cat(-x2, x1),
// at position first + t; values copied.
Vec ref_rotary(const Vec& qkv, const FVec& cos, const FVec& sin, int first, int B, int T, int H,
               int K, int D) {
  const int half = D / 2, width = (H + 2 * K) * D;
  Vec out = qkv;
  Vec c(D), s(D), rh(D);
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t) {
      for (int i = 0; i < D; ++i) {
        c[i] = cos[size_t(first + t) * half + i % half];
        s[i] = sin[size_t(first + t) * half + i % half];
      }
      for (int h = 0; h < H + K; ++h) {
        const size_t at = (size_t(b) * T + t) * width + size_t(h) * D;
        for (int i = 0; i < half; ++i) {
          rh[i] = -qkv[at + half + i];
          rh[half + i] = qkv[at + i];
        }
        for (int i = 0; i < D; ++i) out[at + i] = qkv[at + i] * c[i] + rh[i] * s[i];
      }
    }
  return out;
}

// transformers' definitions, in double.
double ref_activation(Activation kind, double x) {
  switch (kind) {
    case Activation::gelu:
      return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0)));
    case Activation::gelu_tanh:
      return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
    case Activation::relu:
      return std::max(x, 0.0);
    case Activation::silu:
      return x / (1.0 + std::exp(-x));
    case Activation::quick_gelu:
      return x / (1.0 + std::exp(-1.702 * x));
  }
  return NAN;
}

// Attention over packed qkv [B,T,(H+2K)*D] (H query heads, then K key heads, then K value heads)
// with scores q.k * scale; query head h reads key/value head h / (H/K). probs (optional) receives
// the softmax [B,H,T,T] before dropout. The dropout mask element is the flat index into probs.
Vec ref_gqa_attention(const Vec& qkv, const IVec& mask, bool causal, int B, int T, int H, int K,
                      int D, double scale, float p, const RngKey& key, Vec* probs = nullptr) {
  const int C = H * D, W = (H + 2 * K) * D, G = H / K;
  const double keep_scale = 1.0 / (1.0 - double(p));
  Vec out(size_t(B) * T * C, 0.0);
  if (probs) probs->assign(size_t(B) * H * T * T, 0.0);
  Vec s(T);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h)
      for (int i = 0; i < T; ++i) {
        const double* q = &qkv[(size_t(b) * T + i) * W + h * D];
        double mx = -INFINITY;
        for (int j = 0; j < T; ++j) {
          const bool allowed = (mask.empty() || mask[b * T + j] != 0) && (!causal || j <= i);
          if (!allowed) {
            s[j] = -INFINITY;
            continue;
          }
          const double* k = &qkv[(size_t(b) * T + j) * W + C + (h / G) * D];
          double d = 0;
          for (int e = 0; e < D; ++e) d += q[e] * k[e];
          s[j] = d * scale;
          mx = std::max(mx, s[j]);
        }
        double sum = 0;
        for (int j = 0; j < T; ++j) sum += (s[j] = std::isinf(s[j]) ? 0.0 : std::exp(s[j] - mx));
        for (int j = 0; j < T; ++j) {
          const size_t pi = ((size_t(b) * H + h) * T + i) * T + j;
          const double pr = s[j] / sum;
          if (probs) (*probs)[pi] = pr;
          double w = pr;
          if (p > 0) w = kept(key, pi, p) ? pr * keep_scale : 0.0;
          const double* v = &qkv[(size_t(b) * T + j) * W + C + (K + h / G) * D];
          double* o = &out[(size_t(b) * T + i) * C + h * D];
          for (int e = 0; e < D; ++e) o[e] += w * v[e];
        }
      }
  return out;
}

// Multi-head attention over [B,T,3C]: every query head has its own key/value head.
Vec ref_attention(const Vec& qkv, const IVec& mask, bool causal, int B, int T, int H, int D,
                  double scale, float p, const RngKey& key, Vec* probs = nullptr) {
  return ref_gqa_attention(qkv, mask, causal, B, T, H, H, D, scale, p, key, probs);
}

// transformers' repeat_kv on packed qkv: [B,T,(H+2K)*D] -> [B,T,3*H*D], each key/value head
// repeated for H/K consecutive query heads (hidden[:, :, None].expand(.., n_rep, ..).reshape).
FVec repeat_kv(const FVec& qkv, int B, int T, int H, int K, int D) {
  const int G = H / K, W = (H + 2 * K) * D, C = H * D;
  FVec out(size_t(B) * T * 3 * C);
  for (int bt = 0; bt < B * T; ++bt) {
    const float* in = &qkv[size_t(bt) * W];
    float* o = &out[size_t(bt) * 3 * C];
    std::copy(in, in + C, o);
    for (int h = 0; h < H; ++h)
      for (int e = 0; e < D; ++e) {
        o[C + h * D + e] = in[C + (h / G) * D + e];
        o[2 * C + h * D + e] = in[C + K * D + (h / G) * D + e];
      }
  }
  return out;
}

// Summed cross-entropy over rows whose label is not kIgnoreIndex.
double ref_cross_entropy(const Vec& logits, const IVec& labels, int N, int V) {
  double loss = 0;
  for (int n = 0; n < N; ++n) {
    if (labels[n] == brisk::kIgnoreIndex) continue;
    const double* r = &logits[size_t(n) * V];
    const double mx = *std::max_element(r, r + V);
    double sum = 0;
    for (int v = 0; v < V; ++v) sum += std::exp(r[v] - mx);
    loss += mx + std::log(sum) - r[labels[n]];
  }
  return loss;
}

}  // namespace

// ---------------------------------------------------------------------------------------------

TEST(OpsLinear, ForwardMatchesReference) {
  auto be = brisk::make_cpu_backend();
  std::mt19937 rng(1);
  const int K = 13, N = 5;
  for (auto layout : {WeightLayout::out_in, WeightLayout::in_out})
    for (bool bias : {false, true})
      for (bool rank3 : {false, true}) {
        SCOPED_TRACE(::testing::Message() << "out_in=" << (layout == WeightLayout::out_in)
                                          << " bias=" << bias << " rank3=" << rank3);
        const int M = rank3 ? 6 : 7;
        FVec x = randn(size_t(M) * K, rng), w = randn(size_t(K) * N, rng), b = randn(N, rng);
        FVec y(size_t(M) * N, -7.f);
        Shape xs = rank3 ? Shape{2, 3, K} : Shape{M, K};
        Shape ys = rank3 ? Shape{2, 3, N} : Shape{M, N};
        Shape ws = layout == WeightLayout::out_in ? Shape{N, K} : Shape{K, N};
        be->linear_forward(view(x, xs), view(w, ws), bias ? view(b, {N}) : Tensor(), layout,
                           view(y, ys));
        EXPECT_TRUE(
            close(y, ref_linear(to_d(x), to_d(w), bias ? to_d(b) : Vec(), layout, M, K, N)));
      }
}

TEST(OpsLinear, BackwardMatchesFiniteDifferences) {
  auto be = brisk::make_cpu_backend();
  std::mt19937 rng(2);
  const int M = 6, K = 13, N = 5;
  for (auto layout : {WeightLayout::out_in, WeightLayout::in_out})
    for (bool bias : {false, true})
      for (bool accumulate : {false, true}) {
        SCOPED_TRACE(::testing::Message() << "out_in=" << (layout == WeightLayout::out_in)
                                          << " bias=" << bias << " accumulate_dx=" << accumulate);
        Shape ws = layout == WeightLayout::out_in ? Shape{N, K} : Shape{K, N};
        FVec x = randn(size_t(M) * K, rng), w = randn(size_t(K) * N, rng), b = randn(N, rng);
        FVec g = randn(size_t(M) * N, rng);
        const FVec dx0 = randn(x.size(), rng), dw0 = randn(w.size(), rng), db0 = randn(N, rng);
        FVec dx = dx0, dw = dw0, db = db0;
        be->linear_backward(view(x, {2, 3, K}), view(w, ws), view(g, {2, 3, N}), layout,
                            view(dx, {2, 3, K}), accumulate, view(dw, ws),
                            bias ? view(db, {N}) : Tensor());

        const Vec xd = to_d(x), wd = to_d(w), bd = bias ? to_d(b) : Vec(), gd = to_d(g);
        auto loss_x = [&](const Vec& v) { return dot(ref_linear(v, wd, bd, layout, M, K, N), gd); };
        auto loss_w = [&](const Vec& v) { return dot(ref_linear(xd, v, bd, layout, M, K, N), gd); };
        auto loss_b = [&](const Vec& v) { return dot(ref_linear(xd, wd, v, layout, M, K, N), gd); };
        EXPECT_TRUE(grad_close(accumulate ? minus(dx, dx0) : to_d(dx), numeric_grad(xd, loss_x)));
        EXPECT_TRUE(grad_close(minus(dw, dw0), numeric_grad(wd, loss_w)));
        if (bias)
          EXPECT_TRUE(grad_close(minus(db, db0), numeric_grad(to_d(b), loss_b)));
        else
          EXPECT_EQ(db, db0);
      }

  // dx empty: skipped, dw still accumulates.
  FVec x = randn(size_t(M) * K, rng), w = randn(size_t(N) * K, rng), g = randn(size_t(M) * N, rng);
  const FVec dw0 = randn(w.size(), rng);
  FVec dw = dw0;
  be->linear_backward(view(x, {M, K}), view(w, {N, K}), view(g, {M, N}), WeightLayout::out_in,
                      Tensor(), false, view(dw, {N, K}), Tensor());
  const Vec xd = to_d(x), gd = to_d(g);
  auto loss_w = [&](const Vec& v) {
    return dot(ref_linear(xd, v, Vec(), WeightLayout::out_in, M, K, N), gd);
  };
  EXPECT_TRUE(grad_close(minus(dw, dw0), numeric_grad(to_d(w), loss_w)));
}

TEST(OpsLayerNorm, ForwardAndBackward) {
  auto be = brisk::make_cpu_backend();
  std::mt19937 rng(3);
  const int M = 7, C = 13;
  const float eps = 1e-5f;
  FVec x = randn(size_t(M) * C, rng, 1.5f, 2.f);  // non-zero mean on purpose
  FVec gamma = randn(C, rng, 0.3f, 1.f), beta = randn(C, rng, 0.5f);
  FVec y(x.size(), -7.f), mean(M, -7.f), rstd(M, -7.f);
  be->layernorm_forward(view(x, {M, C}), view(gamma, {C}), view(beta, {C}), eps, view(y, {M, C}),
                        view(mean, {M}), view(rstd, {M}));
  const Vec xd = to_d(x), gd = to_d(gamma), bd = to_d(beta);
  Vec ref_mean, ref_rstd;
  EXPECT_TRUE(close(y, ref_layernorm(xd, gd, bd, eps, M, C, &ref_mean, &ref_rstd)));
  EXPECT_TRUE(close(mean, ref_mean));
  EXPECT_TRUE(close(rstd, ref_rstd));

  FVec dy = randn(x.size(), rng);
  const Vec dyd = to_d(dy);
  auto loss_x = [&](const Vec& v) { return dot(ref_layernorm(v, gd, bd, eps, M, C), dyd); };
  auto loss_g = [&](const Vec& v) { return dot(ref_layernorm(xd, v, bd, eps, M, C), dyd); };
  auto loss_b = [&](const Vec& v) { return dot(ref_layernorm(xd, gd, v, eps, M, C), dyd); };
  const Vec want_dx = numeric_grad(xd, loss_x), want_dg = numeric_grad(gd, loss_g),
            want_db = numeric_grad(bd, loss_b);
  for (bool accumulate : {false, true}) {
    SCOPED_TRACE(::testing::Message() << "accumulate_dx=" << accumulate);
    const FVec dx0 = randn(x.size(), rng), dg0 = randn(C, rng), db0 = randn(C, rng);
    FVec dx = dx0, dg = dg0, db = db0;
    be->layernorm_backward(view(dy, {M, C}), view(x, {M, C}), view(gamma, {C}), view(mean, {M}),
                           view(rstd, {M}), view(dx, {M, C}), accumulate, view(dg, {C}),
                           view(db, {C}));
    EXPECT_TRUE(grad_close(accumulate ? minus(dx, dx0) : to_d(dx), want_dx));
    EXPECT_TRUE(grad_close(minus(dg, dg0), want_dg));
    EXPECT_TRUE(grad_close(minus(db, db0), want_db));
  }
}

// Llama's and Qwen2's eps values. Rows scaled down to mean(x^2) ~ 1e-6 make eps matter as much
// as the data, so a misplaced eps shows; a row of zeros gives y = 0 and rstd = 1/sqrt(eps).
TEST(OpsRmsNorm, ForwardAndBackward) {
  auto be = brisk::make_cpu_backend();
  std::mt19937 rng(16);
  const int M = 7, C = 13;
  for (float eps : {1e-6f, 1e-5f}) {
    SCOPED_TRACE(::testing::Message() << "eps=" << eps);
    FVec x = randn(size_t(M) * C, rng, 1.5f, 0.5f);
    for (int c = 0; c < C; ++c) x[size_t(2) * C + c] *= 1e-3f;  // mean(x^2) near eps
    for (int c = 0; c < C; ++c) x[size_t(4) * C + c] = 0.f;
    FVec gamma = randn(C, rng, 0.3f, 1.f);
    FVec y(x.size(), -7.f), rstd(M, -7.f);
    be->rmsnorm_forward(view(x, {M, C}), view(gamma, {C}), eps, view(y, {M, C}), view(rstd, {M}));
    const Vec xd = to_d(x), gd = to_d(gamma);
    Vec ref_rstd;
    EXPECT_TRUE(close(y, ref_rmsnorm(xd, gd, eps, M, C, &ref_rstd)));
    // rstd is large where the row is small: compare it relative to its own size.
    for (int m = 0; m < M; ++m) EXPECT_NEAR(rstd[m], ref_rstd[m], kFwdTol * ref_rstd[m]) << m;
    FVec y_inplace = x;  // y may alias x
    FVec rstd2(M, -7.f);
    be->rmsnorm_forward(view(y_inplace, {M, C}), view(gamma, {C}), eps, view(y_inplace, {M, C}),
                        view(rstd2, {M}));
    EXPECT_EQ(y_inplace, y);
    EXPECT_EQ(rstd2, rstd);

    FVec dy = randn(x.size(), rng);
    const Vec dyd = to_d(dy);
    auto loss_x = [&](const Vec& v) { return dot(ref_rmsnorm(v, gd, eps, M, C), dyd); };
    auto loss_g = [&](const Vec& v) { return dot(ref_rmsnorm(xd, v, eps, M, C), dyd); };
    // A smaller step for the rows near eps, whose curvature is 1e3 times larger.
    const Vec want_dx = numeric_grad(xd, loss_x, 1e-6), want_dg = numeric_grad(gd, loss_g);
    for (bool accumulate : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "accumulate_dx=" << accumulate);
      const FVec dx0 = randn(x.size(), rng), dg0 = randn(C, rng);
      FVec dx = dx0, dg = dg0;
      be->rmsnorm_backward(view(dy, {M, C}), view(x, {M, C}), view(gamma, {C}), view(rstd, {M}),
                           view(dx, {M, C}), accumulate, view(dg, {C}));
      EXPECT_TRUE(grad_close(accumulate ? minus(dx, dx0) : to_d(dx), want_dx));
      EXPECT_TRUE(grad_close(minus(dg, dg0), want_dg));
    }
    // dx in place of dy, and no gamma gradient.
    FVec dyc = dy;
    be->rmsnorm_backward(view(dyc, {M, C}), view(x, {M, C}), view(gamma, {C}), view(rstd, {M}),
                         view(dyc, {M, C}), false, Tensor());
    EXPECT_TRUE(grad_close(to_d(dyc), want_dx));
    // dgamma reads dy before dx overwrites it.
    FVec dyc2 = dy, dg(C, 0.f);
    be->rmsnorm_backward(view(dyc2, {M, C}), view(x, {M, C}), view(gamma, {C}), view(rstd, {M}),
                         view(dyc2, {M, C}), false, view(dg, {C}));
    EXPECT_TRUE(grad_close(to_d(dg), want_dg));
  }
}

TEST(OpsRmsNorm, MismatchedShapesAreRefused) {
  auto be = brisk::make_cpu_backend();
  const int M = 3, C = 4;
  FVec x(size_t(M) * C, 1.f), gamma(C + 1, 1.f), y(x.size()), rstd(M + 1), dx(x.size());
  EXPECT_THROW(be->rmsnorm_forward(view(x, {M, C}), view(gamma, {C + 1}), 1e-6f, view(y, {M, C}),
                                   view(rstd, {M})),
               brisk::Error);  // gamma
  EXPECT_THROW(be->rmsnorm_forward(view(x, {M, C}), view(gamma, {C}), 1e-6f, view(y, {M, C}),
                                   view(rstd, {M + 1})),
               brisk::Error);  // rstd
  EXPECT_THROW(be->rmsnorm_forward(view(x, {M, C}), view(gamma, {C}), 1e-6f, view(y, {M, C - 1}),
                                   view(rstd, {M})),
               brisk::Error);  // y
  EXPECT_THROW(be->rmsnorm_backward(view(y, {M, C}), view(x, {M, C}), view(gamma, {C}),
                                    view(rstd, {M}), view(dx, {M, C}), false, view(gamma, {C + 1})),
               brisk::Error);  // dgamma
}

// rope_tables against transformers' own LlamaRotaryEmbedding (scripts/make_rope_fixture.py):
// rope types default (Llama-2, Qwen2's theta 1e6, a six-wide head), linear and llama3 (3.1, 3.2).
// Tolerances: inv_freq within 2 ulp (float32 steps in transformers' order; only pow is not
// correctly rounded, by torch or by us). Where inv_freq is the same, the angle is the same float32
// product position * inv_freq on both sides and cos/sin agree within one rounding (1.2e-7);
// where it is an ulp apart, the angle moves by up to angle * 1.2e-7: 2e-7 plus 2.4e-7 of it.
TEST(OpsRope, TablesMatchTransformers) {
  const nlohmann::json fx = brisk::read_json_file(
      std::string(BRISK_FIXTURES_DIR) + "/rope/tables.json", "the rope fixture");
  const std::vector<int64_t> positions = fx.at("positions").get<std::vector<int64_t>>();
  const int64_t table_len = positions.back() + 1;
  ASSERT_EQ(fx.at("cases").size(), 6u);
  for (const auto& c : fx.at("cases")) {
    const std::string name = c.at("name").get<std::string>();
    SCOPED_TRACE(name);
    brisk::RopeScaling sc;
    sc.type = brisk::rope_type_from_name(c.at("rope_type").get<std::string>());
    if (c.contains("factor")) sc.factor = c.at("factor").get<double>();
    if (sc.type == brisk::RopeScaling::Type::llama3) {
      sc.low_freq_factor = c.at("low_freq_factor").get<double>();
      sc.high_freq_factor = c.at("high_freq_factor").get<double>();
      sc.original_max_position_embeddings = c.at("original_max_position_embeddings").get<int64_t>();
    }
    const int64_t D = c.at("head_dim").get<int64_t>(), half = D / 2;
    const brisk::RopeTables t =
        brisk::rope_tables(D, c.at("rope_theta").get<double>(), table_len, sc);
    ASSERT_EQ(t.half, half);
    ASSERT_EQ(t.positions, table_len);
    ASSERT_EQ(t.cos.size(), size_t(table_len * half));
    const FVec want_inv = c.at("inv_freq").get<FVec>();
    ASSERT_EQ(t.inv_freq.size(), want_inv.size());
    for (int64_t i = 0; i < half; ++i)
      EXPECT_NEAR(t.inv_freq[i], want_inv[i], 2.4e-7 * want_inv[i]) << "inv_freq " << i;
    const FVec want_cos = c.at("cos").get<FVec>(), want_sin = c.at("sin").get<FVec>();
    ASSERT_EQ(want_cos.size(), positions.size() * size_t(half));
    size_t exact = 0, same_freqs = 0;
    for (size_t k = 0; k < positions.size(); ++k)
      for (int64_t i = 0; i < half; ++i) {
        const int64_t p = positions[k];
        const double angle = double(p) * want_inv[i];
        const bool same_freq = t.inv_freq[i] == want_inv[i];
        const double tol = same_freq ? 1.2e-7 : 2e-7 + 2.4e-7 * angle;
        same_freqs += same_freq;
        const float got_c = t.cos[p * half + i], got_s = t.sin[p * half + i];
        const float wc = want_cos[k * half + i], ws = want_sin[k * half + i];
        EXPECT_NEAR(got_c, wc, tol) << "cos at position " << p << ", pair " << i;
        EXPECT_NEAR(got_s, ws, tol) << "sin at position " << p << ", pair " << i;
        exact += (got_c == wc) + (got_s == ws);
      }
    // Most values are bit-identical; a handful differ in the last bit (torch's pow and cos).
    EXPECT_GT(double(exact) / double(2 * positions.size() * half), 0.8);
    EXPECT_GT(double(same_freqs) / double(positions.size() * half), 0.9);
  }
}

TEST(OpsRope, BadParametersAreRefused) {
  brisk::RopeScaling none;
  EXPECT_THROW(brisk::rope_tables(7, 10000.0, 4, none), brisk::Error);  // odd head_dim
  EXPECT_THROW(brisk::rope_tables(0, 10000.0, 4, none), brisk::Error);
  EXPECT_THROW(brisk::rope_tables(8, 0.0, 4, none), brisk::Error);
  EXPECT_THROW(brisk::rope_tables(8, std::nan(""), 4, none), brisk::Error);
  brisk::RopeScaling linear;
  linear.type = brisk::RopeScaling::Type::linear;
  linear.factor = 0.0;
  EXPECT_THROW(brisk::rope_tables(8, 10000.0, 4, linear), brisk::Error);
  brisk::RopeScaling llama3;
  llama3.type = brisk::RopeScaling::Type::llama3;
  llama3.factor = 8.0;
  llama3.low_freq_factor = 4.0;
  llama3.high_freq_factor = 4.0;  // must exceed low_freq_factor
  EXPECT_THROW(brisk::rope_tables(8, 500000.0, 4, llama3), brisk::Error);
  for (const char* name : {"dynamic", "yarn", "longrope", "Default"})
    EXPECT_THROW(brisk::rope_type_from_name(name), brisk::Error) << name;
}

// The rotation on packed qkv, against the literal rotate_half formula: MHA, GQA (H = 4 over
// K = 2), MQA (K = 1) and a two-wide head, from position 0 and from a later position (decoding).
// The op is linear, so its backward is checked by finite differences of the reference.
TEST(OpsRotary, ForwardAndBackward) {
  auto be = brisk::make_cpu_backend();
  std::mt19937 rng(17);
  struct Case {
    int B, T, H, K, D, first;
  };
  for (const Case& k : {Case{2, 5, 3, 3, 8, 0}, Case{2, 3, 4, 2, 6, 7}, Case{1, 4, 6, 1, 4, 2},
                        Case{2, 2, 2, 2, 2, 1}}) {
    SCOPED_TRACE(::testing::Message() << "B=" << k.B << " T=" << k.T << " H=" << k.H << " K=" << k.K
                                      << " D=" << k.D << " first=" << k.first);
    const int W = (k.H + 2 * k.K) * k.D, P = k.first + k.T + 3;
    const brisk::RopeTables t = brisk::rope_tables(k.D, 10000.0, P);
    FVec cos = t.cos, sin = t.sin;
    const Shape qs{k.B, k.T, W}, ts{P, k.D / 2};
    const FVec x0 = randn(size_t(k.B) * k.T * W, rng);
    FVec x = x0;
    be->rotary_forward(view(x, qs), k.H, k.K, view(cos, ts), view(sin, ts), k.first);
    const Vec want = ref_rotary(to_d(x0), cos, sin, k.first, k.B, k.T, k.H, k.K, k.D);
    EXPECT_TRUE(close(x, want));
    for (int bt = 0; bt < k.B * k.T; ++bt)  // values: bit for bit
      for (int j = (k.H + k.K) * k.D; j < W; ++j)
        ASSERT_EQ(x[size_t(bt) * W + j], x0[size_t(bt) * W + j]) << "value column " << j;

    const FVec g0 = randn(x.size(), rng);
    FVec g = g0;
    be->rotary_backward(view(g, qs), k.H, k.K, view(cos, ts), view(sin, ts), k.first);
    const Vec gd = to_d(g0);
    auto loss = [&](const Vec& v) {
      return dot(ref_rotary(v, cos, sin, k.first, k.B, k.T, k.H, k.K, k.D), gd);
    };
    EXPECT_TRUE(grad_close(to_d(g), numeric_grad(to_d(x0), loss)));
    // Backward undoes forward (the rotation is orthogonal).
    be->rotary_backward(view(x, qs), k.H, k.K, view(cos, ts), view(sin, ts), k.first);
    EXPECT_TRUE(close(x, to_d(x0)));
  }
}

// Position 0 is the identity; position p of a sequence equals position 0 of the same token moved
// p steps on (the op reads table rows first_position + t).
TEST(OpsRotary, PositionsComeFromTheTable) {
  auto be = brisk::make_cpu_backend();
  std::mt19937 rng(18);
  const int H = 2, K = 1, D = 4, W = (H + 2 * K) * D, P = 6;
  const brisk::RopeTables t = brisk::rope_tables(D, 10000.0, P);
  FVec cos = t.cos, sin = t.sin;
  const FVec x0 = randn(size_t(3) * W, rng);
  FVec whole = x0;  // three tokens at positions 2, 3, 4
  be->rotary_forward(view(whole, {1, 3, W}), H, K, view(cos, {P, D / 2}), view(sin, {P, D / 2}), 2);
  for (int t0 = 0; t0 < 3; ++t0) {  // one token at a time
    FVec one(x0.begin() + t0 * W, x0.begin() + (t0 + 1) * W);
    be->rotary_forward(view(one, {1, 1, W}), H, K, view(cos, {P, D / 2}), view(sin, {P, D / 2}),
                       2 + t0);
    for (int j = 0; j < W; ++j) EXPECT_EQ(one[j], whole[t0 * W + j]) << t0 << ", " << j;
  }
  FVec at0 = x0;
  be->rotary_forward(view(at0, {1, 3, W}), H, K, view(cos, {P, D / 2}), view(sin, {P, D / 2}), 0);
  for (int j = 0; j < W; ++j) EXPECT_EQ(at0[j], x0[j]) << "position 0 rotates by nothing";
}

TEST(OpsRotary, MismatchedShapesAreRefused) {
  auto be = brisk::make_cpu_backend();
  const int B = 1, T = 3, H = 2, K = 1, D = 4, W = (H + 2 * K) * D, P = 5;
  FVec x(size_t(B) * T * W, 1.f), cos(size_t(P) * D, 1.f), sin(cos.size(), 0.f);
  const Tensor q = view(x, {B, T, W}), c = view(cos, {P, D / 2}), s = view(sin, {P, D / 2});
  EXPECT_THROW(be->rotary_forward(q, H, K, c, s, 3), brisk::Error);   // positions 3..5 of 5
  EXPECT_THROW(be->rotary_forward(q, H, K, c, s, -1), brisk::Error);  // negative position
  EXPECT_THROW(be->rotary_forward(q, H, 2, c, s, 0), brisk::Error);   // 16 columns over 6 heads
  EXPECT_THROW(be->rotary_forward(q, 0, K, c, s, 0), brisk::Error);
  EXPECT_THROW(be->rotary_backward(q, H, K, view(cos, {P, D}), view(sin, {P, D}), 0),
               brisk::Error);  // table width D, not D/2
  EXPECT_THROW(
      be->rotary_forward(view(x, {B, T, W}), 3, 1, view(cos, {P, 1}), view(sin, {P, 1}), 0),
      brisk::Error);                  // 16 columns over 5 heads
  FVec odd(size_t(B) * T * 12, 1.f);  // H = 2, K = 1: four heads of width 3
  EXPECT_THROW(
      be->rotary_forward(view(odd, {B, T, 12}), 2, 1, view(cos, {P, 1}), view(sin, {P, 1}), 0),
      brisk::Error);
  EXPECT_EQ(x, FVec(x.size(), 1.f)) << "a refused call changes nothing";
}

// Tolerances: each output is a few float32 operations around at most one erf, exp or tanh, which
// glibc's vector versions (under the -ffast-math of cpu_activation.cpp) compute within 4 ulp, so
// an output is within a few 1e-7 of the fp64 value relative to max(1, |y|) (where 1 + erf cancels
// for negative x the error stays an absolute |x| * 1e-7, under the max(1, ...) floor):
// kElemFwdTol = 2e-6. Gradients: the central difference of the fp64 reference with h = 1e-4 is
// off by h^2 |f'''(x)| / 6 ~ 1e-9, the float32 derivative by ~1e-6: kElemGradTol = 1e-5 norm-wise.
TEST(OpsActivation, ForwardAndBackward) {
  auto be = brisk::make_cpu_backend();
  std::mt19937 rng(4);
  const int M = 7, C = 13;
  for (Activation kind : brisk::kAllActivations) {
    SCOPED_TRACE(brisk::activation_name(kind));
    FVec x = randn(size_t(M) * C, rng, 2.5f);
    // Exact zeros (relu's kink), and tails where the exponentials saturate.
    const float edges[] = {0.f, -0.f, 12.f, -12.f, 30.f, -30.f, 1e-3f, -1e-3f};
    std::copy(std::begin(edges), std::end(edges), x.begin());
    FVec y(x.size(), -7.f);
    be->activation_forward(kind, view(x, {M, C}), view(y, {M, C}));
    const Vec xd = to_d(x);
    Vec want(x.size());
    for (size_t i = 0; i < x.size(); ++i) want[i] = ref_activation(kind, xd[i]);
    EXPECT_TRUE(close(y, want, kElemFwdTol));

    const FVec dy = randn(x.size(), rng);
    Vec want_dx(x.size());  // elementwise: dy * (central difference of the activation)
    for (size_t i = 0; i < x.size(); ++i) {
      const double slope =
          (ref_activation(kind, xd[i] + 1e-4) - ref_activation(kind, xd[i] - 1e-4)) / 2e-4;
      // At relu's kink the difference gives 1/2; PyTorch's derivative there is 0.
      want_dx[i] = dy[i] * (kind == Activation::relu && xd[i] == 0.0 ? 0.0 : slope);
    }
    FVec dyc = dy, dx(x.size(), -7.f);
    be->activation_backward(kind, view(x, {M, C}), view(dyc, {M, C}), view(dx, {M, C}));
    EXPECT_TRUE(grad_close(to_d(dx), want_dx, kElemGradTol));
    if (kind == Activation::relu) {
      EXPECT_EQ(dx[0], 0.f) << "relu'(0)";
      EXPECT_EQ(dx[1], 0.f) << "relu'(-0)";
    }
    be->activation_backward(kind, view(x, {M, C}), view(dyc, {M, C}),
                            view(dyc, {M, C}));  // dx == dy
    EXPECT_TRUE(grad_close(to_d(dyc), want_dx, kElemGradTol));
  }
}

// silu(gate) * up against the fp64 definition; gradients of both halves by finite differences
// (elementwise tolerances, as the activations'); the gradient in place of gate_up.
TEST(OpsSwiGlu, ForwardAndBackward) {
  auto be = brisk::make_cpu_backend();
  std::mt19937 rng(19);
  const int B = 2, T = 3, F = 11, R = B * T;
  FVec gu = randn(size_t(R) * 2 * F, rng, 2.5f);
  // Saturated gates, exact zeros in both halves.
  const float edges[] = {0.f, -0.f, 12.f, -12.f, 30.f, -30.f, 1e-3f};
  std::copy(std::begin(edges), std::end(edges), gu.begin());
  gu[F] = 0.f;
  auto ref = [&](const Vec& v) {
    Vec y(size_t(R) * F);
    for (int r = 0; r < R; ++r)
      for (int i = 0; i < F; ++i) {
        const double g = v[size_t(r) * 2 * F + i], u = v[size_t(r) * 2 * F + F + i];
        y[size_t(r) * F + i] = g / (1.0 + std::exp(-g)) * u;
      }
    return y;
  };
  FVec y(size_t(R) * F, -7.f);
  be->swiglu_forward(view(gu, {B, T, 2 * F}), view(y, {B, T, F}));
  EXPECT_TRUE(close(y, ref(to_d(gu)), kElemFwdTol));

  const FVec dout = randn(y.size(), rng);
  const Vec dd = to_d(dout);
  const Vec want = numeric_grad(to_d(gu), [&](const Vec& v) { return dot(ref(v), dd); });
  FVec dgu(gu.size(), -7.f), dout_c = dout;
  be->swiglu_backward(view(gu, {B, T, 2 * F}), view(dout_c, {B, T, F}), view(dgu, {B, T, 2 * F}));
  EXPECT_TRUE(grad_close(to_d(dgu), want, kElemGradTol));
  FVec inplace = gu;  // dgate_up over gate_up
  be->swiglu_backward(view(inplace, {B, T, 2 * F}), view(dout_c, {B, T, F}),
                      view(inplace, {B, T, 2 * F}));
  EXPECT_EQ(inplace, dgu);
  EXPECT_EQ(dout_c, dout);

  // Shapes: an odd last dimension, a half of the wrong width or rows, a dgate_up too small.
  FVec odd(size_t(R) * 5), small(size_t(R) * (F - 1)), d_small(size_t(R) * F);
  EXPECT_THROW(be->swiglu_forward(view(odd, {R, 5}), view(y, {R, F})), brisk::Error);
  EXPECT_THROW(be->swiglu_forward(view(gu, {R, 2 * F}), view(small, {R, F - 1})), brisk::Error);
  EXPECT_THROW(be->swiglu_forward(view(gu, {R / 2, 4 * F}), view(y, {R, F})), brisk::Error);
  EXPECT_THROW(
      be->swiglu_backward(view(gu, {R, 2 * F}), view(dout_c, {R, F}), view(d_small, {R, F})),
      brisk::Error);
}

TEST(OpsTanh, ForwardAndBackward) {
  auto be = brisk::make_cpu_backend();
  std::mt19937 rng(5);
  const int M = 7, C = 13;
  FVec x = randn(size_t(M) * C, rng, 1.5f);
  FVec y(x.size(), -7.f);
  be->tanh_forward(view(x, {M, C}), view(y, {M, C}));
  Vec want(x.size());
  for (size_t i = 0; i < x.size(); ++i) want[i] = std::tanh(double(x[i]));
  EXPECT_TRUE(close(y, want, kElemFwdTol));

  const FVec dy = randn(x.size(), rng);
  const Vec dyd = to_d(dy);
  auto loss = [&](const Vec& v) {
    double s = 0;
    for (size_t i = 0; i < v.size(); ++i) s += std::tanh(v[i]) * dyd[i];
    return s;
  };
  const Vec want_dx = numeric_grad(to_d(x), loss);
  FVec dyc = dy, dx(x.size(), -7.f);
  be->tanh_backward(view(y, {M, C}), view(dyc, {M, C}), view(dx, {M, C}));
  EXPECT_TRUE(grad_close(to_d(dx), want_dx, kElemGradTol));
  be->tanh_backward(view(y, {M, C}), view(dyc, {M, C}), view(dyc, {M, C}));  // dx == dy
  EXPECT_TRUE(grad_close(to_d(dyc), want_dx, kElemGradTol));
}

TEST(OpsDropout, MatchesRngMask) {
  auto be = brisk::make_cpu_backend();
  std::mt19937 rng(6);
  const int M = 7, C = 13;
  const size_t n = size_t(M) * C;
  const float p = 0.3f;
  const RngKey key{0x1234'5678'9abcULL, (1ULL << 32) + 7, 3};
  const FVec x = randn(n, rng), r = randn(n, rng);
  Vec want_y(n), want_add(n);
  for (size_t e = 0; e < n; ++e) {
    const double m = kept(key, e, p) ? 1.0 / (1.0 - double(p)) : 0.0;
    want_y[e] = m * x[e];
    want_add[e] = x[e] + m * r[e];
  }
  FVec xc = x, y(n, -7.f);
  be->dropout_forward(view(xc, {M, C}), p, key, view(y, {M, C}));
  EXPECT_TRUE(close(y, want_y));
  be->dropout_forward(view(xc, {M, C}), p, key, view(xc, {M, C}));  // y == x
  EXPECT_TRUE(close(xc, want_y));

  FVec dyc = x, dx(n, -7.f);  // the backward applies the same mask
  be->dropout_backward(view(dyc, {M, C}), p, key, view(dx, {M, C}));
  EXPECT_TRUE(close(dx, want_y));
  be->dropout_backward(view(dyc, {M, C}), p, key, view(dyc, {M, C}));  // dx == dy
  EXPECT_TRUE(close(dyc, want_y));

  FVec xa = x, ra = r, ya(n, -7.f);
  be->dropout_add(view(xa, {M, C}), view(ra, {M, C}), p, key, view(ya, {M, C}));
  EXPECT_TRUE(close(ya, want_add));
  be->dropout_add(view(xa, {M, C}), view(ra, {M, C}), p, key, view(xa, {M, C}));  // y == x
  EXPECT_TRUE(close(xa, want_add));

  // Another site gives another mask.
  FVec x2 = x, y2(n);
  be->dropout_forward(view(x2, {M, C}), p, RngKey{key.seed, key.step, key.site + 1},
                      view(y2, {M, C}));
  EXPECT_NE(y2, y);
}

TEST(OpsDropout, ZeroProbabilityIsIdentity) {
  auto be = brisk::make_cpu_backend();
  std::mt19937 rng(7);
  const int n = 101;
  const RngKey key{9, 1, 2};
  FVec x = randn(n, rng), r = randn(n, rng), y(n, -7.f), dx(n, -7.f), ya(n, -7.f);
  be->dropout_forward(view(x, {n}), 0.f, key, view(y, {n}));
  EXPECT_EQ(y, x);
  be->dropout_backward(view(x, {n}), 0.f, key, view(dx, {n}));
  EXPECT_EQ(dx, x);
  be->dropout_add(view(x, {n}), view(r, {n}), 0.f, key, view(ya, {n}));
  for (int i = 0; i < n; ++i) EXPECT_EQ(ya[i], x[i] + r[i]);
}

TEST(OpsDropout, KeepRate) {
  auto be = brisk::make_cpu_backend();
  const int n = 1 << 20;
  FVec ones(n, 1.f), y(n);
  for (float p : {0.1f, 0.5f}) {
    be->dropout_forward(view(ones, {n}), p, RngKey{77, 5, 11}, view(y, {n}));
    int64_t kept_count = 0;
    const float s = 1.f / (1.f - p);
    for (float v : y) {
      if (v != 0.f) {
        ++kept_count;
        ASSERT_NEAR(v, s, 1e-6 * s);
      }
    }
    // Binomial standard deviation is below 5e-4 of n; allow about 6 of them.
    EXPECT_NEAR(double(kept_count) / n, 1.0 - p, 3e-3) << "p=" << p;
  }
}

TEST(OpsElementwise, AddFillCopy) {
  auto be = brisk::make_cpu_backend();
  std::mt19937 rng(8);
  const int n = 37;
  const FVec a = randn(n, rng), b = randn(n, rng);
  FVec y = a, x = b;
  be->add_inplace(view(y, {n}), view(x, {n}));
  for (int i = 0; i < n; ++i) EXPECT_EQ(y[i], a[i] + b[i]);
  EXPECT_EQ(x, b);

  be->fill(view(y, {n}), 2.5f);
  EXPECT_EQ(y, FVec(n, 2.5f));
  be->fill(view(y, {n}), 0.f);
  EXPECT_EQ(y, FVec(n, 0.f));

  be->copy(view(x, {n}), view(y, {n}));
  EXPECT_EQ(y, b);
  IVec is{1, -2, 3, 4}, id(4, 0);
  be->copy(view(is, {4}), view(id, {2, 2}));
  EXPECT_EQ(id, is);
}

TEST(OpsEmbedding, ForwardAndBackward) {
  auto be = brisk::make_cpu_backend();
  std::mt19937 rng(9);
  const int B = 2, T = 5, V = 6, C = 7, P = 8, NT = 2;  // position table longer than T
  IVec ids{1, 4, 1, 1, 0, 5, 4, 4, 2, 1};               // repeated ids must accumulate in backward
  IVec types{0, 0, 1, 1, 1, 0, 1, 0, 1, 0};
  FVec word = randn(size_t(V) * C, rng), pos = randn(size_t(P) * C, rng),
       tt = randn(size_t(NT) * C, rng);

  for (bool full : {true, false}) {
    SCOPED_TRACE(full ? "word+pos+type" : "word only");
    FVec out(size_t(B) * T * C, -7.f);
    be->embedding_forward(view(ids, {B, T}), view(word, {V, C}),
                          full ? view(pos, {P, C}) : Tensor(),
                          full ? view(types, {B, T}) : Tensor(),
                          full ? view(tt, {NT, C}) : Tensor(), view(out, {B, T, C}));
    Vec want(out.size());
    for (int bt = 0; bt < B * T; ++bt)
      for (int c = 0; c < C; ++c) {
        double v = word[ids[bt] * C + c];
        if (full) v += double(pos[(bt % T) * C + c]) + double(tt[types[bt] * C + c]);
        want[size_t(bt) * C + c] = v;
      }
    EXPECT_TRUE(close(out, want));

    // padding_idx 4 (three tokens, both sequences): nn.Embedding leaves that row's gradient
    // alone, while the positions and token types of those tokens still get theirs.
    for (int64_t pad : {int64_t{-1}, int64_t{4}}) {
      SCOPED_TRACE(::testing::Message() << "padding_idx=" << pad);
      FVec dout = randn(out.size(), rng);
      const FVec dw0 = randn(word.size(), rng), dp0 = randn(pos.size(), rng),
                 dt0 = randn(tt.size(), rng);
      FVec dw = dw0, dp = dp0, dt = dt0;
      be->embedding_backward(view(dout, {B, T, C}), view(ids, {B, T}), pad,
                             full ? view(types, {B, T}) : Tensor(), view(dw, {V, C}),
                             full ? view(dp, {P, C}) : Tensor(),
                             full ? view(dt, {NT, C}) : Tensor());
      Vec want_dw = to_d(dw0), want_dp = to_d(dp0), want_dt = to_d(dt0);
      for (int bt = 0; bt < B * T; ++bt)
        for (int c = 0; c < C; ++c) {
          const double g = dout[size_t(bt) * C + c];
          if (ids[bt] != pad) want_dw[ids[bt] * C + c] += g;
          if (full) {
            want_dp[(bt % T) * C + c] += g;
            want_dt[types[bt] * C + c] += g;
          }
        }
      EXPECT_TRUE(close(dw, want_dw));
      EXPECT_TRUE(close(dp, want_dp));  // rows >= T (and everything when empty) stay untouched
      EXPECT_TRUE(close(dt, want_dt));
      if (pad >= 0)
        EXPECT_TRUE(
            std::equal(dw.begin() + pad * C, dw.begin() + (pad + 1) * C, dw0.begin() + pad * C))
            << "the padding row's gradient changed";
    }
  }
}

TEST(OpsEmbedding, OutOfRangeIdsThrow) {
  auto be = brisk::make_cpu_backend();
  std::mt19937 rng(10);
  const int B = 1, T = 3, V = 4, C = 5, NT = 2;
  FVec word = randn(size_t(V) * C, rng), pos = randn(size_t(T) * C, rng),
       tt = randn(size_t(NT) * C, rng), out(size_t(B) * T * C);
  IVec good_types{0, 1, 0};
  for (IVec ids : {IVec{0, 4, 1}, IVec{0, -1, 1}}) {
    EXPECT_THROW(be->embedding_forward(view(ids, {B, T}), view(word, {V, C}), Tensor(), Tensor(),
                                       Tensor(), view(out, {B, T, C})),
                 brisk::Error);
  }
  IVec ids{0, 1, 2}, bad_types{0, 2, 0};
  EXPECT_THROW(
      be->embedding_forward(view(ids, {B, T}), view(word, {V, C}), view(pos, {T, C}),
                            view(bad_types, {B, T}), view(tt, {NT, C}), view(out, {B, T, C})),
      brisk::Error);
  // A position table shorter than the sequence.
  EXPECT_THROW(
      be->embedding_forward(view(ids, {B, T}), view(word, {V, C}), view(pos, {T - 1, C}),
                            view(good_types, {B, T}), view(tt, {NT, C}), view(out, {B, T, C})),
      brisk::Error);
  // A padding_idx outside the word table (-1 means none; other negatives are refused).
  FVec dw(word.size(), 0.f);
  for (int64_t pad : {int64_t{V}, int64_t{-2}})
    EXPECT_THROW(be->embedding_backward(view(out, {B, T, C}), view(ids, {B, T}), pad, Tensor(),
                                        view(dw, {V, C}), Tensor(), Tensor()),
                 brisk::Error)
        << "padding_idx " << pad;
}

// Incremental decoding: prompt and new tokens fed in chunks over a key/value cache give each
// query the causal attention of the whole sequence (the fp64 reference), and the cache holds
// every position's key and value; at the usual scale 1/sqrt(D) and at another.
TEST(OpsAttention, DecodeOverACacheEqualsCausalAttention) {
  auto be = brisk::make_cpu_backend();
  std::mt19937 rng(12);
  const int B = 2, T = 9, H = 3, D = 5, C = H * D, S = 12;
  for (float scale : {1.f / std::sqrt(float(D)), 1.f}) {
    SCOPED_TRACE(::testing::Message() << "scale=" << scale);
    FVec qkv = randn(size_t(B) * T * 3 * C, rng);
    const Vec want = ref_attention(to_d(qkv), IVec(), true, B, T, H, D, scale, 0.f, RngKey{});
    FVec kc(size_t(B) * S * C, 0.f), vc(kc.size(), 0.f);
    int past = 0;
    for (int n : {4, 1, 4}) {  // a prompt, one token, then a chunk
      FVec chunk(size_t(B) * n * 3 * C), out(size_t(B) * n * C, -7.f);
      for (int b = 0; b < B; ++b)
        std::copy_n(&qkv[(size_t(b) * T + past) * 3 * C], size_t(n) * 3 * C,
                    &chunk[size_t(b) * n * 3 * C]);
      be->attention_decode(view(chunk, {B, n, 3 * C}), view(kc, {B, S, C}), view(vc, {B, S, C}),
                           past, H, H, scale, view(out, {B, n, C}));
      Vec want_chunk;
      for (int b = 0; b < B; ++b)
        want_chunk.insert(want_chunk.end(), want.begin() + (size_t(b) * T + past) * C,
                          want.begin() + (size_t(b) * T + past + n) * C);
      EXPECT_TRUE(close(out, want_chunk)) << "positions " << past << ".." << past + n;
      past += n;
    }
    for (int b = 0; b < B; ++b)
      for (int t = 0; t < S; ++t)
        for (int c = 0; c < C; ++c) {
          const size_t at = (size_t(b) * S + t) * C + c;
          const size_t src = (size_t(b) * T + t) * 3 * C + c;
          EXPECT_EQ(kc[at], t < T ? qkv[src + C] : 0.f);
          EXPECT_EQ(vc[at], t < T ? qkv[src + 2 * C] : 0.f);
        }
    // Past the cache's end: refused.
    FVec one(size_t(B) * 3 * C, 0.f), out(size_t(B) * C);
    EXPECT_THROW(be->attention_decode(view(one, {B, 1, 3 * C}), view(kc, {B, S, C}),
                                      view(vc, {B, S, C}), S, H, H, scale, view(out, {B, 1, C})),
                 brisk::Error);
  }
}

// Scales: the usual 1/sqrt(D), 1 (GPT-2 with scale_attn_weights = false) and 1/(3 sqrt(D))
// (GPT-2's scale_attn_by_inverse_layer_idx in its third layer).
TEST(OpsAttention, ForwardAndBackward) {
  auto be = brisk::make_cpu_backend();
  std::mt19937 rng(11);
  const int B = 2, T = 5, H = 3, D = 4, C = H * D;
  const RngKey key{42, 3, 5};
  // Zeros at the end of each row; key 0 is always kept, so no query sees an empty row. Any
  // nonzero value keeps a key.
  IVec mask{1, 1, 1, 0, 0, 1, 2, 1, 1, 0};
  const float usual = 1.f / std::sqrt(float(D));
  for (float scale : {usual, 1.f, usual / 3})
    for (bool use_mask : {false, true})
      for (bool causal : {false, true})
        for (float p : {0.f, 0.3f}) {
          SCOPED_TRACE(::testing::Message() << "scale=" << scale << " mask=" << use_mask
                                            << " causal=" << causal << " dropout_p=" << p);
          const IVec& m = use_mask ? mask : IVec();
          FVec qkv = randn(size_t(B) * T * 3 * C, rng);
          FVec probs(size_t(B) * H * T * T, -7.f), out(size_t(B) * T * C, -7.f);
          FVec fwd_scratch(probs.size(), -7.f);
          be->attention_forward(view(qkv, {B, T, 3 * C}), use_mask ? view(mask, {B, T}) : Tensor(),
                                causal, H, H, scale, p, key, view(probs, {B, H, T, T}),
                                view(fwd_scratch, {B, H, T, T}), view(out, {B, T, C}));
          const Vec qd = to_d(qkv);
          Vec want_probs;
          EXPECT_TRUE(
              close(out, ref_attention(qd, m, causal, B, T, H, D, scale, p, key, &want_probs)));
          EXPECT_TRUE(close(probs, want_probs));

          FVec dout = randn(out.size(), rng);
          FVec scratch(probs.size(), -7.f), dqkv = randn(qkv.size(), rng);  // overwritten
          be->attention_backward(view(dout, {B, T, C}), view(qkv, {B, T, 3 * C}),
                                 view(out, {B, T, C}), view(probs, {B, H, T, T}),
                                 use_mask ? view(mask, {B, T}) : Tensor(), causal, H, H, scale, p,
                                 key, view(scratch, {B, H, T, T}), view(dqkv, {B, T, 3 * C}));
          const Vec gd = to_d(dout);
          auto loss = [&](const Vec& v) {
            return dot(ref_attention(v, m, causal, B, T, H, D, scale, p, key), gd);
          };
          EXPECT_TRUE(grad_close(to_d(dqkv), numeric_grad(qd, loss)));
        }
}

// Grouped-query attention: K key/value heads shared by H/K query heads each, ratios 1, 2 and 3
// and multi-query (K = 1), odd head widths; forward against the fp64 reference, backward by finite
// differences (a shared key/value head collects the gradient of its whole group).
TEST(OpsAttention, GroupedQueryForwardAndBackward) {
  auto be = brisk::make_cpu_backend();
  std::mt19937 rng(20);
  const int B = 2, T = 5;
  const RngKey key{7, 1, 9};
  IVec mask{1, 1, 1, 0, 0, 1, 1, 1, 1, 1};
  struct Heads {
    int H, K, D;
  };
  for (const Heads& hk : {Heads{3, 3, 5}, Heads{4, 2, 3}, Heads{6, 2, 5}, Heads{3, 1, 4}})
    for (bool causal : {false, true})
      for (float p : {0.f, 0.2f}) {
        const int H = hk.H, K = hk.K, D = hk.D, C = H * D, W = (H + 2 * K) * D;
        SCOPED_TRACE(::testing::Message() << "H=" << H << " K=" << K << " D=" << D
                                          << " causal=" << causal << " dropout_p=" << p);
        const float scale = 1.f / std::sqrt(float(D));
        FVec qkv = randn(size_t(B) * T * W, rng);
        FVec probs(size_t(B) * H * T * T, -7.f), scratch(probs.size(), -7.f);
        FVec out(size_t(B) * T * C, -7.f);
        be->attention_forward(view(qkv, {B, T, W}), view(mask, {B, T}), causal, H, K, scale, p, key,
                              view(probs, {B, H, T, T}), view(scratch, {B, H, T, T}),
                              view(out, {B, T, C}));
        const Vec qd = to_d(qkv);
        Vec want_probs;
        EXPECT_TRUE(close(
            out, ref_gqa_attention(qd, mask, causal, B, T, H, K, D, scale, p, key, &want_probs)));
        EXPECT_TRUE(close(probs, want_probs));

        FVec dout = randn(out.size(), rng), dqkv = randn(qkv.size(), rng);  // overwritten
        be->attention_backward(view(dout, {B, T, C}), view(qkv, {B, T, W}), view(out, {B, T, C}),
                               view(probs, {B, H, T, T}), view(mask, {B, T}), causal, H, K, scale,
                               p, key, view(scratch, {B, H, T, T}), view(dqkv, {B, T, W}));
        const Vec gd = to_d(dout);
        auto loss = [&](const Vec& v) {
          return dot(ref_gqa_attention(v, mask, causal, B, T, H, K, D, scale, p, key), gd);
        };
        EXPECT_TRUE(grad_close(to_d(dqkv), numeric_grad(qd, loss)));
      }
}

// transformers computes grouped-query attention as multi-head attention over repeat_kv'd keys and
// values: the same output, and the key/value gradients summed over each group.
TEST(OpsAttention, GroupedQueryEqualsMultiHeadOverRepeatedKeys) {
  auto be = brisk::make_cpu_backend();
  std::mt19937 rng(21);
  const int B = 2, T = 6, H = 6, K = 2, D = 4, G = H / K, C = H * D, W = (H + 2 * K) * D;
  const float scale = 0.4f;
  FVec qkv = randn(size_t(B) * T * W, rng), dout = randn(size_t(B) * T * C, rng);
  FVec wide = repeat_kv(qkv, B, T, H, K, D);
  FVec probs(size_t(B) * H * T * T), scratch(probs.size()), out(dout.size()), out_wide(dout.size());
  FVec dqkv(qkv.size()), dwide(wide.size());
  be->attention_forward(view(qkv, {B, T, W}), Tensor(), true, H, K, scale, 0.f, RngKey{},
                        view(probs, {B, H, T, T}), view(scratch, {B, H, T, T}),
                        view(out, {B, T, C}));
  be->attention_backward(view(dout, {B, T, C}), view(qkv, {B, T, W}), view(out, {B, T, C}),
                         view(probs, {B, H, T, T}), Tensor(), true, H, K, scale, 0.f, RngKey{},
                         view(scratch, {B, H, T, T}), view(dqkv, {B, T, W}));
  be->attention_forward(view(wide, {B, T, 3 * C}), Tensor(), true, H, H, scale, 0.f, RngKey{},
                        view(probs, {B, H, T, T}), view(scratch, {B, H, T, T}),
                        view(out_wide, {B, T, C}));
  be->attention_backward(view(dout, {B, T, C}), view(wide, {B, T, 3 * C}),
                         view(out_wide, {B, T, C}), view(probs, {B, H, T, T}), Tensor(), true, H, H,
                         scale, 0.f, RngKey{}, view(scratch, {B, H, T, T}),
                         view(dwide, {B, T, 3 * C}));
  EXPECT_EQ(out, out_wide) << "the same float32 operations per query head";
  Vec want(qkv.size(), 0.0);  // dq as is; dk, dv summed over the group
  for (int bt = 0; bt < B * T; ++bt)
    for (int h = 0; h < H; ++h)
      for (int e = 0; e < D; ++e) {
        const float* dw = &dwide[size_t(bt) * 3 * C];
        double* w = &want[size_t(bt) * W];
        w[h * D + e] = dw[h * D + e];
        w[C + (h / G) * D + e] += dw[C + h * D + e];
        w[C + K * D + (h / G) * D + e] += dw[2 * C + h * D + e];
      }
  EXPECT_TRUE(close(dqkv, want));
}

// Decoding over caches of the K key/value heads equals causal grouped-query attention.
TEST(OpsAttention, GroupedQueryDecodeEqualsCausalAttention) {
  auto be = brisk::make_cpu_backend();
  std::mt19937 rng(22);
  const int B = 2, T = 7, H = 6, K = 2, D = 3, C = H * D, KD = K * D, W = C + 2 * KD, S = 9;
  const float scale = 1.f / std::sqrt(float(D));
  FVec qkv = randn(size_t(B) * T * W, rng);
  const Vec want = ref_gqa_attention(to_d(qkv), IVec(), true, B, T, H, K, D, scale, 0.f, RngKey{});
  FVec kc(size_t(B) * S * KD, 0.f), vc(kc.size(), 0.f);
  int past = 0;
  for (int n : {3, 1, 3}) {
    FVec chunk(size_t(B) * n * W), out(size_t(B) * n * C, -7.f);
    for (int b = 0; b < B; ++b)
      std::copy_n(&qkv[(size_t(b) * T + past) * W], size_t(n) * W, &chunk[size_t(b) * n * W]);
    be->attention_decode(view(chunk, {B, n, W}), view(kc, {B, S, KD}), view(vc, {B, S, KD}), past,
                         H, K, scale, view(out, {B, n, C}));
    Vec want_chunk;
    for (int b = 0; b < B; ++b)
      want_chunk.insert(want_chunk.end(), want.begin() + (size_t(b) * T + past) * C,
                        want.begin() + (size_t(b) * T + past + n) * C);
    EXPECT_TRUE(close(out, want_chunk)) << "positions " << past << ".." << past + n;
    past += n;
  }
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int c = 0; c < KD; ++c) {
        const size_t at = (size_t(b) * S + t) * KD + c, src = (size_t(b) * T + t) * W + C + c;
        EXPECT_EQ(kc[at], qkv[src]);
        EXPECT_EQ(vc[at], qkv[src + KD]);
      }
}

TEST(OpsAttention, UnevenHeadGroupsAreRefused) {
  auto be = brisk::make_cpu_backend();
  const int B = 1, T = 2, D = 2;
  FVec qkv(size_t(B) * T * 14 * D, 0.5f), probs(size_t(B) * 4 * T * T), scratch(probs.size());
  FVec out(size_t(B) * T * 4 * D), kc(size_t(B) * T * 3 * D), vc(kc.size());
  // 4 query heads over 3 key/value heads: the packed width fits (4 + 2*3 heads), the groups do not.
  FVec q10(size_t(B) * T * 10 * D, 0.5f);
  EXPECT_THROW(be->attention_forward(view(q10, {B, T, 10 * D}), Tensor(), false, 4, 3, 1.f, 0.f,
                                     RngKey{}, view(probs, {B, 4, T, T}),
                                     view(scratch, {B, 4, T, T}), view(out, {B, T, 4 * D})),
               brisk::Error);
  EXPECT_THROW(be->attention_forward(view(qkv, {B, T, 14 * D}), Tensor(), false, 4, 0, 1.f, 0.f,
                                     RngKey{}, view(probs, {B, 4, T, T}),
                                     view(scratch, {B, 4, T, T}), view(out, {B, T, 4 * D})),
               brisk::Error);
  // Packed width that does not match the head counts: 14 * D columns for 4 + 2 * 2 heads.
  EXPECT_THROW(be->attention_backward(view(out, {B, T, 4 * D}), view(qkv, {B, T, 14 * D}),
                                      view(out, {B, T, 4 * D}), view(probs, {B, 4, T, T}), Tensor(),
                                      false, 4, 2, 1.f, 0.f, RngKey{}, view(scratch, {B, 4, T, T}),
                                      view(qkv, {B, T, 14 * D})),
               brisk::Error);
  // Caches must hold K * D columns, not H * D.
  FVec q8(size_t(B) * T * 8 * D, 0.5f), wide_cache(size_t(B) * T * 4 * D);
  EXPECT_THROW(
      be->attention_decode(view(q8, {B, T, 8 * D}), view(wide_cache, {B, T, 4 * D}),
                           view(wide_cache, {B, T, 4 * D}), 0, 4, 2, 1.f, view(out, {B, T, 4 * D})),
      brisk::Error);
}

TEST(OpsAttention, NonFiniteScaleIsRefused) {
  auto be = brisk::make_cpu_backend();
  const int B = 1, T = 2, H = 1, D = 2, C = H * D;
  FVec qkv(size_t(B) * T * 3 * C, 0.5f), probs(size_t(B) * H * T * T), scratch(probs.size());
  FVec out(size_t(B) * T * C), dqkv(qkv.size()), kc(size_t(B) * T * C), vc(kc.size());
  for (float scale : {std::numeric_limits<float>::quiet_NaN(), INFINITY}) {
    EXPECT_THROW(be->attention_forward(view(qkv, {B, T, 3 * C}), Tensor(), false, H, H, scale, 0.f,
                                       RngKey{}, view(probs, {B, H, T, T}),
                                       view(scratch, {B, H, T, T}), view(out, {B, T, C})),
                 brisk::Error);
    EXPECT_THROW(
        be->attention_backward(view(out, {B, T, C}), view(qkv, {B, T, 3 * C}), view(out, {B, T, C}),
                               view(probs, {B, H, T, T}), Tensor(), false, H, H, scale, 0.f,
                               RngKey{}, view(scratch, {B, H, T, T}), view(dqkv, {B, T, 3 * C})),
        brisk::Error);
    EXPECT_THROW(be->attention_decode(view(qkv, {B, T, 3 * C}), view(kc, {B, T, C}),
                                      view(vc, {B, T, C}), 0, H, H, scale, view(out, {B, T, C})),
                 brisk::Error);
  }
}

TEST(OpsFirstToken, ForwardAndBackward) {
  auto be = brisk::make_cpu_backend();
  std::mt19937 rng(12);
  const int B = 2, T = 5, C = 7;
  FVec x = randn(size_t(B) * T * C, rng), out(size_t(B) * C, -7.f);
  be->first_token(view(x, {B, T, C}), view(out, {B, C}));
  for (int b = 0; b < B; ++b)
    for (int c = 0; c < C; ++c) EXPECT_EQ(out[b * C + c], x[(b * T) * C + c]);

  FVec dout = randn(out.size(), rng);
  const FVec dx0 = randn(x.size(), rng);
  FVec dx = dx0;
  be->first_token_backward(view(dout, {B, C}), view(dx, {B, T, C}));
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int c = 0; c < C; ++c) {
        const size_t i = (size_t(b) * T + t) * C + c;
        EXPECT_EQ(dx[i], t == 0 ? dx0[i] + dout[b * C + c] : dx0[i]);
      }
}

// The summed loss softmax_cross_entropy adds to its float64 accumulator.
double cross_entropy(brisk::Backend& be, FVec& logits, IVec& labels, int N, int V, bool write_grad,
                     float scale) {
  double loss_sum = 0.0;
  be.softmax_cross_entropy(view(logits, {N, V}), view(labels, {N}), write_grad, scale,
                           brisk::Tensor(&loss_sum, brisk::Shape{1}, brisk::DType::f64));
  return loss_sum;
}

TEST(OpsCrossEntropy, LossAndGradient) {
  auto be = brisk::make_cpu_backend();
  std::mt19937 rng(13);
  const int N = 7, V = 11;
  IVec labels{3, brisk::kIgnoreIndex, 0, 10, 5, brisk::kIgnoreIndex, 7};
  const int count = 5;
  const FVec logits0 = randn(size_t(N) * V, rng, 2.f);
  const Vec ld = to_d(logits0);
  const double want = ref_cross_entropy(ld, labels, N, V);

  FVec logits = logits0;
  const double loss = cross_entropy(*be, logits, labels, N, V, false, 1.f);
  EXPECT_NEAR(loss, want, kFwdTol * std::max(1.0, std::abs(want)));
  EXPECT_EQ(logits, logits0);  // untouched without write_grad

  const float scale = 1.f / count;
  const double loss2 = cross_entropy(*be, logits, labels, N, V, true, scale);
  EXPECT_NEAR(loss2, want, kFwdTol * std::max(1.0, std::abs(want)));
  auto scaled_loss = [&](const Vec& v) {
    return double(scale) * ref_cross_entropy(v, labels, N, V);
  };
  EXPECT_TRUE(grad_close(to_d(logits), numeric_grad(ld, scaled_loss)));
  for (int v = 0; v < V; ++v) {  // ignored rows get exactly zero
    EXPECT_EQ(logits[1 * V + v], 0.f);
    EXPECT_EQ(logits[5 * V + v], 0.f);
  }

  // All rows ignored: zero loss, zero gradient.
  IVec none(N, brisk::kIgnoreIndex);
  logits = logits0;
  EXPECT_EQ(cross_entropy(*be, logits, none, N, V, true, 1.f), 0.0);
  EXPECT_EQ(logits, FVec(logits.size(), 0.f));
}

TEST(OpsMseLoss, LossAndGradient) {
  auto be = brisk::make_cpu_backend();
  std::mt19937 rng(15);
  const int N = 6;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  FVec targets = randn(N, rng, 1.5f);
  targets[2] = nan;  // a row without a label
  const FVec pred0 = randn(N, rng, 2.f);
  auto ref = [&](const Vec& p) {  // fp64 reference: the summed squared error of labelled rows
    double sum = 0;
    for (int r = 0; r < N; ++r)
      if (!std::isnan(targets[r])) sum += (p[r] - double(targets[r])) * (p[r] - double(targets[r]));
    return sum;
  };
  auto run = [&](FVec& p, bool write_grad, float scale) {
    double loss_sum = 0.0;
    be->mse_loss(view(p, {static_cast<int>(p.size()), 1}), view(targets, {N}), write_grad, scale,
                 brisk::Tensor(&loss_sum, brisk::Shape{1}, brisk::DType::f64));
    return loss_sum;
  };
  const double want = ref(to_d(pred0));
  FVec pred = pred0;
  EXPECT_NEAR(run(pred, false, 1.f), want, kFwdTol * std::max(1.0, want));
  EXPECT_EQ(pred, pred0);  // untouched without write_grad
  const float scale = 1.f / 5;
  EXPECT_NEAR(run(pred, true, scale), want, kFwdTol * std::max(1.0, want));
  auto scaled = [&](const Vec& v) { return double(scale) * ref(v); };
  EXPECT_TRUE(grad_close(to_d(pred), numeric_grad(to_d(pred0), scaled)));
  EXPECT_EQ(pred[2], 0.f);  // the unlabelled row gets exactly zero

  FVec wrong(N + 1, 0.f);
  EXPECT_THROW(run(wrong, false, 1.f), brisk::Error);
}

TEST(OpsCrossEntropy, OutOfRangeLabelThrows) {
  auto be = brisk::make_cpu_backend();
  std::mt19937 rng(14);
  const int N = 3, V = 4;
  for (IVec labels : {IVec{0, 4, 1}, IVec{0, -1, 1}}) {
    FVec logits = randn(size_t(N) * V, rng);
    EXPECT_THROW(cross_entropy(*be, logits, labels, N, V, true, 1.f), brisk::Error);
  }
}
