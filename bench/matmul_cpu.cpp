// Micro-benchmark: OpenBLAS sgemm against oneDNN matmul in float32 and bf16 at the shapes of the
// CPU BERT benchmark (tokens x hidden x intermediate). Prints one line per shape and type.
// With --peak it prints instead, as one JSON line, the machine's matrix-product peaks the speed
// benchmark (bench/cpu_speed.py) measures fractions against: the best GFLOP/s of large square
// products, float32 (the faster of OpenBLAS and oneDNN) and bf16 (oneDNN); with them, for
// reference, the instruction ceilings those products run under: every thread issuing only
// independent 512-bit FMAs (vfmadd231ps) or bf16 dot products (vdpbf16ps) on registers, 0 where
// the CPU lacks the instruction.
// With --f32-kernels it prints oneDNN's float32 kernels against each other at the step's shapes;
// with --bf16-shapes, bf16 products at SmolLM2's block shapes with A plain or transposed and the
// result in float32 or bf16.
// Build: cmake --build build --target bench_matmul; run: OMP_NUM_THREADS=2 build/bench_matmul
#include <cblas.h>
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <oneapi/dnnl/dnnl.hpp>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

namespace {
double seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Seconds of one call of a made product, the best of `reps` after a warm-up call.
double best_seconds(const dnnl::matmul& mm, dnnl::stream& stream,
                    const std::unordered_map<int, dnnl::memory>& args, int reps) {
  double best = 1e30;
  for (int r = 0; r <= reps; ++r) {  // run 0 warms up
    const double t = seconds();
    mm.execute(stream, args);
    stream.wait();
    if (r > 0) best = std::min(best, seconds() - t);
  }
  return best;
}

// GFLOP/s of oneDNN's M x M x M product in `dt` (float32 result), the best of `reps` runs; 0
// when oneDNN has no kernel for this CPU.
double onednn_gflops(dnnl::engine& eng, dnnl::stream& stream, dnnl::memory::data_type dt, int M,
                     int reps) {
  using dnnl::memory;
  memory::desc ad({M, M}, dt, memory::format_tag::ab);
  memory::desc bd({M, M}, dt, memory::format_tag::ab);
  memory::desc cd({M, M}, memory::data_type::f32, memory::format_tag::ab);
  dnnl::matmul::primitive_desc pd;
  try {
    pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(ad, bd, cd), eng);
  } catch (const dnnl::error&) {
    return 0;
  }
  dnnl::matmul mm(pd);
  memory am(ad, eng), bm(bd, eng), cm(cd, eng);
  std::fill_n(static_cast<char*>(am.get_data_handle()), ad.get_size(), 0x3f);
  std::fill_n(static_cast<char*>(bm.get_data_handle()), bd.get_size(), 0x3f);
  const std::unordered_map<int, memory> args{
      {DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}};
  return 2.0 * M * M * M / best_seconds(mm, stream, args, reps) * 1e-9;
}

double openblas_gflops(int M, int reps) {
  std::vector<float> a(size_t(M) * M, 0.5f), b(size_t(M) * M, 0.25f), c(size_t(M) * M);
  double best = 1e30;
  for (int r = 0; r <= reps; ++r) {
    const double t = seconds();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, M, M, 1, a.data(), M, b.data(), M, 0,
                c.data(), M);
    if (r > 0) best = std::min(best, seconds() - t);
  }
  return 2.0 * M * M * M / best * 1e-9;
}

// The instruction ceiling: GFLOP/s of all OpenMP threads each running `body` (which issues
// 12 * `iterations` independent instructions of `flops` each), the best of 5 runs.
template <typename Body>
double ceiling_gflops(int64_t iterations, double flops, Body body) {
  double best = 0;
  for (int r = 0; r < 5; ++r) {
    const double t = seconds();
    float sink = 0;
#pragma omp parallel reduction(+ : sink)
    sink += body(iterations);
    const double rate = omp_get_max_threads() * 12.0 * iterations * flops / (seconds() - t);
    if (sink != 1.0f) best = std::max(best, rate * 1e-9);  // sink keeps the work (never 1)
  }
  return best;
}

// 12 chains of 512-bit instructions, long enough apart to hide the latency; the starting values
// keep the sums finite.
__attribute__((target("avx512f"))) float fma_chains(int64_t iterations) {
  __m512 acc[12];
  for (auto& a : acc) a = _mm512_setzero_ps();
  const __m512 x = _mm512_set1_ps(1e-6f), y = _mm512_set1_ps(1e-6f);
  for (int64_t i = 0; i < iterations; ++i)
    for (auto& a : acc) a = _mm512_fmadd_ps(x, y, a);
  float s = 0;
  for (auto& a : acc) s += _mm512_reduce_add_ps(a);
  return s;
}

__attribute__((target("avx512f,avx512bf16"))) float bf16_dot_chains(int64_t iterations) {
  __m512 acc[12];
  for (auto& a : acc) a = _mm512_setzero_ps();
  const __m512bh x = (__m512bh)_mm512_set1_epi32(0x358d358d);  // bf16 1.05e-6 twice
  for (int64_t i = 0; i < iterations; ++i)
    for (auto& a : acc) a = _mm512_dpbf16_ps(a, x, x);
  float s = 0;
  for (auto& a : acc) s += _mm512_reduce_add_ps(a);
  return s;
}

