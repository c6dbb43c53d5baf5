// The MPI communicator: host-memory collectives over MPI_COMM_WORLD or a communicator split from
// it (Open MPI, MPICH), point to point and all-to-all too. bf16 sums
// use a user-defined reduction over 16-bit words (sum in float32, rounded to bf16). Started
// all-reduces (data parallelism's gradient buckets) run in order on a communication thread of
// their own, so that they proceed while the caller computes: MPI libraries move a message only
// while some thread is inside an MPI call.
#include <mpi.h>

#include <atomic>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "core/dtype.h"
#include "core/error.h"
#include "parallel/comm_thread.h"
#include "parallel/communicator.h"

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

// Point-to-point messages' tag (gather_v's pieces use their own).
constexpr int kPeerTag = 7302;

// MPI counts are int: a buffer's elements, checked.
int count_of(int64_t n, const char* op) {
  BRISK_CHECK(n <= INT_MAX, op, ": ", n, " elements per rank exceed MPI's int counts");
  return static_cast<int>(n);
}

// Counts as MPI's ints (each checked by the caller's total), and where each piece starts.
std::vector<int> ints(const std::vector<int64_t>& counts) {
  return std::vector<int>(counts.begin(), counts.end());
}
std::vector<int> starts(const std::vector<int>& counts) {
  std::vector<int> at(counts.size(), 0);
  for (size_t i = 1; i < counts.size(); ++i) at[i] = at[i - 1] + counts[i - 1];
  return at;
}

bool finalized() {
  int done = 0;
  MPI_Finalized(&done);
  return done != 0;
}

// What the world communicator and the ones split from it share: one thread through which every
// started call goes (MPI_THREAD_SERIALIZED: never two threads in MPI at once), one watchdog, the
// bf16 reduction, and the world rank that messages name.
struct MpiShared {
  MpiShared() : watchdog([this](const char* op, double waited) { expire(op, waited); }) {}
  ~MpiShared() {
    thread.stop();
    if (!finalized() && bf16_sum != MPI_OP_NULL) MPI_Op_free(&bf16_sum);
  }
  // The watchdog's verdict: a collective past the timeout ends the run.
  [[noreturn]] void expire(const char* op, double waited) {
    std::fprintf(stderr,
                 "brisk: error (rank %d of %d): %s has waited %.0f s for the other ranks "
                 "(ddp_timeout): a rank is stuck or gone; ending the run\n",
                 world_rank, world_size, op, waited);
    std::fflush(stderr);
    if (started)
      MPI_Abort(MPI_COMM_WORLD, 1);  // before MPI has started, the launcher ends the rest
    std::_Exit(1);
  }
  int world_rank = 0, world_size = 1;
  MPI_Op bf16_sum = MPI_OP_NULL;
  bool threaded = false;             // MPI allows the communication thread (MPI_THREAD_SERIALIZED)
  std::atomic<bool> started{false};  // MPI_Init returned: MPI_Abort may be called
  CommThread thread;                 // every communicator's started work, in order
  Watchdog watchdog;
};

