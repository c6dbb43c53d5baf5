// MemoryPlan offsets and the Arena's single allocation.
#include "core/memory_plan.h"

#include <cstdlib>
#include <cstring>

namespace brisk {

const char* category_name(Category c) {
  static const char* names[kNumCategories] = {
      "weights",     "master_weights", "gradients", "optimizer_state",
      "activations", "temporaries",    "data"};
  return names[static_cast<int>(c)];
}

BufferId MemoryPlan::add(std::string name, Category category, DType dtype, Shape shape) {
  BRISK_CHECK(!finalized_, "memory plan is final; cannot add '", name, "'");
  BRISK_CHECK(find(name) < 0, "memory plan already has a buffer named '", name, "'");
  BufferSpec spec{std::move(name), category, dtype, shape};
  spec.bytes = static_cast<size_t>(shape.numel()) * dtype_size(dtype);
  buffers_.push_back(std::move(spec));
  return static_cast<BufferId>(buffers_.size() - 1);
}

void MemoryPlan::finalize() {
  size_t off = 0;
  for (auto& b : buffers_) {
    b.offset = off;
    off += (b.bytes + kAlignment - 1) / kAlignment * kAlignment;
  }
  total_ = off;
  finalized_ = true;
}

const BufferSpec& MemoryPlan::buffer(BufferId id) const {
  BRISK_CHECK(id >= 0 && static_cast<size_t>(id) < buffers_.size(), "no buffer with id ", id);
  return buffers_[id];
}

BufferId MemoryPlan::find(const std::string& name) const {
  for (size_t i = 0; i < buffers_.size(); ++i)
    if (buffers_[i].name == name) return static_cast<BufferId>(i);
  return -1;
}

size_t MemoryPlan::total_bytes() const {
  BRISK_CHECK(finalized_, "memory plan is not final yet");
  return total_;
}

std::array<size_t, kNumCategories> MemoryPlan::bytes_by_category() const {
  std::array<size_t, kNumCategories> out{};
  for (const auto& b : buffers_) out[static_cast<int>(b.category)] += b.bytes;
  return out;
}

Arena::Arena(const MemoryPlan& plan, Device device) : plan_(plan), device_(device) {
  BRISK_CHECK(plan.finalized(), "an arena needs a finalized memory plan");
  BRISK_CHECK(device == Device::cpu, "this build has no arena for device ", device_name(device));
  capacity_ = plan.total_bytes();
  size_t bytes = capacity_ ? capacity_ : MemoryPlan::kAlignment;
  base_ = static_cast<char*>(std::aligned_alloc(MemoryPlan::kAlignment, bytes));
  BRISK_CHECK(base_ != nullptr, "cannot allocate the ", bytes, "-byte arena: out of host memory");
  // Touch every page now so that the measured resident memory matches the plan from step 1.
  std::memset(base_, 0, bytes);
}

Arena::~Arena() {
  std::free(base_);
}

Tensor Arena::tensor(BufferId id) {
  const BufferSpec& b = plan_.buffer(id);
  if (b.offset + b.bytes > high_water_) high_water_ = b.offset + b.bytes;
  return Tensor(base_ + b.offset, b.shape, b.dtype, device_);
}

}  // namespace brisk
