// The data loader: micro-batches in a per-epoch shuffled order (seeded, so a resumed run sees the
// same order), prepared either inline or in a background thread while the current step computes.
// Its staging slots are planned buffers (category data), so loading allocates nothing.
#pragma once

#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "core/memory_plan.h"
#include "data/dataset.h"

namespace brisk {

class DataLoader {
 public:
  DataLoader(const Dataset& data, BatchLayout layout, uint64_t seed, bool background);
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  void plan(MemoryPlan& plan, BufferBinder& binder);
  // Starts producing from global micro-batch `first` (0 for a new run).
  void start(int64_t first);
  // Copies the next micro-batch into dst (the model's batch buffers); returns its real rows.
  int64_t next(const Batch& dst);

  int64_t batches_per_epoch() const { return (data_.size() + layout_.batch - 1) / layout_.batch; }
  // Loss targets of micro-batches [first, first + count).
  int64_t count_targets(int64_t first, int64_t count);

 private:
  struct Slot {
    Batch batch;
    int64_t rows = 0;
    int64_t index = -1;  // the micro-batch it holds, -1 when free
  };
  // Fills slot with micro-batch m; returns its rows.
  int64_t fill(const Batch& dst, int64_t m);
  void order_for_epoch(int64_t epoch);
  void produce(int64_t first);  // the worker thread: fills slots from micro-batch `first` on
  void stop();

  const Dataset& data_;
  BatchLayout layout_;
  uint64_t seed_;
  bool background_;
  // The epoch's sample order, and a second permutation for count_targets: int64 [samples] each,
  // host buffers of the plan (they grow with the data set, so they are counted).
  Tensor order_;
  int64_t order_epoch_ = -1;
  Tensor count_order_;
  int64_t count_epoch_ = -1;
  Slot slots_[2];
  int64_t next_ = 0;  // next micro-batch the consumer takes
  std::thread worker_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::exception_ptr error_;
};

}  // namespace brisk
