// The data loader: micro-batches in a per-epoch shuffled order (seeded, so a resumed run sees the
// same order), prepared either inline or in a background thread while the current step computes.
// Its staging slots are planned buffers (category data), so loading allocates nothing. Batches
// are padded to the planned length, or dynamically to their longest sample (rounded up to a
// multiple of 8) and then computed at that length (Model::use_seq). group_by_length orders
// each epoch as transformers' LengthGroupedSampler: mega-batches of similar lengths. A packed
// dataset's rows (data/packing.h) and padding-free batches tell the model where their samples lie.
#pragma once

#include <algorithm>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "core/memory_plan.h"
#include "data/dataset.h"

namespace brisk {

struct LoaderOptions {
  bool background = false;       // prepare the next micro-batches in a thread
  bool dynamic_padding = false;  // pad each batch to its longest sample, not the planned length
  // group_by_length: the batch the mega-batches are counted in, the global batch (the micro-batch
  // times the accumulation steps times the ranks; Trainer counts per device, the same for one
  // process), so that the order does not depend on how the global batch is split; 0 = plain
  // shuffling.
  int64_t length_group_batch = 0;
  // Data parallelism, as torch's DistributedSampler shards: every rank draws the same seeded
  // epoch order, padded by wrapping around to a multiple of `ranks`, and takes every ranks-th
  // sample from position `rank` on. So global micro-batch m (all ranks' micro-batch m together)
  // holds the samples one process with ranks x the batch would have in its micro-batch m.
  int rank = 0, ranks = 1;
  // Dynamic padding's lengths are multiples of this too (sequence parallelism splits them).
  int64_t length_multiple = 1;
  // TRL's padding_free: each micro-batch's samples laid end to end over its rows, the rows as
  // short as hold them all (PackedSamples; the tokens after them one padding sample).
  bool padding_free = false;
};

// A micro-batch handed to the model: its real rows (samples) and the sequence length it was
// padded to (padding-free: its rows' length; the model is told where its samples lie).
struct LoadedBatch {
  int64_t rows = 0;
  int64_t seq = 0;
};

// Dynamic padding's length for a batch whose longest sample has `longest` tokens: rounded up to a
// multiple of 8 (DataCollatorWithPadding's pad_to_multiple_of, which keeps the distinct shapes
// few) and of `multiple`, at most the planned length.
int64_t dynamic_padded_length(int64_t longest, int64_t planned, int64_t multiple = 1);

// Padding-free: `count` samples, sample i of length(i) tokens (clamped to 1..planned), laid end to
// end over the `batch` rows of a batch; their places written into `samples` (reserved: nothing
// allocated), the tokens after them one padding sample. Returns the rows' length: as few tokens
// as hold them all, a multiple of `multiple` (Megatron's sequence parallelism slices each row),
// at most `planned`.
template <typename Length>
int64_t lay_end_to_end(int64_t count, Length&& length, int64_t batch, int64_t planned,
                       int64_t multiple, PackedSamples& samples) {
  std::vector<int64_t>& starts = samples.starts;
  starts.clear();
  starts.push_back(0);
  for (int64_t i = 0; i < count; ++i)
    starts.push_back(starts.back() + std::clamp<int64_t>(length(i), 1, planned));
  const int64_t tokens = starts.back(), step = std::max<int64_t>(multiple, 1);
  int64_t seq = std::max<int64_t>(1, (tokens + batch - 1) / batch);
  seq = std::min(planned, (seq + step - 1) / step * step);
  if (batch * seq > tokens) starts.push_back(batch * seq);  // the padding after them
  return seq;
}

class DataLoader {
 public:
  DataLoader(const Dataset& data, BatchLayout layout, uint64_t seed, LoaderOptions options);
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  void plan(MemoryPlan& plan, BufferBinder& binder);
  // Starts producing from global micro-batch `first` (0 for a new run).
  void start(int64_t first);
  // Sets the model to the next micro-batch's length and fills its batch buffers with it.
  LoadedBatch next(BatchTarget& model);
  // The length this rank's rows of micro-batch m are padded to, `order` being the epoch's.
  int64_t padded_length(const int64_t* order, int64_t m) const;

  // Micro-batches per epoch (every rank has as many).
  int64_t batches_per_epoch() const {
    return (per_rank_samples() + layout_.batch - 1) / layout_.batch;
  }
  int64_t samples_per_epoch() const { return data_.size(); }
  // The data position before global micro-batch m, in samples of the global order: m's epoch
  // times the data set's samples, plus the samples of that epoch's order before m (an epoch's
  // wrap-around padding counts as its end). It does not depend on the batch, the ranks or the
  // accumulation, so a run resumes from it with any split of the global batch.
  int64_t position_of(int64_t m) const;
  // The global micro-batch that starts at data position `position`; refused (an Error naming
  // both) when no micro-batch of this loader's global size starts there.
  int64_t micro_batch_at(int64_t position) const;
  // Loss targets of micro-batches [first, first + count), of every rank together.
  int64_t count_targets(int64_t first, int64_t count);

 private:
  struct Slot {
    Batch batch;
    LoadedBatch shape;
    PackedSamples samples;  // padding-free: where its samples lie (capacity kept: no allocation)
    int64_t index = -1;     // the micro-batch it holds, -1 when free
  };
  // Samples each rank sees per epoch: the data set padded to a multiple of the ranks, shared.
  int64_t per_rank_samples() const { return (data_.size() + options_.ranks - 1) / options_.ranks; }
  // This rank's rows of micro-batch m (all ranks have as many).
  int64_t rows_of(int64_t m) const;
  // The position in the epoch order of row r of this rank's micro-batch m (position p >= the
  // data set's size is the padding, sample order[p - size]).
  int64_t position(int64_t m, int64_t r, int rank) const;
  // The rows and padded length of micro-batch m (in the current epoch order); padding-free, its
  // samples' places.
  LoadedBatch shape_of(int64_t m, PackedSamples& samples);
  LoadedBatch padding_free_shape(const int64_t* order, int64_t m, PackedSamples& samples) const;
  // A packed dataset's rows (data/packing.h) at their full length, each row's samples and the
  // padding after them (a row of its own where the batch has fewer rows).
  LoadedBatch packed_shape(const int64_t* order, int64_t m, PackedSamples& samples) const;
  // Fills dst, shaped for micro-batch m's length, with it (padding-free: at `samples`).
  void fill(const Batch& dst, int64_t m, int64_t rows, const PackedSamples& samples);
  void order_for_epoch(int64_t epoch);
  // order = the epoch's permutation of the samples (seeded), grouped by length if asked.
  void arrange(const Tensor& order, int64_t epoch) const;
  void produce(int64_t first);  // the worker thread: fills slots from micro-batch `first` on
  void stop();

  const Dataset& data_;
  BatchLayout layout_;
  uint64_t seed_;
  LoaderOptions options_;
  bool packed_ = false;  // the dataset packs samples into its rows: the batch tells the model
  // The epoch's sample order, and a second permutation for count_targets: int64 [samples] each,
  // host buffers of the plan (they grow with the data set, so they are counted).
  Tensor order_;
  int64_t order_epoch_ = -1;
  Tensor count_order_;
  int64_t count_epoch_ = -1;
  Slot slots_[2];
  PackedSamples inline_samples_;  // the inline path's Slot::samples
  int64_t next_ = 0;              // next micro-batch the consumer takes
  std::thread worker_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::exception_ptr error_;
};

}  // namespace brisk
