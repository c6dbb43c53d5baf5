// MemoryPlan lists every buffer a run needs, with its size and category, before anything is
// allocated; Arena allocates the plan once and hands out views, tracking its high-water mark.
#pragma once

#include <array>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace brisk {

enum class Category : uint8_t {
  weights,
  master_weights,
  gradients,
  optimizer_state,
  activations,
  temporaries,
  data,
};
constexpr int kNumCategories = 7;
const char* category_name(Category c);

using BufferId = int;

struct BufferSpec {
  std::string name;
  Category category;
  DType dtype;
  Shape shape;
  size_t bytes = 0;   // numel * dtype size
  size_t offset = 0;  // assigned by MemoryPlan::finalize
};

class MemoryPlan {
 public:
  static constexpr size_t kAlignment = 64;

  BufferId add(std::string name, Category category, DType dtype, Shape shape);
  // Assigns offsets; no buffer may be added afterwards.
  void finalize();
  bool finalized() const { return finalized_; }

  const std::vector<BufferSpec>& buffers() const { return buffers_; }
  const BufferSpec& buffer(BufferId id) const;
  BufferId find(const std::string& name) const;                  // -1 when absent
  size_t total_bytes() const;                                    // including alignment padding
  std::array<size_t, kNumCategories> bytes_by_category() const;  // without padding

 private:
  std::vector<BufferSpec> buffers_;
  size_t total_ = 0;
  bool finalized_ = false;
};

// One allocation for a whole finalized plan. Views are handed out by BufferId; the high-water
// mark is the end of the furthest buffer handed out so far.
class Arena {
 public:
  Arena(const MemoryPlan& plan, Device device);
  ~Arena();
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  Tensor tensor(BufferId id);
  size_t capacity() const { return capacity_; }
  size_t high_water() const { return high_water_; }
  const MemoryPlan& plan() const { return plan_; }

 private:
  const MemoryPlan& plan_;
  Device device_;
  char* base_ = nullptr;
  size_t capacity_ = 0;
  size_t high_water_ = 0;
};

}  // namespace brisk

namespace brisk {

// Connects planned buffers to the Tensor fields that will view them: `declare` adds a buffer to
// the plan and remembers where its view goes; `bind` fills every view from the arena.
class BufferBinder {
 public:
  void declare(MemoryPlan& plan, Tensor* view, std::string name, Category category, DType dtype,
               Shape shape) {
    entries_.push_back({view, plan.add(std::move(name), category, dtype, shape), nullptr});
  }
  // After binding, *view is the same tensor as *source (shared buffers).
  void alias(Tensor* view, const Tensor* source) { entries_.push_back({view, -1, source}); }
  void bind(Arena& arena) const {
    for (const auto& e : entries_) *e.view = e.source ? *e.source : arena.tensor(e.id);
  }

 private:
  struct Entry {
    Tensor* view;
    BufferId id;
    const Tensor* source;
  };
  std::vector<Entry> entries_;
};

}  // namespace brisk
