// Micro-benchmark: OpenBLAS sgemm against oneDNN matmul in float32 and bf16 at the shapes of the
// CPU BERT benchmark (tokens x hidden x intermediate). Prints one line per shape and type.
// With --peak it prints instead, as one JSON line, the machine's matrix-product peaks the speed
// benchmark (bench/cpu_speed.py) measures fractions against: the best GFLOP/s of large square
// products, float32 (the faster of OpenBLAS and oneDNN) and bf16 (oneDNN).
// Build: cmake --build build --target bench_matmul; run: OMP_NUM_THREADS=2 build/bench_matmul
#include <cblas.h>

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
  double best = 1e30;
  for (int r = 0; r <= reps; ++r) {  // run 0 warms up
    const double t = seconds();
    mm.execute(stream, args);
    stream.wait();
    if (r > 0) best = std::min(best, seconds() - t);
  }
  return 2.0 * M * M * M / best * 1e-9;
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

int peak(dnnl::engine& eng, dnnl::stream& stream) {
  double f32 = 0, f32_dnnl = 0, bf16 = 0;
  for (int M : {1024, 2048, 3072}) {
    f32 = std::max(f32, openblas_gflops(M, 5));
    f32_dnnl = std::max(f32_dnnl, onednn_gflops(eng, stream, dnnl::memory::data_type::f32, M, 5));
    bf16 = std::max(bf16, onednn_gflops(eng, stream, dnnl::memory::data_type::bf16, M, 5));
  }
  std::printf(
      "{\"fp32_gflops\": %.1f, \"fp32_openblas_gflops\": %.1f, \"fp32_onednn_gflops\": %.1f, "
      "\"bf16_gflops\": %.1f}\n",
      std::max(f32, f32_dnnl), f32, f32_dnnl, bf16);
  return 0;
}
}  // namespace

int main(int argc, char** argv) {
  using dnnl::memory;
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(eng);
  if (argc > 1 && std::string(argv[1]) == "--peak") return peak(eng, stream);
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
