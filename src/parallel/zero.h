// ZeRO stage 1 (Rajbhandari et al. 2020): the optimizer state partitioned among the ranks of a
// data-parallel run. Each rank keeps the state of one contiguous run of the flat parameters and
// updates only those; the updated weights are then gathered from their owners. Optimizers whose
// state is per element (AdamW, SGD) take equal runs, cut anywhere, as DeepSpeed does; 8-bit
// AdamW's runs end between whole blocks of a quantized parameter (a piece keeps the whole
// parameter's blocks, and its choice of 8 or 32 bits, by ParamInfo::whole_elements), anywhere in
// a float32 one; Adafactor's runs hold whole parameters, so that its per-matrix row and column
// statistics and the parameter's RMS never straddle two ranks.
// Every optimizer lays its state out element after element, parameter after parameter, so the
// ranks' states laid end to end are one process's state: what checkpoints hold, whatever the
// number of ranks.
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/parameters.h"
#include "core/tensor.h"
#include "models/model.h"

namespace brisk {

class Backend;
class Communicator;
class Optimizer;

struct ParamShard {
  int first = 0, last = 0;  // the parameters [first, last) it holds all or part of
  ElementRange elements;    // its elements in the flat buffers
};

// Where a run may end inside parameter p: at multiples of this many elements from its start (its
// elements or more: only at its ends). Optimizer::shard_granule.
using ShardGranule = std::function<int64_t(const ParamInfo& p)>;
// `ranks` contiguous runs of the trained parameters (ParameterSet::trained_run: all of them
// unless some are frozen, a LoRA's base), rank r's ending at the cut `granule` allows nearest to
// (r + 1) x ceil(total / ranks) elements from the run's start: equal runs (the last shorter) where
// parameters may be split anywhere; otherwise near them (a rank's run may be empty when a
// parameter kept whole outweighs its share). The runs' elements are the flat buffers' places.
std::vector<ParamShard> partition_params(const ParameterSet& params, int ranks,
                                         const ShardGranule& granule);
// The shard's elements as a set of parameters of their own (offsets from the shard's first
// element; a parameter cut by the shard's ends becomes its piece, flat, under its name): what a
// rank's optimizer is planned for.
ParameterSet shard_params(const ParameterSet& params, const ParamShard& shard);

// ZeRO: where a rank's optimizer state lies in a checkpoint's, tensor by tensor (in the order
// of Optimizer::state()): elements [offset, offset + its size) of a tensor of `total` elements.
// Tensor and pipeline parallelism: where each element of this rank's state lies in the
// checkpoint's (the whole model's state), run by run, tensor by tensor (runs[i]: state tensor i's;
// the same for every tensor where the state is laid out as the parameters); `offset` is then
// unused.
struct StateShare {
  std::vector<int64_t> offset, total;
  struct Run {
    int64_t local, full, length;
  };
  std::vector<std::vector<Run>> runs;
};
// An optimizer's state laid out tensor by tensor, parameter after parameter
// (Optimizer::state_elements): where parameter k's part of tensor i starts and its length, and
// each tensor's elements and bytes per element.
// `per_element`: whether a split parameter's part is one value per element of its share, or the
// full parameter's whole state (Optimizer::state_per_element).
struct StateLayout {
  std::vector<std::vector<int64_t>> at, length;  // [tensor][parameter]
  std::vector<std::vector<bool>> per_element;    // [tensor][parameter]
  std::vector<int64_t> total, element_bytes;     // [tensor]
};
StateLayout state_layout(const Optimizer& optimizer, const ParameterSet& params);
// One process's layout (a checkpoint's) of the full parameters that `shares` (a tensor rank's
// parameters) are shares of.
StateLayout full_state_layout(const Optimizer& optimizer, const ParameterSet& shares);

// A part of the parameters an optimizer steps: elements [first, first + count) of `param` (a
// tensor rank's share or a whole parameter), whole parameter `full` of a checkpoint.
struct HeldPiece {
  const ParamInfo* param = nullptr;
  size_t full = 0;
  int64_t first = 0, count = 0;
};
// Where the state of an optimizer planned for `held` (as shard_params gives them) lies in a
// checkpoint laid out as `full`, run by run: a split parameter's per-element state by the places
// of its share's elements, any other state from where the piece's first element puts it.
StateShare checkpoint_state_share(const Optimizer& optimizer, const std::vector<HeldPiece>& held,
                                  const StateLayout& full);

// Every rank, a collective: this rank's StateShare of `optimizer`'s state (planned and reset).
StateShare state_share(Communicator& comm, const Optimizer& optimizer);

// What a save writes when no rank holds it whole: arrays of bytes of which every rank holds a
// part, each whole being the ranks' parts laid end to end in rank order — the weights or master
// copy by the ranks' runs, each optimizer state tensor (every rank's state laid end to end is one
// process's state). Rank 0 reads pieces of the wholes as it writes the files, each piece gathered
// from the ranks that hold it; the other ranks answer those reads in serve() until rank 0 is
// done. No rank ever holds more of the wholes than the piece being read, and the others wait
// for one piece at a time rather than for the whole save.
class GatheredReads {
 public:
  // Every rank, with its parts (in memory the communicator takes: MPI host memory, NCCL either;
  // an empty Tensor() for none) in the same order: a collective (the parts' lengths are
  // exchanged).
  GatheredReads(Communicator& comm, std::vector<Tensor> parts);
  // Rank 0, when it goes without done() (a failed write): the others' serve() ends.
  virtual ~GatheredReads();
  GatheredReads(const GatheredReads&) = delete;
  GatheredReads& operator=(const GatheredReads&) = delete;

