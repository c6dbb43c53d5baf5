// What the conformance suite's table (conformance/op_case.h) does not express: the ops' refusals
// of bad shapes and arguments, the rotary tables against transformers', positions read from the
// table, dropout's keep rate and sites, and grouped-query attention equal to multi-head attention
// over repeated keys.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "backend/activation.h"
#include "backend/backend.h"
#include "backend/cpu/cpu_avx512.h"
#include "backend/cpu/cpu_exp.h"
#include "backend/rope.h"
#include "backend_support.h"
#include "core/error.h"
#include "core/json_file.h"
#include "core/random_init.h"
#include "core/rng.h"
#include "core/tensor.h"

namespace {

using brisk::DType;
using brisk::RngKey;
using brisk::Shape;
using brisk::Tensor;
using Vec = std::vector<double>;
using FVec = std::vector<float>;
using IVec = std::vector<int32_t>;

constexpr double kFwdTol = 1e-5;  // |got - want| / max(1, |want|), element by element

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

}  // namespace

// ---------------------------------------------------------------------------------------------

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

// The router's shapes (k above the experts, int32 experts, the rows' counts) and experts out of
// range in backward are refused by name.
TEST(OpsMoeRoute, BadShapesAndExpertsAreRefused) {
  auto be = brisk::make_cpu_backend();
  const int N = 3, E = 4;
  FVec z(N * E, 0.5f), p(N * E), w(N * (E + 1)), dw(N * (E + 1)), dz(N * E);
  std::vector<int32_t> x(N * (E + 1), 0);
  const Tensor experts(x.data(), Shape{N, 2}, DType::i32);
  brisk::testing::expect_error(
      [&] {
        be->moe_route_forward(view(z, {N, E}), true, view(p, {N, E}), view(w, {N, E + 1}),
                              Tensor(x.data(), Shape{N, E + 1}, DType::i32));
      },
      "5 experts per token of 4");
  brisk::testing::expect_error(
      [&] {
        be->moe_route_forward(view(z, {N, E}), true, view(p, {N, E}), view(w, {N, 2}),
                              Tensor(x.data(), Shape{N, 2}, DType::f32));
      },
      "are not float32 and int32");
  brisk::testing::expect_error(
      [&] {
        be->moe_route_forward(view(z, {N, E - 1}), true, view(p, {N, E}), view(w, {N, 2}), experts);
      },
      "logits");
  x[3] = E;  // token 1's second expert
  brisk::testing::expect_error(
      [&] {
        be->moe_route_backward(view(p, {N, E}), view(w, {N, 2}), experts, view(dw, {N, 2}),
                               Tensor(), true, view(dz, {N, E}));
      },
      "expert 4 of 4");
}

TEST(OpsMoeDispatch, BadShapesExpertsAndPositionsAreRefused) {
  auto be = brisk::make_cpu_backend();
  const int N = 3, k = 2, E = 4, C = 5;
  std::vector<int32_t> x{0, 1, 2, 3, 1, 2}, counts(E), pos(N * k);
  FVec in(N * C), rows(N * k * C), y(N * C), w(N * k), dw(N * k), drows(N * k * C);
  const Tensor experts(x.data(), Shape{N, k}, DType::i32);
  const Tensor positions(pos.data(), Shape{N, k}, DType::i32);
  auto dispatch = [&](int64_t num_experts, const Tensor& c) {
    be->moe_dispatch(experts, num_experts, c, positions);
  };
  brisk::testing::expect_error(
      [&] { dispatch(E, Tensor(counts.data(), Shape{E - 1}, DType::i32)); }, "counts");
  brisk::testing::expect_error([&] { dispatch(0, Tensor(counts.data(), Shape{0}, DType::i32)); },
                               "experts >= 1");
  brisk::testing::expect_error(
      [&] {
        be->moe_dispatch(experts, E, Tensor(counts.data(), Shape{E}, DType::i32),
                         Tensor(pos.data(), Shape{k, N}, DType::i32));
      },
      "positions");
  x[3] = E;
  brisk::testing::expect_error([&] { dispatch(E, Tensor(counts.data(), Shape{E}, DType::i32)); },
                               "expert 4 of 4");
  x[3] = -1;  // what routing NaN probabilities picks
  brisk::testing::expect_error([&] { dispatch(E, Tensor(counts.data(), Shape{E}, DType::i32)); },
                               "the router's probabilities are NaN");
  x[3] = 3;
  dispatch(E, Tensor(counts.data(), Shape{E}, DType::i32));
  EXPECT_EQ(counts, (std::vector<int32_t>{1, 2, 2, 1}));
  EXPECT_EQ(pos, (std::vector<int32_t>{0, 1, 3, 5, 2, 4}));
  brisk::testing::expect_error(
      [&] {
        be->moe_gather(view(in, {N, C}), positions, view(rows, {N * k, C - 1}));
      },
      "rows");
  brisk::testing::expect_error(
      [&] {
        be->moe_combine(view(rows, {N * k, C}), positions, view(w, {N, k - 1}), view(y, {N, C}),
                        false);
      },
      "weights");
  brisk::testing::expect_error(
      [&] {
        be->moe_combine_backward(view(y, {N, C}), view(rows, {N * k, C}), positions, Tensor(),
                                 view(drows, {N * k, C}), view(dw, {N, k}));
      },
      "both needed");
  brisk::testing::expect_error(
      [&] {
        be->moe_gather(view(in, {N, C}), Tensor(), view(rows, {N * k, C}));
      },
      "no positions");
  pos[2] = N * k;
  brisk::testing::expect_error(
      [&] {
        be->moe_gather(view(in, {N, C}), positions, view(rows, {N * k, C}));
      },
      "position 6 is not one of 6 routed rows");
}

