// DataLoader: seeded order, inline or double-buffered background preparation.
#include "data/loader.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>

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
}

void copy_batch(const Batch& src, const Batch& dst) {
  auto cp = [](const Tensor& s, const Tensor& d) {
    if (!s.empty()) std::memcpy(d.data(), s.data(), s.bytes());
  };
  cp(src.input_ids, dst.input_ids);
  cp(src.attention_mask, dst.attention_mask);
  cp(src.token_type_ids, dst.token_type_ids);
  cp(src.labels, dst.labels);
}

void shuffled(const Tensor& order, uint64_t seed, int64_t epoch) {
  BRISK_CHECK(!order.empty(), "the data loader's order buffers are not planned");
  int64_t* first = order.as<int64_t>();
  int64_t* last = first + order.numel();
  std::iota(first, last, 0);
  std::mt19937_64 gen(seed + 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(epoch + 1));
  std::shuffle(first, last, gen);
}
}  // namespace

DataLoader::DataLoader(const Dataset& data, BatchLayout layout, uint64_t seed, bool background)
    : data_(data), layout_(layout), seed_(seed), background_(background) {
  BRISK_CHECK(data.size() >= layout.batch, "the dataset of ", data.size(),
              " samples is smaller than one batch of ", layout.batch);
  BRISK_CHECK(data.seq_len() <= layout.seq, "samples of ", data.seq_len(),
              " tokens do not fit the planned sequence length ", layout.seq);
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
  const int slots = background_ ? 2 : 0;
  for (int s = 0; s < slots; ++s) {
    const std::string p = "loader.slot" + std::to_string(s) + ".";
    Batch& b = slots_[s].batch;
    // Host staging: the worker thread writes them (pinned memory on a GPU run).
    auto slot = [&](Tensor* t, const char* name, Shape shape) {
      binder.declare(plan, t, p + name, Category::data, DType::i32, shape, Placement::host);
    };
    slot(&b.input_ids, "input_ids", bt);
    slot(&b.attention_mask, "attention_mask", bt);
    if (layout_.token_types) slot(&b.token_type_ids, "token_type_ids", bt);
    slot(&b.labels, "labels", layout_.labels_per_token ? bt : Shape{layout_.batch});
  }
}

void DataLoader::order_for_epoch(int64_t epoch) {
  if (order_epoch_ == epoch) return;
  shuffled(order_, seed_, epoch);
  order_epoch_ = epoch;
}

int64_t DataLoader::fill(const Batch& dst, int64_t m) {
  const int64_t per_epoch = batches_per_epoch();
  order_for_epoch(m / per_epoch);
  const int64_t first = (m % per_epoch) * layout_.batch;
  const int64_t rows = std::min(layout_.batch, data_.size() - first);
  reset_rows(dst);
  const int64_t* order = order_.as<int64_t>();
  for (int64_t r = 0; r < rows; ++r) data_.fill_row(order[first + r], dst, r);
  return rows;
}

int64_t DataLoader::count_targets(int64_t first, int64_t count) {
  const int64_t per_epoch = batches_per_epoch();
  int64_t n = 0;
  for (int64_t m = first; m < first + count; ++m) {
    const int64_t epoch = m / per_epoch;
    if (count_epoch_ != epoch) {
      shuffled(count_order_, seed_, epoch);
      count_epoch_ = epoch;
    }
    const int64_t begin = (m % per_epoch) * layout_.batch;
    const int64_t end = std::min(begin + layout_.batch, data_.size());
    const int64_t* order = count_order_.as<int64_t>();
    for (int64_t i = begin; i < end; ++i) n += data_.count_targets(order[i]);
  }
  return n;
}

void DataLoader::start(int64_t first) {
  stop();
  next_ = first;
  if (!background_) return;
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
      const int64_t rows = fill(slot.batch, m);
      {
        std::lock_guard<std::mutex> lock(mu_);
        slot.rows = rows;
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

int64_t DataLoader::next(const Batch& dst) {
  const int64_t m = next_++;
  if (!background_) return fill(dst, m);
  Slot& slot = slots_[m % 2];
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return error_ != nullptr || slot.index == m; });
  if (error_) std::rethrow_exception(error_);
  copy_batch(slot.batch, dst);
  const int64_t rows = slot.rows;
  slot.index = -1;
  lock.unlock();
  cv_.notify_all();
  return rows;
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
