// The host communicators' communication thread and watchdog (see comm_thread.h).
#include "parallel/comm_thread.h"

#include <algorithm>
#include <utility>

#include "core/clock.h"
#include "core/error.h"

namespace brisk {

void CommThread::enqueue(std::function<void()> job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!worker_.joinable()) worker_ = std::thread([this] { work(); });
    queue_.push_back(std::move(job));
    ++pending_;
  }
  work_cv_.notify_one();
}

void CommThread::drain() {
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [&] { return pending_ == 0; });
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

void CommThread::wait_until(int64_t keep) {
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [&] { return pending_ <= keep || error_; });
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

double CommThread::take_busy_seconds() {
  std::lock_guard<std::mutex> lock(mu_);
  return std::exchange(busy_seconds_, 0.0);
}

void CommThread::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

void CommThread::work() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    work_cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;
    const std::function<void()> job = std::move(queue_.front());
    queue_.pop_front();
    const bool skip = error_ != nullptr;
    lock.unlock();
    std::exception_ptr failure;
    const auto start = std::chrono::steady_clock::now();
    if (!skip) try {
        job();
      } catch (...) {
        failure = std::current_exception();
      }
    const double took = seconds_since(start);
    lock.lock();
    busy_seconds_ += took;
    if (failure && !error_) error_ = failure;
    --pending_;
    done_cv_.notify_all();  // wait_until waits for fewer than all
  }
}

Watchdog::~Watchdog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Watchdog::set_timeout(double seconds) {
  BRISK_CHECK(seconds >= 0, "the collectives' timeout must not be negative, got ", seconds);
  std::lock_guard<std::mutex> lock(mu_);
  timeout_ = seconds;
  if (seconds > 0 && !thread_.joinable()) thread_ = std::thread([this] { watch(); });
  cv_.notify_all();
}

Watchdog::Watch::Watch(Watchdog& dog, const char* op) : dog_(dog) {
  std::lock_guard<std::mutex> lock(dog_.mu_);
  dog_.op_ = op;
  dog_.since_ = std::chrono::steady_clock::now();
}

Watchdog::Watch::~Watch() {
  std::lock_guard<std::mutex> lock(dog_.mu_);
  dog_.op_ = nullptr;
}

void Watchdog::watch() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    const double poll = std::min(1.0, std::max(0.05, timeout_ / 20));
    cv_.wait_for(lock, std::chrono::duration<double>(poll));
    if (!op_ || timeout_ <= 0) continue;
    const double waited = seconds_since(since_);
    if (waited >= timeout_) expire_(op_, waited);
  }
}

}  // namespace brisk