TEST(OpsMoeBalance, BadShapesAreRefused) {
  auto be = brisk::make_cpu_backend();
  const int N = 3, k = 2, E = 4;
  std::vector<int32_t> x{0, 1, 2, 3, 1, 4}, mask{1, 0, 1};
  FVec p(N * E), stats(2 * E), scale(E), dp(N * E);
  const Tensor experts(x.data(), Shape{N, k}, DType::i32), m(mask.data(), Shape{N}, DType::i32);
  brisk::testing::expect_error(
      [&] {
        be->moe_balance_stats(view(p, {N, E}), experts, m, view(stats, {E}));
      },
      "statistics");
  brisk::testing::expect_error(
      [&] {
        be->moe_balance_stats(view(p, {N, E}), experts, Tensor(mask.data(), Shape{2}, DType::i32),
                              view(stats, {2, E}));
      },
      "mask");
  brisk::testing::expect_error(
      [&] {
        be->moe_balance_stats(view(p, {N, E}), experts, m, view(stats, {2, E}));
      },
      "expert 4 of 4");
  brisk::testing::expect_error(
      [&] {
        be->moe_balance_backward(m, view(scale, {E - 1}), view(dp, {N, E}));
      },
      "scale");
  FVec logits(N * E), z(N), sum(1);
  brisk::testing::expect_error(
      [&] {
        be->moe_z_stats(view(logits, {N, E}), m, view(z, {N - 1}), view(sum, {1}));
      },
      "z");
  brisk::testing::expect_error(
      [&] {
        be->moe_z_stats(view(logits, {N, E}), m, view(z, {N}), view(stats, {2}));
      },
      "sum");
  brisk::testing::expect_error(
      [&] {
        be->moe_z_backward(view(p, {N, E}), view(z, {N}), 1.0f, view(dp, {N, E - 1}));
      },
      "dlogits");
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
  be->rotary_forward(view(whole, {1, 3, W}), H, K, view(cos, {P, D / 2}), view(sin, {P, D / 2}), 2,
                     Tensor());
  for (int t0 = 0; t0 < 3; ++t0) {  // one token at a time
    FVec one(x0.begin() + t0 * W, x0.begin() + (t0 + 1) * W);
    be->rotary_forward(view(one, {1, 1, W}), H, K, view(cos, {P, D / 2}), view(sin, {P, D / 2}),
                       2 + t0, Tensor());
    for (int j = 0; j < W; ++j) EXPECT_EQ(one[j], whole[t0 * W + j]) << t0 << ", " << j;
  }
  FVec at0 = x0;
  be->rotary_forward(view(at0, {1, 3, W}), H, K, view(cos, {P, D / 2}), view(sin, {P, D / 2}), 0,
                     Tensor());
  for (int j = 0; j < W; ++j) EXPECT_EQ(at0[j], x0[j]) << "position 0 rotates by nothing";
}

TEST(OpsRotary, MismatchedShapesAreRefused) {
  auto be = brisk::make_cpu_backend();
  const int B = 1, T = 3, H = 2, K = 1, D = 4, W = (H + 2 * K) * D, P = 5;
  FVec x(size_t(B) * T * W, 1.f), cos(size_t(P) * D, 1.f), sin(cos.size(), 0.f);
  const Tensor q = view(x, {B, T, W}), c = view(cos, {P, D / 2}), s = view(sin, {P, D / 2});
  const Tensor none;
  EXPECT_THROW(be->rotary_forward(q, H, K, c, s, 3, none), brisk::Error);   // positions 3..5 of 5
  EXPECT_THROW(be->rotary_forward(q, H, K, c, s, -1, none), brisk::Error);  // negative position
  EXPECT_THROW(be->rotary_forward(q, H, 2, c, s, 0, none), brisk::Error);   // 16 columns, 6 heads
  EXPECT_THROW(be->rotary_forward(q, 0, K, c, s, 0, none), brisk::Error);
  EXPECT_THROW(be->rotary_backward(q, H, K, view(cos, {P, D}), view(sin, {P, D}), 0, none),
               brisk::Error);  // table width D, not D/2
  EXPECT_THROW(
      be->rotary_forward(view(x, {B, T, W}), 3, 1, view(cos, {P, 1}), view(sin, {P, 1}), 0, none),
      brisk::Error);                  // 16 columns over 5 heads
  FVec odd(size_t(B) * T * 12, 1.f);  // H = 2, K = 1: four heads of width 3
  EXPECT_THROW(be->rotary_forward(view(odd, {B, T, 12}), 2, 1, view(cos, {P, 1}), view(sin, {P, 1}),
                                  0, none),
               brisk::Error);
  // A packed batch's positions: each a row of the tables, one per token, from position 0.
  IVec past{0, 1, P}, short_of{0, 1}, fine{0, 1, 0};
  EXPECT_THROW(be->rotary_forward(q, H, K, c, s, 0, view(past, {T})), brisk::Error);
  EXPECT_THROW(be->rotary_backward(q, H, K, c, s, 0, view(short_of, {T - 1})), brisk::Error);
  EXPECT_THROW(be->rotary_forward(q, H, K, c, s, 1, view(fine, {T})), brisk::Error);
  EXPECT_EQ(x, FVec(x.size(), 1.f)) << "a refused call changes nothing";
}

// rng_blocks (16 groups at once: the CPU's dropout masks and stochastic rounding) gives
// rng_block's words for every group, with counters whose low word carries into the high one
// within the 16, steps and seeds with high bits, and sites at both ends.
TEST(OpsDropout, RngBlocksEqualRngBlock) {
  const uint64_t firsts[] = {0, 5, 0xfffffff8u, 0x123456789abcULL, ~uint64_t{0} - 20};
  const RngKey keys[] = {RngKey{0, 0, 0}, RngKey{77, 5, 11},
                         RngKey{0xfedcba9876543210ULL, 0x1234567890ULL, 0xffffffffu}};
  for (const RngKey& key : keys)
    for (const uint64_t first : firsts) {
      uint32_t words[4 * brisk::kPhiloxLanes];
      brisk::rng_blocks(key, first, words);
      for (int l = 0; l < brisk::kPhiloxLanes; ++l) {
        const brisk::Philox4 want = brisk::rng_block(key, first + static_cast<uint64_t>(l));
        for (int j = 0; j < 4; ++j)
          ASSERT_EQ(words[4 * l + j], want.v[j])
              << "seed " << key.seed << " step " << key.step << " site " << key.site << " group "
              << first + static_cast<uint64_t>(l) << " word " << j;
      }
    }
}

