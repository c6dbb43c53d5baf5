// Counts heap allocations of the test binary, so tests can prove that a training step allocates
// nothing. Replaces the global operator new for this executable only.
#include <atomic>
#include <cstdlib>
#include <new>

#include "test_support.h"

namespace {
std::atomic<size_t> g_allocations{0};
}

size_t brisk::testing::heap_allocations() {
  return g_allocations.load();
}

void* operator new(size_t n) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void* operator new[](size_t n) {
  return operator new(n);
}
void operator delete(void* p) noexcept {
  std::free(p);
}
void operator delete[](void* p) noexcept {
  std::free(p);
}
void operator delete(void* p, size_t) noexcept {
  std::free(p);
}
void operator delete[](void* p, size_t) noexcept {
  std::free(p);
}
