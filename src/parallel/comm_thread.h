// What the host communicators (MPI, Gloo) share: a communication thread that runs the started
// collectives in the order started while the caller computes, and a watchdog that ends the run
// when a collective waits for the other ranks past the timeout (ddp_timeout).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

namespace brisk {

// Jobs (started collectives and their consumers) run one at a time on a thread of their own,
// started on the first job. After a job fails the rest are skipped: the failure ends the run.
class CommThread {
 public:
  CommThread() = default;
  CommThread(const CommThread&) = delete;
  CommThread& operator=(const CommThread&) = delete;
  ~CommThread() { stop(); }
  void enqueue(std::function<void()> job);
  // Returns when every queued job has finished; rethrows the first failure.
  void drain();
  // Returns when at most `keep` jobs (the latest) are unfinished; rethrows the first failure.
  void wait_until(int64_t keep);
  // The seconds the jobs ran since the last call.
  double take_busy_seconds();
  // Finishes the queued jobs and ends the thread (before the communicator goes).
  void stop();

 private:
  void work();

  std::thread worker_;
  std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  std::deque<std::function<void()>> queue_;
  int64_t pending_ = 0;  // queued and not finished
  double busy_seconds_ = 0;
  std::exception_ptr error_;
  bool stop_ = false;
};

// Watches one collective at a time (the caller's thread and the communication thread take
// turns). A collective that has waited past the timeout calls `expire(op, seconds waited)` on
// the watchdog's thread, which must end the process.
class Watchdog {
 public:
  using Expire = std::function<void(const char* op, double waited)>;
  explicit Watchdog(Expire expire) : expire_(std::move(expire)) {}
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;
  ~Watchdog();
  // 0: no limit. Refuses a negative timeout.
  void set_timeout(double seconds);

  // Marks `op` as running while it lives.
  class Watch {
   public:
    Watch(Watchdog& dog, const char* op);
    ~Watch();
    Watch(const Watch&) = delete;
    Watch& operator=(const Watch&) = delete;

   private:
    Watchdog& dog_;
  };

 private:
  void watch();

  Expire expire_;
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  double timeout_ = 0;
  const char* op_ = nullptr;
  std::chrono::steady_clock::time_point since_;
  bool stop_ = false;
};

}  // namespace brisk