int peak(dnnl::engine& eng, dnnl::stream& stream) {
  double f32 = 0, f32_dnnl = 0, bf16 = 0;
  for (int M : {1024, 2048, 3072}) {
    f32 = std::max(f32, openblas_gflops(M, 5));
    f32_dnnl = std::max(f32_dnnl, onednn_gflops(eng, stream, dnnl::memory::data_type::f32, M, 5));
    bf16 = std::max(bf16, onednn_gflops(eng, stream, dnnl::memory::data_type::bf16, M, 5));
  }
  constexpr int64_t kIterations = 20'000'000;
  const double fma = __builtin_cpu_supports("avx512f")
                         ? ceiling_gflops(kIterations, 32, fma_chains)  // 16 lanes x 2
                         : 0;
  const double dot = __builtin_cpu_supports("avx512bf16")
                         ? ceiling_gflops(kIterations, 64, bf16_dot_chains)  // 16 x 2 pairs x 2
                         : 0;
  std::printf(
      "{\"fp32_gflops\": %.1f, \"fp32_openblas_gflops\": %.1f, \"fp32_onednn_gflops\": %.1f, "
      "\"bf16_gflops\": %.1f, \"fp32_fma_ceiling_gflops\": %.1f, "
      "\"bf16_dot_ceiling_gflops\": %.1f}\n",
      std::max(f32, f32_dnnl), f32, f32_dnnl, bf16, fma, dot);
  return 0;
}

// Float32 at the step's shapes: oneDNN's first choice (brgemm on AVX-512) against its gemm
// kernel, the best of 5 runs each, for A and B as the linear layers' products read them (the
// forward pass's B transposed, the weight gradient's A transposed, the input gradient's both as
// they lie). Backs cpu_matmul_dnnl.cpp's prefers_gemm_kernel.
int f32_kernels(dnnl::engine& eng, dnnl::stream& stream) {
  using dnnl::memory;
  struct Shape {
    int m, k, n;
    bool ta, tb;
  };
  const Shape shapes[] = {{1024, 768, 3072, false, true},  {1024, 3072, 768, false, true},
                          {1024, 3072, 768, false, false}, {1024, 2304, 768, false, false},
                          {1024, 768, 768, false, false},  {768, 1024, 3072, true, false},
                          {3072, 1024, 768, true, false},  {576, 1024, 1536, true, false},
                          {1024, 3072, 576, false, false}, {1024, 1536, 576, false, false},
                          {256, 768, 50257, false, true},  {256, 50257, 768, false, false},
                          {256, 49152, 576, false, false}};
  std::printf("| M x K x N | A | B | B MiB | first choice | GFLOP/s | gemm:jit GFLOP/s |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  for (const Shape& s : shapes) {
    const memory::desc ad({s.m, s.k}, memory::data_type::f32,
                          s.ta ? memory::format_tag::ba : memory::format_tag::ab);
    const memory::desc bd({s.k, s.n}, memory::data_type::f32,
                          s.tb ? memory::format_tag::ba : memory::format_tag::ab);
    const memory::desc cd({s.m, s.n}, memory::data_type::f32, memory::format_tag::ab);
    memory am(ad, eng), bm(bd, eng), cm(cd, eng);
    std::fill_n(static_cast<float*>(am.get_data_handle()), ad.get_size() / 4, 0.5f);
    std::fill_n(static_cast<float*>(bm.get_data_handle()), bd.get_size() / 4, 0.25f);
    const std::unordered_map<int, memory> args{
        {DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}};
    auto rate = [&](const dnnl::matmul::primitive_desc& pd) {
      return 2.0 * s.m * s.k * s.n / best_seconds(dnnl::matmul(pd), stream, args, 5) * 1e-9;
    };
    const dnnl::matmul::desc desc(ad, bd, cd);
    const dnnl::matmul::primitive_desc pd(desc, eng);
    // (oneDNN 2.6's iterator stops once a primitive has been made from the descriptor: a second
    // one walks to the gemm kernel.)
    dnnl::matmul::primitive_desc gemm(desc, eng);
    bool has_gemm = false;
    while (!has_gemm && gemm.next_impl())
      has_gemm = std::string(gemm.impl_info_str()) == "gemm:jit";
    const std::string first = pd.impl_info_str();
    const double first_rate = rate(pd), gemm_rate = has_gemm ? rate(gemm) : 0.0;
    std::printf("| %d x %d x %d | %s | %s | %.1f | %s | %.0f | %.0f |\n", s.m, s.k, s.n,
                s.ta ? "transposed" : "plain", s.tb ? "transposed" : "plain",
                4.0 * s.k * s.n / (1 << 20), first.c_str(), first_rate, gemm_rate);
  }
  return 0;
}
// bf16 at SmolLM2's block shapes, A and B in bf16 with B in the kernel's layout (as brisk's
// packer leaves it): GFLOP/s of a plain A, of a transposed A (the weight gradients read theirs
// so) and of a plain A with the result stored in bf16 (Backend::stores_product_output), the best
// of 20 calls each. Run with OMP_NUM_THREADS=1 and 2 to see one core against two.
int bf16_shapes(dnnl::engine& eng, dnnl::stream& stream) {
  using dnnl::memory;
  using dt = memory::data_type;
  struct Shape {
    int m, k, n;
  };
  const Shape shapes[] = {{3072, 1024, 576}, {1536, 1024, 576}, {960, 1024, 576},
                          {576, 1024, 576},  {576, 1024, 1536}, {1024, 576, 3072},
                          {1024, 3072, 576}, {1024, 576, 1536}};
  std::printf("| M x K x N | A plain | A transposed | A plain, C bf16 | kernel |\n");
  std::printf("|---|---|---|---|---|\n");
  for (const Shape& s : shapes) {
    auto rate = [&](bool trans_a, dt c_type, std::string* kernel) {
      const memory::desc ad({s.m, s.k}, dt::bf16,
                            trans_a ? memory::format_tag::ba : memory::format_tag::ab);
      const memory::desc bd({s.k, s.n}, dt::bf16, memory::format_tag::any);
      const memory::desc cd({s.m, s.n}, c_type, memory::format_tag::ab);
      dnnl::matmul::primitive_desc pd;
      try {
        pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(ad, bd, cd), eng);
      } catch (const dnnl::error&) {
        return 0.0;  // no bf16 kernels on this CPU
      }
      memory am(ad, eng), bm(pd.weights_desc(), eng), cm(cd, eng);
      std::fill_n(static_cast<char*>(am.get_data_handle()), ad.get_size(), 0x3f);
      std::fill_n(static_cast<char*>(bm.get_data_handle()), pd.weights_desc().get_size(), 0x3c);
      dnnl::matmul mm(pd);
      const std::unordered_map<int, memory> args{
          {DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}};
      if (kernel) *kernel = pd.impl_info_str();
      return 2.0 * s.m * s.k * s.n / best_seconds(mm, stream, args, 20) * 1e-9;
    };
    std::string kernel;
    const double plain = rate(false, dt::f32, &kernel), trans = rate(true, dt::f32, nullptr),
                 stored = rate(false, dt::bf16, nullptr);
    std::printf("| %d x %d x %d | %.0f | %.0f | %.0f | %s |\n", s.m, s.k, s.n, plain, trans, stored,
                kernel.c_str());
  }
  return 0;
}
}  // namespace

