// The CUDA backend's attention on tensor cores (cuDNN's fused attention, backend/cuda/
// fused_attention.h), which serves runs whose products are 16-bit, against the CPU's float32
// attention (the reference, itself checked against fp64 and finite differences in conformance/).
// Dropout draws cuDNN's own masks, so with dropout the checks are of what any correct mask gives:
// the same key gives the same bits, the backward uses the forward's mask (<dV, V> = <dO, O>, an
// identity of attention), and the mean over many keys is the attention without dropout.
//
// Tolerances: q, k, v and dO hold bf16 values; cuDNN rounds the probabilities and its output to
// bf16 (relative 2^-9 each), so outputs and gradients agree to about 1e-2 norm-wise; a wrong
// stride, head or mask is off by order one.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#if defined(BRISK_HAVE_CUDA)
#include <dlfcn.h>

#include "backend/cuda/fused_attention.h"
#endif

#include "backend/backend.h"
#include "backend/workspace.h"
#include "backend_support.h"

namespace brisk::testing {
namespace {

struct AttnCase {
  int64_t B, T, H, K, D;
  bool causal = false, masked = false;
  float dropout = 0.0f;
  bool padded = false;  // the mask right-padded, given with its rows' key counts
};

struct AttnInputs {
  FVec qkv, dout;
  IVec mask, lengths;
};

struct AttnResult {
  FVec out, dqkv;
  DType dqkv_dtype;  // the dtype attention_backward gave it in
};

// bf16 values throughout, as a bf16 block's rounded activations are; the mask keeps key 0 of
// every row (so every query sees a key) and drops about a quarter of the others, not only at the
// end; or (padded) keeps a prefix of each row, given with the rows' key counts.
AttnInputs make_inputs(const AttnCase& c, uint32_t seed) {
  std::mt19937 rng(seed);
  AttnInputs in;
  in.qkv = rounded(randn(c.B * c.T * (c.H + 2 * c.K) * c.D, rng), DType::bf16);
  in.dout = rounded(randn(c.B * c.T * c.H * c.D, rng), DType::bf16);
  if (c.masked && c.padded) {  // rows keeping all keys, about half, one
    in.mask.assign(static_cast<size_t>(c.B * c.T), 0);
    for (int64_t b = 0; b < c.B; ++b) {
      const int64_t n = b % 3 == 0 ? c.T : b % 3 == 1 ? c.T / 2 + 1 : 1;
      in.lengths.push_back(static_cast<int32_t>(n));
      std::fill_n(in.mask.begin() + b * c.T, n, 1);
    }
  } else if (c.masked) {
    in.mask = randint(c.B * c.T, 0, 4, rng);
    for (int64_t b = 0; b < c.B; ++b) in.mask[static_cast<size_t>(b * c.T)] = 1;
  }
  return in;
}

// Products in `product` on `be`, and the workspace Model::matmul_operands asks for the fused
// attention.
void plan_workspace(Backend& be, DeviceBuffers& d, const AttnCase& c, DType product) {
  be.set_matmul_dtype(product);
  MatmulOperands operands(c.B * c.T * ((c.H + 2 * c.K) * c.D + c.H * c.D));
  operands.attention = operands.a;
  operands.attention_workspace = fused_attention_workspace_bound(c.B, c.T, c.H, c.K, c.D);
  d.workspace(operands);
}

// Forward and backward on `be`, its products in `product` (bf16: the fused attention on a GPU),
// the backward rounding dout and dqkv to `round`; `held` of the key's step given in the backend's
// memory (RngKey::step_offset).
AttnResult run(Backend& be, const AttnCase& c, const AttnInputs& in, DType product,
               const RngKey& given_key, DType round = DType::f32, uint64_t held = 0) {
  DeviceBuffers d(be);
  const RngKey key = held > 0 ? d.hold_step(given_key, held) : given_key;
  plan_workspace(be, d, c, product);
  const Shape packed{c.B, c.T, (c.H + 2 * c.K) * c.D}, flat{c.B, c.T, c.H * c.D};
  const AttentionBuffers ab = attention_buffers(be.device(), c.B, c.H, c.T, c.D);
  const Tensor qkv = d.put(in.qkv, packed), dout = d.put(in.dout, flat);
  KeyMask mask = c.masked ? KeyMask(d.put(in.mask, {c.B, c.T})) : KeyMask();
  if (c.padded) mask.lengths = d.put(in.lengths, {c.B});
  const Tensor stats = d.alloc(ab.stats), scratch = d.alloc(ab.scratch);
  const Tensor out = d.alloc(flat), dqkv = d.alloc(packed);
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.D));
  be.attention_forward(qkv, mask, c.causal, static_cast<int>(c.H), static_cast<int>(c.K), scale,
                       c.dropout, key, stats, scratch, out);
  const Tensor given = be.attention_backward(dout, qkv, out, stats, mask, c.causal,
                                             static_cast<int>(c.H), static_cast<int>(c.K), scale,
                                             c.dropout, key, scratch, dqkv, round, round);
  return {d.get<float>(out), d.floats(given), given.dtype()};
}

