// Micro-benchmark: OpenBLAS sgemm against oneDNN matmul in float32 and bf16 at the shapes of the
// CPU BERT benchmark (tokens x hidden x intermediate). Prints one line per shape and type.
// Build: cmake --build build --target bench_matmul; run: OMP_NUM_THREADS=2 build/bench_matmul
#include <cblas.h>

#include <chrono>
#include <cstdio>
#include <oneapi/dnnl/dnnl.hpp>
#include <tuple>
#include <vector>

namespace {
double seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

int main() {
  using dnnl::memory;
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(eng);
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