  size_t size() const { return parts_.size(); }
  // The bytes of whole i.
  int64_t whole_bytes(size_t i) const { return starts_.at(i).back(); }
  // Rank 0: bytes [offset, offset + bytes) of whole i into dst (host memory).
  void read(size_t i, size_t offset, size_t bytes, void* dst);
  // Rank 0: bytes [at, at + n) of parameter p's full tensor (float32), whole 0 being the
  // weights laid out as the parameters from element `weights_origin` on (a LoRA's trained run);
  // and the same of optimizer state tensor i (whole i + 1, laid out as the optimizer's state),
  // its full size in bytes first. Tensor parallelism's saves map them onto the ranks' shares.
  virtual void read_param(const ParamInfo& p, size_t at, size_t n, void* dst) {
    read(0, static_cast<size_t>(p.offset - weights_origin_) * 4 + at, n, dst);
  }
  void set_weights_origin(int64_t element) { weights_origin_ = element; }
  virtual int64_t state_bytes(size_t i) const { return whole_bytes(i + 1); }
  virtual void read_state(size_t i, size_t at, size_t n, void* dst) { read(i + 1, at, n, dst); }
  // Rank 0: no more reads.
  void done();
  // The other ranks: answers rank 0's reads until it is done.
  void serve();

 protected:
  // Where rank r's part of whole i starts in it.
  int64_t part_start(size_t i, int r) const { return starts_.at(i).at(static_cast<size_t>(r)); }
  int64_t part_bytes(size_t i, int r) const { return part_start(i, r + 1) - part_start(i, r); }
  // Rank 0: bytes [at, at + n) of the parts of whole i that `ranks` hold, laid end to end in
  // that order (a share's data replicas: ZeRO's runs, or one whole); `what` names them in an
  // error.
  void read_across(size_t i, const std::vector<int>& ranks, size_t at, size_t n, char* dst,
                   const char* what);

