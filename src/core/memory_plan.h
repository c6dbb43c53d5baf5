// MemoryPlan lists every buffer a run needs, with its size and category, before anything is
// allocated; Arena allocates the plan once and hands out views, tracking its high-water mark.
#pragma once

#include <array>
#include <cstddef>
#include <memory>
#include <string>
#include <unordered_map>
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

// Where a buffer lives: in the run's device memory (the default), or in host memory that the
// host writes and the device reads from (batches on their way to a GPU; pinned there). On a CPU
// run both are host memory.
enum class Placement : uint8_t { device, host };
constexpr int kNumPlacements = 2;

struct BufferSpec {
  std::string name;
  Category category;
  DType dtype;
  Shape shape;
  Placement placement = Placement::device;
  size_t bytes = 0;   // numel * dtype size
  size_t offset = 0;  // within its placement's block; assigned by MemoryPlan::finalize
  size_t back = 0;    // MemoryPlan::add_over's: bytes it lies over those declared before it
};

class MemoryPlan {
 public:
  // 256: what cudaMalloc guarantees and cuBLASLt assumes of its operands and workspace.
  static constexpr size_t kAlignment = 256;

  BufferId add(std::string name, Category category, DType dtype, Shape shape,
               Placement placement = Placement::device);
  // A buffer laid over the last `back` bytes (rounded down to the alignment) of those declared
  // before it in its placement, which the caller knows to be dead whenever it is live; buffers
  // declared after it start after its end.
  BufferId add_over(std::string name, Category category, DType dtype, Shape shape, size_t back,
                    Placement placement = Placement::device);
  // Where the next buffer of `placement` would start (finalize's offsets so far).
  size_t end(Placement placement) const;
  // Bytes that lie over others (add_over's): bytes_by_category counts them twice.
  size_t overlaid_bytes() const;
  // Assigns offsets; no buffer may be added afterwards.
  void finalize();
  bool finalized() const { return finalized_; }

  const std::vector<BufferSpec>& buffers() const { return buffers_; }
  const BufferSpec& buffer(BufferId id) const;
  BufferId find(const std::string& name) const;  // -1 when absent
  // Bytes of one placement's block, or of both, including alignment padding.
  size_t total_bytes(Placement placement) const;
  size_t total_bytes() const;
  std::array<size_t, kNumCategories> bytes_by_category() const;  // without padding
  std::array<size_t, kNumCategories> bytes_by_category(Placement placement) const;

 private:
  std::vector<BufferSpec> buffers_;
  std::unordered_map<std::string, BufferId> by_name_;  // name -> index: declaring stays linear
  std::array<size_t, kNumPlacements> total_{};
  bool finalized_ = false;
};

// Allocates and frees the blocks an Arena carves up: host memory here, device or pinned host
// memory in the CUDA backend. Blocks come back zeroed.
class MemoryResource {
 public:
  virtual ~MemoryResource() = default;
  virtual Device device() const = 0;
  virtual void* allocate(size_t bytes) = 0;  // throws brisk::Error when out of memory
  virtual void deallocate(void* p) = 0;
};
// Page-touched, zeroed, aligned host memory.
MemoryResource& host_memory();

// One allocation per placement for a whole finalized plan. Views are handed out by BufferId; the
// high-water mark is the end of the furthest buffer handed out so far in each block.
class Arena {
 public:
  // Both placements in host memory (a CPU run).
  Arena(const MemoryPlan& plan, Device device);
  Arena(const MemoryPlan& plan, MemoryResource& device_memory, MemoryResource& host_memory);
  ~Arena();
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  Tensor tensor(BufferId id);
  size_t capacity(Placement p) const { return block(p).capacity; }
  size_t high_water(Placement p) const { return block(p).high_water; }
  size_t capacity() const { return capacity(Placement::device) + capacity(Placement::host); }
  size_t high_water() const { return high_water(Placement::device) + high_water(Placement::host); }
  const MemoryPlan& plan() const { return plan_; }

 private:
  struct Block {
    MemoryResource* resource = nullptr;
    char* base = nullptr;
    size_t capacity = 0;
    size_t high_water = 0;
  };
  const Block& block(Placement p) const { return blocks_[static_cast<int>(p)]; }
  const MemoryPlan& plan_;
  std::array<Block, kNumPlacements> blocks_;
};

}  // namespace brisk

namespace brisk {

// Connects planned buffers to the Tensor fields that will view them: `declare` adds a buffer to
// the plan and remembers where its view goes; `bind` fills every view from the arena.
class BufferBinder {
 public:
  void declare(MemoryPlan& plan, Tensor* view, std::string name, Category category, DType dtype,
               Shape shape, Placement placement = Placement::device) {
    entries_.push_back(
        {view, plan.add(std::move(name), category, dtype, shape, placement), nullptr});
  }
  // declare's, laid over `back` bytes before it (MemoryPlan::add_over).
  void declare_over(MemoryPlan& plan, Tensor* view, std::string name, Category category,
                    DType dtype, Shape shape, size_t back) {
    entries_.push_back(
        {view, plan.add_over(std::move(name), category, dtype, shape, back), nullptr});
  }
  // After binding, *view is the same tensor as *source (shared buffers).
  void alias(Tensor* view, const Tensor* source) { entries_.push_back({view, -1, source}); }
  void bind(Arena& arena) const {
    for (const auto& e : entries_) *e.view = e.source ? *e.source : arena.tensor(e.id);
  }
  // The shape each entry's buffer has in `plan` (the plan it was declared in); aliases: empty.
  std::vector<Shape> shapes(const MemoryPlan& plan) const;
  // Binds every view to its buffer in `arena` with the entry's shape from `shapes` instead of
  // the planned one, which must hold no more elements: a smaller problem in the same memory.
  void bind_shaped(Arena& arena, const std::vector<Shape>& shapes) const;
  // Whether `other` declares the same views in the same order (the same planning code re-run).
  bool same_views(const BufferBinder& other) const;

 private:
  struct Entry {
    Tensor* view;
    BufferId id;
    const Tensor* source;
  };
  std::vector<Entry> entries_;
};

}  // namespace brisk