// Skips where cuDNN cannot be opened; fails where it opens but refuses a case brisk sends it.
#if defined(BRISK_HAVE_CUDA)
// The fused attention's problem for a case, as the backend forms it.
cuda::FusedAttentionShape fused_shape(const AttnCase& c) {
  cuda::FusedAttentionShape shape;
  shape.B = c.B, shape.T = c.T, shape.H = c.H, shape.K = c.K, shape.D = c.D;
  shape.causal = c.causal, shape.masked = c.masked && !c.padded, shape.padded = c.padded;
  shape.scale = 1.0f / std::sqrt(static_cast<float>(c.D)), shape.dropout_p = c.dropout;
  return shape;
}

#define REQUIRE_FUSED(c)                                                             \
  do {                                                                               \
    REQUIRE_GPU();                                                                   \
    std::string why;                                                                 \
    if (!cuda::cudnn_available(&why)) GTEST_SKIP() << "no cuDNN to run it: " << why; \
    const cuda::FusedAttentionShape shape = fused_shape(c);                          \
    ASSERT_TRUE(cuda::fused_attention_supported(shape, &why)) << why;                \
  } while (false)
#else
#define REQUIRE_FUSED(c) GTEST_SKIP() << "this brisk was built without the CUDA toolkit"
#endif

const AttnCase kCases[] = {
    {2, 67, 4, 4, 64, false, true},   // BERT-like: padding mask, odd length
    {2, 128, 4, 4, 64, true, false},  // GPT-2-like: causal
    {1, 96, 8, 2, 128, true, true},   // grouped-query, wide heads, causal and masked
    {3, 40, 2, 1, 32, false, false},  // multi-query
};

TEST(FusedAttention, AgreesWithTheFloat32Reference) {
  for (const AttnCase& c : kCases) {
    REQUIRE_FUSED(c);
    SCOPED_TRACE("B=" + std::to_string(c.B) + " T=" + std::to_string(c.T) + " H=" +
                 std::to_string(c.H) + " K=" + std::to_string(c.K) + " D=" + std::to_string(c.D));
    const AttnInputs in = make_inputs(c, 7);
    auto cpu = make_cpu_backend();
    auto gpu = make_cuda_backend();
    const AttnResult want = run(*cpu, c, in, DType::f32, RngKey{1, 1, 1});
    const AttnResult fused = run(*gpu, c, in, DType::bf16, RngKey{1, 1, 1});
    EXPECT_TRUE(rel_near(fused.out, want.out, 1e-2));
    EXPECT_TRUE(rel_near(fused.dqkv, want.dqkv, 2e-2));
    // It is not the float32 kernel (which a float32 run keeps): that one agrees to 1e-5.
    const AttnResult simt = run(*gpu, c, in, DType::f32, RngKey{1, 1, 1});
    EXPECT_TRUE(rel_near(simt.out, want.out, 1e-5));
    EXPECT_FALSE(rel_near(fused.out, simt.out, 1e-6));
  }
}