int main(int argc, char** argv) {
  using dnnl::memory;
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(eng);
  if (argc > 1 && std::string(argv[1]) == "--peak") return peak(eng, stream);
  if (argc > 1 && std::string(argv[1]) == "--f32-kernels") return f32_kernels(eng, stream);
  if (argc > 1 && std::string(argv[1]) == "--bf16-shapes") return bf16_shapes(eng, stream);
  const int reps = 50;
  std::printf("%-22s %-5s %12s %12s %8s  %s\n", "M x K x N", "type", "openblas ms", "onednn ms",
              "ratio", "oneDNN kernel");
  for (auto [M, K, N] :
       {std::tuple{1024, 256, 1024}, {1024, 1024, 256}, {1024, 256, 768}, {256, 1024, 1024}}) {
    std::vector<float> a(M * K, 0.5f), b(K * N, 0.25f), c(M * N);
    double t = seconds();
    for (int r = 0; r < reps; ++r)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1, a.data(), K, b.data(), K, 0,
                  c.data(), N);
    const double blas = (seconds() - t) / reps;
    for (auto dt : {memory::data_type::f32, memory::data_type::bf16}) {
      memory::desc ad({M, K}, dt, memory::format_tag::ab);
      memory::desc bd({K, N}, dt, memory::format_tag::ba);
      memory::desc cd({M, N}, memory::data_type::f32, memory::format_tag::ab);
      dnnl::matmul::primitive_desc pd;
      try {
        pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(ad, bd, cd), eng);
      } catch (const dnnl::error&) {  // no bf16 matmul on this CPU (e.g. AVX2 only)
        std::printf("%5d x %5d x %5d    %-5s %12.3f %12s %8s  %s\n", M, K, N, "bf16", blas * 1e3,
                    "n/a", "-", "oneDNN has no kernel for this CPU");
        continue;
      }
      dnnl::matmul mm(pd);
      memory am(ad, eng), bm(bd, eng), cm(cd, eng);
      const std::unordered_map<int, memory> args{
          {DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}};
      mm.execute(stream, args);
      stream.wait();
      t = seconds();
      for (int r = 0; r < reps; ++r) mm.execute(stream, args);
      stream.wait();
      const double dnn = (seconds() - t) / reps;
      std::printf("%5d x %5d x %5d    %-5s %12.3f %12.3f %8.2f  %s\n", M, K, N,
                  dt == memory::data_type::f32 ? "f32" : "bf16", blas * 1e3, dnn * 1e3, blas / dnn,
                  pd.impl_info_str());
    }
  }
  return 0;
}
