// Collectives across the processes of a run (ranks), on flat buffers: what data parallelism and
// ZeRO are built from. One Communicator per run, made from how the processes were launched
// (parallel/launch.h): a single process needs none and gets SingleProcess; `mpirun -np N brisk ...`
// gets MPI (host memory); `torchrun --no-python --nproc_per_node N brisk ...` gets Gloo. The
// buffers are float32, bf16 (sums of bf16 are taken in float32 and rounded to bf16 at each partial
// sum, as NCCL's bf16 reductions do) or float64 (statistics).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "parallel/launch.h"

namespace brisk {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // "single process", "MPI (Open MPI 4.1.4)", ...
  virtual std::string name() const = 0;

  // In place: buf becomes the elementwise sum of every rank's buf (the same shape on all).
  virtual void all_reduce_sum(const Tensor& buf) = 0;
  // In place: float32 buf becomes the elementwise largest of every rank's buf. The default
  // gathers every rank's buf a piece at a time.
  virtual void all_reduce_max(const Tensor& buf);
  // in holds size() equal chunks of out's length; out becomes the sum over ranks of chunk
  // rank() of their in.
  virtual void reduce_scatter_sum(const Tensor& in, const Tensor& out) = 0;
  // The same with pieces of any length: in holds counts[r] elements for each rank r in rank order
  // (counts: size() entries, the same on every rank), and out, counts[rank()] elements, becomes
  // the sum over ranks of piece rank() of their in. ZeRO stage 2's gradient segments.
  virtual void reduce_scatter_sum_v(const Tensor& in, const std::vector<int64_t>& counts,
                                    const Tensor& out) = 0;
  // out (size() chunks of in's length) becomes every rank's in, in rank order.
  virtual void all_gather(const Tensor& in, const Tensor& out) = 0;
  // On `root`, out becomes every rank's in laid end to end in rank order; in holds counts[rank()]
  // elements (counts: the same on every rank), out their sum on root and is not touched
  // elsewhere (it may be empty there). Saving a sharded state without every rank holding it all.
  virtual void gather_v(const Tensor& in, const std::vector<int64_t>& counts, const Tensor& out,
                        int root) = 0;
  // out becomes every rank's in laid end to end in rank order, on every rank: in holds
  // counts[rank()] elements (counts: the same on every rank), out their sum. ZeRO stage 3 gathers
  // a segment of the weights from every rank's run of them.
  virtual void all_gather_v(const Tensor& in, const std::vector<int64_t>& counts,
                            const Tensor& out) = 0;
  // buf becomes root's buf.
  virtual void broadcast(const Tensor& buf, int root) = 0;
  // Returns when every rank has called it.
  virtual void barrier() = 0;

  // Between two ranks and among every rank at once: what pipeline stages, sequence parallelism
  // and experts exchange. The default (a communicator without them) refuses, naming itself.
  // buf goes to rank `peer`, which receives it into a buffer of the same length and type.
  virtual void send(const Tensor& buf, int peer);
  virtual void receive(const Tensor& buf, int peer);
  // `out` to rank `to` while `in` arrives from rank `from`, so that ranks sending to each other
  // never wait on one another (a ring, or two stages exchanging activations and gradients).
  virtual void send_receive(const Tensor& out, int to, const Tensor& in, int from);
  // in and out of one length, size() equal chunks: chunk r of in goes to rank r, and chunk r of
  // out becomes chunk rank() of rank r's in.
  virtual void all_to_all(const Tensor& in, const Tensor& out);
  // Pieces of any length: in holds send[r] elements for each rank r in rank order, and out
  // receives receive[r] elements from each rank r in rank order (counts: size() entries each; rank
  // p's receive[r] is rank r's send[p]). Expert parallelism's dispatch and combine.
  virtual void all_to_all_v(const Tensor& in, const std::vector<int64_t>& send, const Tensor& out,
                            const std::vector<int64_t>& receive);
  // The ranks that pass the same `color` (>= 0) as a communicator of their own, ranked by `key`
  // (ties in this communicator's rank order): a collective of every rank. The new communicator
  // shares this one's timeout and order of started work.
  virtual std::unique_ptr<Communicator> split(int color, int key);

  // Starts buf's all-reduce sum and returns: buf must not be read or written until
  // wait_started() returns. Every rank starts the same buffers in the same order. What data
  // parallelism overlaps with backward; here (the default) it runs at once. A blocking collective
  // first finishes the started ones.
  virtual void start_all_reduce_sum(const Tensor& buf);
  // Starts reduce_scatter_sum_v(in, counts, out) the same way, then runs `then` (on the thread
  // that ran it: it must not call the communicator) — what consumes `out` before the next
  // started collective. ZeRO stage 2's sums during backward.
  virtual void start_reduce_scatter_sum_v(const Tensor& in, const std::vector<int64_t>& counts,
                                          const Tensor& out, std::function<void()> then);
  // Starts all_gather_v(in, counts, out) the same way: out must not be read, nor in written,
  // until the wait for it returns. ZeRO stage 3's gathers of the next block's weights.
  virtual void start_all_gather_v(const Tensor& in, const std::vector<int64_t>& counts,
                                  const Tensor& out);
  // How many collectives have been started so far: right after starting one, its ticket; the wait
  // for that one alone (and those started before it) is wait_started_until(started() - ticket).
  int64_t started() const { return started_count_; }
  // Returns when every started collective has finished, with the seconds they took to run since
  // the last call (time overlapped with other work included); rethrows a failure of one.
  virtual double wait_started();
  // Returns when at most `keep` started collectives (the latest ones) are unfinished; rethrows a
  // failure of one.
  virtual void wait_started_until(int64_t keep);
  // Ends every rank of the run now, with exit code `code` (a rank that failed must not leave the
  // others waiting in a collective).
  [[noreturn]] virtual void abort(int code) = 0;
  // A collective that has waited this many seconds for the other ranks ends the run (every
  // rank, as abort) with a message naming this rank and the collective: a peer that hangs
  // or is gone (TrainingArguments' ddp_timeout). 0: wait for ever. One process never waits.
  virtual void set_timeout(double /*seconds*/) {}
  // GPU collectives run on a stream of their own: each is queued after the GPU work queued so far
  // on `stream` (the backend's, Backend::device_stream; null: none), so that it reads what that
  // work wrote and writes nothing it still reads, without the host waiting. Host communicators
  // have nothing to order.
  virtual void set_device_stream(void* /*stream*/) {}

