// MemoryPlan offsets and the Arena's single allocation.
#include "core/memory_plan.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "core/checked.h"

namespace brisk {

const char* category_name(Category c) {
  static const char* names[kNumCategories] = {
      "weights",     "master_weights", "gradients", "optimizer_state",
      "activations", "temporaries",    "data"};
  return names[static_cast<int>(c)];
}

BufferId MemoryPlan::add(std::string name, Category category, DType dtype, Shape shape,
                         Placement placement) {
  BRISK_CHECK(!finalized_, "memory plan is final; cannot add '", name, "'");
  BRISK_CHECK(find(name) < 0, "memory plan already has a buffer named '", name, "'");
  BufferSpec spec{std::move(name), category, dtype, shape, placement};
  spec.bytes = static_cast<size_t>(checked_mul(
      shape.numel(), static_cast<int64_t>(dtype_size(dtype)), "a planned buffer's bytes"));
  by_name_.emplace(spec.name, static_cast<BufferId>(buffers_.size()));
  buffers_.push_back(std::move(spec));
  return static_cast<BufferId>(buffers_.size() - 1);
}

BufferId MemoryPlan::add_over(std::string name, Category category, DType dtype, Shape shape,
                              size_t back, Placement placement) {
  const BufferId id = add(std::move(name), category, dtype, shape, placement);
  buffers_[static_cast<size_t>(id)].back = back / kAlignment * kAlignment;
  return id;
}

namespace {
// Where buffer b starts after those before it ended at `end`, which it advances past b.
size_t place(const BufferSpec& b, size_t& end) {
  BRISK_CHECK(b.back <= end, "internal error: '", b.name, "' reaches back before the plan's start");
  const size_t offset = end - b.back;
  const int64_t padded =
      checked_add(static_cast<int64_t>(b.bytes), MemoryPlan::kAlignment - 1, "the memory plan") /
      MemoryPlan::kAlignment * MemoryPlan::kAlignment;
  end = std::max(end, static_cast<size_t>(
                          checked_add(static_cast<int64_t>(offset), padded, "the memory plan")));
  return offset;
}
}  // namespace

size_t MemoryPlan::end(Placement placement) const {
  size_t end = 0;
  for (const auto& b : buffers_)
    if (b.placement == placement) place(b, end);
  return end;
}

size_t MemoryPlan::overlaid_bytes() const {
  size_t sum = 0;
  for (const auto& b : buffers_) sum += std::min(b.back, b.bytes);
  return sum;
}

void MemoryPlan::finalize() {
  for (auto& b : buffers_) b.offset = place(b, total_[static_cast<int>(b.placement)]);
  finalized_ = true;
}

const BufferSpec& MemoryPlan::buffer(BufferId id) const {
  BRISK_CHECK(id >= 0 && static_cast<size_t>(id) < buffers_.size(), "no buffer with id ", id);
  return buffers_[id];
}

BufferId MemoryPlan::find(const std::string& name) const {
  const auto it = by_name_.find(name);
  return it == by_name_.end() ? -1 : it->second;
}

size_t MemoryPlan::total_bytes(Placement placement) const {
  BRISK_CHECK(finalized_, "memory plan is not final yet");
  return total_[static_cast<int>(placement)];
}

size_t MemoryPlan::total_bytes() const {
  return total_bytes(Placement::device) + total_bytes(Placement::host);
}

std::array<size_t, kNumCategories> MemoryPlan::bytes_by_category() const {
  std::array<size_t, kNumCategories> out{};
  for (const auto& b : buffers_) out[static_cast<int>(b.category)] += b.bytes;
  return out;
}

std::array<size_t, kNumCategories> MemoryPlan::bytes_by_category(Placement placement) const {
  std::array<size_t, kNumCategories> out{};
  for (const auto& b : buffers_)
    if (b.placement == placement) out[static_cast<int>(b.category)] += b.bytes;
  return out;
}

namespace {
class HostMemory final : public MemoryResource {
 public:
  Device device() const override { return Device::cpu; }
  void* allocate(size_t bytes) override {
    // Blocks of a few MiB and more are whole 2 MiB pages, asked for as transparent huge pages
    // (a hint: kernels with them off, or "never", give 4 KiB pages as before). A GPT-2 arena
    // is then ~1,300 page faults instead of ~680,000 when first touched, and the step's passes
    // over gigabytes of weights, gradients and optimizer state miss the TLB far less.
    const bool huge = bytes >= 2 * kHugePage;
    const size_t align = huge ? kHugePage : MemoryPlan::kAlignment;
    BRISK_CHECK(bytes <= SIZE_MAX - align, "cannot allocate ", bytes, " bytes of host memory");
    const size_t rounded = (std::max<size_t>(bytes, 1) + align - 1) / align * align;
    void* p = std::aligned_alloc(align, rounded);
    BRISK_CHECK(p != nullptr, "cannot allocate ", bytes, " bytes: out of host memory");
    if (huge) ::madvise(p, rounded, MADV_HUGEPAGE);
    // Touch every page now so that the measured resident memory matches the plan from step 1.
    std::memset(p, 0, rounded);
    return p;
  }
  void deallocate(void* p) override { std::free(p); }

