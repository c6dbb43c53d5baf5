// DataLoader: seeded order, inline or double-buffered background preparation.
#include "data/loader.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <string>

namespace brisk {

namespace {
void reset_rows(const Batch& b) {
  auto set = [](const Tensor& t, int32_t v) {
    if (!t.empty()) std::fill(t.i32(), t.i32() + t.numel(), v);
  };
  set(b.input_ids, 0);
  set(b.attention_mask, 0);
  set(b.token_type_ids, 0);
  set(b.labels, kIgnoreIndex);
  reset_label_values(b);
}

void copy_batch(const Batch& src, const Batch& dst) {
  auto cp = [](const Tensor& s, const Tensor& d) {
    if (!s.empty()) std::memcpy(d.data(), s.data(), s.bytes());
  };
  cp(src.input_ids, dst.input_ids);
  cp(src.attention_mask, dst.attention_mask);
  cp(src.token_type_ids, dst.token_type_ids);
  cp(src.labels, dst.labels);
  cp(src.label_values, dst.label_values);
}

// The batch's [B, T] tensors viewed as [B, seq] over the same memory (rows packed at seq).
Batch shaped(const Batch& b, int64_t seq) {
  auto view = [seq](const Tensor& t) {
    if (t.empty() || t.rank() != 2 || t.dim(1) == seq) return t;
    return Tensor(t.data(), Shape{t.dim(0), seq}, t.dtype(), t.device());
  };
  return {view(b.input_ids), view(b.attention_mask), view(b.token_type_ids), view(b.labels),
          b.label_values};
}
}  // namespace

int64_t dynamic_padded_length(int64_t longest, int64_t planned, int64_t multiple) {
  const int64_t step = std::lcm<int64_t>(8, std::max<int64_t>(multiple, 1));
  const int64_t rounded = (std::max<int64_t>(longest, 1) + step - 1) / step * step;
  return std::min(rounded, planned);
}

void DataLoader::arrange(const Tensor& order, int64_t epoch) const {
  BRISK_CHECK(!order.empty(), "the data loader's order buffers are not planned");
  int64_t* first = order.as<int64_t>();
  int64_t* last = first + order.numel();
  std::iota(first, last, 0);
  std::mt19937_64 gen(seed_ + 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(epoch + 1));
  std::shuffle(first, last, gen);
  const int64_t group = options_.length_group_batch;
  if (group <= 0) return;
  // LengthGroupedSampler: mega-batches of up to 50 batches (fewer for small data), each sorted
  // longest first, and the longest sample of all at the very front (an out-of-memory shows at
  // once). Sorting is stable, so equal lengths keep their shuffled order.
  const int64_t n = order.numel();
  const int64_t mult = std::max<int64_t>(1, std::min<int64_t>(n / (group * 4), 50));
  const int64_t mega = group * mult;
  auto longer = [this](int64_t a, int64_t b) { return data_.length(a) > data_.length(b); };
  int64_t best = 0;  // the mega-batch whose first sample is the longest
  for (int64_t begin = 0; begin < n; begin += mega) {
    std::stable_sort(first + begin, first + std::min(n, begin + mega), longer);
    if (data_.length(first[begin]) > data_.length(first[best])) best = begin;
  }
  std::swap(first[0], first[best]);
}

DataLoader::DataLoader(const Dataset& data, BatchLayout layout, uint64_t seed,
                       LoaderOptions options)
    : data_(data), layout_(layout), seed_(seed), options_(options) {
  BRISK_CHECK(options.ranks >= 1 && options.rank >= 0 && options.rank < options.ranks,
              "the loader of rank ", options.rank, " of ", options.ranks, " ranks");
  BRISK_CHECK(data.size() / options.ranks >= layout.batch, "the dataset of ", data.size(),
              " samples is smaller than one batch of ", layout.batch,
              options.ranks > 1 ? " on each of " + std::to_string(options.ranks) + " ranks" : "");
  BRISK_CHECK(data.seq_len() <= layout.seq, "samples of ", data.seq_len(),
              " tokens do not fit the planned sequence length ", layout.seq);
  // Padding-free or packed: a micro-batch's samples and its padding, placed without allocating.
  size_t most = 0;  // the most samples a packed row holds
  if (!data.packed_lengths(0).empty())
    for (int64_t i = 0; i < data.size(); ++i) most = std::max(most, data.packed_lengths(i).size());
  packed_ = most > 0;
  const size_t reserve = packed_ ? static_cast<size_t>(layout.batch) * (most + 1) + 1
                                 : static_cast<size_t>(layout.batch) + 2;
  if (options.padding_free || packed_)
    for (PackedSamples* s : {&slots_[0].samples, &slots_[1].samples, &inline_samples_})
      s->starts.reserve(reserve);
}

DataLoader::~DataLoader() {
  stop();
}

void DataLoader::plan(MemoryPlan& plan, BufferBinder& binder) {
  const Shape samples{data_.size()};
  binder.declare(plan, &order_, "loader.order", Category::data, DType::i64, samples,
                 Placement::host);
  binder.declare(plan, &count_order_, "loader.count_order", Category::data, DType::i64, samples,
                 Placement::host);
  const Shape bt{layout_.batch, layout_.seq};
  const int slots = options_.background ? 2 : 0;
  for (int s = 0; s < slots; ++s) {
    const std::string p = "loader.slot" + std::to_string(s) + ".";
    Batch& b = slots_[s].batch;
    // Host staging: the worker thread writes them (pinned memory on a GPU run).
    auto slot = [&](Tensor* t, const char* name, Shape shape, DType dtype = DType::i32) {
      binder.declare(plan, t, p + name, Category::data, dtype, shape, Placement::host);
    };
    slot(&b.input_ids, "input_ids", bt);
    slot(&b.attention_mask, "attention_mask", bt);
    if (layout_.token_types) slot(&b.token_type_ids, "token_type_ids", bt);
    if (layout_.regression)
      slot(&b.label_values, "label_values", Shape{layout_.batch}, DType::f32);
    else
      slot(&b.labels, "labels", layout_.labels_per_token ? bt : Shape{layout_.batch});
  }
}

void DataLoader::order_for_epoch(int64_t epoch) {
  if (order_epoch_ == epoch) return;
  arrange(order_, epoch);
  order_epoch_ = epoch;
}

int64_t DataLoader::rows_of(int64_t m) const {
  const int64_t first = (m % batches_per_epoch()) * layout_.batch;
  return std::min(layout_.batch, per_rank_samples() - first);
}

int64_t DataLoader::position(int64_t m, int64_t r, int rank) const {
  const int64_t j = (m % batches_per_epoch()) * layout_.batch + r;  // this rank's j-th sample
  return j * options_.ranks + rank;
}

int64_t DataLoader::padded_length(const int64_t* order, int64_t m) const {
  if (!options_.dynamic_padding) return layout_.seq;
  int64_t longest = 1;
  for (int64_t r = 0; r < rows_of(m); ++r)
    longest = std::max(longest, data_.length(order[position(m, r, options_.rank) % data_.size()]));
  return dynamic_padded_length(longest, layout_.seq, options_.length_multiple);
}

int64_t DataLoader::position_of(int64_t m) const {
  const int64_t n = data_.size(), per_epoch = batches_per_epoch();
  const int64_t within = (m % per_epoch) * layout_.batch * options_.ranks;
  return (m / per_epoch) * n + std::min(within, n);
}

int64_t DataLoader::micro_batch_at(int64_t position) const {
  const int64_t n = data_.size(), global = layout_.batch * options_.ranks;
  const int64_t epoch = position / n, within = position % n;
  BRISK_CHECK(within % global == 0, "the data position, sample ", within, " of epoch ", epoch,
              "'s ", n, ", is not where a micro-batch of ", global, " samples (", options_.ranks,
              options_.ranks == 1 ? " process" : " processes", " x ", layout_.batch,
              ") starts; choose a per-device batch size whose global micro-batch divides ", within);
  return epoch * batches_per_epoch() + within / global;
}

LoadedBatch DataLoader::shape_of(int64_t m, PackedSamples& samples) {
  order_for_epoch(m / batches_per_epoch());
  samples.starts.clear();
  if (packed_) return packed_shape(order_.as<int64_t>(), m, samples);
  if (options_.padding_free) return padding_free_shape(order_.as<int64_t>(), m, samples);
  return {rows_of(m), padded_length(order_.as<int64_t>(), m)};
}

LoadedBatch DataLoader::padding_free_shape(const int64_t* order, int64_t m,
                                           PackedSamples& samples) const {
  const int64_t rows = rows_of(m);
  auto length = [&](int64_t r) {
    return data_.length(order[position(m, r, options_.rank) % data_.size()]);
  };
  return {rows, lay_end_to_end(rows, length, layout_.batch, layout_.seq, options_.length_multiple,
                               samples)};
}

LoadedBatch DataLoader::packed_shape(const int64_t* order, int64_t m,
                                     PackedSamples& samples) const {
  const LoadedBatch shape{rows_of(m), data_.seq_len()};
  std::vector<int64_t>& starts = samples.starts;
  starts.push_back(0);
  for (int64_t r = 0; r < layout_.batch; ++r) {
    if (r < shape.rows)
      for (const int64_t len :
           data_.packed_lengths(order[position(m, r, options_.rank) % data_.size()]))
        starts.push_back(starts.back() + len);
    if (starts.back() < (r + 1) * shape.seq)
      starts.push_back((r + 1) * shape.seq);  // the row's padding
  }
  return shape;
}

void DataLoader::fill(const Batch& dst, int64_t m, int64_t rows, const PackedSamples& samples) {
  reset_rows(dst);
  const int64_t* order = order_.as<int64_t>();
  const int64_t epoch = m / batches_per_epoch();
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t sample = order[position(m, r, options_.rank) % data_.size()];
    if (samples.empty() || packed_) {  // a packed row writes its samples itself
      data_.fill_row(sample, epoch, dst, r);
      continue;
    }
    const int64_t at = samples.starts[static_cast<size_t>(r)];
    data_.fill_row(sample, epoch, token_view(dst, at, samples.length(r), r), 0);
  }
}