// A right-padded batch given its rows' key counts runs cuDNN's padding mask (no bias): the
// float32 reference's values given the mask alone, and the bias's where the counts are not given.
TEST(FusedAttention, ARightPaddedBatchHidesItsPaddingWithoutABias) {
  const AttnCase padded[] = {
      {4, 67, 4, 4, 64, false, true, 0.0f, true},   // odd length, one row keeping a single key
      {3, 128, 8, 2, 128, true, true, 0.0f, true},  // grouped-query, causal
  };
  for (const AttnCase& c : padded) {
    REQUIRE_FUSED(c);
    SCOPED_TRACE("T=" + std::to_string(c.T) + (c.causal ? " causal" : ""));
    const AttnInputs in = make_inputs(c, 11);
    AttnCase bias = c;
    bias.padded = false;
    auto cpu = make_cpu_backend();
    auto gpu = make_cuda_backend();
    const AttnResult want = run(*cpu, bias, in, DType::f32, RngKey{3, 3, 3});
    const AttnResult fused = run(*gpu, c, in, DType::bf16, RngKey{3, 3, 3});
    const AttnResult biased = run(*gpu, bias, in, DType::bf16, RngKey{3, 3, 3});
    EXPECT_TRUE(rel_near(fused.out, want.out, 1e-2));
    EXPECT_TRUE(rel_near(fused.dqkv, want.dqkv, 2e-2));
    EXPECT_TRUE(rel_near(fused.out, biased.out, 1e-2));
    EXPECT_TRUE(rel_near(fused.dqkv, biased.dqkv, 2e-2));
  }
}

// Rounding dout and dqkv to bf16 as the block asks is the fused attention's own casts: the bits
// of rounding them before and after, from a dout that is not bf16 already; dqkv then stays in
// bf16 (for products that read it so), float32 where no rounding is asked.
TEST(FusedAttention, RoundsItsGradientsAsPassesOfTheirOwnWould) {
  const AttnCase c = kCases[1];
  REQUIRE_FUSED(c);
  AttnInputs in = make_inputs(c, 9);
  std::mt19937 rng(10);
  in.dout = randn(static_cast<int64_t>(in.dout.size()), rng);
  auto gpu = make_cuda_backend();
  const AttnResult asked = run(*gpu, c, in, DType::bf16, RngKey{2, 2, 2}, DType::bf16);
  AttnInputs rounded_in = in;
  rounded_in.dout = rounded(in.dout, DType::bf16);
  const AttnResult passes = run(*gpu, c, rounded_in, DType::bf16, RngKey{2, 2, 2});
  EXPECT_TRUE(identical(asked.out, passes.out));
  EXPECT_TRUE(identical(asked.dqkv, rounded(passes.dqkv, DType::bf16)));
  EXPECT_TRUE(identical(asked.dqkv, rounded(asked.dqkv, DType::bf16))) << "dqkv holds bf16 values";
  EXPECT_EQ(asked.dqkv_dtype, DType::bf16);
  EXPECT_EQ(passes.dqkv_dtype, DType::f32);
}

