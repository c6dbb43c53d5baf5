// The NCCL communicator: GPU-memory collectives on a stream of their own, each queued after the
// backend's queued work (an event on its stream, set_device_stream) and waited for on the host
// with the run's timeout (a peer gone makes NCCL wait for ever; the watchdog here aborts the
// communicator and ends the process naming the collective) — the blocking ones at once, the
// started ones (data parallelism's buckets, ZeRO stage 3's gathers) when their wait comes, so
// they run while the backend's stream computes. Only this file sees NCCL.
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "backend/device_traits.h"
#include "core/clock.h"
#include "core/error.h"
#include "parallel/communicator.h"
#include "parallel/rendezvous.h"
#include "parallel/route.h"

namespace brisk {
namespace {

void check_cuda(cudaError_t e, const char* what) {
  BRISK_CHECK(e == cudaSuccess, what, ": ", cudaGetErrorString(e));
}

void check_nccl(ncclResult_t r, const char* what) {
  BRISK_CHECK(r == ncclSuccess, what, ": ", ncclGetErrorString(r));
}

ncclDataType_t type_of(const Tensor& t) {
  switch (t.dtype()) {
    case DType::f32:
      return ncclFloat32;
    case DType::f64:
      return ncclFloat64;
    case DType::bf16:
      return ncclBfloat16;
    default:
      return ncclUint8;  // copies only (check_buffer)
  }
}

// NCCL's sockets (its bootstrap, and its transport between hosts without InfiniBand) on the
// interface that reaches MASTER_ADDR, when the launch gives one beyond this host and the user
// named none (NCCL_SOCKET_IFNAME): NCCL would otherwise take the first interface it likes.
void name_socket_interface(const LaunchInfo& launch) {
  const char* given = std::getenv("NCCL_SOCKET_IFNAME");
  if ((given && *given) || launch.master_addr.empty() || is_loopback(launch.master_addr)) return;
  const LocalRoute route = route_to(launch.master_addr, "MASTER_ADDR");
  if (!route.interface.empty()) ::setenv("NCCL_SOCKET_IFNAME", ("=" + route.interface).c_str(), 0);
}

class Nccl final : public Communicator {
 public:
  Nccl(const LaunchInfo& launch, Communicator* bootstrap, Device memory, double timeout)
      : rank_(launch.rank), size_(launch.size), memory_(memory) {
    int devices = 0;
    check_cuda(cudaGetDeviceCount(&devices), "NCCL: counting GPUs");
    BRISK_CHECK(devices > 0, "NCCL: this process sees no GPU");
    device_ = launch.local_rank % devices;
    check_cuda(cudaSetDevice(device_), "NCCL: selecting the GPU");
    if (size_ > 1) name_socket_interface(launch);
    ncclUniqueId id{};
    std::vector<uint8_t> bytes(sizeof id);
    if (rank_ == 0) {
      check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
      std::memcpy(bytes.data(), &id, sizeof id);
    }
    if (size_ > 1) {
      if (bootstrap) {
        BRISK_CHECK(bootstrap->size() == size_ && bootstrap->rank() == rank_,
                    "NCCL: the bootstrap communicator is rank ", bootstrap->rank(), " of ",
                    bootstrap->size(), ", not ", rank_, " of ", size_);
        bootstrap->broadcast(
            Tensor(bytes.data(), Shape{static_cast<int64_t>(bytes.size())}, DType::u8), 0);
      } else {
        bytes = rendezvous_share(launch, bytes, sizeof id, timeout);
      }
      std::memcpy(&id, bytes.data(), sizeof id);
    }
    check_nccl(ncclCommInitRank(&comm_, size_, id, rank_), "ncclCommInitRank");
    open_streams();
  }
  // A communicator split from `parent` (ncclCommSplit's `comm`), on the parent's GPU, with its
  // timeout and the backend's stream to follow.
  Nccl(const Nccl& parent, ncclComm_t comm)
      : rank_(0), size_(1), device_(parent.device_), comm_(comm), memory_(parent.memory_) {
    check_nccl(ncclCommUserRank(comm_, &rank_), "ncclCommUserRank");
    check_nccl(ncclCommCount(comm_, &size_), "ncclCommCount");
    open_streams();
    device_stream_ = parent.device_stream_;
    timeout_ = parent.timeout_;
  }
  ~Nccl() override {
    for (size_t i = waited_; i < started_.size(); ++i)
      free_events_.insert(free_events_.end(), {started_[i].begin, started_[i].end});
    for (cudaEvent_t e : free_events_) cudaEventDestroy(e);
    if (device_done_) cudaEventDestroy(device_done_);
    for (void* p : staging_)
      if (p) cudaFree(p);
    if (scratch_) cudaFree(scratch_);
    if (stream_) cudaStreamDestroy(stream_);
    if (comm_) ncclCommDestroy(comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override {
    int v = 0;
    ncclGetVersion(&v);
    return "NCCL " + std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." +
           std::to_string(v % 100);
  }

  void all_reduce_sum(const Tensor& buf) override {
    if (on_host(buf))
      return in_place_through_device(buf, [&](const Tensor& b) { all_reduce_sum(b); });
    all_reduce(buf, ncclSum, "all_reduce_sum");
  }
  void all_reduce_max(const Tensor& buf) override {
    BRISK_CHECK(buf.dtype() == DType::f32, "all_reduce_max: float32 expected, not ",
                dtype_name(buf.dtype()));
    if (on_host(buf))
      return in_place_through_device(buf, [&](const Tensor& b) { all_reduce_max(b); });
    all_reduce(buf, ncclMax, "all_reduce_max");
  }
  void reduce_scatter_sum(const Tensor& in, const Tensor& out) override {
    if (on_host(in) || on_host(out))
      return through_device(in, out,
                            [&](const Tensor& i, const Tensor& o) { reduce_scatter_sum(i, o); });
    check_pair(in, out, size_, 1, "reduce_scatter_sum");
    wait_for_device_work();
    check_nccl(ncclReduceScatter(in.data(), out.data(), static_cast<size_t>(out.numel()),
                                 type_of(in), ncclSum, comm_, stream_),
               "reduce_scatter_sum (ncclReduceScatter)");
    finish("reduce_scatter_sum");
  }
  // Pieces of any length: one reduction to each rank, grouped.
  void reduce_scatter_sum_v(const Tensor& in, const std::vector<int64_t>& counts,
                            const Tensor& out) override {
    if (on_host(in) || on_host(out))
      return through_device(
          in, out, [&](const Tensor& i, const Tensor& o) { reduce_scatter_sum_v(i, counts, o); });
    check_pieces(in, counts, out);
    wait_for_device_work();
    auto* base = static_cast<char*>(in.data());
    grouped_per_piece(counts, in.dtype(), [&](int r, size_t first_byte, size_t n) {
      void* send = base + first_byte;
      check_nccl(ncclReduce(send, r == rank_ ? out.data() : send, n, type_of(in), ncclSum, r, comm_,
                            stream_),
                 "reduce_scatter_sum_v (ncclReduce)");
    });
    finish("reduce_scatter_sum_v");
  }
  void all_gather(const Tensor& in, const Tensor& out) override {
    if (on_host(in) || on_host(out))
      return through_device(in, out, [&](const Tensor& i, const Tensor& o) { all_gather(i, o); });
    check_pair(in, out, 1, size_, "all_gather");
    wait_for_device_work();
    check_nccl(ncclAllGather(in.data(), out.data(), static_cast<size_t>(in.numel()), type_of(in),
                             comm_, stream_),
               "all_gather (ncclAllGather)");
    finish("all_gather");
  }
  void gather_v(const Tensor& in, const std::vector<int64_t>& counts, const Tensor& out,
                int root) override {
    // Off the root, out is not used (it may be empty).
    if (on_host(in) || (rank_ == root && on_host(out)))
      return through_device(
          in, rank_ == root ? out : Tensor(nullptr, Shape{0}, in.dtype()),
          [&](const Tensor& i, const Tensor& o) { gather_v(i, counts, o, root); });
    check_gather(in, counts, out, root);
    wait_for_device_work();
    const size_t esize = dtype_size(in.dtype());
    check_nccl(ncclGroupStart(), "ncclGroupStart");
    if (rank_ != root) {
      if (in.numel() > 0)
        check_nccl(
            ncclSend(in.data(), static_cast<size_t>(in.numel()), type_of(in), root, comm_, stream_),
            "gather_v (ncclSend)");
    } else {
      auto* base = static_cast<char*>(out.data());
      int64_t first = 0;
      for (int r = 0; r < size_; ++r) {
        const auto n = static_cast<size_t>(counts[static_cast<size_t>(r)]);
        char* at = base + static_cast<size_t>(first) * esize;
        if (r == rank_ && n > 0)
          check_cuda(cudaMemcpyAsync(at, in.data(), n * esize, cudaMemcpyDeviceToDevice, stream_),
                     "gather_v (own piece)");
        else if (n > 0)
          check_nccl(ncclRecv(at, n, type_of(in), r, comm_, stream_), "gather_v (ncclRecv)");
        first += counts[static_cast<size_t>(r)];
      }
    }
    check_nccl(ncclGroupEnd(), "ncclGroupEnd");
    finish("gather_v");
  }
  // Pieces of any length: one broadcast from each rank into its place, grouped.
  void all_gather_v(const Tensor& in, const std::vector<int64_t>& counts,
                    const Tensor& out) override {
    if (on_host(in) || on_host(out))
      return through_device(in, out,
                            [&](const Tensor& i, const Tensor& o) { all_gather_v(i, counts, o); });
    check_all_gather_v(in, counts, out);
    wait_for_device_work();
    queue_all_gather_v(in, counts, out);
    finish("all_gather_v");
  }
  // Started collectives of GPU buffers are queued and waited for later (host buffers run at once,
  // through the base class).
  void start_all_reduce_sum(const Tensor& buf) override {
    if (on_host(buf)) return Communicator::start_all_reduce_sum(buf);
    check_buffer(buf, "all_reduce_sum");
    wait_for_device_work();
    queue_started("all_reduce_sum", [&] {
      check_nccl(ncclAllReduce(buf.data(), buf.data(), static_cast<size_t>(buf.numel()),
                               type_of(buf), ncclSum, comm_, stream_),
                 "all_reduce_sum (ncclAllReduce)");
    });
  }
  void start_all_gather_v(const Tensor& in, const std::vector<int64_t>& counts,
                          const Tensor& out) override {
    if (on_host(in) || on_host(out)) return Communicator::start_all_gather_v(in, counts, out);
    check_all_gather_v(in, counts, out);
    wait_for_device_work();
    queue_started("all_gather_v", [&] { queue_all_gather_v(in, counts, out); });
  }
  void wait_started_until(int64_t keep) override {
    const int64_t last = started() - keep;  // the latest ticket to wait for
    while (waited_ < started_.size() && started_[waited_].ticket <= last) {
      const Started s = started_[waited_];
      wait_for(s.op, [&] { return cudaEventQuery(s.end); });
      float ms = 0;
      check_cuda(cudaEventElapsedTime(&ms, s.begin, s.end), "NCCL: timing a collective");
      started_seconds_ += ms / 1000.0;
      ++waited_;
      if (waited_ == started_.size()) {  // all waited for: the list starts again, its capacity kept
        started_.clear();
        waited_ = 0;
      }
      free_events_.insert(free_events_.end(), {s.begin, s.end});
    }
  }
  double wait_started() override {
    wait_started_until(0);
    return Communicator::wait_started() + std::exchange(started_seconds_, 0.0);
  }
  void broadcast(const Tensor& buf, int root) override {
    if (on_host(buf))
      return in_place_through_device(buf, [&](const Tensor& b) { broadcast(b, root); });
    check_buffer(buf, "broadcast");
    wait_for_device_work();
    BRISK_CHECK(root >= 0 && root < size_, "broadcast: root ", root, " of ", size_, " ranks");
    check_nccl(ncclBroadcast(buf.data(), buf.data(), static_cast<size_t>(buf.numel()), type_of(buf),
                             root, comm_, stream_),
               "broadcast (ncclBroadcast)");
    finish("broadcast");
  }
  void barrier() override {
    check_nccl(ncclAllReduce(scratch_, scratch_, 1, ncclFloat32, ncclSum, comm_, stream_),
               "barrier (ncclAllReduce)");
    finish("barrier");
  }
  // Point to point and all-to-all: GPU buffers, each side's sends and receives grouped.
  void send(const Tensor& buf, int peer) override {
    check_buffer(buf, "send");
    check_peer(peer, "send");
    wait_for_device_work();
    check_nccl(ncclSend(buf.data(), count(buf), type_of(buf), peer, comm_, stream_),
               "send (ncclSend)");
    finish("send");
  }
  void receive(const Tensor& buf, int peer) override {
    check_buffer(buf, "receive");
    check_peer(peer, "receive");
    wait_for_device_work();
    check_nccl(ncclRecv(buf.data(), count(buf), type_of(buf), peer, comm_, stream_),
               "receive (ncclRecv)");
    finish("receive");
  }
  void send_receive(const Tensor& out, int to, const Tensor& in, int from) override {
    check_buffer(out, "send_receive");
    check_buffer(in, "send_receive");
    check_peer(to, "send_receive");
    check_peer(from, "send_receive");
    wait_for_device_work();
    check_nccl(ncclGroupStart(), "ncclGroupStart");
    check_nccl(ncclSend(out.data(), count(out), type_of(out), to, comm_, stream_),
               "send_receive (ncclSend)");
    check_nccl(ncclRecv(in.data(), count(in), type_of(in), from, comm_, stream_),
               "send_receive (ncclRecv)");
    check_nccl(ncclGroupEnd(), "ncclGroupEnd");
    finish("send_receive");
  }
  void all_to_all(const Tensor& in, const Tensor& out) override {
    check_all_to_all(in, out);
    wait_for_device_work();
    const size_t chunk = count(in) / static_cast<size_t>(size_);
    const size_t chunk_bytes = chunk * dtype_size(in.dtype());
    auto* from = static_cast<char*>(in.data());
    auto* to = static_cast<char*>(out.data());
    check_nccl(ncclGroupStart(), "ncclGroupStart");
    for (int r = 0; r < size_; ++r) {
      const size_t at = static_cast<size_t>(r) * chunk_bytes;
      check_nccl(ncclSend(from + at, chunk, type_of(in), r, comm_, stream_),
                 "all_to_all (ncclSend)");
      check_nccl(ncclRecv(to + at, chunk, type_of(out), r, comm_, stream_),
                 "all_to_all (ncclRecv)");
    }
    check_nccl(ncclGroupEnd(), "ncclGroupEnd");
    finish("all_to_all");
  }
  // Pieces of any length: a send and a receive per rank with something to pass, grouped; this
  // rank's own piece copied.
  void all_to_all_v(const Tensor& in, const std::vector<int64_t>& send, const Tensor& out,
                    const std::vector<int64_t>& receive) override {
    if (on_host(in) || on_host(out))
      return through_device(
          in, out, [&](const Tensor& i, const Tensor& o) { all_to_all_v(i, send, o, receive); });
    check_all_to_all_v(in, send, out, receive);
    wait_for_device_work();
    const size_t esize = dtype_size(in.dtype());
    auto* from = static_cast<char*>(in.data());
    auto* to = static_cast<char*>(out.data());
    check_nccl(ncclGroupStart(), "ncclGroupStart");
    for (int r = 0; r < size_; ++r) {
      const auto n_out = static_cast<size_t>(send[static_cast<size_t>(r)]);
      const auto n_in = static_cast<size_t>(receive[static_cast<size_t>(r)]);
      if (r == rank_ && n_out > 0)
        check_cuda(cudaMemcpyAsync(to, from, n_out * esize, cudaMemcpyDeviceToDevice, stream_),
                   "all_to_all_v (own piece)");
      else if (n_out > 0)
        check_nccl(ncclSend(from, n_out, type_of(in), r, comm_, stream_),
                   "all_to_all_v (ncclSend)");
      if (r != rank_ && n_in > 0)
        check_nccl(ncclRecv(to, n_in, type_of(out), r, comm_, stream_), "all_to_all_v (ncclRecv)");
      from += n_out * esize;
      to += n_in * esize;
    }
    check_nccl(ncclGroupEnd(), "ncclGroupEnd");
    finish("all_to_all_v");
  }
  std::unique_ptr<Communicator> split(int color, int key) override {
    BRISK_CHECK(color >= 0, "split: color ", color, " is negative");
    ncclComm_t sub = nullptr;
    check_nccl(ncclCommSplit(comm_, color, key, &sub, nullptr), "split (ncclCommSplit)");
    return std::unique_ptr<Communicator>(new Nccl(*this, sub));
  }
  void set_timeout(double seconds) override {
    BRISK_CHECK(seconds >= 0, "the collectives' timeout must not be negative, got ", seconds);
    timeout_ = seconds;
  }
  void set_device_stream(void* stream) override {
    device_stream_ = static_cast<cudaStream_t>(stream);
  }
  [[noreturn]] void abort(int code) override {
    if (comm_) ncclCommAbort(comm_);
    comm_ = nullptr;
    std::exit(code);
  }

 protected:
  Device memory() const override { return memory_; }

 private:
  static bool on_host(const Tensor& t) { return device_traits(t.device()).host_memory; }
  // In place on the GPU: buf reduced by `reduce` over the ranks.
  void all_reduce(const Tensor& buf, ncclRedOp_t reduce, const char* op) {
    check_buffer(buf, op);
    wait_for_device_work();
    check_nccl(ncclAllReduce(buf.data(), buf.data(), static_cast<size_t>(buf.numel()), type_of(buf),
                             reduce, comm_, stream_),
               op);
    finish(op);
  }
  // Runs `op` on GPU copies of whichever of in and out are host buffers; out's is copied back.
  template <typename Op>
  void through_device(const Tensor& in, const Tensor& out, Op op) {
    const Tensor gpu_in = on_host(in) ? stage(in, 0, true) : in;
    const Tensor gpu_out = on_host(out) ? stage(out, 1, false) : out;
    op(gpu_in, gpu_out);
    if (on_host(out)) unstage(1, out);
    release_large_staging();
  }
  // The same for a collective in place: one GPU copy, copied back.
  template <typename Op>
  void in_place_through_device(const Tensor& buf, Op op) {
    op(stage(buf, 0, true));
    unstage(0, buf);
    release_large_staging();
  }
  // A host buffer's copy in GPU memory (staging slot 0 or 1, grown as needed), uploaded when
  // `upload`: host collectives run on it, and unstage copies the result back.
  Tensor stage(const Tensor& host, int slot, bool upload) {
    const auto i = static_cast<size_t>(slot);
    const size_t bytes = host.empty() ? 0 : host.bytes();
    if (bytes > staging_bytes_[i] || !staging_[i]) {
      if (staging_[i]) check_cuda(cudaFree(staging_[i]), "NCCL: freeing host staging");
      staging_[i] = nullptr;
      staging_bytes_[i] = 0;
      check_cuda(cudaMalloc(&staging_[i], std::max<size_t>(bytes, 256)), "NCCL: host staging");
      staging_bytes_[i] = std::max<size_t>(bytes, 256);
    }
    // On NCCL's stream, so the collective queued next reads it whole.
    if (upload && bytes > 0)
      check_cuda(cudaMemcpyAsync(staging_[i], host.data(), bytes, cudaMemcpyHostToDevice, stream_),
                 "NCCL: staging a host buffer");
    return Tensor(staging_[i], bytes == 0 ? Shape{0} : host.shape(), host.dtype(), memory_);
  }
  void unstage(int slot, const Tensor& host) {
    if (host.empty() || host.bytes() == 0) return;
    check_cuda(cudaMemcpyAsync(host.data(), staging_[static_cast<size_t>(slot)], host.bytes(),
                               cudaMemcpyDeviceToHost, stream_),
               "NCCL: copying a host buffer back");
    check_cuda(cudaStreamSynchronize(stream_), "NCCL: copying a host buffer back");
  }
  // The staging buffers stay allocated (outside the run's plan) up to 8 MiB each, enough for the
  // trainer's metrics and texts; a larger host collective (evaluation predictions gathered)
  // frees its buffers when done, so they do not grow with the data.
  void release_large_staging() {
    constexpr size_t kKept = size_t{8} << 20;
    for (size_t i = 0; i < staging_.size(); ++i)
      if (staging_[i] && staging_bytes_[i] > kKept) {
        check_cuda(cudaFree(staging_[i]), "NCCL: freeing host staging");
        staging_[i] = nullptr;
        staging_bytes_[i] = 0;
      }
  }
  // The communicator's own stream, barrier scratch and event.
  void open_streams() {
    check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "NCCL: a stream");
    check_cuda(cudaMalloc(&scratch_, sizeof(float)), "NCCL: barrier scratch");
    check_cuda(cudaEventCreateWithFlags(&device_done_, cudaEventDisableTiming), "NCCL: an event");
  }
  static size_t count(const Tensor& t) { return static_cast<size_t>(t.numel()); }
  // NCCL's stream waits (on the GPU) for what the backend's stream has queued so far.
  void wait_for_device_work() {
    if (!device_stream_) return;
    check_cuda(cudaEventRecord(device_done_, device_stream_), "NCCL: marking the backend's work");
    check_cuda(cudaStreamWaitEvent(stream_, device_done_, 0), "NCCL: waiting for the backend");
  }
  // One grouped broadcast per rank's piece, queued on NCCL's stream.
  void queue_all_gather_v(const Tensor& in, const std::vector<int64_t>& counts, const Tensor& out) {
    auto* base = static_cast<char*>(out.data());
    grouped_per_piece(counts, in.dtype(), [&](int r, size_t first_byte, size_t n) {
      check_nccl(ncclBroadcast(r == rank_ ? in.data() : nullptr, base + first_byte, n, type_of(in),
                               r, comm_, stream_),
                 "all_gather_v (ncclBroadcast)");
    });
  }
  // In one NCCL group, call(r, first byte, elements) for each rank r's piece of a buffer cut
  // into counts[r] elements of `dtype` per rank, in rank order; empty pieces are skipped.
  template <typename Call>
  void grouped_per_piece(const std::vector<int64_t>& counts, DType dtype, Call call) {
    const size_t esize = dtype_size(dtype);
    check_nccl(ncclGroupStart(), "ncclGroupStart");
    size_t first = 0;
    for (int r = 0; r < size_; ++r) {
      const auto n = static_cast<size_t>(counts[static_cast<size_t>(r)]);
      if (n > 0) call(r, first * esize, n);
      first += n;
    }
    check_nccl(ncclGroupEnd(), "ncclGroupEnd");
  }
  // Queues a started collective between two timing events and counts it.
  template <typename Queue>
  void queue_started(const char* op, Queue queue) {
    Started s{0, event(), event(), op};
    check_cuda(cudaEventRecord(s.begin, stream_), "NCCL: timing a collective");
    queue();
    check_cuda(cudaEventRecord(s.end, stream_), "NCCL: timing a collective");
    count_started();
    s.ticket = started();
    started_.push_back(s);
  }
  cudaEvent_t event() {
    if (free_events_.empty()) {
      cudaEvent_t e = nullptr;
      check_cuda(cudaEventCreate(&e), "NCCL: an event");
      return e;
    }
    const cudaEvent_t e = free_events_.back();
    free_events_.pop_back();
    return e;
  }

  // Waits for the stream.
  void finish(const char* op) {
    wait_for(op, [&] { return cudaStreamQuery(stream_); });
  }
  // Waits until `query` says done, watching NCCL's asynchronous errors and the timeout: a
  // collective past it aborts the communicator and ends the process (the peers' collectives then
  // fail in turn).
  template <typename Query>
  void wait_for(const char* op, Query query) {
    const auto start = std::chrono::steady_clock::now();
    for (int spins = 0;; ++spins) {
      const cudaError_t q = query();
      if (q == cudaSuccess) return;
      BRISK_CHECK(q == cudaErrorNotReady, op, ": ", cudaGetErrorString(q));
      ncclResult_t async = ncclSuccess;
      check_nccl(ncclCommGetAsyncError(comm_, &async), "ncclCommGetAsyncError");
      BRISK_CHECK(async == ncclSuccess || async == ncclInProgress, op,
                  " failed: ", ncclGetErrorString(async), " (a rank is gone?)");
      const double waited = seconds_since(start);
      if (timeout_ > 0 && waited >= timeout_) {
        std::fprintf(stderr,
                     "brisk: error (rank %d of %d): %s has waited %.0f s for the other ranks "
                     "(ddp_timeout): a rank is stuck or gone; ending the run\n",
                     rank_, size_, op, waited);
        std::fflush(stderr);
        ncclCommAbort(comm_);
        std::_Exit(1);
      }
      if (spins > 1000) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  int rank_, size_, device_ = 0;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  void* scratch_ = nullptr;
  std::array<void*, 2> staging_{};
  std::array<size_t, 2> staging_bytes_{};
  cudaStream_t device_stream_ = nullptr;  // the backend's (set_device_stream)
  cudaEvent_t device_done_ = nullptr;     // recorded on it before each collective
  Device memory_;                         // the GPU memory its collectives read and write
  // Started collectives not yet waited for, oldest first: ticket, timing events, name.
  struct Started {
    int64_t ticket;
    cudaEvent_t begin, end;
    const char* op;
  };
  // A list reused step after step (no allocation once it has grown): [waited_, size) pending.
  std::vector<Started> started_;
  size_t waited_ = 0;
  std::vector<cudaEvent_t> free_events_;
  double started_seconds_ = 0;  // the waited-for started collectives' time on the GPU
  double timeout_ = 0;
};

}  // namespace

std::unique_ptr<Communicator> make_nccl(const LaunchInfo& launch, Communicator* bootstrap,
                                        Device memory, double timeout_seconds) {
  return std::make_unique<Nccl>(launch, bootstrap, memory, timeout_seconds);
}

bool nccl_built_in() {
  return true;
}

}  // namespace brisk
