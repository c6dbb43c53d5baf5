#include "parallel/communicator.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

#include "backend/device_traits.h"
#include "core/checked.h"
#include "core/clock.h"
#include "core/error.h"
#include "parallel/comm_thread.h"

namespace brisk {

void Communicator::check_buffer(const Tensor& t, const char* op) const {
  BRISK_CHECK(t.device() == memory(), op, ": the buffer must be in ",
              device_traits(memory()).host_memory ? "host" : "GPU", " memory");
  // Copies (gathers, broadcasts) also move bytes: uint8 buffers.
  const bool copies = std::strcmp(op, "all_gather") == 0 || std::strcmp(op, "broadcast") == 0 ||
                      std::strcmp(op, "gather_v") == 0 || std::strcmp(op, "all_gather_v") == 0;
  BRISK_CHECK(t.dtype() == DType::f32 || t.dtype() == DType::bf16 || t.dtype() == DType::f64 ||
                  (copies && t.dtype() == DType::u8),
              op, ": float32, bf16 or float64 buffers only", copies ? " (or uint8)" : "", ", not ",
              dtype_name(t.dtype()));
}

void Communicator::check_pair(const Tensor& in, const Tensor& out, int64_t in_per_out,
                              int64_t out_per_in, const char* op) const {
  check_buffer(in, op);
  check_buffer(out, op);
  BRISK_CHECK(in.dtype() == out.dtype(), op, ": in and out are ", dtype_name(in.dtype()), " and ",
              dtype_name(out.dtype()));
  BRISK_CHECK(in.numel() * out_per_in == out.numel() * in_per_out, op, ": ", in.numel(),
              " elements in and ", out.numel(), " out over ", size(), " ranks");
}

bool Communicator::check_all_gather(const Tensor& in, const Tensor& out) const {
  check_pair(in, out, 1, size(), "all_gather");
  const bool own_chunk =
      in.data() == static_cast<char*>(out.data()) + static_cast<size_t>(rank()) * in.bytes();
  BRISK_CHECK(own_chunk || !overlap(in, out),
              "all_gather: in overlaps out other than as this rank's chunk");
  return own_chunk;
}

bool Communicator::overlap(const Tensor& a, const Tensor& b) {
  const auto* pa = static_cast<const char*>(a.data());
  const auto* pb = static_cast<const char*>(b.data());
  return a.bytes() > 0 && b.bytes() > 0 && pa < pb + b.bytes() && pb < pa + a.bytes();
}

int64_t Communicator::check_counts(const std::vector<int64_t>& counts, const char* op) const {
  BRISK_CHECK(counts.size() == static_cast<size_t>(size()), op, ": ", counts.size(), " counts for ",
              size(), " ranks");
  int64_t total = 0;
  for (int64_t c : counts) {
    BRISK_CHECK(c >= 0, op, ": a negative count");
    total = checked_add(total, c, "the pieces' elements");
  }
  return total;
}

void Communicator::check_pieces(const Tensor& in, const std::vector<int64_t>& counts,
                                const Tensor& out) const {
  const char* op = "reduce_scatter_sum_v";
  check_buffer(in, op);
  check_buffer(out, op);
  BRISK_CHECK(in.dtype() == out.dtype(), op, ": in and out are ", dtype_name(in.dtype()), " and ",
              dtype_name(out.dtype()));
  const int64_t total = check_counts(counts, op);
  BRISK_CHECK(total == in.numel() && counts[static_cast<size_t>(rank())] == out.numel(), op, ": ",
              in.numel(), " elements in and ", out.numel(), " out for pieces adding up to ", total);
}

void Communicator::check_gather(const Tensor& in, const std::vector<int64_t>& counts,
                                const Tensor& out, int root) const {
  const char* op = "gather_v";
  BRISK_CHECK(root >= 0 && root < size(), op, ": root ", root, " of ", size(), " ranks");
  const int64_t total = check_counts(counts, op);
  BRISK_CHECK(in.numel() == counts[static_cast<size_t>(rank())], op, ": ", in.numel(),
              " elements in, the counts say ", counts[static_cast<size_t>(rank())]);
  check_buffer(in, op);
  if (rank() != root) return;
  check_buffer(out, op);
  BRISK_CHECK(out.dtype() == in.dtype() && out.numel() == total, op, ": ", out.numel(),
              " elements out for pieces adding up to ", total);
}

void Communicator::check_all_gather_v(const Tensor& in, const std::vector<int64_t>& counts,
                                      const Tensor& out) const {
  const char* op = "all_gather_v";
  check_buffer(in, op);
  check_buffer(out, op);
  const int64_t total = check_counts(counts, op);
  BRISK_CHECK(in.dtype() == out.dtype(), op, ": in and out are ", dtype_name(in.dtype()), " and ",
              dtype_name(out.dtype()));
  BRISK_CHECK(in.numel() == counts[static_cast<size_t>(rank())] && out.numel() == total, op, ": ",
              in.numel(), " elements in and ", out.numel(), " out for pieces adding up to ", total);
  BRISK_CHECK(!overlap(in, out), op, ": in and out overlap");
}

void Communicator::check_peer(int peer, const char* op) const {
  BRISK_CHECK(peer >= 0 && peer < size() && peer != rank(), op, ": rank ", peer,
              " is not another rank of ", size());
}

void Communicator::check_all_to_all(const Tensor& in, const Tensor& out) const {
  check_pair(in, out, 1, 1, "all_to_all");
  BRISK_CHECK(in.numel() % size() == 0, "all_to_all: ", in.numel(), " elements are not ", size(),
              " equal chunks");
  BRISK_CHECK(!overlap(in, out), "all_to_all: in and out overlap");
}

void Communicator::check_all_to_all_v(const Tensor& in, const std::vector<int64_t>& send,
                                      const Tensor& out,
                                      const std::vector<int64_t>& receive) const {
  const char* op = "all_to_all_v";
  check_buffer(in, op);
  check_buffer(out, op);
  BRISK_CHECK(in.dtype() == out.dtype(), op, ": in and out are ", dtype_name(in.dtype()), " and ",
              dtype_name(out.dtype()));
  const int64_t sent = check_counts(send, op), received = check_counts(receive, op);
  BRISK_CHECK(sent == in.numel() && received == out.numel(), op, ": ", in.numel(),
              " elements in and ", out.numel(), " out for pieces adding up to ", sent, " and ",
              received);
  const auto me = static_cast<size_t>(rank());
  BRISK_CHECK(send[me] == receive[me], op, ": ", send[me], " elements to this rank, ", receive[me],
              " from it");
  BRISK_CHECK(!overlap(in, out), op, ": in and out overlap");
}

namespace {
[[noreturn]] void refuse(const Communicator& c, const char* op) {
  BRISK_FAIL(c.name(), " has no ", op,
             " yet: tensor, pipeline and sequence parallelism run on MPI (mpirun) for now");
}
}  // namespace

void Communicator::send(const Tensor&, int) {
  refuse(*this, "send");
}
void Communicator::receive(const Tensor&, int) {
  refuse(*this, "receive");
}
void Communicator::send_receive(const Tensor&, int, const Tensor&, int) {
  refuse(*this, "send_receive");
}
void Communicator::all_to_all(const Tensor&, const Tensor&) {
  refuse(*this, "all_to_all");
}
void Communicator::all_to_all_v(const Tensor&, const std::vector<int64_t>&, const Tensor&,
                                const std::vector<int64_t>&) {
  refuse(*this, "all_to_all_v");
}
std::unique_ptr<Communicator> Communicator::split(int, int) {
  refuse(*this, "split");
}

void Communicator::all_reduce_max(const Tensor& buf) {
  check_buffer(buf, "all_reduce_max");
  BRISK_CHECK(buf.dtype() == DType::f32, "all_reduce_max: float32 expected, not ",
              dtype_name(buf.dtype()));
  if (size() == 1) return;
  const int64_t piece = std::min<int64_t>(buf.numel(), 1 << 16);
  std::vector<float> all(static_cast<size_t>(piece * size()));
  float* out = buf.f32();
  for (int64_t at = 0; at < buf.numel(); at += piece) {
    const int64_t n = std::min(piece, buf.numel() - at);
    all_gather(Tensor(out + at, Shape{n}, DType::f32),
               Tensor(all.data(), Shape{n * size()}, DType::f32));
    for (int r = 0; r < size(); ++r)
      for (int64_t i = 0; i < n; ++i) out[at + i] = std::max(out[at + i], all[r * n + i]);
  }
}

void Communicator::start_all_reduce_sum(const Tensor& buf) {
  count_started();
  const auto start = std::chrono::steady_clock::now();
  all_reduce_sum(buf);
  started_seconds_ += seconds_since(start);
}

void Communicator::start_reduce_scatter_sum_v(const Tensor& in, const std::vector<int64_t>& counts,
                                              const Tensor& out, std::function<void()> then) {
  count_started();
  const auto start = std::chrono::steady_clock::now();
  reduce_scatter_sum_v(in, counts, out);
  if (then) then();
  started_seconds_ += seconds_since(start);
}

void Communicator::start_all_gather_v(const Tensor& in, const std::vector<int64_t>& counts,
                                      const Tensor& out) {
  count_started();
  const auto start = std::chrono::steady_clock::now();
  all_gather_v(in, counts, out);
  started_seconds_ += seconds_since(start);
}

void Communicator::wait_started_until(int64_t /*keep*/) {}  // the default runs them at once

double Communicator::wait_started() {
  return std::exchange(started_seconds_, 0.0);
}

std::vector<uint8_t> gather_pieces(Communicator& comm, const Tensor& piece,
                                   std::vector<int64_t>* bytes_per_rank, int root) {
  const auto N = static_cast<size_t>(comm.size());
  std::vector<double> lengths(N, 0.0);
  lengths[static_cast<size_t>(comm.rank())] = static_cast<double>(piece.bytes());
  comm.all_reduce_sum(Tensor(lengths.data(), Shape{comm.size()}, DType::f64));
  if (bytes_per_rank) bytes_per_rank->clear();
  if (root >= 0) {
    std::vector<int64_t> counts;
    int64_t total = 0;
    for (double l : lengths) {
      counts.push_back(static_cast<int64_t>(l));
      total += counts.back();
      if (bytes_per_rank) bytes_per_rank->push_back(counts.back());
    }
    std::vector<uint8_t> out(comm.rank() == root ? static_cast<size_t>(total) : 0);
    comm.gather_v(Tensor(piece.data(), Shape{static_cast<int64_t>(piece.bytes())}, DType::u8),
                  counts, Tensor(out.data(), Shape{static_cast<int64_t>(out.size())}, DType::u8),
                  root);
    return out;
  }
  const auto longest = static_cast<size_t>(*std::max_element(lengths.begin(), lengths.end()));
  std::vector<uint8_t> padded(std::max<size_t>(longest, 1)), all(padded.size() * N), out;
  if (piece.bytes() > 0) std::memcpy(padded.data(), piece.data(), piece.bytes());
  comm.all_gather(Tensor(padded.data(), Shape{static_cast<int64_t>(padded.size())}, DType::u8),
                  Tensor(all.data(), Shape{static_cast<int64_t>(all.size())}, DType::u8));
  for (size_t r = 0; r < N; ++r) {
    const auto* first = all.data() + r * padded.size();
    out.insert(out.end(), first, first + static_cast<size_t>(lengths[r]));
    if (bytes_per_rank) bytes_per_rank->push_back(static_cast<int64_t>(lengths[r]));
  }
  return out;
}

namespace {

// One process: every collective is a copy or nothing.
class SingleProcess final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string name() const override { return "single process"; }
  void all_reduce_sum(const Tensor& buf) override { check_buffer(buf, "all_reduce_sum"); }
  void reduce_scatter_sum(const Tensor& in, const Tensor& out) override {
    check_pair(in, out, 1, 1, "reduce_scatter_sum");
    if (in.data() != out.data()) std::memcpy(out.data(), in.data(), out.bytes());
  }
  void reduce_scatter_sum_v(const Tensor& in, const std::vector<int64_t>& counts,
                            const Tensor& out) override {
    check_pieces(in, counts, out);
    if (in.data() != out.data()) std::memcpy(out.data(), in.data(), out.bytes());
  }
  void all_gather(const Tensor& in, const Tensor& out) override {
    check_pair(in, out, 1, 1, "all_gather");
    if (in.data() != out.data()) std::memcpy(out.data(), in.data(), out.bytes());
  }
  void gather_v(const Tensor& in, const std::vector<int64_t>& counts, const Tensor& out,
                int root) override {
    check_gather(in, counts, out, root);
    if (in.data() != out.data() && in.bytes() > 0) std::memcpy(out.data(), in.data(), in.bytes());
  }
  void all_gather_v(const Tensor& in, const std::vector<int64_t>& counts,
                    const Tensor& out) override {
    check_all_gather_v(in, counts, out);
    if (in.bytes() > 0) std::memcpy(out.data(), in.data(), in.bytes());
  }
  // One process has no peer: check_peer refuses every rank.
  void send(const Tensor&, int peer) override { check_peer(peer, "send"); }
  void receive(const Tensor&, int peer) override { check_peer(peer, "receive"); }
  void send_receive(const Tensor&, int to, const Tensor&, int) override {
    check_peer(to, "send_receive");
  }
  void all_to_all(const Tensor& in, const Tensor& out) override {
    check_all_to_all(in, out);
    if (in.bytes() > 0) std::memcpy(out.data(), in.data(), in.bytes());
  }
  void all_to_all_v(const Tensor& in, const std::vector<int64_t>& send, const Tensor& out,
                    const std::vector<int64_t>& receive) override {
    check_all_to_all_v(in, send, out, receive);
    if (in.bytes() > 0) std::memcpy(out.data(), in.data(), in.bytes());
  }
  std::unique_ptr<Communicator> split(int color, int) override {
    BRISK_CHECK(color >= 0, "split: color ", color, " is negative");
    return make_single_process();
  }