double dot(const FVec& a, const FVec& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

// <dV, V> over the value columns of packed qkv.
double value_dot(const AttnCase& c, const FVec& dqkv, const FVec& qkv) {
  const int64_t row = (c.H + 2 * c.K) * c.D, first = (c.H + c.K) * c.D;
  double s = 0;
  for (int64_t r = 0; r < c.B * c.T; ++r)
    for (int64_t j = first; j < row; ++j)
      s += static_cast<double>(dqkv[static_cast<size_t>(r * row + j)]) *
           qkv[static_cast<size_t>(r * row + j)];
  return s;
}

TEST(FusedAttention, DropoutIsReproducibleAndTheBackwardUsesTheForwardsMask) {
  const AttnCase c{2, 64, 4, 4, 64, true, true, 0.1f};
  REQUIRE_FUSED(c);
  const AttnInputs in = make_inputs(c, 11);
  auto gpu = make_cuda_backend();
  const AttnResult a = run(*gpu, c, in, DType::bf16, RngKey{5, 3, 9});
  const AttnResult again = run(*gpu, c, in, DType::bf16, RngKey{5, 3, 9});
  EXPECT_TRUE(identical(a.out, again.out));
  EXPECT_TRUE(identical(a.dqkv, again.dqkv));
  const AttnResult other = run(*gpu, c, in, DType::bf16, RngKey{5, 4, 9});
  EXPECT_FALSE(rel_near(a.out, other.out, 1e-2)) << "another step draws another mask";
  const AttnResult held = run(*gpu, c, in, DType::bf16, RngKey{5, 3, 9}, DType::f32, 2);
  EXPECT_TRUE(identical(a.out, held.out)) << "a step held in GPU memory draws the same mask";
  EXPECT_TRUE(identical(a.dqkv, held.dqkv));
  // O = (P * M) V is linear in V, so <dV, V> = <dO, O> for the mask the forward drew: a backward
  // with any other mask misses by far more than rounding.
  const double lhs = value_dot(c, a.dqkv, in.qkv), rhs = dot(in.dout, a.out);
  EXPECT_NEAR(lhs, rhs, 1e-2 * std::abs(rhs) + 1e-3) << "<dV, V> against <dO, O>";
}

TEST(FusedAttention, DropoutAveragesToTheAttentionWithout) {
  AttnCase c{1, 64, 2, 2, 64, false, false, 0.1f};
  REQUIRE_FUSED(c);
  const AttnInputs in = make_inputs(c, 13);
  auto gpu = make_cuda_backend();
  const int draws = 64;
  AttnResult mean;
  for (int i = 0; i < draws; ++i) {
    const AttnResult r = run(*gpu, c, in, DType::bf16, RngKey{21, static_cast<uint64_t>(i), 2});
    if (i == 0) mean = {FVec(r.out.size()), FVec(r.dqkv.size())};
    for (size_t j = 0; j < r.out.size(); ++j) mean.out[j] += r.out[j] / draws;
    for (size_t j = 0; j < r.dqkv.size(); ++j) mean.dqkv[j] += r.dqkv[j] / draws;
    if (i == 0) {
      c.dropout = 0;
      const AttnResult plain = run(*gpu, c, in, DType::bf16, RngKey{});
      c.dropout = 0.1f;
      EXPECT_FALSE(rel_near(r.out, plain.out, 3e-2)) << "one draw drops something";
    }
  }
  c.dropout = 0;
  const AttnResult plain = run(*gpu, c, in, DType::bf16, RngKey{});
  // Each draw is off by about 0.3 of the output's scale; 64 draws by about 0.04.
  EXPECT_TRUE(rel_near(mean.out, plain.out, 0.1));
  EXPECT_TRUE(rel_near(mean.dqkv, plain.dqkv, 0.15));
}

// A padding-free or packed batch: rows of tokens holding samples end to end (each row's lengths
// sum to T), with grouped heads, causal or not.
struct PackedCase {
  std::vector<std::vector<int64_t>> rows;
  int64_t H, K, D;
  bool causal;
  AttnCase dims() const {
    int64_t T = 0;
    for (int64_t n : rows[0]) T += n;
    return {static_cast<int64_t>(rows.size()), T, H, K, D, causal};
  }
  PackedSamples samples() const {
    PackedSamples s{{0}};
    for (const auto& row : rows)
      for (int64_t n : row) s.starts.push_back(s.starts.back() + n);
    return s;
  }
};

// packed_attention_forward and _backward on `be`, its products in `product`, the samples' starts
// in its memory as a model lays them; `signature`: what add_packed_signature gives for them.
AttnResult run_packed(Backend& be, const PackedCase& p, const AttnInputs& in, DType product,
                      std::vector<int64_t>* signature = nullptr) {
  const AttnCase c = p.dims();
  PackedSamples samples = p.samples();
  DeviceBuffers d(be);
  plan_workspace(be, d, c, product);
  samples.at =
      d.put(IVec(samples.starts.begin(), samples.starts.end()), {samples.count() + 1}, DType::i32);
  const Shape packed{c.B, c.T, (c.H + 2 * c.K) * c.D}, flat{c.B, c.T, c.H * c.D};
  const AttentionBuffers ab = attention_buffers(be.device(), c.B, c.H, c.T, c.D);
  const Tensor qkv = d.put(in.qkv, packed), dout = d.put(in.dout, flat);
  const Tensor stats = d.alloc(ab.stats), scratch = d.alloc(ab.scratch);
  const Tensor out = d.alloc(flat), dqkv = d.alloc(packed);
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.D));
  const int h = static_cast<int>(c.H), k = static_cast<int>(c.K);
  if (signature)
    be.add_packed_signature(samples, attention_dims(qkv, h, k, "test"), c.causal, scale, 0.0f,
                            *signature);
  be.packed_attention_forward(qkv, samples, c.causal, h, k, scale, 0.0f, RngKey{}, stats, scratch,
                              out);
  const Tensor given =
      be.packed_attention_backward(dout, qkv, out, stats, samples, c.causal, h, k, scale, 0.0f,
                                   RngKey{}, scratch, dqkv, DType::f32, DType::f32);
  return {d.get<float>(out), d.floats(given), given.dtype()};
}