 private:
  static constexpr size_t kHugePage = size_t{2} << 20;
};
}  // namespace

MemoryResource& host_memory() {
  static HostMemory memory;
  return memory;
}

Arena::Arena(const MemoryPlan& plan, Device device) : Arena(plan, host_memory(), host_memory()) {
  BRISK_CHECK(device == Device::cpu, "a ", device_name(device),
              " arena needs that backend's memory resource");
}

Arena::Arena(const MemoryPlan& plan, MemoryResource& device_memory, MemoryResource& host)
    : plan_(plan) {
  BRISK_CHECK(plan.finalized(), "an arena needs a finalized memory plan");
  blocks_[static_cast<int>(Placement::device)].resource = &device_memory;
  blocks_[static_cast<int>(Placement::host)].resource = &host;
  for (int p = 0; p < kNumPlacements; ++p) {
    Block& b = blocks_[p];
    b.capacity = plan.total_bytes(static_cast<Placement>(p));
    if (b.capacity > 0) b.base = static_cast<char*>(b.resource->allocate(b.capacity));
  }
}

Arena::~Arena() {
  for (Block& b : blocks_)
    if (b.base) b.resource->deallocate(b.base);
}

Tensor Arena::tensor(BufferId id) {
  const BufferSpec& s = plan_.buffer(id);
  Block& b = blocks_[static_cast<int>(s.placement)];
  if (s.offset + s.bytes > b.high_water) b.high_water = s.offset + s.bytes;
  return Tensor(b.base + s.offset, s.shape, s.dtype, b.resource->device());
}

std::vector<Shape> BufferBinder::shapes(const MemoryPlan& plan) const {
  std::vector<Shape> out;
  out.reserve(entries_.size());
  for (const auto& e : entries_) out.push_back(e.source ? Shape() : plan.buffer(e.id).shape);
  return out;
}

void BufferBinder::bind_shaped(Arena& arena, const std::vector<Shape>& shapes) const {
  BRISK_CHECK(shapes.size() == entries_.size(), "bind_shaped: ", shapes.size(), " shapes for ",
              entries_.size(), " views");
  for (size_t i = 0; i < entries_.size(); ++i) {
    const Entry& e = entries_[i];
    if (e.source) {
      *e.view = *e.source;
      continue;
    }
    const Tensor t = arena.tensor(e.id);
    BRISK_CHECK(shapes[i].numel() <= t.numel(), "bind_shaped: ", shapes[i].str(),
                " does not fit the buffer of ", t.shape().str());
    *e.view = Tensor(t.data(), shapes[i], t.dtype(), t.device());
  }
}

bool BufferBinder::same_views(const BufferBinder& other) const {
  if (entries_.size() != other.entries_.size()) return false;
  for (size_t i = 0; i < entries_.size(); ++i)
    if (entries_[i].view != other.entries_[i].view ||
        (entries_[i].source == nullptr) != (other.entries_[i].source == nullptr))
      return false;
  return true;
}

}  // namespace brisk