  void broadcast(const Tensor& buf, int root) override {
    check_buffer(buf, "broadcast");
    BRISK_CHECK(root == 0, "broadcast: root ", root, " of 1 rank");
  }
  void barrier() override {}
  [[noreturn]] void abort(int code) override { std::exit(code); }
};

Communicator* world_made = nullptr;  // world_communicator's, once made

}  // namespace

std::unique_ptr<Communicator> make_single_process() {
  return std::make_unique<SingleProcess>();
}

// mpi.cpp or no_mpi.cpp, gloo.cpp or no_gloo.cpp: the ranks wait at most `timeout_seconds` for
// each other to start (0: no bound).
std::unique_ptr<Communicator> make_mpi(const LaunchInfo& launch, double timeout_seconds);
std::unique_ptr<Communicator> make_gloo(const LaunchInfo& launch, double timeout_seconds);

Communicator& world_communicator(Device memory, double timeout_seconds) {
  if (device_traits(memory).host_memory || launch_info_from_env().size == 1) {
    static const std::unique_ptr<Communicator> world =
        make_communicator(launch_info_from_env(), timeout_seconds);
    world_made = world.get();
    return *world;
  }
  static const std::unique_ptr<Communicator> gpu = [memory, timeout_seconds] {
    const LaunchInfo launch = launch_info_from_env();
    // Under MPI, the host communicator is the bootstrap, and the one that ends every rank.
    Communicator* host = launch.launcher == Launcher::mpi
                             ? &world_communicator(kHostDevice, timeout_seconds)
                             : nullptr;
    // The rendezvous (or the bootstrap's broadcast) waits at most the timeout for the NCCL id,
    // and NCCL's own initialization, which has no bound, at most as long again: the watchdog
    // ends the rank past both (the rendezvous names a rank that did not come first).
    Watchdog start([&launch, host](const char* op, double waited) {
      std::fprintf(stderr,
                   "brisk: error (rank %d of %d): %s has waited %.0f s for the other ranks "
                   "(ddp_timeout): a rank is stuck or gone; ending the run\n",
                   launch.rank, launch.size, op, waited);
      std::fflush(stderr);
      if (host) host->abort(1);
      std::_Exit(1);
    });
    start.set_timeout(2 * timeout_seconds);
    const Watchdog::Watch watch(start, "NCCL's start (the ranks' start)");
    std::unique_ptr<Communicator> made =
        make_nccl(launch, host, memory, timeout_seconds > 0 ? timeout_seconds : 1e9);
    if (!world_made) world_made = made.get();
    return made;
  }();
  return *gpu;
}

void end_every_rank_on_error(int code) {
  if (world_made && world_made->size() > 1) world_made->abort(code);
}

std::unique_ptr<Communicator> make_communicator(const LaunchInfo& launch, double timeout_seconds) {
  BRISK_CHECK(timeout_seconds >= 0, "the start's timeout must not be negative, got ",
              timeout_seconds);
  switch (launch.launcher) {
    case Launcher::none:
      return make_single_process();
    case Launcher::mpi:
      return make_mpi(launch, timeout_seconds);
    case Launcher::torchrun:
      return launch.size == 1 ? make_single_process() : make_gloo(launch, timeout_seconds);
  }
  return make_single_process();
}

}  // namespace brisk