// The samples of a padding-free or packed batch run as one ragged call of the fused attention
// (cuDNN's THD layout): the CPU's float32 packed attention's values, which computes each sample
// alone; the GPU's float32 kernels, one call per sample, agree with it to 1e-5, the ragged call
// to bf16's precision. Samples of one token, a row that is one sample, grouped and one key head.
TEST(FusedAttention, APackedBatchRunsAsOneRaggedCall) {
  const PackedCase cases[] = {{{{40, 1, 23}}, 4, 4, 64, false},
                              {{{17, 47}, {64}}, 8, 2, 128, true},
                              {{{100, 28}, {1, 127}}, 6, 1, 32, true}};
  for (const PackedCase& p : cases) {
    const AttnCase c = p.dims();
    REQUIRE_FUSED(c);
#if defined(BRISK_HAVE_CUDA)
    cuda::FusedAttentionShape ragged = fused_shape(c);
    ragged.ragged = true, ragged.B = p.samples().count(), ragged.T = (c.T + 63) / 64 * 64;
    std::string why;
    int64_t workspace = 0;
    ASSERT_TRUE(cuda::fused_attention_supported(ragged, &why, &workspace)) << why;
    // What the backend needs to take the ragged call rather than one call per sample: cuDNN's
    // workspace and the lengths and offsets (a few KiB) within the planned bound run_packed gives.
    EXPECT_LE(workspace + 4096, fused_attention_workspace_bound(c.B, c.T, c.H, c.K, c.D));
#endif
    SCOPED_TRACE("T=" + std::to_string(c.T) + " H=" + std::to_string(c.H) +
                 " K=" + std::to_string(c.K) + (c.causal ? " causal" : ""));
    const AttnInputs in = make_inputs(c, 13);
    auto cpu = make_cpu_backend();
    auto gpu = make_cuda_backend();
    const AttnResult want = run_packed(*cpu, p, in, DType::f32);
    std::vector<int64_t> signature;
    const AttnResult fused = run_packed(*gpu, p, in, DType::bf16, &signature);
    // The ragged call served: its launches follow the samples' count and longest length only.
    int64_t longest = 0;
    for (const auto& row : p.rows)
      longest = std::max(longest, *std::max_element(row.begin(), row.end()));
    EXPECT_EQ(signature, (std::vector<int64_t>{p.samples().count(), (longest + 63) / 64 * 64}));
    const AttnResult simt = run_packed(*gpu, p, in, DType::f32);
    EXPECT_TRUE(rel_near(fused.out, want.out, 1e-2));
    EXPECT_TRUE(rel_near(fused.dqkv, want.dqkv, 2e-2));
    EXPECT_TRUE(rel_near(simt.out, want.out, 1e-5));
    EXPECT_TRUE(rel_near(simt.dqkv, want.dqkv, 1e-5));
    EXPECT_FALSE(rel_near(fused.out, simt.out, 1e-6)) << "the fused call ran";
  }
}

