// The Gloo communicator: host-memory collectives for the CPU ranks of a torchrun-style launch
// (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT and no MPI launcher) over Gloo's TCP transport, the
// library PyTorch's CPU collectives use. The ranks find each other through brisk's rendezvous
// store (parallel/rendezvous.h), served by rank 0 on the port derived from MASTER_PORT. As the MPI
// communicator: started collectives run in order on a communication thread, a watchdog ends
// the run at the timeout, bf16 sums are taken in float32 and rounded at each partial sum.
#include <gloo/allgather.h>
#include <gloo/allgatherv.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/config.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/types.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
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
#include "parallel/rendezvous.h"
#include "parallel/route.h"

namespace brisk {
namespace {

// Gloo's waits all take a timeout; brisk's watchdog decides when waiting is too long.
constexpr std::chrono::milliseconds kForever = std::chrono::hours(24 * 365);
// The ranks' pieces of reduce_scatter_sum_v and gather_v, sent point to point: a slot of their
// own, apart from Gloo's collectives' (types.h's prefixes).
constexpr uint8_t kPiecesSlotPrefix = 0x42;

// Gloo's store interface over brisk's rendezvous store.
class Store final : public gloo::rendezvous::Store {
 public:
  explicit Store(RendezvousStore& store) : store_(store) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    store_.set(key, std::vector<uint8_t>(data.begin(), data.end()));
  }
  // Connecting, Gloo waits for each other rank's address under its rank number: a rank that
  // never sets it is named as the one that did not join.
  std::vector<char> get(const std::string& key) override {
    std::vector<uint8_t> value;
    try {
      value = store_.get(key);
    } catch (const Error& e) {
      const bool rank = !key.empty() && key.size() < 8 &&
                        key.find_first_not_of("0123456789") == std::string::npos;
      if (!rank) throw;
      BRISK_FAIL("rank ", key, " did not join the run (ddp_timeout): ", e.what());
    }
    return std::vector<char>(value.begin(), value.end());
  }
  void wait(const std::vector<std::string>& keys) override {
    for (const std::string& key : keys) get(key);  // bounded by the store's timeout
  }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds&) override {
    wait(keys);
  }

 private:
  RendezvousStore& store_;
};

void bf16_sum(void* c, const void* a, const void* b, size_t n) {
  auto* out = static_cast<uint16_t*>(c);
  const auto* x = static_cast<const uint16_t*>(a);
  const auto* y = static_cast<const uint16_t*>(b);
  for (size_t i = 0; i < n; ++i) out[i] = float_to_bf16(bf16_to_float(x[i]) + bf16_to_float(y[i]));
}

using Reduce = void (*)(void*, const void*, const void*, size_t);

Reduce sum_of(DType t) {
  return t == DType::f32   ? static_cast<Reduce>(&gloo::sum<float>)
         : t == DType::f64 ? static_cast<Reduce>(&gloo::sum<double>)
                           : &bf16_sum;
}

// Where this rank's end of the connections listens: the loopback interface when MASTER_ADDR is
// this host's loopback (every rank on one host), else GLOO_SOCKET_IFNAME's interface (PyTorch's
// variable) or the address this host reaches MASTER_ADDR from (route_to).
std::shared_ptr<gloo::transport::Device> make_device(const LaunchInfo& launch) {
  gloo::transport::tcp::attr attr;
  const std::string& m = launch.master_addr;
  const char* iface = std::getenv("GLOO_SOCKET_IFNAME");
  if (is_loopback(m)) {
    attr.hostname = "127.0.0.1";
  } else if (iface && *iface) {
    attr.iface = std::string(iface).substr(0, std::string(iface).find(','));
  } else {
    attr.hostname = route_to(m, "MASTER_ADDR").address;
  }
  try {
    return gloo::transport::tcp::CreateDevice(attr);
  } catch (const gloo::Exception& e) {
    BRISK_FAIL("Gloo cannot open a TCP device on ",
               attr.iface.empty() ? "the address of " + attr.hostname : "interface " + attr.iface,
               ": ", e.what(),
               " (set GLOO_SOCKET_IFNAME to the interface the ranks reach each other on)");
  }
}