 private:
  // Sends a request from rank 0 ({i, offset, bytes}; i = -1: done) and takes part in its gather.
  void answer(double request[3], void* dst);
  Communicator& comm_;
  std::vector<Tensor> parts_;
  // Per whole: where each rank's part starts in it, then its end.
  std::vector<std::vector<int64_t>> starts_;
  bool done_ = false;
  int64_t weights_origin_ = 0;
};

// The parts a ZeRO checkpoint gathers (GatheredReads): the weights a save writes, the trained
// parameters' (this rank's run of the master copy or of stage 3's weights when those are
// partitioned; else rank 0's whole copy and nothing elsewhere), then each tensor of the
// optimizer's state() (this rank's).
std::vector<Tensor> checkpoint_parts(const Tensor& weights, bool weights_partitioned, int rank,
                                     const Optimizer* optimizer);

// ZeRO stage 2's pieces: bucket_cap_mb (ddp_bucket_cap_mb) of float32 gradients (at least one
// element).
int64_t gradient_piece_elements(double bucket_cap_mb);

// ZeRO stage 2: this rank's shard of the gradients, summed over the ranks segment by segment as
// backward reports them final, on every micro-batch. A segment's sums are started (they run on
// the communicator's thread, each adding its piece into the shard and the last zeroing the
// segment's place) and the report returns once no sum still reads a place the next segment's
// backward writes (Model::grad_layout().overlap): with the model's two slots, a block's sums run
// while the next block's backward computes.
class ShardedGradients {
 public:
  // `shard`: float32, this rank's elements; `receive`: receive_elements(). A segment is summed
  // in pieces of at most `piece` elements (DeepSpeed's reduce_bucket_size; brisk's
  // ddp_bucket_cap_mb), which bounds the buffer the sums arrive in and MPI's own buffers. In
  // host memory the sums are added on the communicator's thread; in GPU memory by `be`.
  ShardedGradients(Backend& be, const std::vector<ParamShard>& shards, int rank, Tensor shard,
                   Tensor receive, int64_t piece);
  // The receive buffer the sums need: the most elements of this rank's shard any piece holds.
  static int64_t receive_elements(const std::vector<ParamShard>& shards, int rank,
                                  const std::vector<ElementRange>& segments, int64_t piece);
  // Segment i of the model's gradients is final: starts shard += every rank's piece of it
  // summed, and waits as the model's slots require (for every sum after the last segment).
  void segment_done(Communicator& comm, const Model& model, int segment);
  const Tensor& shard() const { return shard_; }
  // The seconds the sums ran and the seconds backward waited for them, since the last call
  // (after the last segment: nothing is running).
  std::pair<double, double> take_seconds(Communicator& comm);

 private:
  Backend& be_;
  std::vector<ParamShard> shards_;
  int rank_;
  Tensor shard_, receive_;
  int64_t piece_;
  // Per segment: the ticket of its last started sum (Communicator::started), 0 once waited for.
  std::vector<int64_t> ticket_;
  double waited_ = 0;
};

// ZeRO stage 3: this rank keeps only its run of the compute weights (`shard`); each segment's
// weights (a block's, the embeddings', the head's) are gathered from every rank's run into their
// place in the model's staged buffer when a pass needs them, forward and again backward, the next
// segment's gather started meanwhile where its place is free (a block's while the block before
// computes, in two slots). A gather is skipped while the segment is still in place (nothing
// gathered over it since: a block that ends the forward pass starts the backward pass; weights
// change only at the update). Every rank asks for the same segments in the same order, so the
// gathers match up. A model that cannot stage its weights keeps them whole, gathered after every
// change of the shard (publish). A segment no shard holds any of stays whole in its place (with
// a LoRA's frozen base partitioned: the head's, with the adapters, and the embeddings').
class ShardedWeights final : public WeightSlots {
 public:
  ShardedWeights(Backend& be, Communicator& comm, const Model& model,
                 const std::vector<ParamShard>& shards, int rank, Tensor shard);
  void need(int segment) override;
  void prefetch(int segment) override;
  // Keeps this rank's part of a segment the model just wrote (weights loaded or initialized).
  void filled(int segment) override;
  // After the shard changed (an update, a load): every segment to be gathered anew (unstaged
  // weights: all gathered now).
  void publish();
  const Tensor& shard() const { return shard_; }
  // The seconds the model waited for gathers since the last call.
  double take_wait_seconds() { return std::exchange(waited_, 0.0); }

 private:
  void start(int segment);
  bool sharded(int segment) const;
  Backend& be_;
  Communicator& comm_;
  const Model& model_;
  Tensor shard_;
  // Per segment (param_segments()): this rank's part of it, at its place in the shard, where
  // that part starts within the segment, and every rank's element count of it (the gather's).
  std::vector<Tensor> pieces_;
  std::vector<int64_t> piece_at_;
  std::vector<std::vector<int64_t>> counts_;
  // Per segment: whether its place holds it or is receiving it, and the receiving gather's
  // ticket (Communicator::started; 0 once it has arrived).
  std::vector<bool> present_;
  std::vector<int64_t> ticket_;
  double waited_ = 0;
};

}  // namespace brisk
