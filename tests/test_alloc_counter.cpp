// Counts heap allocations of the test binary, so tests can prove that a training step allocates
// nothing. Replaces the global operator new for this executable only: every plain and nothrow
// form, so that no allocation made by one runtime is freed by the other (std::stable_sort's
// buffer comes from the nothrow form; AddressSanitizer reports a mismatch otherwise).
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
void* operator new(size_t n, const std::nothrow_t&) noexcept {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  return std::malloc(n ? n : 1);
}
void* operator new[](size_t n, const std::nothrow_t& tag) noexcept {
  return operator new(n, tag);
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
void operator delete(void* p, const std::nothrow_t&) noexcept {
  std::free(p);
}
void operator delete[](void* p, const std::nothrow_t&) noexcept {
  std::free(p);
}