// The planned workspace holds what cuDNN asks for at the benchmarks' shapes (bert-large and GPT-2
// 124M at the batch sizes of bench/gpu_anchors.py) with a bias for every query.
TEST(FusedAttention, TheWorkspaceBoundHoldsAtTheBenchShapes) {
  const AttnCase bench[] = {{4, 512, 16, 16, 64, false, true, 0.1f},
                            {32, 512, 16, 16, 64, false, true, 0.1f},
                            {8, 1024, 12, 12, 64, true, false, 0.1f},
                            {32, 1024, 12, 12, 64, true, false, 0.1f},
                            {4, 2048, 32, 8, 64, true, false, 0.0f}};
  for (const AttnCase& c : bench) {
    REQUIRE_FUSED(c);
#if defined(BRISK_HAVE_CUDA)
    const cuda::FusedAttentionShape shape = fused_shape(c);
    ASSERT_TRUE(cuda::fused_attention_supported(shape));
    const int64_t forward = cuda::fused_attention_workspace(shape, false),
                  backward = cuda::fused_attention_workspace(shape, true);
    const int64_t bias = c.B * c.T * c.T * 2,
                  bound = fused_attention_workspace_bound(c.B, c.T, c.H, c.K, c.D);
    std::printf(
        "fused attention B=%ld T=%ld H=%ld K=%ld D=%ld: workspace forward %ld, backward %ld, "
        "bias %ld, bound %ld bytes\n",
        c.B, c.T, c.H, c.K, c.D, forward, backward, bias, bound);
    EXPECT_LE(std::max(forward, backward) + bias, bound);
#endif
  }
}

// What cuDNN 9.19's deterministic backward asked for on an H100 (2026-11-26, the GPU run of the
// test above, and a grouped-query case of the first): the plan's bound holds each with its bias,
// and by at most a third more where it is large.
TEST(FusedAttention, TheBoundCoversWhatAnH100AskedFor) {
  struct Seen {
    int64_t B, T, H, K, D, bytes;
  };
  const Seen seen[] = {{4, 512, 16, 16, 64, 33685760},   {32, 512, 16, 16, 64, 269484288},
                       {8, 1024, 12, 12, 64, 201720064}, {32, 1024, 12, 12, 64, 806879488},
                       {4, 2048, 32, 8, 64, 1141899520}, {1, 96, 8, 2, 128, 658688}};
  for (const Seen& s : seen) {
    const int64_t need = s.bytes + s.B * s.T * s.T * 2;
    const int64_t bound = fused_attention_workspace_bound(s.B, s.T, s.H, s.K, s.D);
    EXPECT_GE(bound, need) << "B=" << s.B << " T=" << s.T << " H=" << s.H << " K=" << s.K;
    if (need > (int64_t{16} << 20))
      EXPECT_LE(bound, need + need / 3) << "B=" << s.B << " T=" << s.T << " H=" << s.H;
  }
}

// The plan stages the fused attention in the product buffers: they grow to what it needs.
TEST(FusedAttention, TheProductBuffersHoldItsStaging) {
  MatmulOperands operands(1000, 800);
  operands.attention = 5000;
  for (DType product : {DType::bf16, DType::f32}) {
    MemoryPlan plan;
    BufferBinder binder;
    BackendWorkspace ws;
    plan_backend_workspace(Device::cuda, product, operands, plan, binder, ws);
    const BufferId a = plan.find("backend.operand_a"), b = plan.find("backend.operand_b");
    if (product == DType::f32) {
      EXPECT_EQ(a, -1);  // float32 products: neither buffer, and no fused attention
      continue;
    }
    ASSERT_NE(a, -1);
    ASSERT_NE(b, -1);
    EXPECT_EQ(plan.buffer(a).shape.numel(), 5000);
    EXPECT_EQ(plan.buffer(b).shape.numel(), 5000);
  }
}