class Mpi final : public Communicator {
 public:
  // The world. The watchdog bounds the start as it bounds a collective: MPI's initialization
  // waits for every rank of the launch, the first barrier for every rank to have come this far.
  Mpi(const LaunchInfo& launch, double timeout)
      : s_(std::make_shared<MpiShared>()), rank_(launch.rank), size_(launch.size) {
    s_->world_rank = launch.rank;
    s_->world_size = launch.size;
    s_->watchdog.set_timeout(timeout);
    {
      const Watchdog::Watch watch(s_->watchdog, "MPI_Init (the ranks' start)");
      initialize();
    }
    s_->started = true;
    int level = 0;
    MPI_Query_thread(&level);
    s_->threaded = level >= MPI_THREAD_SERIALIZED;
    // Errors come back as codes, which become messages, instead of aborting inside MPI.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    BRISK_CHECK(rank_ == launch.rank && size_ == launch.size, "MPI says rank ", rank_, " of ",
                size_, ", the launcher's environment rank ", launch.rank, " of ", launch.size);
    check(MPI_Op_create(bf16_sum, /*commute=*/1, &s_->bf16_sum), "MPI_Op_create");
    const Watchdog::Watch watch(s_->watchdog, "the first barrier (the ranks' start)");
    check(MPI_Barrier(MPI_COMM_WORLD), "the first barrier (MPI_Barrier)");
  }
  // A communicator split from another (`comm`: MPI_Comm_split's).
  Mpi(std::shared_ptr<MpiShared> shared, MPI_Comm comm) : s_(std::move(shared)), comm_(comm) {
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  ~Mpi() override {
    if (comm_ == MPI_COMM_WORLD || finalized()) return;
    drain();  // nothing started on it may still run
    MPI_Comm_free(&comm_);
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
  void all_reduce_max(const Tensor& buf) override {
    check_buffer(buf, "all_reduce_max");
    BRISK_CHECK(buf.dtype() == DType::f32, "all_reduce_max: float32 expected, not ",
                dtype_name(buf.dtype()));
    drain();
    all_reduce_now(buf, MPI_MAX, "all_reduce_max");
  }
  void start_all_reduce_sum(const Tensor& buf) override {
    check_buffer(buf, "start_all_reduce_sum");
    if (!s_->threaded) return Communicator::start_all_reduce_sum(buf);
    enqueue([this, buf] { all_reduce_now(buf); });
  }
  void start_reduce_scatter_sum_v(const Tensor& in, const std::vector<int64_t>& counts,
                                  const Tensor& out, std::function<void()> then) override {
    if (!s_->threaded) return Communicator::start_reduce_scatter_sum_v(in, counts, out, then);
    check_reduce_scatter_v(in, counts, out);
    enqueue([this, in, counts, out, then = std::move(then)] {
      reduce_scatter_v_now(in, counts, out);
      if (then) then();
    });
  }
  void start_all_gather_v(const Tensor& in, const std::vector<int64_t>& counts,
                          const Tensor& out) override {
    if (!s_->threaded) return Communicator::start_all_gather_v(in, counts, out);
    check_all_gather_v_ints(in, counts, out);
    enqueue([this, in, counts, out] { all_gather_v_now(in, counts, out); });
  }
  double wait_started() override {
    if (!s_->threaded) return Communicator::wait_started();
    drain();
    return s_->thread.take_busy_seconds();
  }
  void wait_started_until(int64_t keep) override {
    if (s_->threaded) s_->thread.wait_until(keep);
  }
  void reduce_scatter_sum(const Tensor& in, const Tensor& out) override {
    check_pair(in, out, size_, 1, "reduce_scatter_sum");
    BRISK_CHECK(!overlap(in, out), "reduce_scatter_sum: in and out overlap");
    drain();
    const Watchdog::Watch watch(s_->watchdog, "reduce_scatter_sum");
    check(
        MPI_Reduce_scatter_block(in.data(), out.data(), count_of(out.numel(), "reduce_scatter_sum"),
                                 type(in), op(in), comm_),
        "reduce_scatter_sum (MPI_Reduce_scatter_block)");
  }
  void reduce_scatter_sum_v(const Tensor& in, const std::vector<int64_t>& counts,
                            const Tensor& out) override {
    check_reduce_scatter_v(in, counts, out);
    drain();
    reduce_scatter_v_now(in, counts, out);
  }
  void all_gather(const Tensor& in, const Tensor& out) override {
    const bool own_chunk = check_all_gather(in, out);
    const int n = count_of(in.numel(), "all_gather");
    drain();
    const Watchdog::Watch watch(s_->watchdog, "all_gather");
    check(MPI_Allgather(own_chunk ? MPI_IN_PLACE : in.data(), n, type(in), out.data(), n, type(in),
                        comm_),
          "all_gather (MPI_Allgather)");
  }
  // Point to point, in pieces of at most 2^30 elements (MPI counts are int), so that only the
  // root ever holds every rank's piece.
  void gather_v(const Tensor& in, const std::vector<int64_t>& counts, const Tensor& out,
                int root) override {
    check_gather(in, counts, out, root);
    drain();
    const Watchdog::Watch watch(s_->watchdog, "gather_v");
    const int64_t piece = int64_t{1} << 30;
    const auto size = static_cast<int64_t>(dtype_size(in.dtype()));
    constexpr int kTag = 7301;
    if (rank_ != root) {
      auto* base = static_cast<char*>(in.data());
      for (int64_t at = 0; at < in.numel(); at += piece)
        check(MPI_Send(base + at * size, static_cast<int>(std::min(piece, in.numel() - at)),
                       type(in), root, kTag, comm_),
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
                         type(in), r, kTag, comm_, MPI_STATUS_IGNORE),
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
    const Watchdog::Watch watch(s_->watchdog, "broadcast");
    const int64_t piece = int64_t{1} << 30;
    auto* base = static_cast<char*>(buf.data());
    for (int64_t at = 0; at < buf.numel(); at += piece) {
      const int n = static_cast<int>(std::min(piece, buf.numel() - at));
      check(MPI_Bcast(base + at * dtype_size(buf.dtype()), n, type(buf), root, comm_),
            "broadcast (MPI_Bcast)");
    }
  }
  void barrier() override {
    drain();
    const Watchdog::Watch watch(s_->watchdog, "barrier");
    check(MPI_Barrier(comm_), "barrier (MPI_Barrier)");
  }
  void send(const Tensor& buf, int peer) override {
    check_buffer(buf, "send");
    check_peer(peer, "send");
    drain();
    const Watchdog::Watch watch(s_->watchdog, "send");
    check(MPI_Send(buf.data(), count_of(buf.numel(), "send"), type(buf), peer, kPeerTag, comm_),
          "send (MPI_Send)");
  }
  void receive(const Tensor& buf, int peer) override {
    check_buffer(buf, "receive");
    check_peer(peer, "receive");
    drain();
    const Watchdog::Watch watch(s_->watchdog, "receive");
    MPI_Status status;
    check(MPI_Recv(buf.data(), count_of(buf.numel(), "receive"), type(buf), peer, kPeerTag, comm_,
                   &status),
          "receive (MPI_Recv)");
    check_arrived(status, buf, peer, "receive");
  }
  void send_receive(const Tensor& out, int to, const Tensor& in, int from) override {
    check_buffer(out, "send_receive");
    check_buffer(in, "send_receive");
    check_peer(to, "send_receive");
    check_peer(from, "send_receive");
    drain();
    const Watchdog::Watch watch(s_->watchdog, "send_receive");
    MPI_Status status;
    check(MPI_Sendrecv(out.data(), count_of(out.numel(), "send_receive"), type(out), to, kPeerTag,
                       in.data(), count_of(in.numel(), "send_receive"), type(in), from, kPeerTag,
                       comm_, &status),
          "send_receive (MPI_Sendrecv)");
    check_arrived(status, in, from, "send_receive");
  }
  void all_to_all(const Tensor& in, const Tensor& out) override {
    check_all_to_all(in, out);
    const int chunk = count_of(in.numel() / size_, "all_to_all");
    drain();
    const Watchdog::Watch watch(s_->watchdog, "all_to_all");
    check(MPI_Alltoall(in.data(), chunk, type(in), out.data(), chunk, type(out), comm_),
          "all_to_all (MPI_Alltoall)");
  }
  void all_to_all_v(const Tensor& in, const std::vector<int64_t>& send, const Tensor& out,
                    const std::vector<int64_t>& receive) override {
    check_all_to_all_v(in, send, out, receive);
    // MPI's counts and displacements are int.
    count_of(in.numel(), "all_to_all_v");
    count_of(out.numel(), "all_to_all_v");
    const std::vector<int> send_counts = ints(send), send_at = starts(send_counts),
                           receive_counts = ints(receive), receive_at = starts(receive_counts);
    drain();
    const Watchdog::Watch watch(s_->watchdog, "all_to_all_v");
    check(MPI_Alltoallv(in.data(), send_counts.data(), send_at.data(), type(in), out.data(),
                        receive_counts.data(), receive_at.data(), type(out), comm_),
          "all_to_all_v (MPI_Alltoallv)");
  }
  std::unique_ptr<Communicator> split(int color, int key) override {
    BRISK_CHECK(color >= 0, "split: color ", color, " is negative");
    drain();
    const Watchdog::Watch watch(s_->watchdog, "split");
    MPI_Comm sub = MPI_COMM_NULL;
    check(MPI_Comm_split(comm_, color, key, &sub), "split (MPI_Comm_split)");
    return std::make_unique<Mpi>(s_, sub);
  }
  void set_timeout(double seconds) override { s_->watchdog.set_timeout(seconds); }
  [[noreturn]] void abort(int code) override {
    MPI_Abort(MPI_COMM_WORLD, code);
    std::exit(code);  // MPI_Abort does not return; should it, this process still ends
  }

 private:
  void initialize() {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (initialized) return;
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
  void enqueue(std::function<void()> job) {
    count_started();
    s_->thread.enqueue(std::move(job));
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
    const Watchdog::Watch watch(s_->watchdog, "all_gather_v");
    check(MPI_Allgatherv(in.data(), ints[static_cast<size_t>(rank_)], type(in), out.data(),
                         ints.data(), displacements.data(), type(in), comm_),
          "all_gather_v (MPI_Allgatherv)");
  }
  void reduce_scatter_v_now(const Tensor& in, const std::vector<int64_t>& counts,
                            const Tensor& out) {
    std::vector<int> ints;
    for (int64_t c : counts) ints.push_back(static_cast<int>(c));
    const Watchdog::Watch watch(s_->watchdog, "reduce_scatter_sum_v");
    check(MPI_Reduce_scatter(in.data(), out.data(), ints.data(), type(in), op(in), comm_),
          "reduce_scatter_sum_v (MPI_Reduce_scatter)");
  }
  // `reduce`: the sum unless given.
  void all_reduce_now(const Tensor& buf, MPI_Op reduce = MPI_OP_NULL,
                      const char* what = "all_reduce_sum") {
    const Watchdog::Watch watch(s_->watchdog, what);
    // In pieces of at most 2^30 elements: MPI counts are int.
    const int64_t piece = int64_t{1} << 30;
    auto* base = static_cast<char*>(buf.data());
    for (int64_t at = 0; at < buf.numel(); at += piece) {
      const int n = static_cast<int>(std::min(piece, buf.numel() - at));
      check(MPI_Allreduce(MPI_IN_PLACE, base + at * dtype_size(buf.dtype()), n, type(buf),
                          reduce == MPI_OP_NULL ? op(buf) : reduce, comm_),
            what);
    }
  }
  // A message shorter than the buffer it arrived in (a longer one fails MPI_Recv).
  void check_arrived(const MPI_Status& status, const Tensor& buf, int peer, const char* op) const {
    int count = 0;
    MPI_Get_count(&status, type(buf), &count);
    BRISK_CHECK(count == buf.numel(), op, ": rank ", peer, " sent ", count, " elements, ",
                buf.numel(), " expected");
  }
  void drain() { s_->thread.drain(); }
  static MPI_Datatype type(const Tensor& t) {
    return t.dtype() == DType::f32   ? MPI_FLOAT
           : t.dtype() == DType::f64 ? MPI_DOUBLE
           : t.dtype() == DType::u8  ? MPI_UINT8_T
                                     : MPI_UINT16_T;
  }
  MPI_Op op(const Tensor& t) const { return t.dtype() == DType::bf16 ? s_->bf16_sum : MPI_SUM; }
  std::shared_ptr<MpiShared> s_;
  MPI_Comm comm_ = MPI_COMM_WORLD;
  int rank_ = 0, size_ = 1;
};

}  // namespace

std::unique_ptr<Communicator> make_mpi(const LaunchInfo& launch, double timeout_seconds) {
  return std::make_unique<Mpi>(launch, timeout_seconds);
}

bool mpi_built_in() {
  return true;
}

}  // namespace brisk
