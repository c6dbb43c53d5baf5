// Micro-benchmark of the CPU's bf16 operand packing and of what it buys the products, at the
// block-weight shapes of GPT-2 and SmolLM2 (K x N of B; 1024 rows of A, the CPU speed benchmark's
// 4 x 256 tokens). Per shape and way of reading B (plain: B = W, transposed: B = W^T):
//   - brisk's packer into oneDNN's blocked bf16 layout (pack_bf16_ba16a64b2a) against the plain
//     rounding (bf16_operand), each over 12 weights in turn (so B comes from memory, not cache);
//   - oneDNN's product with B plain (the kernel copies it into its layout) and with B already
//     blocked, in bf16 and in float32 (the float32 blocked layout is BA16a64b).
// Then the rounding of one row to bf16 on one thread (bf16_round_row, which every CPU op storing
// bf16 rows calls) against the integer rounding on AVX-512 registers (round16_bits: the path for
// builds without AVX512-BF16 and for vectors holding a denormal), from L1 and L2 and from memory.
// Build: cmake --build build --target bench_packing; run: OMP_NUM_THREADS=2 build/bench_packing
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <oneapi/dnnl/dnnl.hpp>
#include <vector>

#include "backend/cpu/cpu_avx512.h"
#include "backend/cpu/cpu_matmul_dnnl.h"
#include "backend/cpu/cpu_tiles.h"

namespace {
double seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

template <typename F>
double best_of(int reps, F&& f) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const double t = seconds();
    f();
    best = std::min(best, seconds() - t);
  }
  return best;
}

// GFLOP/s of oneDNN's M x K x N product with B read as `b_tag` (ab or ba: plain; any: the
// kernel's blocked layout, filled beforehand).
double product_gflops(dnnl::engine& eng, dnnl::stream& stream, dnnl::memory::data_type dt,
                      int64_t m, int64_t k, int64_t n, dnnl::memory::format_tag b_tag) {
  using dnnl::memory;
  const memory::desc ad({m, k}, dt, memory::format_tag::ab), bd({k, n}, dt, b_tag);
  const memory::desc cd({m, n}, memory::data_type::f32, memory::format_tag::ab);
  const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(ad, bd, cd), eng);
  const dnnl::matmul mm(pd);
  memory am(ad, eng), bm(pd.weights_desc(), eng), cm(cd, eng);
  for (memory* x : {&am, &bm})
    std::fill_n(static_cast<char*>(x->get_data_handle()), x->get_desc().get_size(), 0x3f);
  const double t = best_of(10, [&] {
    mm.execute(stream, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
    stream.wait();
  });
  return 2.0 * static_cast<double>(m * n * k) / t / 1e9;
}
}  // namespace

int main() {
  using brisk::DType;
  using tag = dnnl::memory::format_tag;
  using dt = dnnl::memory::data_type;
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(eng);
  const int64_t M = 1024, kWeights = 12;
  const std::pair<int64_t, int64_t> shapes[] = {{768, 2304}, {768, 768},  {768, 3072},
                                                {3072, 768}, {576, 1536}, {1536, 576}};
  std::printf(
      "| K x N | B | pack blocked (ms) | round plain (ms) | bf16 plain B | bf16 blocked B "
      "| fp32 plain B | fp32 blocked B |\n|---|---|---|---|---|---|---|---|\n");
  for (const auto& [k, n] : shapes)
    for (const bool trans : {false, true}) {
      const int64_t rows = trans ? n : k, cols = trans ? k : n;
      std::vector<std::vector<float>> w(kWeights, std::vector<float>(rows * cols, 1.5f));
      std::vector<uint16_t> blocked(((k + 31) / 32) * ((n + 63) / 64) * 2048), plain(rows * cols);
      const brisk::Tensor plain_t(plain.data(), brisk::Shape{rows * cols}, DType::bf16);
      const double pack = best_of(5, [&] {
        for (const auto& x : w)
          brisk::pack_bf16_ba16a64b2a(trans, k, n, x.data(), DType::f32, cols, blocked.data());
      });
      const double round = best_of(5, [&] {
        for (const auto& x : w) brisk::bf16_operand(x.data(), rows, cols, cols, plain_t);
      });
      const tag plain_tag = trans ? tag::ba : tag::ab;
      std::printf("| %ld x %ld | %s | %.3f | %.3f | %.0f | %.0f | %.0f | %.0f |\n",
                  static_cast<long>(k), static_cast<long>(n), trans ? "W^T" : "W",
                  pack / kWeights * 1e3, round / kWeights * 1e3,
                  product_gflops(eng, stream, dt::bf16, M, k, n, plain_tag),
                  product_gflops(eng, stream, dt::bf16, M, k, n, tag::any),
                  product_gflops(eng, stream, dt::f32, M, k, n, plain_tag),
                  product_gflops(eng, stream, dt::f32, M, k, n, tag::any));
    }
  std::printf(
      "\n| floats in the row | integer rounding (Gfloat/s) | bf16_round_row (Gfloat/s) |\n"
      "|---|---|---|\n");
  for (const int64_t n : {int64_t{16} << 10, int64_t{128} << 10, int64_t{32} << 20}) {
    std::vector<float> in(n);
    for (int64_t i = 0; i < n; ++i) in[i] = 1.0f + static_cast<float>(i % 1000) * 1e-3f;
    std::vector<uint16_t> out(n);
    const int reps = n > (int64_t{1} << 20) ? 5 : 200;
    double integer = 0;
#ifdef BRISK_PACK_AVX512
    integer = best_of(reps, [&] {
      for (int64_t j = 0; j + 16 <= n; j += 16)
        _mm256_storeu_si256(
            reinterpret_cast<__m256i*>(out.data() + j),
            _mm512_cvtepi32_epi16(brisk::avx512::round16_bits(_mm512_loadu_ps(in.data() + j))));
    });
#endif
    const double row = best_of(reps, [&] { brisk::bf16_round_row(in.data(), out.data(), n); });
    std::printf("| %ld | %.1f | %.1f |\n", static_cast<long>(n),
                integer > 0 ? static_cast<double>(n) / integer / 1e9 : 0.0,
                static_cast<double>(n) / row / 1e9);
  }
  return 0;
}