class Gloo final : public Communicator {
 public:
  // The rendezvous and the connections wait at most `timeout` (0: no bound) for the other ranks;
  // the collectives' watchdog starts with the same.
  Gloo(const LaunchInfo& launch, double timeout)
      : rank_(launch.rank),
        size_(launch.size),
        watchdog_([this](const char* op, double waited) { expire(op, waited); }) {
    watchdog_.set_timeout(timeout);
    const double connect_timeout = timeout > 0 ? timeout : 1e9;
    auto device = make_device(launch);
    auto context = std::make_shared<gloo::rendezvous::Context>(rank_, size_);
    context->setTimeout(std::chrono::milliseconds(static_cast<int64_t>(connect_timeout * 1000)));
    RendezvousStore store(launch, connect_timeout);
    Store adapter(store);
    try {
      context->connectFullMesh(adapter, device);
    } catch (const gloo::Exception& e) {
      BRISK_FAIL("Gloo could not connect rank ", rank_, " to the other ", size_ - 1,
                 " ranks: ", e.what());
    }
    store.finish();  // every rank connected: nobody needs the store any more
    context->setTimeout(kForever);
    context_ = std::move(context);
  }
  ~Gloo() override { thread_.stop(); }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override {
    return "Gloo " + std::to_string(GLOO_VERSION_MAJOR) + "." + std::to_string(GLOO_VERSION_MINOR) +
           "." + std::to_string(GLOO_VERSION_PATCH) + " (TCP)";
  }

  void all_reduce_sum(const Tensor& buf) override {
    check_buffer(buf, "all_reduce_sum");
    thread_.drain();
    all_reduce_now(buf);
  }
  void reduce_scatter_sum(const Tensor& in, const Tensor& out) override {
    check_pair(in, out, size_, 1, "reduce_scatter_sum");
    BRISK_CHECK(!overlap(in, out), "reduce_scatter_sum: in and out overlap");
    thread_.drain();
    reduce_scatter_v_now(in, std::vector<int64_t>(static_cast<size_t>(size_), out.numel()), out,
                         "reduce_scatter_sum");
  }
  void reduce_scatter_sum_v(const Tensor& in, const std::vector<int64_t>& counts,
                            const Tensor& out) override {
    check_reduce_scatter_v(in, counts, out);
    thread_.drain();
    reduce_scatter_v_now(in, counts, out, "reduce_scatter_sum_v");
  }
  void all_gather(const Tensor& in, const Tensor& out) override {
    const bool own_chunk = check_all_gather(in, out);
    thread_.drain();
    if (out.bytes() == 0) return;
    run("all_gather", [&] {
      gloo::AllgatherOptions o(context_);
      o.setTimeout(kForever);
      if (!own_chunk) o.setInput(static_cast<uint8_t*>(in.data()), in.bytes());
      o.setOutput(static_cast<uint8_t*>(out.data()), out.bytes());
      gloo::allgather(o);
    });
  }
  void gather_v(const Tensor& in, const std::vector<int64_t>& counts, const Tensor& out,
                int root) override {
    check_gather(in, counts, out, root);
    thread_.drain();
    run("gather_v", [&] { gather_v_now(in, counts, out, root); });
  }
  void all_gather_v(const Tensor& in, const std::vector<int64_t>& counts,
                    const Tensor& out) override {
    check_all_gather_v(in, counts, out);
    thread_.drain();
    all_gather_v_now(in, counts, out);
  }
  void broadcast(const Tensor& buf, int root) override {
    check_buffer(buf, "broadcast");
    BRISK_CHECK(root >= 0 && root < size_, "broadcast: root ", root, " of ", size_, " ranks");
    thread_.drain();
    if (buf.bytes() == 0) return;
    run("broadcast", [&] {
      gloo::BroadcastOptions o(context_);
      o.setTimeout(kForever);
      o.setOutput(static_cast<uint8_t*>(buf.data()), buf.bytes());
      o.setRoot(root);
      gloo::broadcast(o);
    });
  }
  void barrier() override {
    thread_.drain();
    run("barrier", [&] {
      gloo::BarrierOptions o(context_);
      o.setTimeout(kForever);
      gloo::barrier(o);
    });
  }

