// The whole model's parameters and optimizer state read for a save from the ranks that hold
// parts of it: pipeline stages, expert ranks, and their tensor ranks' shares.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/parameters.h"
#include "parallel/split_bands.h"
#include "parallel/zero.h"

namespace brisk {

// Where a parameter of the whole model lies on one tensor rank: the holder of its part (a tied
// embedding's: the first stage's) and its share there (offset and split: the whole
// parameter without tensor parallelism); for an optimizer whose state is not laid out as the
// parameters, where its part of each state tensor starts in the holder's.
struct Placed {
  int holder = -1;
  ParamInfo share;
  std::vector<int64_t> state_at;
};

// A save's reads of the whole model from the ranks' parts of it (pipeline stages, expert ranks,
// and their tensor ranks). A holder is the data replicas of one part (one stage's share of one
// tensor rank, one expert rank's): its whole i, its parameters (i = 0) or its optimizer state
// tensor i - 1, is their parts end to end (ZeRO's runs, or the first replica's whole). A parameter
// whole on each tensor rank is read from tensor rank 0's share; a split one (and its per-element
// state) a band at a time from every tensor rank's (SplitBands).
class PartReads final : public GatheredReads {
 public:
  // placed[k][t]: whole parameter k on tensor rank t; holders[h]: holder h's world ranks in data
  // order. `held`: the holders' parameter elements together. `state`: the whole model's
  // StateLayout (the checkpoint's).
  PartReads(Communicator& world, std::vector<Tensor> parts, const ParameterSet& full,
            std::vector<std::vector<Placed>> placed, std::vector<std::vector<int>> holders,
            int64_t held, const StateLayout& state)
      : GatheredReads(world, std::move(parts)),
        full_(full),
        placed_(std::move(placed)),
        holders_(std::move(holders)),
        held_(held),
        state_(state) {}

  void read_param(const ParamInfo& p, size_t at, size_t n, void* dst) override {
    read_whole(0, static_cast<size_t>(full_.index(p.name)), at, n, static_cast<char*>(dst));
  }

  int64_t state_bytes(size_t i) const override { return state_.total[i] * state_.element_bytes[i]; }

  // The whole model's state: each parameter's from its stage (a split one's per-element state
  // from every tensor rank, the rest tensor rank 0's).
  void read_state(size_t i, size_t at, size_t n, void* dst) override {
    const auto bytes = static_cast<size_t>(state_.element_bytes[i]);
    auto* out = static_cast<char*>(dst);
    for (size_t k = 0; k < full_.list().size() && n > 0; ++k) {
      const auto begin = static_cast<size_t>(state_.at[i][k]) * bytes;
      const size_t end = begin + static_cast<size_t>(state_.length[i][k]) * bytes;
      if (at >= end) continue;
      const size_t take = std::min(n, end - at);
      if (state_.per_element[i][k]) {
        read_whole(i + 1, k, at - begin, take, out);
      } else {
        const Placed& where = placed_[k][0];
        read_held(i + 1, where, static_cast<size_t>(where.state_at[i]) * bytes + at - begin, take,
                  out);
      }
      out += take;
      at += take;
      n -= take;
    }
  }

 private:
  // The bytes per element of whole `whole`: a weight's (from the holders' parts), a state
  // tensor's.
  int64_t element_bytes(size_t whole) const {
    if (whole > 0) return state_.element_bytes[whole - 1];
    int64_t bytes = 0;
    for (const std::vector<int>& ranks : holders_)
      for (int r : ranks) bytes += part_bytes(0, r);
    BRISK_CHECK(held_ > 0 && bytes % held_ == 0, "internal error: a save part of ", bytes,
                " bytes for ", held_, " parameter elements");
    return bytes / held_;
  }

  // Bytes [at, at + n) of whole parameter k in whole `whole` (its weights, or its state laid out
  // one value per element of its shares).
  void read_whole(size_t whole, size_t k, size_t at, size_t n, char* dst) {
    const auto bytes = static_cast<size_t>(element_bytes(whole));
    auto start = [&](const Placed& where) {
      return static_cast<size_t>(whole == 0 ? where.share.offset : where.state_at[whole - 1]) *
             bytes;
    };
    const Placed& first = placed_[k][0];
    if (!first.share.split.split()) {
      read_held(whole, first, start(first) + at, n, dst);
      return;
    }
    if (banded_whole_ != whole || banded_param_ != k) bands_.forget();
    banded_whole_ = whole;
    banded_param_ = k;
    // A band at a time from the tensor ranks' shares (the first of a slice's copies).
    bands_.read(
        first.share, bytes, at, n, dst, [&](int slice, size_t local, size_t count, char* out) {
          const Placed& where = placed_[k][static_cast<size_t>(slice * first.share.split.copies)];
          read_held(whole, where, start(where) + local, count, out);
        });
  }

  // Bytes [at, at + n) of `where`'s holder's whole `whole`, from its ranks' parts.
  void read_held(size_t whole, const Placed& where, size_t at, size_t n, char* dst) {
    read_across(whole, holders_[static_cast<size_t>(where.holder)], at, n, dst, "a stage");
  }

  const ParameterSet& full_;
  std::vector<std::vector<Placed>> placed_;
  std::vector<std::vector<int>> holders_;
  int64_t held_;
  const StateLayout& state_;
  SplitBands bands_;
  size_t banded_whole_ = 0, banded_param_ = static_cast<size_t>(-1);
};

// p's elements among the gradients a rank holds (from element `base` of the parameters, n of them),
// as a range of those gradients (empty where it holds none).
ElementRange held_range(const ParamInfo& p, int64_t base, int64_t n);
// f(range) for the held ranges of parameters `ids` of `params` (as held_range), neighbouring
// parameters' as one range: the runs a layout sums over a group at once.
void for_each_held_run(const ParameterSet& params, const std::vector<int>& ids, int64_t base,
                       int64_t n, const std::function<void(ElementRange)>& f);
// Where the optimizer state of elements `run` of a rank's part of the parameters (`part`) lies
// in a checkpoint's laid out as the whole model's (`whole`'s parameters, by name; its state
// `layout`).
StateShare whole_layout_share(const Optimizer& optimizer, const ParameterSet& part,
                              const ParameterSet& whole, ElementRange run,
                              const StateLayout& layout);
// Each parameter of `part` (the part of holder `holder`, on tensor rank `tensor`) placed among the
// whole model's (`whole`, by name) in `placed` (by whole parameter, then tensor rank), with where
// its optimizer state starts; a parameter placed already keeps its first holder.
void place_part(const Optimizer& optimizer, const ParameterSet& part, const ParameterSet& whole,
                int holder, size_t tensor, std::vector<std::vector<Placed>>& placed);

}  // namespace brisk
