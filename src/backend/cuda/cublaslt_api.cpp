#include "backend/cuda/cublaslt_api.h"

#include <dlfcn.h>

#include <string>

#include "core/error.h"

namespace brisk {
namespace {

#define BRISK_STRINGIFY2(x) #x
#define BRISK_STRINGIFY(x) BRISK_STRINGIFY2(x)

CublasLt load() {
  // The soname of the major version the headers describe, found as the dynamic linker finds it
  // (LD_LIBRARY_PATH, the program's run path, the system cache), else where the build found it.
  const std::string soname = "libcublasLt.so." BRISK_STRINGIFY(CUBLAS_VER_MAJOR);
  void* lib = dlopen(soname.c_str(), RTLD_NOW | RTLD_LOCAL);
#ifdef BRISK_CUBLASLT_BUILD_DIR
  if (!lib)
    lib =
        dlopen((std::string(BRISK_CUBLASLT_BUILD_DIR "/") + soname).c_str(), RTLD_NOW | RTLD_LOCAL);
#endif
  if (!lib) {
    const char* err = dlerror();
    BRISK_FAIL("--device cuda: cannot load cuBLASLt (", soname, "): ", err ? err : "not found",
               "; add the CUDA toolkit's library folder to LD_LIBRARY_PATH");
  }
  CublasLt api;
#define BRISK_CUBLASLT_LOAD(name)                                                \
  api.name = reinterpret_cast<decltype(api.name)>(dlsym(lib, "cublasLt" #name)); \
  BRISK_CHECK(api.name, "--device cuda: ", soname, " has no function cublasLt" #name);
  BRISK_CUBLASLT_FUNCTIONS(BRISK_CUBLASLT_LOAD)
#undef BRISK_CUBLASLT_LOAD
  return api;  // the library stays open for the life of the program
}
}  // namespace

const CublasLt& cublaslt() {
  static const CublasLt api = load();
  return api;
}

}  // namespace brisk