// A CPU run never opens libcudnn.
// The graphs brisk describes pass the frontend's validation against libcudnn, which needs no
// GPU: the cases above (masked, right-padded, causal, grouped-query, multi-query), with dropout,
// and the bench shapes. A graph cuDNN refuses fails here, before a GPU session. Refused on purpose:
// a bias over a key mask whose rows the queries' heads do not divide (H % K != 0).
TEST(FusedAttention, ItsGraphsPassTheFrontendsValidationWithoutAGpu) {
#if !defined(BRISK_HAVE_CUDA)
  GTEST_SKIP() << "this brisk was built without the CUDA toolkit";
#else
  std::string why;
  if (!cuda::cudnn_loadable(&why)) GTEST_SKIP() << "no libcudnn to validate against: " << why;
  std::vector<AttnCase> cases(std::begin(kCases), std::end(kCases));
  cases.push_back({4, 67, 4, 4, 64, false, true, 0.0f, true});
  cases.push_back({3, 128, 8, 2, 128, true, true, 0.1f, true});
  cases.push_back({32, 512, 16, 16, 64, false, true, 0.1f, true});   // bert-large, padded
  cases.push_back({32, 512, 16, 16, 64, false, true, 0.1f, false});  // its bias
  cases.push_back({32, 1024, 12, 12, 64, true, false, 0.1f});        // GPT-2
  cases.push_back({4, 2048, 32, 4, 64, true, false, 0.0f});          // a Llama's
  for (AttnCase c : cases)
    for (const float dropout : {0.0f, 0.1f}) {
      c.dropout = dropout;
      EXPECT_TRUE(cuda::fused_attention_graphs_valid(fused_shape(c), 90, &why))
          << "B=" << c.B << " T=" << c.T << " H=" << c.H << " K=" << c.K << " D=" << c.D
          << (c.causal ? " causal" : "")
          << (c.padded   ? " padded"
              : c.masked ? " masked"
                         : "")
          << " dropout " << dropout << ": " << why;
    }
  AttnCase odd{2, 64, 6, 4, 64};  // 6 query heads over 4 key/value heads
  EXPECT_FALSE(cuda::fused_attention_graphs_valid(fused_shape(odd), 90, &why));
  EXPECT_FALSE(why.empty());
#endif
}

// The ragged graphs of padding-free and packed batches (samples end to end, THD) pass the
// frontend's validation for a Hopper GPU without one: multi-head, grouped-query and multi-query
// heads, causal or not, with dropout or without, bf16 and fp16, a SmolLM2's heads.
TEST(FusedAttention, ItsRaggedGraphsPassTheFrontendsValidationWithoutAGpu) {
#if !defined(BRISK_HAVE_CUDA)
  GTEST_SKIP() << "this brisk was built without the CUDA toolkit";
#else
  std::string why;
  if (!cuda::cudnn_loadable(&why)) GTEST_SKIP() << "no libcudnn to validate against: " << why;
  const AttnCase cases[] = {{5, 64, 4, 4, 64},
                            {3, 128, 8, 2, 128},
                            {9, 128, 9, 3, 64},
                            {33, 64, 6, 1, 32},
                            {1, 2048, 32, 8, 128}};
  for (AttnCase c : cases)
    for (const bool causal : {false, true})
      for (const float dropout : {0.0f, 0.1f})
        for (const DType dtype : {DType::bf16, DType::f16}) {
          c.causal = causal, c.dropout = dropout;
          cuda::FusedAttentionShape shape = fused_shape(c);
          shape.ragged = true, shape.dtype = dtype;
          EXPECT_TRUE(cuda::fused_attention_graphs_valid(shape, 90, &why))
              << c.B << " samples of at most " << c.T << " tokens, H=" << c.H << " K=" << c.K
              << " D=" << c.D << (causal ? " causal" : "") << " dropout " << dropout << " "
              << dtype_name(dtype) << ": " << why;
        }
#endif
}

TEST(FusedAttention, CudnnIsOpenedOnlyWhenAsked) {
#if !defined(BRISK_HAVE_CUDA)
  GTEST_SKIP() << "this brisk was built without the CUDA toolkit";
#else
  const char* soname = "libcudnn.so.9";
  if (dlopen(soname, RTLD_NOW | RTLD_NOLOAD) || cuda::cudnn_opened())
    GTEST_SKIP() << "an earlier test in this process opened " << soname;
  const AttnCase c{1, 16, 2, 2, 8, true, false};
  auto cpu = make_cpu_backend();
  run(*cpu, c, make_inputs(c, 3), DType::bf16, RngKey{});
  EXPECT_FALSE(cuda::cudnn_opened());
  EXPECT_EQ(dlopen(soname, RTLD_NOW | RTLD_NOLOAD), nullptr);
#endif
}

}  // namespace
}  // namespace brisk::testing
