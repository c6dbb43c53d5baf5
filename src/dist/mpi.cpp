// The MPI communicator: host-memory collectives over MPI_COMM_WORLD (Open MPI, MPICH). bf16 sums
// use a user-defined reduction over 16-bit words (sum in float32, rounded to bf16). Started
// all-reduces (data parallelism's gradient buckets) run in order on a communication thread of
// their own, so that they proceed while the caller computes: MPI libraries move a message only
// while some thread is inside an MPI call.
#include <mpi.h>

#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "core/dtype.h"
#include "core/error.h"
#include "dist/communicator.h"

namespace brisk {
namespace {

void check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  BRISK_FAIL(what, " failed: ", std::string(text, static_cast<size_t>(len)));
}

void bf16_sum(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = float_to_bf16(bf16_to_float(a[i]) + bf16_to_float(b[i]));
}

void finalize_at_exit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

// MPI counts are int: a buffer's elements, checked.
int count_of(int64_t n, const char* op) {
  BRISK_CHECK(n <= INT_MAX, op, ": ", n, " elements per rank exceed MPI's int counts");
  return static_cast<int>(n);
}

class Mpi final : public Communicator {
 public:
  explicit Mpi(const LaunchInfo& launch) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      // A rank's communication thread shares the cores with its computing threads: waiting in
      // MPI yields the core (sched_yield) rather than spinning on it, unless the user chose
      // otherwise. Open MPI reads its parameters from the environment at initialization.
      ::setenv("OMPI_MCA_mpi_yield_when_idle", "1", /*overwrite=*/0);
      int provided = 0;
      // Serialized: the communication thread and the caller's thread call MPI in turn, never at
      // once (blocking collectives first finish the started ones).
      check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided), "MPI_Init_thread");
      std::atexit(finalize_at_exit);
    }
    int level = 0;
    MPI_Query_thread(&level);
    threaded_ = level >= MPI_THREAD_SERIALIZED;
    // Errors come back as codes, which become messages, instead of aborting inside MPI.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    BRISK_CHECK(rank_ == launch.rank && size_ == launch.size, "MPI says rank ", rank_, " of ",
                size_, ", the launcher's environment rank ", launch.rank, " of ", launch.size);
    check(MPI_Op_create(bf16_sum, /*commute=*/1, &bf16_sum_), "MPI_Op_create");
  }
  ~Mpi() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    work_cv_.notify_all();
    if (worker_.joinable()) worker_.join();
    {
      std::lock_guard<std::mutex> lock(watch_mu_);
      watch_stop_ = true;
    }
    watch_cv_.notify_all();
    if (watchdog_.joinable()) watchdog_.join();
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Op_free(&bf16_sum_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override {
    char version[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    MPI_Get_library_version(version, &len);
    std::string v(version, static_cast<size_t>(len));
    v = v.substr(0, v.find_first_of(",\n"));
    return "MPI (" + v + ")";
  }

  void all_reduce_sum(const Tensor& buf) override {
    check_buffer(buf, "all_reduce_sum");
    drain();
    all_reduce_now(buf);
  }
  void start_all_reduce_sum(const Tensor& buf) override {
    check_buffer(buf, "start_all_reduce_sum");
    if (!threaded_) return Communicator::start_all_reduce_sum(buf);
    enqueue(Started{buf, Tensor(), {}, {}});
  }
  void start_reduce_scatter_sum_v(const Tensor& in, const std::vector<int64_t>& counts,
                                  const Tensor& out, std::function<void()> then) override {
    if (!threaded_) return Communicator::start_reduce_scatter_sum_v(in, counts, out, then);
    check_reduce_scatter_v(in, counts, out);
    enqueue(Started{in, out, counts, std::move(then)});
  }
  void start_all_gather_v(const Tensor& in, const std::vector<int64_t>& counts,
                          const Tensor& out) override {
    if (!threaded_) return Communicator::start_all_gather_v(in, counts, out);
    check_all_gather_v_ints(in, counts, out);
    enqueue(Started{in, out, counts, {}, /*gather=*/true});
  }
  double wait_started() override {
    if (!threaded_) return Communicator::wait_started();
    drain();
    std::lock_guard<std::mutex> lock(mu_);
    return std::exchange(busy_seconds_, 0.0);
  }
  void wait_started_until(int64_t keep) override {
    if (!threaded_) return;
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [&] { return pending_ <= keep || error_; });
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  }
  void reduce_scatter_sum(const Tensor& in, const Tensor& out) override {
    check_pair(in, out, size_, 1, "reduce_scatter_sum");
    BRISK_CHECK(!overlap(in, out), "reduce_scatter_sum: in and out overlap");
    drain();
    const Watch watch(*this, "reduce_scatter_sum");
    check(
        MPI_Reduce_scatter_block(in.data(), out.data(), count_of(out.numel(), "reduce_scatter_sum"),
                                 type(in), op(in), MPI_COMM_WORLD),
        "reduce_scatter_sum (MPI_Reduce_scatter_block)");
  }
  void reduce_scatter_sum_v(const Tensor& in, const std::vector<int64_t>& counts,
                            const Tensor& out) override {
    check_reduce_scatter_v(in, counts, out);
    drain();
    reduce_scatter_v_now(in, counts, out);
  }
  void all_gather(const Tensor& in, const Tensor& out) override {
    check_pair(in, out, 1, size_, "all_gather");
    const int n = count_of(in.numel(), "all_gather");
    // ZeRO's way: in is this rank's own chunk of out.
    const bool own_chunk =
        in.data() == static_cast<char*>(out.data()) + static_cast<size_t>(rank_) * in.bytes();
    BRISK_CHECK(own_chunk || !overlap(in, out),
                "all_gather: in overlaps out other than as this rank's chunk");
    drain();
    const Watch watch(*this, "all_gather");
    check(MPI_Allgather(own_chunk ? MPI_IN_PLACE : in.data(), n, type(in), out.data(), n, type(in),
                        MPI_COMM_WORLD),
          "all_gather (MPI_Allgather)");
  }
  // Point to point, in pieces of at most 2^30 elements (MPI counts are int), so that only the
  // root ever holds every rank's piece.
  void gather_v(const Tensor& in, const std::vector<int64_t>& counts, const Tensor& out,
                int root) override {
    check_gather(in, counts, out, root);
    drain();
    const Watch watch(*this, "gather_v");
    const int64_t piece = int64_t{1} << 30;
    const auto size = static_cast<int64_t>(dtype_size(in.dtype()));
    constexpr int kTag = 7301;
    if (rank_ != root) {
      auto* base = static_cast<char*>(in.data());
      for (int64_t at = 0; at < in.numel(); at += piece)
        check(MPI_Send(base + at * size, static_cast<int>(std::min(piece, in.numel() - at)),
                       type(in), root, kTag, MPI_COMM_WORLD),
              "gather_v (MPI_Send)");
      return;
    }
    auto* base = static_cast<char*>(out.data());
    int64_t first = 0;
    for (int r = 0; r < size_; ++r) {
      const int64_t n = counts[static_cast<size_t>(r)];
      if (r == rank_) {
        if (n > 0) std::memcpy(base + first * size, in.data(), static_cast<size_t>(n * size));
      } else {
        for (int64_t at = 0; at < n; at += piece)
          check(MPI_Recv(base + (first + at) * size, static_cast<int>(std::min(piece, n - at)),
                         type(in), r, kTag, MPI_COMM_WORLD, MPI_STATUS_IGNORE),
                "gather_v (MPI_Recv)");
      }
      first += n;
    }
  }
  void all_gather_v(const Tensor& in, const std::vector<int64_t>& counts,
                    const Tensor& out) override {
    check_all_gather_v_ints(in, counts, out);
    drain();
    all_gather_v_now(in, counts, out);
  }
  void broadcast(const Tensor& buf, int root) override {
    check_buffer(buf, "broadcast");
    BRISK_CHECK(root >= 0 && root < size_, "broadcast: root ", root, " of ", size_, " ranks");
    drain();
    const Watch watch(*this, "broadcast");
    const int64_t piece = int64_t{1} << 30;
    auto* base = static_cast<char*>(buf.data());
    for (int64_t at = 0; at < buf.numel(); at += piece) {
      const int n = static_cast<int>(std::min(piece, buf.numel() - at));
      check(MPI_Bcast(base + at * dtype_size(buf.dtype()), n, type(buf), root, MPI_COMM_WORLD),
            "broadcast (MPI_Bcast)");
    }
  }
  void barrier() override {
    drain();
    const Watch watch(*this, "barrier");
    check(MPI_Barrier(MPI_COMM_WORLD), "barrier (MPI_Barrier)");
  }
  void set_timeout(double seconds) override {
    BRISK_CHECK(seconds >= 0, "the collectives' timeout must not be negative, got ", seconds);
    std::lock_guard<std::mutex> lock(watch_mu_);
    timeout_ = seconds;
    if (seconds > 0 && !watchdog_.joinable()) watchdog_ = std::thread([this] { watch(); });
    watch_cv_.notify_all();
  }
  [[noreturn]] void abort(int code) override {
    MPI_Abort(MPI_COMM_WORLD, code);
    std::exit(code);  // MPI_Abort does not return; should it, this process still ends
  }

 private:
  // A started collective: an all-reduce of `in` (counts empty), a reduce-scatter of pieces
  // into `out` or (gather) an all-gather of pieces into `out`, then `then`.
  struct Started {
    Tensor in, out;
    std::vector<int64_t> counts;
    std::function<void()> then;
    bool gather = false;
  };
  void enqueue(Started item) {
    count_started();
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!worker_.joinable()) worker_ = std::thread([this] { work(); });
      queue_.push_back(std::move(item));
      ++pending_;
    }
    work_cv_.notify_one();
  }
  void check_reduce_scatter_v(const Tensor& in, const std::vector<int64_t>& counts,
                              const Tensor& out) const {
    check_pieces(in, counts, out);
    BRISK_CHECK(!overlap(in, out), "reduce_scatter_sum_v: in and out overlap");
    for (int64_t c : counts) count_of(c, "reduce_scatter_sum_v");
    count_of(in.numel(), "reduce_scatter_sum_v");  // MPI's displacements are int as well
  }
  void check_all_gather_v_ints(const Tensor& in, const std::vector<int64_t>& counts,
                               const Tensor& out) const {
    check_all_gather_v(in, counts, out);
    count_of(out.numel(), "all_gather_v");  // MPI's counts and displacements are int
  }
  void all_gather_v_now(const Tensor& in, const std::vector<int64_t>& counts, const Tensor& out) {
    std::vector<int> ints, displacements;
    int at = 0;
    for (int64_t c : counts) {
      ints.push_back(static_cast<int>(c));
      displacements.push_back(at);
      at += static_cast<int>(c);
    }
    const Watch watch(*this, "all_gather_v");
    check(MPI_Allgatherv(in.data(), ints[static_cast<size_t>(rank_)], type(in), out.data(),
                         ints.data(), displacements.data(), type(in), MPI_COMM_WORLD),
          "all_gather_v (MPI_Allgatherv)");
  }
  void reduce_scatter_v_now(const Tensor& in, const std::vector<int64_t>& counts,
                            const Tensor& out) {
    std::vector<int> ints;
    for (int64_t c : counts) ints.push_back(static_cast<int>(c));
    const Watch watch(*this, "reduce_scatter_sum_v");
    check(MPI_Reduce_scatter(in.data(), out.data(), ints.data(), type(in), op(in), MPI_COMM_WORLD),
          "reduce_scatter_sum_v (MPI_Reduce_scatter)");
  }
  void all_reduce_now(const Tensor& buf) {
    const Watch watch(*this, "all_reduce_sum");
    // In pieces of at most 2^30 elements: MPI counts are int.
    const int64_t piece = int64_t{1} << 30;
    auto* base = static_cast<char*>(buf.data());
    for (int64_t at = 0; at < buf.numel(); at += piece) {
      const int n = static_cast<int>(std::min(piece, buf.numel() - at));
      check(MPI_Allreduce(MPI_IN_PLACE, base + at * dtype_size(buf.dtype()), n, type(buf), op(buf),
                          MPI_COMM_WORLD),
            "all_reduce_sum (MPI_Allreduce)");
    }
  }
  // While a collective runs, the watchdog knows which and since when (one at a time: the
  // caller's thread and the communication thread take turns).
  struct Watch {
    Mpi& m;
    Watch(Mpi& mpi, const char* op) : m(mpi) {
      std::lock_guard<std::mutex> lock(m.watch_mu_);
      m.watched_op_ = op;
      m.watched_since_ = std::chrono::steady_clock::now();
    }
    ~Watch() {
      std::lock_guard<std::mutex> lock(m.watch_mu_);
      m.watched_op_ = nullptr;
    }
  };
  // The watchdog thread: a collective past the timeout ends the run.
  void watch() {
    std::unique_lock<std::mutex> lock(watch_mu_);
    while (!watch_stop_) {
      const double poll = std::min(1.0, std::max(0.05, timeout_ / 20));
      watch_cv_.wait_for(lock, std::chrono::duration<double>(poll));
      if (!watched_op_ || timeout_ <= 0) continue;
      const double waited =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - watched_since_).count();
      if (waited < timeout_) continue;
      std::fprintf(stderr,
                   "brisk: error (rank %d of %d): %s has waited %.0f s for the other ranks "
                   "(ddp_timeout): a rank is stuck or gone; ending the run\n",
                   rank_, size_, watched_op_, waited);
      std::fflush(stderr);
      MPI_Abort(MPI_COMM_WORLD, 1);
      std::_Exit(1);
    }
  }
  // Waits for the started collectives (rethrowing the first failure).
  void drain() {
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [&] { return pending_ == 0; });
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  }
  // The communication thread: the started all-reduces in order; after a failure the rest are
  // skipped (the failure ends the run, and every rank with it).
  void work() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      work_cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      const Started item = std::move(queue_.front());
      queue_.pop_front();
      const bool skip = error_ != nullptr;
      lock.unlock();
      std::exception_ptr failure;
      const auto start = std::chrono::steady_clock::now();
      if (!skip) try {
          if (item.counts.empty())
            all_reduce_now(item.in);
          else if (item.gather)
            all_gather_v_now(item.in, item.counts, item.out);
          else
            reduce_scatter_v_now(item.in, item.counts, item.out);
          if (item.then) item.then();
        } catch (...) {
          failure = std::current_exception();
        }
      const double took =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      lock.lock();
      busy_seconds_ += took;
      if (failure && !error_) error_ = failure;
      --pending_;
      done_cv_.notify_all();  // wait_started_until waits for fewer than all
    }
  }
  static MPI_Datatype type(const Tensor& t) {
    return t.dtype() == DType::f32   ? MPI_FLOAT
           : t.dtype() == DType::f64 ? MPI_DOUBLE
           : t.dtype() == DType::u8  ? MPI_UINT8_T
                                     : MPI_UINT16_T;
  }
  MPI_Op op(const Tensor& t) const { return t.dtype() == DType::bf16 ? bf16_sum_ : MPI_SUM; }
  static bool overlap(const Tensor& a, const Tensor& b) {
    const auto* pa = static_cast<const char*>(a.data());
    const auto* pb = static_cast<const char*>(b.data());
    return pa < pb + b.bytes() && pb < pa + a.bytes();
  }

  int rank_ = 0, size_ = 1;
  MPI_Op bf16_sum_ = MPI_OP_NULL;
  bool threaded_ = false;  // MPI allows the communication thread (MPI_THREAD_SERIALIZED)
  // The communication thread and what it shares with the caller, under mu_.
  std::thread worker_;
  std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  std::deque<Started> queue_;
  int64_t pending_ = 0;  // started and not finished
  double busy_seconds_ = 0;
  std::exception_ptr error_;
  bool stop_ = false;
  // The watchdog and what it watches, under watch_mu_.
  std::thread watchdog_;
  std::mutex watch_mu_;
  std::condition_variable watch_cv_;
  double timeout_ = 0;
  const char* watched_op_ = nullptr;
  std::chrono::steady_clock::time_point watched_since_;
  bool watch_stop_ = false;
};

}  // namespace

std::unique_ptr<Communicator> make_mpi(const LaunchInfo& launch) {
  return std::make_unique<Mpi>(launch);
}

bool mpi_built_in() {
  return true;
}

}  // namespace brisk
