// cuBLASLt's entry points, opened with dlopen when the first CUDA backend is made. Linked at build
// time, the library (541 MB, 150 MB of it data and tables initialized at load) was mapped into
// every run and cost a CPU run about 170 MiB of resident memory it never used.
#pragma once

#include <cublasLt.h>

namespace brisk {

// Every cuBLASLt function the backend calls, as X(name without the cublasLt prefix).
#define BRISK_CUBLASLT_FUNCTIONS(X) \
  X(Create)                         \
  X(Destroy)                        \
  X(Matmul)                         \
  X(MatmulAlgoGetHeuristic)         \
  X(MatmulDescCreate)               \
  X(MatmulDescDestroy)              \
  X(MatmulDescSetAttribute)         \
  X(MatmulPreferenceCreate)         \
  X(MatmulPreferenceDestroy)        \
  X(MatmulPreferenceSetAttribute)   \
  X(MatrixLayoutCreate)             \
  X(MatrixLayoutDestroy)

struct CublasLt {
#define BRISK_CUBLASLT_POINTER(name) decltype(&::cublasLt##name) name = nullptr;
  BRISK_CUBLASLT_FUNCTIONS(BRISK_CUBLASLT_POINTER)
#undef BRISK_CUBLASLT_POINTER
};

// The library's functions, loaded on the first call (thread-safe); fails with a message naming
// the library when it cannot be opened or lacks a function.
const CublasLt& cublaslt();

}  // namespace brisk
