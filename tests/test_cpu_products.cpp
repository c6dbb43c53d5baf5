// Matrix products on the CPU in bf16 and float32 (oneDNN, OpenBLAS, brisk's own packing) against
// fp64 references on the rounded operands: linear forward and backward, held and blocked weights,
// 16-bit inputs and outputs, attention's closeness to float32.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "backend/cpu/cpu_matmul_dnnl.h"
#include "backend/cpu/cpu_tiles.h"
#include "backend/workspace.h"
#include "test_support.h"

namespace brisk::testing {
namespace {

// Linear forward and backward with bf16 matrix products (oneDNN on bf16 units where available)
// against an fp64 reference on the bf16-rounded operands: products of bf16 values are exact in
// float32, so only the float32 summation differs. The same for float32 products by the default
// library, by oneDNN (BRISK_CPU_PRODUCTS=onednn) and by OpenBLAS (=openblas), and for bf16
// operands rounded and multiplied in float32 by OpenBLAS (what a CPU without bf16 units does).
class CpuProducts : public ::testing::TestWithParam<const char*> {
 protected:
  void attention_stays_close_to_float32(int64_t T, int64_t D);
};

// The CPU backend of a CpuProducts parameter (its library forced by BRISK_CPU_PRODUCTS while it is
// made, bf16 or float32 products) with its workspace planned for `operands`.
struct ProductsBackend {
  std::string param = ::testing::TestWithParam<const char*>::GetParam();
  bool openblas = param.rfind("openblas", 0) == 0;
  bool bf16 = param == "bf16" || param == "openblas_bf16";
  std::unique_ptr<Backend> be;
  MemoryPlan plan;
  BufferBinder binder;
  std::unique_ptr<Arena> arena;
  explicit ProductsBackend(MatmulOperands operands) {
    if (openblas) set_switch("BRISK_CPU_PRODUCTS", "openblas");
    if (param == "onednn") set_switch("BRISK_CPU_PRODUCTS", "onednn");
    be = make_cpu_backend(read_switches());
    be->set_matmul_dtype(bf16 ? DType::bf16 : DType::f32);
    be->plan_workspace(plan, binder, operands);  // the library decides the packing type
    set_switch("BRISK_CPU_PRODUCTS", nullptr);
    plan.finalize();
    arena = std::make_unique<Arena>(plan, Device::cpu);
    binder.bind(*arena);
  }
};

// A linear layer's input [M,K], weight (N x K values) and output gradient [M,N], standard normal
// values drawn in that order from `seed`.
struct LinearOperands {
  std::vector<float> x, w, dy;
  LinearOperands(unsigned seed, int64_t M, int64_t K, int64_t N) : x(M * K), w(N * K), dy(M * N) {
    std::mt19937 gen(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (auto* v : {&x, &w, &dy})
      for (auto& e : *v) e = normal(gen);
  }
};

TEST_P(CpuProducts, MatchTheReferenceOnRoundedOperands) {
  ProductsBackend p(37 * 29);
  Backend* be = p.be.get();
  std::mt19937 gen(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t M = 37, K = 29, N = 23;
  auto raw = [&](int64_t n) {
    std::vector<float> v(n);
    for (auto& x : v) x = normal(gen);
    return v;
  };
  auto rounded = [&](std::vector<float> v) {
    for (auto& x : v) x = bf16_to_float(float_to_bf16(x));
    return v;
  };
  for (WeightLayout layout : {WeightLayout::out_in, WeightLayout::in_out}) {
    const bool out_in = layout == WeightLayout::out_in;
    const std::vector<float> x_raw = raw(M * K), w_raw = raw(N * K);
    std::vector<float> x = rounded(x_raw), w = rounded(w_raw), b = rounded(raw(N)),
                       dy = rounded(raw(M * N));
    auto W = [&](int64_t n, int64_t k) -> double { return out_in ? w[n * K + k] : w[k * N + n]; };
    std::vector<float> y(M * N), dx(M * K, 0.0f), dw(N * K, 0.0f), db(N, 0.0f);
    const Shape ws = out_in ? Shape{N, K} : Shape{K, N};
    be->linear_forward(Tensor(x.data(), {M, K}, DType::f32), Tensor(w.data(), ws, DType::f32),
                       Tensor(b.data(), {N}, DType::f32), layout,
                       Tensor(y.data(), {M, N}, DType::f32));
    be->linear_backward(
        Tensor(x.data(), {M, K}, DType::f32), Tensor(w.data(), ws, DType::f32),
        Tensor(dy.data(), {M, N}, DType::f32), layout, Tensor(dx.data(), {M, K}, DType::f32), false,
        Tensor(dw.data(), ws, DType::f32), Tensor(db.data(), {N}, DType::f32), true);
    std::vector<float> ry(M * N), rdx(M * K), rdw(N * K);
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        double acc = b[n];
        for (int64_t k = 0; k < K; ++k) acc += x[m * K + k] * W(n, k);
        ry[m * N + n] = static_cast<float>(acc);
      }
    for (int64_t m = 0; m < M; ++m)
      for (int64_t k = 0; k < K; ++k) {
        double acc = 0;
        for (int64_t n = 0; n < N; ++n) acc += dy[m * N + n] * W(n, k);
        rdx[m * K + k] = static_cast<float>(acc);
      }
    for (int64_t n = 0; n < N; ++n)
      for (int64_t k = 0; k < K; ++k) {
        double acc = 0;
        for (int64_t m = 0; m < M; ++m) acc += dy[m * N + n] * x[m * K + k];
        rdw[out_in ? n * K + k : k * N + n] = static_cast<float>(acc);
      }
    EXPECT_LE(rel_error(y.data(), ry.data(), M * N), 1e-6);
    // bf16 products round their operands: unrounded ones give the same bits; float32 products
    // see them as they are.
    std::vector<float> y_raw(M * N);
    be->linear_forward(Tensor(const_cast<float*>(x_raw.data()), {M, K}, DType::f32),
                       Tensor(const_cast<float*>(w_raw.data()), ws, DType::f32),
                       Tensor(b.data(), {N}, DType::f32), layout,
                       Tensor(y_raw.data(), {M, N}, DType::f32));
    EXPECT_EQ(y_raw == y, p.bf16);
    // Once a shape has its primitive, a product allocates no buffers: only oneDNN's own
    // per-call bookkeeping inside the library (13 small objects with oneDNN 2.6), a known
    // exception to brisk's no-allocation rule, bounded here so that growth is noticed; OpenBLAS
    // none.
    const size_t before = heap_allocations();
    be->linear_forward(Tensor(x.data(), {M, K}, DType::f32), Tensor(w.data(), ws, DType::f32),
                       Tensor(b.data(), {N}, DType::f32), layout,
                       Tensor(y.data(), {M, N}, DType::f32));
    EXPECT_LE(heap_allocations() - before, p.openblas ? 0u : 16u);
    EXPECT_LE(rel_error(dx.data(), rdx.data(), M * K), 1e-6);
    EXPECT_LE(rel_error(dw.data(), rdw.data(), N * K), 1e-6);
  }
}

// B rounded into oneDNN's BA16a64b2a layout by brisk's packer: every value (the specials and
// ties of rounding to nearest even among them) where the layout's index formula puts it and
// zeros in the padding, in whole blocks (the AVX-512 paths) and at edges, for both ways of
// reading B; the same bytes as oneDNN's reorder, and the product of a plain bf16 B up to float32
// summation order, where the CPU's bf16 kernel reads that layout; a bias added inside either
// product is the product plus the bias.
TEST(CpuPacking, BlockedBf16MatchesTheLayoutAndOneDnn) {
  std::mt19937 gen(21);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const float specials[] = {1.0f + 0x1p-8f,
                            1.0f + 0x1p-8f + 0x1p-23f,
                            1.0f + 3 * 0x1p-8f,
                            -0.0f,
                            INFINITY,
                            -INFINITY,
                            3.4e38f,
                            std::nanf(""),
                            1e-40f};
  int compared_with_onednn = 0;
  for (const auto& [k, n] : {std::pair<int64_t, int64_t>{64, 128},
                             {96, 192},
                             {29, 23},
                             {50, 70},
                             {100, 130},
                             {768, 256}})
    for (const bool trans : {false, true}) {
      const int64_t rows = trans ? n : k, cols = trans ? k : n, ldb = cols + 3;
      std::vector<float> b(rows * ldb);
      for (auto& v : b) v = normal(gen);
      for (size_t i = 0; i < std::size(specials); ++i) b[(i * 131) % b.size()] = specials[i];
      auto at = [&](int64_t kk, int64_t nn) { return trans ? b[nn * ldb + kk] : b[kk * ldb + nn]; };
      const int64_t kb = (k + 31) / 32, nb = (n + 63) / 64;
      std::vector<uint16_t> got(kb * nb * 2048, 0xdead), want(got.size(), 0);
      for (int64_t kk = 0; kk < k; ++kk)
        for (int64_t nn = 0; nn < n; ++nn)
          want[(nn / 64 * kb + kk / 32) * 2048 + kk % 32 / 2 * 128 + nn % 64 * 2 + kk % 2] =
              float_to_bf16(at(kk, nn));
      pack_bf16_ba16a64b2a(trans, k, n, b.data(), DType::f32, ldb, got.data());
      ASSERT_EQ(got, want) << k << " x " << n << (trans ? " transposed" : "");
      // A bf16 B (activations) moves as it is.
      std::vector<uint16_t> b16(b.size()), got16(got.size(), 0xdead);
      for (size_t i = 0; i < b.size(); ++i) b16[i] = float_to_bf16(b[i]);
      pack_bf16_ba16a64b2a(trans, k, n, b16.data(), DType::bf16, ldb, got16.data());
      ASSERT_EQ(got16, want) << k << " x " << n << (trans ? " transposed" : "") << ", from bf16";
      if (!DnnlMatmul::available(DType::bf16)) continue;
      // oneDNN's own reorder and products, on finite normal values that stay finite in bf16 (its
      // reorder need not keep NaN payloads or subnormals as float_to_bf16 does).
      for (auto& v : b)
        if (!std::isnormal(v) || std::fabs(v) > 1e30f) v = 1.0f;
      DnnlMatmul mm(DType::bf16);
      const int64_t m = 37;
      const DnnlMatmul::Product p{false, trans, m, n, k, k, ldb, n, false};
      const DnnlMatmul::BlockedB layout = mm.blocked_b(p);
      if (!layout.own_packer) continue;  // this CPU's kernel reads B in another layout
      ++compared_with_onednn;
      ASSERT_EQ(layout.bytes, got.size() * 2);
      std::vector<uint16_t> ours(got.size()), theirs(got.size());
      mm.round_blocked_b(p, b.data(), DType::f32, ours.data());
      mm.round_blocked_b(p, b.data(), DType::f32, theirs.data(), true);
      ASSERT_EQ(ours, theirs) << k << " x " << n << (trans ? " transposed" : "");
      std::vector<uint16_t> a(m * k), plain(rows * ldb);
      for (auto& v : a) v = float_to_bf16(normal(gen));
      for (size_t i = 0; i < b.size(); ++i) plain[i] = float_to_bf16(b[i]);
      std::vector<float> c_blocked(m * n), c_plain(m * n);
      mm.run_blocked_b(p, a.data(), ours.data(), c_blocked.data());
      mm.run(false, trans, m, n, k, a.data(), k, plain.data(), ldb, false, c_plain.data(), n);
      // The kernel for a plain B copies it in parts and may add along K in another order.
      EXPECT_LE(rel_error(c_blocked.data(), c_plain.data(), m * n), 1e-6)
          << k << " x " << n << (trans ? " transposed" : "");
      // A bias added inside the product (linear_forward's) is the product plus the bias, on
      // every row: the same float32 sums, bit for bit, from either B.
      std::vector<float> bias(n), c_bias(m * n, 7.0f), c_bias_plain(m * n, 7.0f);
      for (auto& v : bias) v = normal(gen);
      DnnlMatmul::Product pb = p;
      pb.bias = true;
      mm.run_blocked_b(pb, a.data(), ours.data(), c_bias.data(), bias.data());
      mm.run(false, trans, m, n, k, a.data(), k, plain.data(), ldb, false, c_bias_plain.data(), n,
             bias.data());
      for (int64_t i = 0; i < m * n; ++i) {
        ASSERT_EQ(c_bias[i], c_blocked[i] + bias[i % n]) << k << " x " << n << ", at " << i;
        ASSERT_EQ(c_bias_plain[i], c_plain[i] + bias[i % n]) << k << " x " << n << ", at " << i;
      }
    }
  if (DnnlMatmul::available(DType::bf16) && compared_with_onednn == 0)
    GTEST_SKIP() << "this CPU's bf16 kernels read B in another layout than BA16a64b2a: brisk's "
                    "packer checked against the layout's formula only";
}

// The float32 kernel rule (cpu_matmul_dnnl.cpp's prefers_gemm_kernel): a product whose B is read
// as it lies and is over 4 MiB runs on oneDNN's gemm kernel — the input gradient through a
// 768 x 3072 weight, and the weight gradient over a 1024 x 3072 input (A transposed) — while
// below 4 MiB, or with B transposed, the product keeps oneDNN's first choice (checked where that
// is brgemm, as on AVX-512 CPUs). bf16 products are left alone.
TEST(CpuPacking, LargeUntransposedFloat32BsRunOnTheGemmKernel) {
  if (!DnnlMatmul::available(DType::f32))
    GTEST_SKIP() << "this build or CPU has no oneDNN float32 products";
  DnnlMatmul mm(DType::f32);
  using P = DnnlMatmul::Product;
  const P input_grad{false, false, 1024, 768, 3072, 3072, 768, 768, false, false};
  const P weight_grad{true, false, 768, 3072, 1024, 768, 3072, 3072, true, false};
  EXPECT_EQ(mm.kernel(input_grad), "gemm:jit");
  EXPECT_EQ(mm.kernel(weight_grad), "gemm:jit");
  const P forward{false, true, 1024, 3072, 768, 768, 768, 3072, false, true};  // B = W^T
  const P small{false, false, 1024, 768, 768, 768, 768, 768, false, false};    // 2.25 MiB
  const std::string first = mm.kernel(forward);
  if (first.starts_with("brg"))
    EXPECT_TRUE(mm.kernel(small).starts_with("brg")) << mm.kernel(small);
  if (DnnlMatmul::available(DType::bf16)) {
    DnnlMatmul bf(DType::bf16);
    EXPECT_NE(bf.kernel(input_grad), "gemm:jit");
  }
}

// The float32 library rule (float32_rule_prefers_onednn): oneDNN on AVX-512 CPUs, but OpenBLAS
// on Intel CPUs without AMX it has AVX-512 kernels for, and wherever the CPU has no AVX-512; the
// core's name in any case.
TEST(CpuPacking, Float32ProductsGoToOneDnnButOnIntelCpusWithoutAmxOpenBlasKnows) {
  struct Case {
    const char* core;
    bool avx512f, amd, amx, onednn;
  };
  for (const Case& c :
       {Case{"Haswell", true, true, false, true},           // Zen 5, taken for Haswell
        Case{"COOPERLAKE", true, true, false, true},        // Zen 4
        Case{"Zen", false, true, false, false},             // Zen 3: no AVX-512
        Case{"SKYLAKEX", true, false, true, true},          // Intel AMX, taken for Skylake-X
        Case{"SapphireRapids", true, false, true, true},    // Intel AMX, known as itself
        Case{"SapphireRapids", true, false, false, false},  // the same with AMX switched off
        Case{"SKYLAKEX", true, false, false, false}, Case{"cooperlake", true, false, false, false},
        Case{"Haswell", true, false, false, true},  // an Intel CPU this OpenBLAS misreads
        Case{"Haswell", false, false, false, false}})
    EXPECT_EQ(float32_rule_prefers_onednn(c.core, c.avx512f, c.amd, c.amx), c.onednn)
        << c.core << (c.avx512f ? " AVX-512 " : " no AVX-512 ") << (c.amd ? "AMD" : "Intel")
        << (c.amx ? " AMX" : "");
}

// A weight gradient with more than 4096 rows goes in blocks of rows (cpu_linear.cpp): the blocks
// after the first read B as the first rounded it, and the result matches the fp64 reference. In
// bf16 mode also from a bf16 output gradient, which each block reads transposed with a row
// stride wider than its rows: on bf16 units brisk writes those blocks plain (bf16_transposed,
// through its 32 x 16 register blocks where there are 32 tokens or more) for oneDNN to read.
TEST_P(CpuProducts, WeightGradientsInBlocksOfRowsMatchTheReference) {
  const int64_t K = 3, N = 4100;
  ProductsBackend p(MatmulOperands(40 * N, 40 * K));
  for (const int64_t M : {5, 40})
    for (const DType dy_type : {DType::f32, DType::bf16}) {
      if (dy_type == DType::bf16 && !p.bf16) continue;
      std::mt19937 gen(11);
      std::normal_distribution<float> normal(0.0f, 1.0f);
      std::vector<float> x(M * K), w(N * K), dy(M * N), dw(N * K, 0.0f);
      for (auto* v : {&x, &w, &dy})
        for (auto& e : *v) e = bf16_to_float(float_to_bf16(normal(gen)));
      std::vector<uint16_t> dy16(M * N);
      for (int64_t i = 0; i < M * N; ++i) dy16[i] = float_to_bf16(dy[i]);
      const Tensor dyt = dy_type == DType::f32 ? Tensor(dy.data(), {M, N}, DType::f32)
                                               : Tensor(dy16.data(), {M, N}, DType::bf16);
      p.be->linear_backward(Tensor(x.data(), {M, K}, DType::f32),
                            Tensor(w.data(), {N, K}, DType::f32), dyt, WeightLayout::out_in,
                            Tensor(), false, Tensor(dw.data(), {N, K}, DType::f32), Tensor(), true);
      std::vector<float> want(N * K);
      for (int64_t n = 0; n < N; ++n)
        for (int64_t k = 0; k < K; ++k) {
          double acc = 0;
          for (int64_t m = 0; m < M; ++m) acc += static_cast<double>(dy[m * N + n]) * x[m * K + k];
          want[n * K + k] = static_cast<float>(acc);
        }
      const std::string what = std::to_string(M) + " tokens, dy " + dtype_name(dy_type);
      EXPECT_LE(rel_error(dw.data(), want.data(), N * K), 1e-6) << what;
      // The last block's rows, past 4096, are right too.
      EXPECT_LE(rel_error(dw.data() + 4096 * K, want.data() + 4096 * K, (N - 4096) * K), 1e-6)
          << what;
    }
}

// A held weight (Backend::hold_weight) is rounded once into its planned buffer (on bf16 units
// into the blocked layouts of the two products that read it, padded: 23 x 29 is 64 x 32 there):
// the products that read it give the same bits as unheld ones, and until release_weight they
// read that copy; after it they read the weight again. float32 products have nothing to
// prepare: they always read it.
TEST_P(CpuProducts, AHeldWeightGivesTheSameBits) {
  const int64_t M = 37, K = 29, N = 23;
  ProductsBackend p(MatmulOperands(M * K, N * K, N * K, K));
  Backend* be = p.be.get();
  LinearOperands random(9, M, K, N);
  std::vector<float>&x = random.x, &w = random.w, &dy = random.dy;
  const Tensor xt(x.data(), {M, K}, DType::f32), wt(w.data(), {N, K}, DType::f32);
  const Tensor dyt(dy.data(), {M, N}, DType::f32);
  auto products = [&] {
    std::vector<float> y(M * N), dx(M * K);
    be->linear_forward(xt, wt, Tensor(), WeightLayout::out_in,
                       Tensor(y.data(), {M, N}, DType::f32));
    be->linear_backward(xt, wt, dyt, WeightLayout::out_in, Tensor(dx.data(), {M, K}, DType::f32),
                        false, Tensor(), Tensor(), true);
    y.insert(y.end(), dx.begin(), dx.end());
    return y;
  };
  const std::vector<float> unheld = products();
  be->hold_weight(wt);
  EXPECT_EQ(products(), unheld);
  const float first = w[0];
  w[0] += 1.0f;  // breaks the caller's promise, to see which copy the products read
  EXPECT_EQ(products() == unheld, p.bf16);
  be->release_weight();
  EXPECT_NE(products(), unheld);
  w[0] = first;
  EXPECT_EQ(products(), unheld);
}

// On bf16 units B (a weight, rounded, or a bf16 or float32 input or output gradient in a weight
// gradient's product) is packed per product straight into the blocked layout its kernel reads
// where the packing buffer holds the padded layout, else passed plainly (and copied into that
// layout inside the kernel): the same bits either way, for weights that pad on both sides and on
// one, in both layouts, forward and backward, from a float32 and a bf16 input.
TEST_P(CpuProducts, AWeightPackedBlockedOrPlainGivesTheSameBits) {
  for (const auto& [K, N] : {std::pair<int64_t, int64_t>{29, 23}, {96, 70}}) {
    const int64_t M = 37;
    LinearOperands random(19, M, K, N);
    std::vector<uint16_t> x16(M * K);
    for (int64_t i = 0; i < M * K; ++i) x16[i] = float_to_bf16(random.x[i]);
    auto products = [&](const MatmulOperands& operands, bool bf16_input) {
      ProductsBackend p(operands);
      std::vector<float> out;
      if (bf16_input && !p.bf16) return out;
      for (WeightLayout layout : {WeightLayout::out_in, WeightLayout::in_out}) {
        const Shape ws = layout == WeightLayout::out_in ? Shape{N, K} : Shape{K, N};
        std::vector<float> y(M * N), dx(M * K), dw(N * K);
        const Tensor xt = bf16_input ? Tensor(x16.data(), {M, K}, DType::bf16)
                                     : Tensor(random.x.data(), {M, K}, DType::f32);
        const Tensor wt(random.w.data(), ws, DType::f32);
        p.be->linear_forward(xt, wt, Tensor(), layout, Tensor(y.data(), {M, N}, DType::f32));
        p.be->linear_backward(xt, wt, Tensor(random.dy.data(), {M, N}, DType::f32), layout,
                              Tensor(dx.data(), {M, K}, DType::f32), false,
                              Tensor(dw.data(), ws, DType::f32), Tensor(), false);
        for (const auto* part : {&y, &dx, &dw}) out.insert(out.end(), part->begin(), part->end());
      }
      return out;
    };
    const int64_t a = M * std::max(K, N);
    for (const bool bf16_input : {false, true}) {
      const std::vector<float> plain = products(MatmulOperands(a, std::max(N, M) * K), bf16_input);
      EXPECT_EQ(products(MatmulOperands(a, cpu_blocked_elements(K, N)), bf16_input), plain)
          << K << " x " << N << (bf16_input ? ", bf16 input" : "");
    }
  }
}

// A product input stored in bf16 (Backend::reads_product_input: the model's 16-bit activations)
// gives the same bits as the float32 input it was rounded from, in both layouts and every product
// that reads it (forward; the weight gradient, with A and B in both roles, alone and beside the
// input gradient); float32 products refuse it, naming the op.
TEST_P(CpuProducts, ABf16InputGivesTheSameBitsAsItsFloat32) {
  const int64_t M = 37, K = 29, N = 23;
  ProductsBackend p(M * K * 2);
  Backend* be = p.be.get();
  EXPECT_EQ(be->reads_product_input(DType::bf16), p.bf16);
  EXPECT_FALSE(be->reads_product_input(DType::f16));
  LinearOperands random(13, M, K, N);
  std::vector<float>&x = random.x, &w = random.w, &dy = random.dy;
  std::vector<uint16_t> x16(M * K);
  for (int64_t i = 0; i < M * K; ++i) x16[i] = float_to_bf16(x[i]);
  const Tensor x32t(x.data(), {M, K}, DType::f32), x16t(x16.data(), {M, K}, DType::bf16);
  if (!p.bf16) {
    std::vector<float> y(M * N);
    EXPECT_THROW(be->linear_forward(x16t, Tensor(w.data(), {N, K}, DType::f32), Tensor(),
                                    WeightLayout::out_in, Tensor(y.data(), {M, N}, DType::f32)),
                 Error);
    return;
  }
  for (WeightLayout layout : {WeightLayout::out_in, WeightLayout::in_out}) {
    const Shape ws = layout == WeightLayout::out_in ? Shape{N, K} : Shape{K, N};
    // The weight gradient alone, written over NaNs, and with the input gradient (dy then packed
    // once for both), added to zeros: the same bits.
    auto products = [&](const Tensor& xt) {
      std::vector<float> y(M * N), dw(N * K, std::nanf("")), dw2(N * K, 0.0f), dx(M * K);
      be->linear_forward(xt, Tensor(w.data(), ws, DType::f32), Tensor(), layout,
                         Tensor(y.data(), {M, N}, DType::f32));
      be->linear_backward(xt, Tensor(w.data(), ws, DType::f32),
                          Tensor(dy.data(), {M, N}, DType::f32), layout, Tensor(), false,
                          Tensor(dw.data(), ws, DType::f32), Tensor(), false);
      be->linear_backward(xt, Tensor(w.data(), ws, DType::f32),
                          Tensor(dy.data(), {M, N}, DType::f32), layout,
                          Tensor(dx.data(), {M, K}, DType::f32), false,
                          Tensor(dw2.data(), ws, DType::f32), Tensor(), true);
      EXPECT_EQ(dw2, dw);
      for (const auto* part : {&dw, &dx}) y.insert(y.end(), part->begin(), part->end());
      return y;
    };
    const std::vector<float> want = products(x32t);
    EXPECT_EQ(products(x16t), want);
    // Not a copy of the float32 answer: the input takes part.
    x16[0] = float_to_bf16(x[0] + 1.0f);
    EXPECT_NE(products(x16t), want);
    x16[0] = float_to_bf16(x[0]);
  }
}

// A product's output stored in bf16 (Backend::stores_product_output: bf16 products on bf16 units)
// holds the float32 output rounded to nearest even, bit for bit, in both layouts, with and without
// a bias, from a float32 or bf16 input and from a held weight; dropout_add reads such a branch as
// the float32 one holding the same values. Elsewhere both refuse a bf16 output, naming the op.
TEST_P(CpuProducts, ABf16OutputIsTheFloat32OneRounded) {
  const int64_t M = 37, K = 29, N = 23;
  ProductsBackend p(M * K * 2);
  Backend* be = p.be.get();
  const bool stores = be->stores_product_output(DType::bf16);
  EXPECT_EQ(stores, p.bf16 && !p.openblas && cpu_has_bf16_products());
  EXPECT_FALSE(be->stores_product_output(DType::f16));
  EXPECT_FALSE(be->stores_product_output(DType::f32));
  LinearOperands random(19, M, K, N);
  std::vector<float> bias(N);
  for (int64_t j = 0; j < N; ++j) bias[j] = random.dy[j];
  std::vector<uint16_t> x16(M * K);
  for (int64_t i = 0; i < M * K; ++i) x16[i] = float_to_bf16(random.x[i]);
  std::vector<float> y32(M * N);
  std::vector<uint16_t> y16(M * N);
  const Tensor y32t(y32.data(), {M, N}, DType::f32), y16t(y16.data(), {M, N}, DType::bf16);
  if (!stores) {
    EXPECT_THROW(be->linear_forward(Tensor(random.x.data(), {M, K}, DType::f32),
                                    Tensor(random.w.data(), {N, K}, DType::f32), Tensor(),
                                    WeightLayout::out_in, y16t),
                 Error);
    EXPECT_THROW(be->dropout_add(y32t, y16t, 0.0f, RngKey{}, y32t), Error);
    return;
  }
  for (WeightLayout layout : {WeightLayout::out_in, WeightLayout::in_out})
    for (bool with_bias : {false, true})
      for (bool bf16_input : {false, true})
        for (bool held : {false, true}) {
          const Shape ws = layout == WeightLayout::out_in ? Shape{N, K} : Shape{K, N};
          const Tensor xt = bf16_input ? Tensor(x16.data(), {M, K}, DType::bf16)
                                       : Tensor(random.x.data(), {M, K}, DType::f32);
          const Tensor wt(random.w.data(), ws, DType::f32);
          const Tensor bt = with_bias ? Tensor(bias.data(), {N}, DType::f32) : Tensor();
          if (held) be->hold_weight(wt);
          std::fill(y16.begin(), y16.end(), uint16_t{0x7fc1});  // NaNs where nothing is written
          be->linear_forward(xt, wt, bt, layout, y16t);
          be->linear_forward(xt, wt, bt, layout, y32t);
          if (held) be->release_weight();
          int64_t differ = 0;
          for (int64_t i = 0; i < M * N; ++i) differ += y16[i] != float_to_bf16(y32[i]);
          EXPECT_EQ(differ, 0) << (layout == WeightLayout::out_in ? "out_in" : "in_out")
                               << (with_bias ? ", bias" : "") << (bf16_input ? ", bf16 input" : "")
                               << (held ? ", held weight" : "");
        }
  // The branch as dropout_add reads it: the float32 values it holds, kept or dropped alike.
  std::vector<float> widened(M * N), x(random.x.begin(), random.x.begin() + M * N);
  for (int64_t i = 0; i < M * N; ++i) widened[i] = bf16_to_float(y16[i]);
  for (float drop : {0.0f, 0.25f}) {
    std::vector<float> want(M * N), got(M * N);
    const RngKey key{5, 3, 2};
    be->dropout_add(Tensor(x.data(), {M, N}, DType::f32),
                    Tensor(widened.data(), {M, N}, DType::f32), drop, key,
                    Tensor(want.data(), {M, N}, DType::f32));
    be->dropout_add(Tensor(x.data(), {M, N}, DType::f32), y16t, drop, key,
                    Tensor(got.data(), {M, N}, DType::f32));
    EXPECT_EQ(got, want) << "dropout " << drop;
    y16[0] = float_to_bf16(widened[0] + 1.0f);  // not a copy of the float32 answer
    be->dropout_add(Tensor(x.data(), {M, N}, DType::f32), y16t, drop, key,
                    Tensor(got.data(), {M, N}, DType::f32));
    EXPECT_NE(got, want) << "dropout " << drop;
    y16[0] = float_to_bf16(widened[0]);
  }
  // Over several of dropout_add's pieces, with the sum written over x: the mask dropout_forward
  // draws over the whole branch (its own loop), element by element, whatever piece an element
  // is widened in; the float32 branch gives the same bits.
  const int64_t L = 3001;
  std::vector<uint16_t> r16(L);
  std::vector<float> r32(L), base(L), mask(L);
  for (int64_t i = 0; i < L; ++i) {
    r16[i] = float_to_bf16(1.0f + std::fabs(random.x[i % (M * K)]));  // never 0
    r32[i] = bf16_to_float(r16[i]);
    base[i] = random.w[i % (N * K)];
  }
  const RngKey key{7, 1, 4};
  be->dropout_forward(Tensor(r32.data(), {L}, DType::f32), 0.5f, key,
                      Tensor(mask.data(), {L}, DType::f32));
  std::vector<float> want(base), got(base);
  be->dropout_add(Tensor(want.data(), {L}, DType::f32), Tensor(r32.data(), {L}, DType::f32), 0.5f,
                  key, Tensor(want.data(), {L}, DType::f32));
  be->dropout_add(Tensor(got.data(), {L}, DType::f32), Tensor(r16.data(), {L}, DType::bf16), 0.5f,
                  key, Tensor(got.data(), {L}, DType::f32));
  EXPECT_EQ(got, want) << "a branch of " << L << " values, written over x";
  int64_t kept = 0, wrong = 0;
  for (int64_t i = 0; i < L; ++i) {
    kept += mask[i] != 0.0f;
    wrong += mask[i] == 0.0f ? got[i] != base[i]
                             : std::fabs(got[i] - (base[i] + 2.0f * r32[i])) > 1e-5f * 8;
  }
  EXPECT_EQ(wrong, 0);
  EXPECT_GT(kept, L / 4);
  EXPECT_LT(kept, 3 * L / 4);
}

// An output gradient stored in bf16 (what the CPU's bf16 LM heads pass: the logits' gradient
// rounded once; and SwiGLU's bias-free input gradient) gives the same input, weight and bias
// gradients, bit for bit, as the float32 gradient holding the same values, in both layouts,
// written or added; float32 products refuse it, naming the op. And bf16 products round a float32
// gradient as they take it in: an unrounded one gives the input and weight gradients of its
// rounded values (what lets block_backward skip rounding a bias-free gradient first).
TEST_P(CpuProducts, ABf16OutputGradientGivesTheSameBitsAsItsFloat32) {
  const int64_t M = 37, K = 29, N = 23;
  ProductsBackend p(M * K * 2);
  Backend* be = p.be.get();
  LinearOperands random(17, M, K, N);
  std::vector<float>&x = random.x, &w = random.w, &dy = random.dy;
  const std::vector<float> unrounded = dy;
  std::vector<uint16_t> dy16(M * N);
  for (int64_t i = 0; i < M * N; ++i) {
    dy16[i] = float_to_bf16(dy[i]);
    dy[i] = bf16_to_float(dy16[i]);
  }
  const Tensor xt(x.data(), {M, K}, DType::f32);
  const Tensor dy32(dy.data(), {M, N}, DType::f32), dy16t(dy16.data(), {M, N}, DType::bf16);
  std::vector<uint16_t> x16(M * K);
  for (int64_t i = 0; i < M * K; ++i) x16[i] = float_to_bf16(x[i]);
  const Tensor x16t(x16.data(), {M, K}, DType::bf16);
  for (WeightLayout layout : {WeightLayout::out_in, WeightLayout::in_out})
    for (bool accumulate : {false, true}) {
      const Shape ws = layout == WeightLayout::out_in ? Shape{N, K} : Shape{K, N};
      auto gradients = [&](const Tensor& g, bool bias = true, const Tensor& in = Tensor()) {
        std::vector<float> dx(M * K), dw(N * K, 0.5f), db(N, 0.25f);
        be->linear_backward(in.empty() ? xt : in, Tensor(w.data(), ws, DType::f32), g, layout,
                            Tensor(dx.data(), {M, K}, DType::f32), false,
                            Tensor(dw.data(), ws, DType::f32),
                            bias ? Tensor(db.data(), {N}, DType::f32) : Tensor(), accumulate);
        for (const auto* part : {&dw, &db}) dx.insert(dx.end(), part->begin(), part->end());
        return dx;
      };
      if (!p.bf16) {
        EXPECT_THROW(gradients(dy16t), Error);
        continue;
      }
      const std::vector<float> want = gradients(dy32);
      EXPECT_EQ(gradients(dy16t), want);
      const Tensor raw(const_cast<float*>(unrounded.data()), {M, N}, DType::f32);
      EXPECT_EQ(gradients(raw, false), gradients(dy32, false)) << "an unrounded float32 gradient";
      // With a bf16 input both products read one packing of the gradient (linear_backward).
      EXPECT_EQ(gradients(raw, false, x16t), gradients(dy32, false, x16t))
          << "an unrounded float32 gradient, bf16 input";
      dy16[0] = float_to_bf16(dy[0] + 1.0f);  // not a copy of the float32 answer
      EXPECT_NE(gradients(dy16t), want);
      dy16[0] = float_to_bf16(dy[0]);
    }
}

// Attention's products in each library and type (in bf16 mode the probabilities and their
// gradient rounded to bf16, on bf16 units or not) against float32 attention, which the
// conformance suite holds to its fp64 reference: within bf16's precision on q, k, v rounded to
// bf16, over three blocks of query rows (the last one short: 2 rows, or 3 with an odd length
// that the bf16 tiles pad), causal with dropout and grouped heads, or with a key mask; and a
// right-padded batch given its rows' key counts too (odd ones), against the float32 attention
// given the mask alone.
TEST_P(CpuProducts, AttentionStaysCloseToFloat32) {
  for (const auto& [T, D] : {std::pair<int64_t, int64_t>{130, 16}, {131, 64}})
    attention_stays_close_to_float32(T, D);
}

void CpuProducts::attention_stays_close_to_float32(int64_t T, int64_t D) {
  SCOPED_TRACE("T = " + std::to_string(T) + ", D = " + std::to_string(D));
  ProductsBackend p(1);
  auto reference = make_cpu_backend();
  reference->set_matmul_dtype(DType::f32);
  const int64_t B = 3, H = 4, K = 2, W = (H + 2 * K) * D, C = H * D;
  std::mt19937 gen(17);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> qkv(B * T * W), dout(B * T * C);
  for (auto& x : qkv) x = bf16_to_float(float_to_bf16(normal(gen)));
  for (auto& x : dout) x = bf16_to_float(float_to_bf16(normal(gen)));
  std::vector<int32_t> mask(B * T, 1);
  for (int64_t t = 100; t < T; ++t) mask[t] = 0;   // the first sequence's last 30 keys hidden
  std::fill(mask.begin() + 2 * T, mask.end(), 0);  // the third sequence's queries see no key
  std::vector<int32_t> right_padded(B * T, 0), lengths{101, static_cast<int32_t>(T), 37};
  for (int64_t b = 0; b < B; ++b)
    std::fill_n(right_padded.begin() + b * T, lengths[static_cast<size_t>(b)], 1);
  const AttentionBuffers ab = attention_buffers(Device::cpu, B, H, T, D);
  for (const bool causal : {true, false})
    for (const bool padded : {false, true}) {
      auto run = [&](Backend& be, bool with_lengths) {
        // Scratch as a previous layer leaves it, not zeros (nor a float whose low bf16 half is).
        std::vector<float> stats(ab.stats.numel()), scratch(ab.scratch.numel(), 1.1f),
            out(B * T * C), dqkv(qkv.size());
        const Tensor q(qkv.data(), {B, T, W}, DType::f32);
        KeyMask m = causal ? KeyMask() : KeyMask(Tensor(mask.data(), {B, T}, DType::i32));
        if (padded) m = KeyMask(Tensor(right_padded.data(), {B, T}, DType::i32));
        if (with_lengths) m.lengths = Tensor(lengths.data(), {B}, DType::i32);
        const float p_drop = causal ? 0.1f : 0.0f;
        const RngKey key{3, 1, 0};
        const Tensor st(stats.data(), ab.stats, DType::f32),
            sc(scratch.data(), ab.scratch, DType::f32);
        be.attention_forward(q, m, causal, H, K, 0.25f, p_drop, key, st, sc,
                             Tensor(out.data(), {B, T, C}, DType::f32));
        be.attention_backward(Tensor(dout.data(), {B, T, C}, DType::f32), q,
                              Tensor(out.data(), {B, T, C}, DType::f32), st, m, causal, H, K, 0.25f,
                              p_drop, key, sc, Tensor(dqkv.data(), {B, T, W}, DType::f32),
                              DType::f32, DType::f32);
        out.insert(out.end(), dqkv.begin(), dqkv.end());
        return out;
      };
      const std::vector<float> want = run(*reference, false), got = run(*p.be, padded);
      const double err = rel_error(got.data(), want.data(), static_cast<int64_t>(want.size()));
      EXPECT_LE(err, p.bf16 ? 5e-3 : 1e-5) << (padded   ? "right-padded"
                                               : causal ? "causal"
                                                        : "masked");
      if (p.bf16) EXPECT_GT(err, 0.0) << "bf16 mode rounds the probabilities";
      if (!causal && !padded)  // queries that see no key: zero outputs
        EXPECT_EQ(std::count(got.begin() + 2 * T * C, got.begin() + 3 * T * C, 0.0f), T * C);
    }
}

INSTANTIATE_TEST_SUITE_P(Precision, CpuProducts,
                         ::testing::Values("bf16", "f32", "onednn", "openblas", "openblas_bf16"),
                         [](const auto& info) { return std::string(info.param); });

}  // namespace
}  // namespace brisk::testing