  void start_all_reduce_sum(const Tensor& buf) override {
    check_buffer(buf, "start_all_reduce_sum");
    enqueue([this, buf] { all_reduce_now(buf); });
  }
  void start_reduce_scatter_sum_v(const Tensor& in, const std::vector<int64_t>& counts,
                                  const Tensor& out, std::function<void()> then) override {
    check_reduce_scatter_v(in, counts, out);
    enqueue([this, in, counts, out, then = std::move(then)] {
      reduce_scatter_v_now(in, counts, out, "reduce_scatter_sum_v");
      if (then) then();
    });
  }
  void start_all_gather_v(const Tensor& in, const std::vector<int64_t>& counts,
                          const Tensor& out) override {
    check_all_gather_v(in, counts, out);
    enqueue([this, in, counts, out] { all_gather_v_now(in, counts, out); });
  }
  double wait_started() override {
    thread_.drain();
    return thread_.take_busy_seconds();
  }
  void wait_started_until(int64_t keep) override { thread_.wait_until(keep); }
  void set_timeout(double seconds) override { watchdog_.set_timeout(seconds); }
  // The other ranks' connections to this one close with it: each fails in its next collective
  // (or at once, waiting in one), and a launcher such as torchrun ends the rest.
  [[noreturn]] void abort(int code) override {
    std::fflush(stdout);
    std::fflush(stderr);
    std::_Exit(code);
  }