 protected:
  // Where the buffers must be: host memory (MPI), GPU memory (NCCL).
  virtual Device memory() const { return kHostDevice; }
  // Throws naming `op` unless the buffers suit it: memory(), float32, bf16 or float64, in and
  // out of one type, out `factor` times in's length (reduce-scatter: in = size() x out).
  void check_buffer(const Tensor& t, const char* op) const;
  void check_pair(const Tensor& in, const Tensor& out, int64_t in_per_out, int64_t out_per_in,
                  const char* op) const;
  // all_gather's buffers: in is out's own chunk for this rank (ZeRO's way; returns true) or lies
  // apart from out.
  bool check_all_gather(const Tensor& in, const Tensor& out) const;
  // Whether a and b share a byte.
  static bool overlap(const Tensor& a, const Tensor& b);
  // A count for every rank, none negative; returns their sum.
  int64_t check_counts(const std::vector<int64_t>& counts, const char* op) const;
  // reduce_scatter_sum_v's and gather_v's buffers and counts.
  void check_pieces(const Tensor& in, const std::vector<int64_t>& counts, const Tensor& out) const;
  void check_gather(const Tensor& in, const std::vector<int64_t>& counts, const Tensor& out,
                    int root) const;
  // all_gather_v's.
  void check_all_gather_v(const Tensor& in, const std::vector<int64_t>& counts,
                          const Tensor& out) const;
  // A rank other than this one, for `op`.
  void check_peer(int peer, const char* op) const;
  // all_to_all's buffers.
  void check_all_to_all(const Tensor& in, const Tensor& out) const;
  void check_all_to_all_v(const Tensor& in, const std::vector<int64_t>& send, const Tensor& out,
                          const std::vector<int64_t>& receive) const;
  // Every start_* counts itself here (the caller's thread only).
  void count_started() { ++started_count_; }

 private:
  double started_seconds_ = 0;  // the default start_all_reduce_sum's time since wait_started
  int64_t started_count_ = 0;
};

// Every rank's `piece` (host memory, any length), its bytes laid end to end in rank order, on
// every rank, or only on `root` when root >= 0 (the others get nothing); `bytes_per_rank`, when
// given, receives each rank's share.
std::vector<uint8_t> gather_pieces(Communicator& comm, const Tensor& piece,
                                   std::vector<int64_t>* bytes_per_rank = nullptr, int root = -1);

// The process's communicator for buffers in `memory`, made on first use from the environment.
// Host memory: make_communicator's. GPU memory, for a run of several processes: NCCL (make_nccl,
// bootstrapped through the host communicator under an MPI launch, else through the TCP
// rendezvous), which also takes host buffers (through the GPU); for one process, the host one.
// `timeout_seconds` (the first call's; 0: no bound) bounds the start, as make_communicator's.
Communicator& world_communicator(Device memory = kHostDevice, double timeout_seconds = 1800);
// After an error: in a run of several processes, ends them all (code); otherwise returns.
void end_every_rank_on_error(int code);

// The communicator of this process: SingleProcess when `launch` says one process; MPI when the
// run was started by an MPI launcher; Gloo for a torchrun-style launch without one (its ranks
// connecting through the rendezvous of parallel/rendezvous.h). Either refused, saying so, when
// brisk was built without it. MPI is initialized here and finalized at exit. The start is bounded
// as PyTorch's init_process_group bounds it: a rank that has not met every other within
// `timeout_seconds` (ddp_timeout; 0: no bound) of its own start ends the run with one line naming
// the stage it waited in (MPI's initialization, the rendezvous, the first handshake) and, where the
// rendezvous knows them, the ranks that did not come. The collectives' watchdog is set to the same
// timeout (Communicator::set_timeout may change it).
std::unique_ptr<Communicator> make_communicator(const LaunchInfo& launch,
                                                double timeout_seconds = 1800);
std::unique_ptr<Communicator> make_single_process();
// Whether this brisk was built with MPI; with Gloo.
bool mpi_built_in();
bool gloo_built_in();
// The NCCL communicator (GPU memory), for `launch`'s rank of its size on the GPU local_rank
// picks: NCCL's unique id goes from rank 0 to the others through `bootstrap` (a host
// communicator of the same ranks, e.g. MPI's) or, when that is null, the TCP rendezvous on
// MASTER_ADDR at the port derived from MASTER_PORT (parallel/rendezvous.h) waiting at most
// `timeout_seconds`. `memory`: the run's device, whose memory the collectives read and write. It
// takes host buffers too, copied to the GPU and back around the collective (the trainer's metrics
// and texts; small).
std::unique_ptr<Communicator> make_nccl(const LaunchInfo& launch, Communicator* bootstrap,
                                        Device memory, double timeout_seconds = 300);
// Whether this brisk was built with NCCL (with the CUDA backend, where the toolkit has it).
bool nccl_built_in();

}  // namespace brisk
