#include "parallel/zero.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <limits>
#include <utility>

#include "backend/backend.h"
#include "backend/device_traits.h"
#include "core/checked.h"
#include "core/clock.h"
#include "core/error.h"
#include "models/model.h"
#include "optim/optimizer.h"
#include "parallel/communicator.h"

namespace brisk {

std::vector<ParamShard> partition_params(const ParameterSet& params, int ranks,
                                         const ShardGranule& granule) {
  BRISK_CHECK(ranks >= 1, "internal error: ", ranks, " ranks");
  const std::vector<ParamInfo>& list = params.list();
  const ParameterSet::Run run = params.trained_run();
  const int count = run.last;
  const int64_t start = run.elements.offset, total = start + run.elements.count;
  const int64_t chunk = (run.elements.count + ranks - 1) / ranks;
  std::vector<ParamShard> shards(static_cast<size_t>(ranks));
  int at = run.first;     // the parameter holding the next cut's target (or count)
  int first = run.first;  // the first parameter of rank r's run
  int64_t begin = start;  // where rank r's run starts
  for (int r = 0; r < ranks; ++r) {
    // Rank r ends at the allowed cut nearest to its share's end (the later of two as near).
    const int64_t target = std::min(total, start + chunk * (r + 1));
    while (at < count &&
           list[static_cast<size_t>(at)].offset + list[static_cast<size_t>(at)].shape.numel() <=
               target)
      ++at;
    int64_t end = total;
    if (at < count && r < ranks - 1) {
      const ParamInfo& p = list[static_cast<size_t>(at)];
      const int64_t numel = p.shape.numel();
      const int64_t g = std::max<int64_t>(1, granule(p));
      const int64_t below = p.offset + (target - p.offset) / g * g;
      const int64_t above = std::min(p.offset + numel, below + g);
      end = target - below < above - target ? below : above;
    }
    end = std::max(end, begin);
    ParamShard& s = shards[static_cast<size_t>(r)];
    s.elements = {begin, end - begin};
    // The parameters overlapping [begin, end) (begin only grows: so does first).
    while (first < count && list[static_cast<size_t>(first)].offset +
                                    list[static_cast<size_t>(first)].shape.numel() <=
                                begin)
      ++first;
    int last = first;
    while (last < count && list[static_cast<size_t>(last)].offset < end) ++last;
    s.first = first;
    s.last = end > begin ? last : first;
    begin = end;
  }
  return shards;
}

ParameterSet shard_params(const ParameterSet& params, const ParamShard& shard) {
  ParameterSet out;
  const int64_t begin = shard.elements.offset, end = begin + shard.elements.count;
  for (int i = shard.first; i < shard.last; ++i) {
    const ParamInfo& p = params.list()[static_cast<size_t>(i)];
    const int64_t lo = std::max(begin, p.offset), hi = std::min(end, p.offset + p.shape.numel());
    if (lo >= hi) continue;
    const bool whole = lo == p.offset && hi == p.offset + p.shape.numel();
    // A whole parameter keeps its tensor-parallel split (an optimizer's state may be the full
    // parameter's); a piece is flat.
    out.add(p.name, whole ? p.shape : Shape{hi - lo}, ParamRole{p.decay, p.embedding, p.product},
            whole ? 0 : p.shape.numel(), whole ? p.split : ParamSplit{});
  }
  return out;
}

GatheredReads::GatheredReads(Communicator& comm, std::vector<Tensor> parts)
    : comm_(comm), parts_(std::move(parts)) {
  const auto N = static_cast<size_t>(comm.size());
  std::vector<double> lengths(parts_.size() * N, 0.0);
  for (size_t i = 0; i < parts_.size(); ++i) {
    const Tensor& part = parts_[i];
    lengths[i * N + static_cast<size_t>(comm.rank())] =
        part.empty() ? 0.0 : static_cast<double>(part.bytes());
  }
  if (!lengths.empty())
    comm.all_reduce_sum(
        Tensor(lengths.data(), Shape{static_cast<int64_t>(lengths.size())}, DType::f64));
  for (size_t i = 0; i < parts_.size(); ++i) {
    starts_.emplace_back(1, 0);
    for (size_t r = 0; r < N; ++r)
      starts_[i].push_back(
          checked_add(starts_[i].back(), static_cast<int64_t>(lengths[i * N + r]), "a save"));
  }
}

GatheredReads::~GatheredReads() {
  if (comm_.rank() != 0 || done_) return;
  try {
    done();
  } catch (...) {  // the communicator failed too: the error already on its way ends every rank
  }
}

void GatheredReads::answer(double request[3], void* dst) {
  comm_.broadcast(Tensor(request, Shape{3}, DType::f64), 0);
  if (request[0] < 0) return;
  const auto i = static_cast<size_t>(request[0]);
  BRISK_CHECK(i < parts_.size(), "internal error: a read of save part ", i);
  const auto begin = static_cast<int64_t>(request[1]);
  const int64_t end = begin + static_cast<int64_t>(request[2]);
  const std::vector<int64_t>& at = starts_[i];
  BRISK_CHECK(begin >= 0 && begin <= end && end <= at.back(), "internal error: bytes [", begin,
              ", ", end, ") of a save part of ", at.back());
  std::vector<int64_t> counts;
  for (size_t r = 0; r + 1 < at.size(); ++r)
    counts.push_back(std::max<int64_t>(0, std::min(end, at[r + 1]) - std::max(begin, at[r])));
  const auto me = static_cast<size_t>(comm_.rank());
  const int64_t mine = counts[me];
  // MPI takes no null buffer, even for nothing.
  static uint8_t nothing = 0;
  const Tensor in = mine > 0 ? Tensor(parts_[i].as<uint8_t>() + (std::max(begin, at[me]) - at[me]),
                                      Shape{mine}, DType::u8, parts_[i].device())
                             : Tensor(&nothing, Shape{0}, DType::u8);
  comm_.gather_v(
      in, counts,
      Tensor(me == 0 && end > begin ? dst : &nothing, Shape{me == 0 ? end - begin : 0}, DType::u8),
      0);
}

void GatheredReads::read(size_t i, size_t offset, size_t bytes, void* dst) {
  BRISK_CHECK(comm_.rank() == 0 && !done_, "internal error: a save read outside rank 0's save");
  double request[3] = {static_cast<double>(i), static_cast<double>(offset),
                       static_cast<double>(bytes)};
  answer(request, dst);
}

void GatheredReads::read_across(size_t i, const std::vector<int>& ranks, size_t at, size_t n,
                                char* dst, const char* what) {
  for (int r : ranks) {
    const auto length = static_cast<size_t>(part_bytes(i, r));
    if (at >= length) {
      at -= length;
      continue;
    }
    const size_t take = std::min(n, length - at);
    read(i, static_cast<size_t>(part_start(i, r)) + at, take, dst);
    dst += take;
    n -= take;
    at = 0;
    if (n == 0) return;
  }
  BRISK_CHECK(n == 0, "internal error: a read past ", what, "'s save part");
}

void GatheredReads::done() {
  BRISK_CHECK(comm_.rank() == 0 && !done_, "internal error: a save ended twice");
  done_ = true;
  double request[3] = {-1, 0, 0};
  answer(request, nullptr);
}

void GatheredReads::serve() {
  BRISK_CHECK(comm_.rank() != 0, "internal error: rank 0 serves its own save");
  for (;;) {
    double request[3] = {0, 0, 0};
    answer(request, nullptr);
    if (request[0] < 0) return;
  }
}

StateLayout state_layout(const Optimizer& optimizer, const ParameterSet& params) {
  StateLayout l;
  const auto named = optimizer.state();
  for (size_t i = 0; i < named.size(); ++i) {
    int64_t at = 0;
    l.at.emplace_back();
    l.length.emplace_back();
    l.per_element.emplace_back();
    for (const ParamInfo& p : params.list()) {
      const int64_t n = p.frozen ? 0 : optimizer.state_elements(i, p);
      l.at.back().push_back(at);
      l.length.back().push_back(n);
      l.per_element.back().push_back(optimizer.state_per_element(i, p));
      at += n;
    }
    l.total.push_back(at);
    l.element_bytes.push_back(static_cast<int64_t>(dtype_size(named[i].second.dtype())));
  }
  return l;
}

StateLayout full_state_layout(const Optimizer& optimizer, const ParameterSet& shares) {
  ParameterSet full;
  for (const ParamInfo& p : shares.list()) {
    const int i = full.add(p.name, p.full_shape(), ParamRole{p.decay, p.embedding, p.product});
    if (p.frozen) full.freeze(i);
  }
  return state_layout(optimizer, full);
}

StateShare checkpoint_state_share(const Optimizer& optimizer, const std::vector<HeldPiece>& held,
                                  const StateLayout& full) {
  ParameterSet pieces;
  for (const HeldPiece& h : held) {
    const ParamInfo& p = *h.param;
    const bool whole = h.count == p.shape.numel();
    pieces.add(p.name, whole ? p.shape : Shape{h.count}, ParamRole{p.decay, p.embedding, p.product},
               whole ? 0 : p.shape.numel(), whole ? p.split : ParamSplit{});
  }
  const StateLayout mine = state_layout(optimizer, pieces);
  StateShare share{std::vector<int64_t>(full.total.size(), 0), full.total, {}};
  for (size_t i = 0; i < full.total.size(); ++i) {
    std::vector<StateShare::Run>& runs = share.runs.emplace_back();
    for (size_t j = 0; j < held.size(); ++j) {
      const HeldPiece& h = held[j];
      const int64_t local = mine.at[i][j], length = mine.length[i][j];
      const int64_t base = full.at[i][h.full];
      if (length == 0) continue;
      if (!optimizer.state_per_element(i, *h.param)) {
        runs.push_back({local, base + optimizer.state_offset(i, *h.param, h.first), length});
        continue;
      }
      for_each_split_run(*h.param, h.first, h.count, [&](int64_t at, int64_t place, int64_t n) {
        runs.push_back({local + at - h.first, base + place, n});
      });
    }
  }
  return share;
}

StateShare state_share(Communicator& comm, const Optimizer& optimizer) {
  const auto named = optimizer.state();
  const auto N = static_cast<size_t>(comm.size());
  std::vector<double> sizes(named.size() * N, 0.0);  // [tensor][rank]
  for (size_t i = 0; i < named.size(); ++i)
    sizes[i * N + static_cast<size_t>(comm.rank())] = static_cast<double>(named[i].second.numel());
  comm.all_reduce_sum(Tensor(sizes.data(), Shape{static_cast<int64_t>(sizes.size())}, DType::f64));
  StateShare share;
  for (size_t i = 0; i < named.size(); ++i) {
    int64_t before = 0, total = 0;
    for (size_t r = 0; r < N; ++r) {
      const auto n = static_cast<int64_t>(sizes[i * N + r]);
      if (r < static_cast<size_t>(comm.rank())) before += n;
      total += n;
    }
    share.offset.push_back(before);
    share.total.push_back(total);
  }
  return share;
}

std::vector<Tensor> checkpoint_parts(const Tensor& weights, bool weights_partitioned, int rank,
                                     const Optimizer* optimizer) {
  std::vector<Tensor> parts{weights_partitioned || rank == 0 ? weights : Tensor()};
  if (optimizer)
    for (const auto& named : optimizer->state()) parts.push_back(named.second);
  return parts;
}

int64_t gradient_piece_elements(double bucket_cap_mb) {
  return std::max<int64_t>(1, static_cast<int64_t>(bucket_cap_mb * 1024 * 1024 / 4));
}

namespace {
// The elements of `a` within `b`.
ElementRange intersect(ElementRange a, ElementRange b) {
  const int64_t lo = std::max(a.offset, b.offset);
  const int64_t hi = std::min(a.offset + a.count, b.offset + b.count);
  return {lo, std::max<int64_t>(0, hi - lo)};
}
}  // namespace

ShardedGradients::ShardedGradients(Backend& be, const std::vector<ParamShard>& shards, int rank,
                                   Tensor shard, Tensor receive, int64_t piece)
    : be_(be),
      shards_(shards),
      rank_(rank),
      shard_(std::move(shard)),
      receive_(std::move(receive)),
      piece_(piece) {
  BRISK_CHECK(piece_ > 0, "internal error: gradient pieces of ", piece_, " elements");
  BRISK_CHECK(shard_.numel() == shards_.at(static_cast<size_t>(rank_)).elements.count,
              "internal error: the gradient shard holds ", shard_.numel(), " elements");
}

int64_t ShardedGradients::receive_elements(const std::vector<ParamShard>& shards, int rank,
                                           const std::vector<ElementRange>& segments,
                                           int64_t piece) {
  int64_t most = 0;
  for (const ElementRange& s : segments)
    most = std::max(most, intersect(s, shards.at(static_cast<size_t>(rank)).elements).count);
  return std::min(most, piece);
}

void ShardedGradients::segment_done(Communicator& comm, const Model& model, int segment) {
  const bool host = device_traits(shard_.device()).host_memory;
  BRISK_CHECK(receive_.device() == shard_.device() &&
                  model.grad_segment(segment).device() == shard_.device(),
              "internal error: ZeRO stage 2's gradients in two memories");
  const auto start = std::chrono::steady_clock::now();
  // The segment's place among the parameters (the shards' coordinates).
  ElementRange range = model.grad_segments().at(static_cast<size_t>(segment));
  range.offset += model.params().gradient_origin();
  const Tensor staged = model.grad_segment(segment);
  const ElementRange own = shards_[static_cast<size_t>(rank_)].elements;
  int64_t started = 0;
  for (int64_t at = 0; at < range.count; at += piece_) {  // every rank skips an empty segment
    // The shards are consecutive runs in rank order, so a piece of the segment is every rank's
    // part of it laid end to end.
    const ElementRange part{range.offset + at, std::min(piece_, range.count - at)};
    std::vector<int64_t> counts;
    for (const ParamShard& s : shards_) counts.push_back(intersect(part, s.elements).count);
    const ElementRange mine = intersect(part, own);
    BRISK_CHECK(mine.count <= receive_.numel(),
                "internal error: the gradient sums' receive buffer is short");
    const bool last = at + piece_ >= range.count;
    // Runs where the sum ran (host memory: the communicator's thread), before the next started
    // one reuses the receive buffer. On a GPU the backend queues it, and the next collective
    // waits for the backend's queued work before it starts.
    const Tensor into =
        element_range(shard_, mine.count > 0 ? mine.offset - own.offset : 0, mine.count);
    const Tensor sum = element_range(receive_, 0, mine.count);
    std::function<void()> then;
    if (host) {
      then = [into, sum, last, staged] {
        float* y = into.f32();
        const float* x = sum.f32();
        for (int64_t j = 0; j < into.numel(); ++j) y[j] += x[j];
        if (last && staged.bytes() > 0) std::memset(staged.data(), 0, staged.bytes());
      };
    } else {
      Backend* be = &be_;
      then = [be, into, sum, last, staged] {
        if (into.numel() > 0) be->add_inplace(into, sum);
        if (last && staged.numel() > 0) be->fill(staged, 0.0f);
      };
    }
    comm.start_reduce_scatter_sum_v(element_range(staged, at, part.count), counts,
                                    element_range(receive_, 0, mine.count), std::move(then));
    ++started;
  }
  // The next segment's backward writes its place (staged: a slot, or over the slots the
  // embeddings' gradients): the sums still reading a place it overlaps, and those started before
  // them, must be done first (two slots: the segment's before this one; one slot: this
  // segment's). After the last segment every sum is waited for: the shard is complete and every
  // place empty for the next micro-batch.
  const int segments = static_cast<int>(model.grad_segments().size());
  if (static_cast<int>(ticket_.size()) != segments)
    ticket_.assign(static_cast<size_t>(segments), 0);
  if (started > 0) ticket_[static_cast<size_t>(segment)] = comm.started();
  int64_t wait_for = 0;  // the latest ticket to wait for
  if (segment + 1 == segments) {
    wait_for = comm.started();
  } else {
    for (int s = 0; s < segments; ++s)
      if (ticket_[static_cast<size_t>(s)] > 0 && model.grad_layout().overlap(s, segment + 1))
        wait_for = std::max(wait_for, ticket_[static_cast<size_t>(s)]);
  }
  if (wait_for > 0) {
    comm.wait_started_until(comm.started() - wait_for);
    for (int64_t& t : ticket_)
      if (t <= wait_for) t = 0;
  }
  waited_ += seconds_since(start);
}

std::pair<double, double> ShardedGradients::take_seconds(Communicator& comm) {
  const double ran = comm.wait_started();
  return {ran, std::exchange(waited_, 0.0)};
}

ShardedWeights::ShardedWeights(Backend& be, Communicator& comm, const Model& model,
                               const std::vector<ParamShard>& shards, int rank, Tensor shard)
    : be_(be),
      comm_(comm),
      model_(model),
      shard_(std::move(shard)),
      present_(model.param_segments().size(), false),
      ticket_(present_.size(), 0) {
  const ElementRange own = shards.at(static_cast<size_t>(rank)).elements;
  BRISK_CHECK(shard_.numel() == own.count, "internal error: the weight shard holds ",
              shard_.numel(), " elements");
  for (const ElementRange& segment : model.param_segments()) {
    const ElementRange mine = intersect(segment, own);
    pieces_.push_back(
        element_range(shard_, mine.count > 0 ? mine.offset - own.offset : 0, mine.count));
    piece_at_.push_back(mine.count > 0 ? mine.offset - segment.offset : 0);
    counts_.emplace_back();
    for (const ParamShard& s : shards)
      counts_.back().push_back(intersect(segment, s.elements).count);
  }
}

void ShardedWeights::start(int segment) {
  const auto i = static_cast<size_t>(segment);
  comm_.start_all_gather_v(pieces_.at(i), counts_[i], model_.weight_segment(segment));
  for (size_t t = 0; t < present_.size(); ++t)
    if (t != i && model_.weight_layout().overlap(segment, static_cast<int>(t))) present_[t] = false;
  present_[i] = true;
  ticket_[i] = comm_.started();
}

bool ShardedWeights::sharded(int segment) const {
  const std::vector<int64_t>& c = counts_.at(static_cast<size_t>(segment));
  return std::any_of(c.begin(), c.end(), [](int64_t n) { return n > 0; });
}

void ShardedWeights::need(int segment) {
  if (!model_.staged_weights() || !sharded(segment)) return;  // kept whole, in place
  const auto i = static_cast<size_t>(segment);
  if (!present_.at(i)) start(segment);
  if (ticket_[i] == 0) return;
  const auto begin = std::chrono::steady_clock::now();
  comm_.wait_started_until(comm_.started() - ticket_[i]);
  ticket_[i] = 0;
  waited_ += seconds_since(begin);
}

void ShardedWeights::prefetch(int segment) {
  if (!model_.staged_weights() || !sharded(segment) || present_.at(static_cast<size_t>(segment)))
    return;
  start(segment);
}

void ShardedWeights::filled(int segment) {
  comm_.wait_started_until(0);  // no gather still writes the model's weights
  const Tensor& mine = pieces_.at(static_cast<size_t>(segment));
  if (mine.numel() > 0)
    be_.copy(element_range(model_.weight_segment(segment), piece_at_[static_cast<size_t>(segment)],
                           mine.numel()),
             mine);
  present_[static_cast<size_t>(segment)] = false;  // its place held unrounded weights
}

void ShardedWeights::publish() {
  if (!model_.staged_weights())
    for (size_t s = 0; s < pieces_.size(); ++s)
      if (sharded(static_cast<int>(s)))
        comm_.all_gather_v(pieces_[s], counts_[s], model_.weight_segment(static_cast<int>(s)));
  std::fill(present_.begin(), present_.end(), false);
  std::fill(ticket_.begin(), ticket_.end(), 0);
}

}  // namespace brisk
