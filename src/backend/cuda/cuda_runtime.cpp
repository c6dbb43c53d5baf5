// The CUDA runtime around the backend: whether a GPU is usable, device and pinned memory for
// arenas, and the driver's own figure of memory in use (NVML, loaded at run time so the program
// starts where no NVIDIA driver is installed).
#include <dlfcn.h>

#include <cstring>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_launch.h"

namespace brisk {

bool cuda_available(std::string* why_not) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    if (why_not)
      *why_not = err != cudaSuccess ? cudaGetErrorString(err) : "no CUDA device is present";
    cudaGetLastError();  // clear it: the CPU run goes on
    return false;
  }
  return true;
}

int cuda_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

std::unique_ptr<Backend> make_cuda_backend(const Switches& switches) {
  std::string why;
  BRISK_CHECK(cuda_available(&why), "--device cuda: no usable GPU here (", why,
              "); use --device cpu");
  return std::make_unique<CudaBackend>(switches);
}

int64_t CudaBackend::device_memory_free() const {
  size_t free_bytes = 0, total = 0;
  if (cudaMemGetInfo(&free_bytes, &total) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  return static_cast<int64_t>(free_bytes);
}

void* CudaDeviceMemory::allocate(size_t bytes) {
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, bytes);
  if (err != cudaSuccess) {
    cudaGetLastError();
    size_t free_bytes = 0, total = 0;
    cudaMemGetInfo(&free_bytes, &total);
    BRISK_FAIL("cannot allocate the ", bytes, "-byte device arena: ", cudaGetErrorString(err), " (",
               free_bytes, " of ", total,
               " bytes free); lower the batch size or turn on gradient checkpointing");
  }
  // Zeroed, as host arenas are, so that no buffer starts with garbage. cudaMemset runs on the
  // legacy default stream, which the backend's non-blocking stream does not wait for: finish it
  // here so no later upload can be overwritten.
  cuda::check_cuda(cudaMemset(p, 0, bytes), "cudaMemset of the arena");
  cuda::check_cuda(cudaDeviceSynchronize(), "zeroing the arena");
  return p;
}

void CudaDeviceMemory::deallocate(void* p) {
  cudaFree(p);
}

void* CudaPinnedMemory::allocate(size_t bytes) {
  void* p = nullptr;
  const cudaError_t err = cudaMallocHost(&p, bytes);
  if (err != cudaSuccess) {
    cudaGetLastError();
    BRISK_FAIL("cannot allocate ", bytes,
               " bytes of page-locked host memory: ", cudaGetErrorString(err));
  }
  std::memset(p, 0, bytes);
  return p;
}

void CudaPinnedMemory::deallocate(void* p) {
  cudaFreeHost(p);
}

namespace {
// The few NVML entry points used, declared here so that no NVML header or library is needed to
// build. Layouts as in NVML's public API.
struct NvmlMemory {
  unsigned long long total, free, used;
};
using NvmlDevice = void*;
using NvmlInit = int (*)();
using NvmlByPci = int (*)(const char*, NvmlDevice*);
using NvmlMemoryInfo = int (*)(NvmlDevice, NvmlMemory*);

struct Nvml {
  void* lib = nullptr;
  NvmlByPci by_pci = nullptr;
  NvmlMemoryInfo memory_info = nullptr;
  Nvml() {
    lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) return;
    auto init = reinterpret_cast<NvmlInit>(dlsym(lib, "nvmlInit_v2"));
    by_pci = reinterpret_cast<NvmlByPci>(dlsym(lib, "nvmlDeviceGetHandleByPciBusId_v2"));
    memory_info = reinterpret_cast<NvmlMemoryInfo>(dlsym(lib, "nvmlDeviceGetMemoryInfo"));
    if (!init || !by_pci || !memory_info || init() != 0) by_pci = nullptr;
  }
};
}  // namespace

int64_t nvml_memory_used(int cuda_device) {
  static Nvml nvml;
  if (!nvml.by_pci) return -1;
  // CUDA and NVML may number devices differently (CUDA_VISIBLE_DEVICES); the PCI bus id is common.
  char bus[32] = {};
  if (cudaDeviceGetPCIBusId(bus, sizeof bus, cuda_device) != cudaSuccess) return -1;
  NvmlDevice dev = nullptr;
  NvmlMemory mem{};
  if (nvml.by_pci(bus, &dev) != 0 || nvml.memory_info(dev, &mem) != 0) return -1;
  return static_cast<int64_t>(mem.used);
}

}  // namespace brisk