// The initial weights' normals (core/random_init.h): each value against Box-Muller in fp64 over
// the same Philox words (offsets at every position in a group and a 64-value block, seeds and
// streams with high bits, the standard deviation applied); a tensor filled in pieces of any size
// equals one filled whole on all threads, bit for bit; and the values look standard normal.
double init_normal_fp64(uint64_t seed, uint32_t stream, int64_t e) {
  const brisk::Philox4 w =
      brisk::rng_block(RngKey{seed, brisk::kInitRngStep, stream}, static_cast<uint64_t>(e) / 4);
  const int pair = static_cast<int>(e % 4) / 2;
  const double u1 = static_cast<double>(static_cast<float>(w.v[2 * pair] | 1u)) * 0x1p-32;
  const double u2 = static_cast<double>(w.v[2 * pair + 1]) * 0x1p-32;
  const double r = std::sqrt(-2.0 * std::log(u1)), theta = 2.0 * M_PI * u2;
  return e % 2 == 0 ? r * std::cos(theta) : r * std::sin(theta);
}

TEST(OpsInit, NormalsFollowBoxMullerInFp64) {
  for (const auto& [seed, stream] :
       {std::pair<uint64_t, uint32_t>{42, 0}, {7, 13}, {0xfedcba9876543210ULL, 0xffffffffu}})
    for (const int64_t first :
         {int64_t{0}, int64_t{1}, int64_t{3}, int64_t{61}, int64_t{1000003}}) {
      const int64_t n = 203;
      FVec z(n);
      brisk::fill_normal(seed, stream, first, n, 0.02f, z.data());
      for (int64_t i = 0; i < n; ++i) {
        const double want = 0.02 * init_normal_fp64(seed, stream, first + i);
        ASSERT_NEAR(z[i], want, 2e-7 * std::max(1.0, std::fabs(want) / 0.02))
            << "seed " << seed << " stream " << stream << " element " << first + i;
      }
    }
}