 private:
  void enqueue(std::function<void()> job) {
    count_started();
    thread_.enqueue(std::move(job));
  }
  // Runs one collective under the watchdog; Gloo's failures (a peer gone) name the collective.
  void run(const char* op, const std::function<void()>& body) {
    const Watchdog::Watch watch(watchdog_, op);
    try {
      body();
    } catch (const gloo::Exception& e) {
      BRISK_FAIL(op, " through Gloo failed on rank ", rank_, " of ", size_, ": ", e.what(),
                 " (has another rank ended?)");
    }
  }
  [[noreturn]] void expire(const char* op, double waited) {
    std::fprintf(stderr,
                 "brisk: error (rank %d of %d): %s has waited %.0f s for the other ranks "
                 "(ddp_timeout): a rank is stuck or gone; ending the run\n",
                 rank_, size_, op, waited);
    abort(1);
  }
  void check_reduce_scatter_v(const Tensor& in, const std::vector<int64_t>& counts,
                              const Tensor& out) const {
    check_pieces(in, counts, out);
    BRISK_CHECK(!overlap(in, out), "reduce_scatter_sum_v: in and out overlap");
  }
  void all_reduce_now(const Tensor& buf) {
    if (buf.numel() == 0) return;
    run("all_reduce_sum", [&] {
      gloo::AllreduceOptions o(context_);
      o.setTimeout(kForever);
      if (buf.dtype() == DType::f32)
        o.setOutput(static_cast<float*>(buf.data()), static_cast<size_t>(buf.numel()));
      else if (buf.dtype() == DType::f64)
        o.setOutput(static_cast<double*>(buf.data()), static_cast<size_t>(buf.numel()));
      else
        o.setOutput(static_cast<uint16_t*>(buf.data()), static_cast<size_t>(buf.numel()));
      o.setReduceFunction(sum_of(buf.dtype()));
      gloo::allreduce(o);
    });
  }
  void all_gather_v_now(const Tensor& in, const std::vector<int64_t>& counts, const Tensor& out) {
    if (out.bytes() == 0) return;
    const size_t element = dtype_size(in.dtype());
    std::vector<size_t> bytes;
    for (int64_t c : counts) bytes.push_back(static_cast<size_t>(c) * element);
    run("all_gather_v", [&] {
      gloo::AllgathervOptions o(context_);
      o.setTimeout(kForever);
      o.setInput(static_cast<uint8_t*>(in.data()), in.bytes());
      o.setOutput(static_cast<uint8_t*>(out.data()), bytes);
      gloo::allgatherv(o);
    });
  }
  // Each rank sends every other rank its piece of `in`; the owner sums the pieces in rank order
  // (piece by piece through `scratch_`), so its result is the same whichever arrives first.
  void reduce_scatter_v_now(const Tensor& in, const std::vector<int64_t>& counts, const Tensor& out,
                            const char* op) {
    if (in.bytes() == 0) return;
    const size_t element = dtype_size(in.dtype());
    run(op, [&] {
      const uint64_t slot = gloo::Slot::build(kPiecesSlotPrefix, 0);
      auto source = context_->createUnboundBuffer(in.data(), in.bytes());
      size_t sends = 0, at = 0, mine = 0;
      for (int q = 0; q < size_; ++q) {
        const size_t n = static_cast<size_t>(counts[static_cast<size_t>(q)]) * element;
        if (q == rank_) mine = at;
        if (q != rank_ && n > 0) {
          source->send(q, slot, at, n);
          ++sends;
        }
        at += n;
      }
      if (out.bytes() > 0) sum_pieces(static_cast<const char*>(in.data()) + mine, out, slot);
      for (size_t i = 0; i < sends; ++i) source->waitSend(kForever);
    });
  }
  void sum_pieces(const void* own, const Tensor& out, uint64_t slot) {
    const size_t n = out.bytes();
    if (scratch_.size() < n) scratch_.resize(n);
    auto into_out = context_->createUnboundBuffer(out.data(), n);
    auto into_scratch = context_->createUnboundBuffer(scratch_.data(), n);
    for (int q = 0; q < size_; ++q) {
      if (q == 0 && rank_ == 0) {
        std::memcpy(out.data(), own, n);
      } else if (q == 0) {
        into_out->recv(0, slot, 0, n);
        into_out->waitRecv(kForever);
      } else if (q == rank_) {
        sum_of(out.dtype())(out.data(), out.data(), own, static_cast<size_t>(out.numel()));
      } else {
        into_scratch->recv(q, slot, 0, n);
        into_scratch->waitRecv(kForever);
        sum_of(out.dtype())(out.data(), out.data(), scratch_.data(),
                            static_cast<size_t>(out.numel()));
      }
    }
  }
  // The others send their piece to root, which receives each into its place in out.
  void gather_v_now(const Tensor& in, const std::vector<int64_t>& counts, const Tensor& out,
                    int root) {
    const size_t element = dtype_size(in.dtype());
    const uint64_t slot = gloo::Slot::build(kPiecesSlotPrefix, 1);
    if (rank_ != root) {
      if (in.bytes() == 0) return;
      auto source = context_->createUnboundBuffer(in.data(), in.bytes());
      source->send(root, slot);
      source->waitSend(kForever);
      return;
    }
    if (out.bytes() == 0) return;
    auto target = context_->createUnboundBuffer(out.data(), out.bytes());
    size_t at = 0, receives = 0;
    for (int q = 0; q < size_; ++q) {
      const size_t n = static_cast<size_t>(counts[static_cast<size_t>(q)]) * element;
      if (q == rank_ && n > 0) std::memcpy(static_cast<char*>(out.data()) + at, in.data(), n);
      if (q != rank_ && n > 0) {
        target->recv(q, slot, at, n);
        ++receives;
      }
      at += n;
    }
    for (size_t i = 0; i < receives; ++i) target->waitRecv(kForever);
  }
  int rank_ = 0, size_ = 1;
  std::shared_ptr<gloo::Context> context_;
  std::vector<uint8_t> scratch_;  // one piece of a reduce-scatter, received
  CommThread thread_;             // started collectives, in order
  Watchdog watchdog_;
};

}  // namespace

std::unique_ptr<Communicator> make_gloo(const LaunchInfo& launch, double timeout_seconds) {
  return std::make_unique<Gloo>(launch, timeout_seconds);
}

bool gloo_built_in() {
  return true;
}

}  // namespace brisk