int64_t DataLoader::count_targets(int64_t first, int64_t count) {
  const int64_t per_epoch = batches_per_epoch();
  int64_t n = 0;
  for (int64_t m = first; m < first + count; ++m) {
    const int64_t epoch = m / per_epoch;
    if (count_epoch_ != epoch) {
      arrange(count_order_, epoch);
      count_epoch_ = epoch;
    }
    const int64_t* order = count_order_.as<int64_t>();
    for (int rank = 0; rank < options_.ranks; ++rank)
      for (int64_t r = 0; r < rows_of(m); ++r)
        n += data_.count_targets(order[position(m, r, rank) % data_.size()], epoch);
  }
  return n;
}

void DataLoader::start(int64_t first) {
  stop();
  next_ = first;
  if (!options_.background) return;
  stopping_ = false;
  error_ = nullptr;
  slots_[0].index = slots_[1].index = -1;
  worker_ = std::thread([this, first] { produce(first); });
}

void DataLoader::produce(int64_t first) {
  try {
    for (int64_t m = first;; ++m) {
      Slot& slot = slots_[m % 2];
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stopping_ || slot.index < 0; });
        if (stopping_) return;
      }
      const LoadedBatch shape = shape_of(m, slot.samples);  // the slot is free: not read now
      fill(shaped(slot.batch, shape.seq), m, shape.rows, slot.samples);
      {
        std::lock_guard<std::mutex> lock(mu_);
        slot.shape = shape;
        slot.index = m;
      }
      cv_.notify_all();
    }
  } catch (...) {
    std::lock_guard<std::mutex> lock(mu_);
    error_ = std::current_exception();
    cv_.notify_all();
  }
}

LoadedBatch DataLoader::next(BatchTarget& model) {
  const int64_t m = next_++;
  if (!options_.background) {
    const LoadedBatch shape = shape_of(m, inline_samples_);
    model.use_seq(shape.seq);
    model.use_samples(inline_samples_);
    fill(model.batch(), m, shape.rows, inline_samples_);
    return shape;
  }
  Slot& slot = slots_[m % 2];
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return error_ != nullptr || slot.index == m; });
  if (error_) std::rethrow_exception(error_);
  const LoadedBatch shape = slot.shape;
  model.use_seq(shape.seq);
  model.use_samples(slot.samples);
  copy_batch(shaped(slot.batch, shape.seq), model.batch());
  slot.index = -1;
  lock.unlock();
  cv_.notify_all();
  return shape;
}

void DataLoader::stop() {
  if (!worker_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  worker_.join();
}

}  // namespace brisk