TEST(OpsInit, NormalsInPiecesEqualTheWholeOnEveryThread) {
  const int64_t n = 300007;  // parallel when whole, serial in pieces
  FVec whole(n), pieces(n);
  brisk::fill_normal(9, 4, 0, n, 1.f, whole.data());
  int64_t at = 0;
  for (const int64_t size : {int64_t{1}, int64_t{2}, int64_t{63}, int64_t{65}, int64_t{4097}}) {
    brisk::fill_normal(9, 4, at, size, 1.f, pieces.data() + at);
    at += size;
  }
  for (; at < n; at += 70001)
    brisk::fill_normal(9, 4, at, std::min<int64_t>(70001, n - at), 1.f, pieces.data() + at);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(whole[i], pieces[i]) << i;
  // Moments and tails of a standard normal, within ~5 standard errors at this count.
  double sum = 0, squares = 0, beyond = 0, largest = 0;
  for (float v : whole) {
    sum += v;
    squares += double{v} * v;
    beyond += std::fabs(v) > 1.959964f;
    largest = std::max(largest, double{std::fabs(v)});
  }
  EXPECT_NEAR(sum / n, 0.0, 0.01);
  EXPECT_NEAR(squares / n, 1.0, 0.015);
  EXPECT_NEAR(beyond / n, 0.05, 0.002);
  EXPECT_GT(largest, 3.5);
  EXPECT_LT(largest, 6.7);  // sqrt(-2 ln 2^-32): the largest value the 32-bit uniforms allow
  // Another stream or seed gives other values.
  FVec other(64);
  brisk::fill_normal(9, 5, 0, 64, 1.f, other.data());
  EXPECT_NE(other[0], whole[0]);
  brisk::fill_normal(10, 4, 0, 64, 1.f, other.data());
  EXPECT_NE(other[0], whole[0]);
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

TEST(OpsEmbedding, OutOfRangeIdsThrow) {
  auto be = brisk::make_cpu_backend();
  std::mt19937 rng(10);
  const int B = 1, T = 3, V = 4, C = 5, NT = 2;
  FVec word = randn(size_t(V) * C, rng), pos = randn(size_t(T) * C, rng),
       tt = randn(size_t(NT) * C, rng), out(size_t(B) * T * C);
  IVec good_types{0, 1, 0};
  for (IVec ids : {IVec{0, 4, 1}, IVec{0, -1, 1}}) {
    EXPECT_THROW(be->embedding_forward(view(ids, {B, T}), view(word, {V, C}), Tensor(), Tensor(),
                                       Tensor(), view(out, {B, T, C}), {}, Tensor()),
                 brisk::Error);
  }
  IVec ids{0, 1, 2}, bad_types{0, 2, 0};
  EXPECT_THROW(be->embedding_forward(view(ids, {B, T}), view(word, {V, C}), view(pos, {T, C}),
                                     view(bad_types, {B, T}), view(tt, {NT, C}),
                                     view(out, {B, T, C}), {}, Tensor()),
               brisk::Error);
  // A position table shorter than the sequence.
  EXPECT_THROW(be->embedding_forward(view(ids, {B, T}), view(word, {V, C}), view(pos, {T - 1, C}),
                                     view(good_types, {B, T}), view(tt, {NT, C}),
                                     view(out, {B, T, C}), {}, Tensor()),
               brisk::Error);
  // A packed batch's position past the table, or positions not one per token.
  IVec past{0, 1, T}, short_of{0, 1};
  EXPECT_THROW(be->embedding_forward(view(ids, {B, T}), view(word, {V, C}), view(pos, {T, C}),
                                     Tensor(), Tensor(), view(out, {B, T, C}), {}, view(past, {T})),
               brisk::Error);
  EXPECT_THROW(
      be->embedding_forward(view(ids, {B, T}), view(word, {V, C}), view(pos, {T, C}), Tensor(),
                            Tensor(), view(out, {B, T, C}), {}, view(short_of, {T - 1})),
      brisk::Error);
  // A padding_idx outside the word table (-1 means none; other negatives are refused).
  FVec dw(word.size(), 0.f);
  for (int64_t pad : {int64_t{V}, int64_t{-2}})
    EXPECT_THROW(be->embedding_backward(view(out, {B, T, C}), view(ids, {B, T}), pad, Tensor(),
                                        view(dw, {V, C}), Tensor(), Tensor(), {}, Tensor()),
                 brisk::Error)
        << "padding_idx " << pad;
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
  const brisk::AttentionBuffers ab = brisk::attention_buffers(brisk::Device::cpu, B, H, T, D);
  FVec stats(ab.stats.numel()), scratch(ab.scratch.numel()), out(dout.size()),
      out_wide(dout.size());
  FVec dqkv(qkv.size()), dwide(wide.size());
  be->attention_forward(view(qkv, {B, T, W}), Tensor(), true, H, K, scale, 0.f, RngKey{},
                        view(stats, ab.stats), view(scratch, ab.scratch), view(out, {B, T, C}));
  be->attention_backward(view(dout, {B, T, C}), view(qkv, {B, T, W}), view(out, {B, T, C}),
                         view(stats, ab.stats), Tensor(), true, H, K, scale, 0.f, RngKey{},
                         view(scratch, ab.scratch), view(dqkv, {B, T, W}), DType::f32, DType::f32);
  be->attention_forward(view(wide, {B, T, 3 * C}), Tensor(), true, H, H, scale, 0.f, RngKey{},
                        view(stats, ab.stats), view(scratch, ab.scratch),
                        view(out_wide, {B, T, C}));
  be->attention_backward(view(dout, {B, T, C}), view(wide, {B, T, 3 * C}),
                         view(out_wide, {B, T, C}), view(stats, ab.stats), Tensor(), true, H, H,
                         scale, 0.f, RngKey{}, view(scratch, ab.scratch),
                         view(dwide, {B, T, 3 * C}), DType::f32, DType::f32);
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

TEST(OpsAttention, UnevenHeadGroupsAreRefused) {
  auto be = brisk::make_cpu_backend();
  const int B = 1, T = 2, D = 2;
  FVec qkv(size_t(B) * T * 14 * D, 0.5f), stats(size_t(B) * 4 * T), scratch(stats.size());
  FVec out(size_t(B) * T * 4 * D), kc(size_t(B) * T * 3 * D), vc(kc.size());
  // 4 query heads over 3 key/value heads: the packed width fits (4 + 2*3 heads), the groups do not.
  FVec q10(size_t(B) * T * 10 * D, 0.5f);
  EXPECT_THROW(be->attention_forward(view(q10, {B, T, 10 * D}), Tensor(), false, 4, 3, 1.f, 0.f,
                                     RngKey{}, view(stats, {B, 4, T}), view(scratch, {B, 4, T}),
                                     view(out, {B, T, 4 * D})),
               brisk::Error);
  EXPECT_THROW(be->attention_forward(view(qkv, {B, T, 14 * D}), Tensor(), false, 4, 0, 1.f, 0.f,
                                     RngKey{}, view(stats, {B, 4, T}), view(scratch, {B, 4, T}),
                                     view(out, {B, T, 4 * D})),
               brisk::Error);
  // Packed width that does not match the head counts: 14 * D columns for 4 + 2 * 2 heads.
  EXPECT_THROW(be->attention_backward(view(out, {B, T, 4 * D}), view(qkv, {B, T, 14 * D}),
                                      view(out, {B, T, 4 * D}), view(stats, {B, 4, T}), Tensor(),
                                      false, 4, 2, 1.f, 0.f, RngKey{}, view(scratch, {B, 4, T}),
                                      view(qkv, {B, T, 14 * D}), DType::f32, DType::f32),
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
  const brisk::AttentionBuffers ab = brisk::attention_buffers(brisk::Device::cpu, B, H, T, D);
  FVec qkv(size_t(B) * T * 3 * C, 0.5f), stats(ab.stats.numel()), scratch(ab.scratch.numel());
  FVec out(size_t(B) * T * C), dqkv(qkv.size()), kc(size_t(B) * T * C), vc(kc.size());
  for (float scale : {std::numeric_limits<float>::quiet_NaN(), INFINITY}) {
    EXPECT_THROW(be->attention_forward(view(qkv, {B, T, 3 * C}), Tensor(), false, H, H, scale, 0.f,
                                       RngKey{}, view(stats, ab.stats), view(scratch, ab.scratch),
                                       view(out, {B, T, C})),
                 brisk::Error);
    EXPECT_THROW(be->attention_backward(
                     view(out, {B, T, C}), view(qkv, {B, T, 3 * C}), view(out, {B, T, C}),
                     view(stats, ab.stats), Tensor(), false, H, H, scale, 0.f, RngKey{},
                     view(scratch, ab.scratch), view(dqkv, {B, T, 3 * C}), DType::f32, DType::f32),
                 brisk::Error);
    EXPECT_THROW(be->attention_decode(view(qkv, {B, T, 3 * C}), view(kc, {B, T, C}),
                                      view(vc, {B, T, C}), 0, H, H, scale, view(out, {B, T, C})),
                 brisk::Error);
  }
}

// Key counts the mask does not bear out, or without a mask, or out of [1, T], are refused naming
// the row: the CPU reads them to skip keys.
TEST(OpsAttention, KeyCountsTheMaskDoesNotKeepAreRefused) {
  auto be = brisk::make_cpu_backend();
  const int B = 2, T = 4, H = 1, D = 2, C = H * D;
  const brisk::AttentionBuffers ab = brisk::attention_buffers(brisk::Device::cpu, B, H, T, D);
  FVec qkv(size_t(B) * T * 3 * C, 0.5f), stats(ab.stats.numel()), scratch(ab.scratch.numel());
  FVec out(size_t(B) * T * C);
  IVec mask{1, 1, 0, 0, 1, 1, 1, 0};
  auto forward = [&](IVec counts, bool with_mask) {
    const brisk::KeyMask m(with_mask ? view(mask, {B, T}) : Tensor(), view(counts, {B}));
    be->attention_forward(view(qkv, {B, T, 3 * C}), m, false, H, H, 1.f, 0.f, RngKey{},
                          view(stats, ab.stats), view(scratch, ab.scratch), view(out, {B, T, C}));
  };
  forward({2, 3}, true);  // what the mask keeps
  brisk::testing::expect_error([&] { forward({2, 2}, true); }, "row 1 of the key mask");
  brisk::testing::expect_error([&] { forward({2, 5}, true); }, "key length 5 of row 1");
  brisk::testing::expect_error([&] { forward({0, 3}, true); }, "key length 0 of row 0");
  brisk::testing::expect_error([&] { forward({2, 3}, false); }, "without the mask");
}

// The summed loss softmax_cross_entropy adds to its float64 accumulator.
double cross_entropy(brisk::Backend& be, FVec& logits, IVec& labels, int N, int V, bool write_grad,
                     float scale) {
  double loss_sum = 0.0;
  be.softmax_cross_entropy(view(logits, {N, V}), view(labels, {N}), write_grad, scale,
                           brisk::Tensor(&loss_sum, brisk::Shape{1}, brisk::DType::f64),
                           brisk::Tensor());
  return loss_sum;
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

// A gradient written apart must be float32 or bf16 of the logits' rows and columns.
TEST(OpsCrossEntropy, AMismatchedGradientIsRefused) {
  auto be = brisk::make_cpu_backend();
  std::mt19937 rng(15);
  const int N = 3, V = 4;
  FVec logits = randn(size_t(N) * V, rng), wide(size_t(N) * (V + 1)), same(size_t(N) * V);
  IVec labels{0, 1, 2};
  std::vector<int32_t> ints(size_t(N) * V);
  double loss = 0.0;
  const brisk::Tensor sum(&loss, brisk::Shape{1}, brisk::DType::f64);
  for (const brisk::Tensor& grad :
       {view(wide, {N, V + 1}), brisk::Tensor(ints.data(), {N, V}, brisk::DType::i32)})
    EXPECT_THROW(
        be->softmax_cross_entropy(view(logits, {N, V}), view(labels, {N}), true, 1.f, sum, grad),
        brisk::Error);
  // Without write_grad no gradient is written, so none is checked.
  be->softmax_cross_entropy(view(logits, {N, V}), view(labels, {N}), false, 1.f, sum,
                            view(wide, {N, V + 1}));
  be->softmax_cross_entropy(view(logits, {N, V}), view(labels, {N}), true, 1.f, sum,
                            view(same, {N, V}));
}

// The CPU's sums (the gradients' squares, the loss) give the same bits on any number of threads.
// OpenMP's reduction clause added the threads' parts in the order they finished: from three
// threads on, the bits changed from run to run (seen on a 16-core machine).
TEST(OpsSums, TheSameBitsOnAnyNumberOfThreads) {
  auto be = brisk::make_cpu_backend();
  std::mt19937 rng(16);
  const int N = 700, V = 33, n = 1 << 20;
  const FVec x = randn(n, rng), logits0 = randn(size_t(N) * V, rng);
  IVec labels(N);
  for (int r = 0; r < N; ++r) labels[r] = r % V;
  const int before = omp_get_max_threads();
  Vec squares, losses;
  for (int threads : {1, 2, 3, 7, 16}) {
    omp_set_num_threads(threads);
    FVec xs = x, logits = logits0;
    double acc = 0.0;
    be->sum_squares(view(xs, {n}), Tensor(&acc, Shape{1}, DType::f64));
    squares.push_back(acc);
    losses.push_back(cross_entropy(*be, logits, labels, N, V, true, 1.f));
  }
  omp_set_num_threads(before);
  for (size_t i = 1; i < squares.size(); ++i) {
    EXPECT_EQ(squares[i], squares[0]) << "sum_squares, run " << i;
    EXPECT_EQ(losses[i], losses[0]) << "softmax_cross_entropy, run " << i;
  }
}

// Shapes: an odd last dimension, a half of the wrong width or rows, a dgate_up too small.
TEST(OpsSwiGlu, MismatchedShapesAreRefused) {
  auto be = brisk::make_cpu_backend();
  const int R = 6, F = 11;
  FVec gu(size_t(R) * 2 * F, 0.5f), y(size_t(R) * F), dout(y.size(), 1.f);
  FVec odd(size_t(R) * 5), small(size_t(R) * (F - 1)), d_small(size_t(R) * F);
  EXPECT_THROW(be->swiglu_forward(view(odd, {R, 5}), view(y, {R, F})), brisk::Error);
  EXPECT_THROW(be->swiglu_forward(view(gu, {R, 2 * F}), view(small, {R, F - 1})), brisk::Error);
  EXPECT_THROW(be->swiglu_forward(view(gu, {R / 2, 4 * F}), view(y, {R, F})), brisk::Error);
  EXPECT_THROW(be->swiglu_backward(view(gu, {R, 2 * F}), view(dout, {R, F}), view(d_small, {R, F}),
                                   DType::f32),
               brisk::Error);
}

// The conformance suite checks masks against the keyed generator; here, that the key's site
// matters: another site gives another mask.
TEST(OpsDropout, AnotherSiteGivesAnotherMask) {
  auto be = brisk::make_cpu_backend();
  const int n = 91;
  const RngKey key{0x1234'5678'9abcULL, 7, 3};
  FVec ones(n, 1.f), a(n), b(n);
  be->dropout_forward(view(ones, {n}), 0.3f, key, view(a, {n}));
  be->dropout_forward(view(ones, {n}), 0.3f, RngKey{key.seed, key.step, key.site + 1},
                      view(b, {n}));
  EXPECT_NE(a, b);
}

TEST(OpsAttention, DecodingPastTheCacheIsRefused) {
  auto be = brisk::make_cpu_backend();
  const int B = 2, H = 3, D = 5, C = H * D, S = 12;
  FVec kc(size_t(B) * S * C, 0.f), vc(kc.size(), 0.f), one(size_t(B) * 3 * C, 0.f),
      out(size_t(B) * C);
  EXPECT_THROW(be->attention_decode(view(one, {B, 1, 3 * C}), view(kc, {B, S, C}),
                                    view(vc, {B, S, C}), S, H, H, 1.f, view(out, {B, 1, C})),
               brisk::Error);
}

TEST(OpsMseLoss, MismatchedShapesAreRefused) {
  auto be = brisk::make_cpu_backend();
  const int N = 6;
  FVec targets(N, 1.f), wrong(N + 1, 0.f);
  double loss_sum = 0.0;
  EXPECT_THROW(be->mse_loss(view(wrong, {N + 1, 1}), view(targets, {N}), false, 1.f,
                            brisk::Tensor(&loss_sum, brisk::Shape{1}, brisk::DType::f64)),
               brisk::Error);
}

TEST(OpsCopyRows, RunsOutsideEitherTensorOrOfAnotherDtypeAreRefused) {
  auto be = brisk::make_cpu_backend();
  FVec src(20, 1.f), dst(20, 0.f);
  const brisk::Tensor s = view(src, {20}), d = view(dst, {20});
  using brisk::RowCopy;
  be->copy_rows(s, d, RowCopy{0, 5, 0, 5, 5, 4});  // exactly every element
  EXPECT_EQ(dst, src);
  auto refused = [&](const RowCopy& c, const char* needle) {
    try {
      be->copy_rows(s, d, c);
      ADD_FAILURE() << "accepted " << needle;
    } catch (const brisk::Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  refused({1, 5, 0, 5, 5, 4}, "past the source");
  refused({0, 5, 0, 6, 5, 4}, "past the destination");
  refused({0, 4, 0, 5, 5, 2}, "overlap");
  refused({0, 5, -1, 5, 5, 1}, "negative");
  refused({0, 4, 0, 4, 1, int64_t{1} << 62}, "extent");
  std::vector<int32_t> ints(20);
  EXPECT_THROW(be->copy_rows(s, brisk::Tensor(ints.data(), brisk::Shape{20}, brisk::DType::i32),
                             RowCopy{0, 1, 0, 1, 1, 1}),
               brisk::Error);
}

// The CPU's vectorizable exp (softmax in attention and the loss), and its AVX-512 form (exp16,
// attention's softmax), against exp in double: within 2 ulp over float's normal results, 0 below
// them, inf above, NaN kept.
void expect_exp_within_two_ulp(float (*exp_of)(float)) {
  double worst = 0.0;
  for (float x = -87.3f; x < 88.72f; x += 0.000731f) {
    const double ref = std::exp(static_cast<double>(x));
    const float rf = static_cast<float>(ref);
    const double ulp = std::nextafter(rf, std::numeric_limits<float>::infinity()) - rf;
    worst = std::max(worst, std::fabs(exp_of(x) - ref) / ulp);
  }
  EXPECT_LE(worst, 2.0);
  for (float x : {-0.0f, 1e-30f, -1e-30f, 1.0f, -1.0f, 0.5f})
    EXPECT_NEAR(exp_of(x), std::exp(static_cast<double>(x)), 2e-7 * std::exp(x)) << x;
  EXPECT_EQ(exp_of(-87.5f), 0.0f);
  EXPECT_EQ(exp_of(-std::numeric_limits<float>::infinity()), 0.0f);
  EXPECT_EQ(exp_of(89.0f), std::numeric_limits<float>::infinity());
  EXPECT_EQ(exp_of(std::numeric_limits<float>::infinity()), std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(exp_of(std::numeric_limits<float>::quiet_NaN())));
}

TEST(CpuMath, VectorExpIsWithinTwoUlpOfTheFp64Exp) {
  expect_exp_within_two_ulp(brisk::vector_expf);
}

TEST(CpuMath, Exp16IsWithinTwoUlpOfTheFp64ExpInEveryLane) {
#ifdef BRISK_PACK_AVX512
  // Each value in a different lane among other values, so that every lane's path is exercised.
  static int lane = 0;
  expect_exp_within_two_ulp([](float x) {
    lane = (lane + 1) % 16;
    alignas(64) float in[16], out[16];
    for (int i = 0; i < 16; ++i) in[i] = static_cast<float>(i) - 8.0f;
    in[lane] = x;
    _mm512_store_ps(out, brisk::avx512::exp16(_mm512_load_ps(in)));
    return out[lane];
  });
#else
  GTEST_SKIP() << "this build does not target AVX-512";
#endif
}

// bf16 mode, a linear layer's backward over a bf16 input (a stored activation) with a bias: its
// float32 gradient dy is rounded to bf16 once for both products. The same bits as from a float32
// input holding those values (where each product rounds dy itself), over an output width that
// ends mid-vector, the bias gradient written and added to; and the bias gradient within float32's
// error of the fp64 column sums.
TEST(OpsStoredBf16, LinearBackwardOverABf16InputGivesItsFloat32Bits) {
  std::mt19937 rng(45);
  auto be = brisk::make_cpu_backend();
  be->set_matmul_dtype(DType::bf16);
  const int64_t M = 9, K = 24, N = 1037;
  brisk::testing::DeviceBuffers d(*be);
  d.workspace(std::max(M * N, N * K));
  FVec x = randn(size_t(M) * K, rng), w = randn(size_t(N) * K, rng, 0.3f);
  FVec dy = randn(size_t(M) * N, rng), db0 = randn(N, rng);
  std::vector<uint16_t> x16(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    x16[i] = brisk::float_to_bf16(x[i]);
    x[i] = brisk::bf16_to_float(x16[i]);
  }
  const Tensor xf = d.put(x, {M, K}), xh = d.put(x16, {M, K}, DType::bf16);
  const Tensor wt = d.put(w, {N, K}), g = d.put(dy, {M, N});
  for (const bool accumulate : {false, true}) {
    SCOPED_TRACE(accumulate ? "bias gradient added to" : "bias gradient written");
    std::vector<FVec> got;
    for (const Tensor& in : {xh, xf}) {  // bf16 first: the workspace holds no rounded dy yet
      const Tensor dx = d.alloc({M, K}), dw = d.alloc({N, K}), db = d.put(db0, {N});
      be->linear_backward(in, wt, g, brisk::WeightLayout::out_in, dx, false, dw, db, accumulate);
      for (const Tensor& t : {dx, dw, db}) got.push_back(d.get(t));
    }
    EXPECT_EQ(got[0], got[3]) << "dx";
    EXPECT_EQ(got[1], got[4]) << "dw";
    EXPECT_EQ(got[2], got[5]) << "db";
    for (int64_t j = 0; j < N; ++j) {
      double want = accumulate ? db0[j] : 0.0;
      for (int64_t i = 0; i < M; ++i) want += dy[i * N + j];
      ASSERT_NEAR(got[2][j], want, 1e-5 * std::max(1.0, std::abs(want))) << "column " << j;
    }
  }
}

// bf16 mode: the saved activations a CPU bf16 run keeps only as bf16 (Model's stored copies) are
// read as the float32 values they hold: the same bits out as from float32 tensors holding those
// values, on each path of the products (the bf16 tiles; oneDNN's bf16 products, which attention
// takes for an odd head size; float32 products by OpenBLAS); and written by their producers (the
// norms, the activations) as their float32 results rounded. Outside bf16 mode a bf16 input or
// output is refused.
TEST(OpsStoredBf16, SavedInputsReadAsTheFloat32TheyHold) {
  std::mt19937 rng(44);
  auto bf16_of = [](const FVec& v) {
    std::vector<uint16_t> h(v.size());
    for (size_t i = 0; i < v.size(); ++i) h[i] = brisk::float_to_bf16(v[i]);
    return h;
  };
  auto rounded = [&](FVec v) {
    for (float& x : v) x = brisk::bf16_to_float(brisk::float_to_bf16(x));
    return v;
  };
  auto half = [](std::vector<uint16_t>& v, Shape s) { return Tensor(v.data(), s, DType::bf16); };
  for (const char* library : {"default", "openblas"}) {
    SCOPED_TRACE(library);
    if (std::string(library) == "openblas")
      brisk::testing::set_switch("BRISK_CPU_PRODUCTS", "openblas");
    else
      brisk::testing::set_switch("BRISK_CPU_PRODUCTS", nullptr);
    auto be = brisk::make_cpu_backend(brisk::read_switches());
    be->set_matmul_dtype(DType::bf16);
    // The activations and SwiGLU.
    const int R = 7, F = 37;
    FVec x = rounded(randn(size_t(R) * 2 * F, rng, 2.5f)), dy = randn(x.size(), rng);
    std::vector<uint16_t> x16 = bf16_of(x);
    for (brisk::Activation k :
         {brisk::Activation::gelu, brisk::Activation::gelu_tanh, brisk::Activation::relu,
          brisk::Activation::silu, brisk::Activation::quick_gelu}) {
      SCOPED_TRACE(brisk::activation_name(k));
      FVec y(x.size()), y16(x.size()), dx(x.size()), dx16(x.size());
      be->activation_forward(k, view(x, {R, 2 * F}), view(y, {R, 2 * F}));
      be->activation_forward(k, half(x16, {R, 2 * F}), view(y16, {R, 2 * F}));
      be->activation_backward(k, view(x, {R, 2 * F}), view(dy, {R, 2 * F}), view(dx, {R, 2 * F}),
                              DType::f32);
      be->activation_backward(k, half(x16, {R, 2 * F}), view(dy, {R, 2 * F}),
                              view(dx16, {R, 2 * F}), DType::f32);
      EXPECT_EQ(y16, y);
      EXPECT_EQ(dx16, dx);
      std::vector<uint16_t> out16(x.size());
      be->activation_forward(k, view(x, {R, 2 * F}), half(out16, {R, 2 * F}));
      EXPECT_EQ(out16, bf16_of(y)) << "written in bf16";
    }
    FVec y(size_t(R) * F), y16(y.size()), dgu(x.size()), dgu16(x.size());
    FVec dout = randn(y.size(), rng);
    be->swiglu_forward(view(x, {R, 2 * F}), view(y, {R, F}));
    be->swiglu_forward(half(x16, {R, 2 * F}), view(y16, {R, F}));
    be->swiglu_backward(view(x, {R, 2 * F}), view(dout, {R, F}), view(dgu, {R, 2 * F}), DType::f32);
    be->swiglu_backward(half(x16, {R, 2 * F}), view(dout, {R, F}), view(dgu16, {R, 2 * F}),
                        DType::f32);
    EXPECT_EQ(y16, y) << "swiglu_forward";
    EXPECT_EQ(dgu16, dgu) << "swiglu_backward";
    std::vector<uint16_t> act16(y.size());
    be->swiglu_forward(view(x, {R, 2 * F}), half(act16, {R, F}));
    EXPECT_EQ(act16, bf16_of(y)) << "swiglu_forward written in bf16";
    // The gradient written in bf16 (a bias-free gated MLP's, for the products): the float32 one
    // rounded, from float32 and bf16 inputs, also in rows wider than the blocks it goes in.
    for (int wide : {F, 300}) {
      FVec xw = rounded(randn(size_t(R) * 2 * wide, rng, 2.5f)), gw = randn(size_t(R) * wide, rng);
      std::vector<uint16_t> xw16 = bf16_of(xw), d16(xw.size()), d16b(xw.size());
      FVec d(xw.size());
      be->swiglu_backward(view(xw, {R, 2 * wide}), view(gw, {R, wide}), view(d, {R, 2 * wide}),
                          DType::f32);
      be->swiglu_backward(view(xw, {R, 2 * wide}), view(gw, {R, wide}), half(d16, {R, 2 * wide}),
                          DType::f32);
      be->swiglu_backward(half(xw16, {R, 2 * wide}), view(gw, {R, wide}), half(d16b, {R, 2 * wide}),
                          DType::f32);
      EXPECT_EQ(d16, bf16_of(d)) << "swiglu_backward written in bf16, F " << wide;
      EXPECT_EQ(d16b, bf16_of(d)) << "swiglu_backward from and to bf16, F " << wide;
    }
    // The norms written in bf16: their float32 outputs rounded (rows longer than the chunks the
    // rounding goes in).
    {
      const int C = 300;
      FVec in = randn(size_t(R) * C, rng), gamma = randn(C, rng), beta = randn(C, rng);
      FVec out(in.size()), mean(R), rstd(R);
      std::vector<uint16_t> out16(in.size());
      be->rmsnorm_forward(view(in, {R, C}), view(gamma, {C}), 1e-5f, view(out, {R, C}),
                          view(rstd, {R}));
      be->rmsnorm_forward(view(in, {R, C}), view(gamma, {C}), 1e-5f, half(out16, {R, C}),
                          view(rstd, {R}));
      EXPECT_EQ(out16, bf16_of(out)) << "rmsnorm_forward";
      be->layernorm_forward(view(in, {R, C}), view(gamma, {C}), view(beta, {C}), 1e-5f,
                            view(out, {R, C}), view(mean, {R}), view(rstd, {R}));
      be->layernorm_forward(view(in, {R, C}), view(gamma, {C}), view(beta, {C}), 1e-5f,
                            half(out16, {R, C}), view(mean, {R}), view(rstd, {R}));
      EXPECT_EQ(out16, bf16_of(out)) << "layernorm_forward";
    }
    // Attention, causal and masked, over grouped heads of an even and an odd size.
    for (int D : {8, 5}) {
      SCOPED_TRACE("head size " + std::to_string(D));
      const int B = 2, T = 70, H = 4, K = 2, C = H * D, W = (H + 2 * K) * D;
      FVec qkv = rounded(randn(size_t(B) * T * W, rng)), g = randn(size_t(B) * T * C, rng);
      std::vector<uint16_t> qkv16 = bf16_of(qkv);
      IVec mask(size_t(B) * T, 1);
      mask[3] = mask[T + 10] = 0;
      const brisk::AttentionBuffers ab = brisk::attention_buffers(brisk::Device::cpu, B, H, T, D);
      FVec stats(ab.stats.numel()), stats16(stats.size()), scratch(ab.scratch.numel());
      FVec out(g.size()), out16(g.size()), d(qkv.size()), d16(qkv.size());
      auto run = [&](const Tensor& in, FVec& o, FVec& s, FVec& dq) {
        be->attention_forward(in, view(mask, {B, T}), true, H, K, 0.3f, 0.f, RngKey{},
                              view(s, ab.stats), view(scratch, ab.scratch), view(o, {B, T, C}));
        be->attention_backward(view(g, {B, T, C}), in, view(o, {B, T, C}), view(s, ab.stats),
                               view(mask, {B, T}), true, H, K, 0.3f, 0.f, RngKey{},
                               view(scratch, ab.scratch), view(dq, {B, T, W}), DType::f32,
                               DType::f32);
      };
      run(view(qkv, {B, T, W}), out, stats, d);
      run(half(qkv16, {B, T, W}), out16, stats16, d16);
      EXPECT_EQ(out16, out) << "attention_forward";
      EXPECT_EQ(stats16, stats) << "attention_forward statistics";
      EXPECT_EQ(d16, d) << "attention_backward";
    }
  }
  brisk::testing::set_switch("BRISK_CPU_PRODUCTS", nullptr);
  auto be = brisk::make_cpu_backend();  // float32 mode
  std::vector<uint16_t> gu16(6 * 2 * 11, 0x3f80);
  FVec y(6 * 11);
  EXPECT_THROW(be->swiglu_forward(half(gu16, {6, 22}), view(y, {6, 11})), brisk::Error);
  FVec gu(6 * 2 * 11, 1.f);
  EXPECT_THROW(
      be->swiglu_backward(view(gu, {6, 22}), view(y, {6, 11}), half(gu16, {6, 22}), DType::f32),
      brisk::Error);
  EXPECT_THROW(
      be->activation_forward(brisk::Activation::gelu, half(gu16, {6, 22}), view(y, {6, 11})),
      brisk::Error);
  FVec x(6 * 11, 1.f), gamma(11, 1.f), rstd(6);
  EXPECT_THROW(be->rmsnorm_forward(view(x, {6, 11}), view(gamma, {11}), 1e-5f, half(gu16, {6, 11}),
                                   view(rstd, {6})),
               brisk::Error);
}
