// Sequence parallelism inside the model. DeepSpeed-Ulysses': the ranks of a sequence group hold
// the tokens of every sequence between them, rank r tokens [r*t, (r+1)*t) of sequences of
// t * size() tokens, and compute everything token by token on their own; attention exchanges
// tokens for heads by an all-to-all (each rank then holds every token of its share of the heads)
// and back. Megatron's, under tensor parallelism: between the tensor-parallel products the
// residual stream, norms and dropouts hold a tensor rank's slice of the tokens; the products'
// inputs are all-gathered and their partial outputs reduce-scattered.
#pragma once

#include <array>

#include "backend/backend.h"
#include "core/rng.h"

namespace brisk {

// Tensor parallelism's group (parallel/ makes it from a communicator): the ranks that hold a
// block's heads and MLP width between them, the rest of it alike.
class TensorGroup {
 public:
  virtual ~TensorGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // buf (float32, in the backend's memory) becomes the sum over the group of every rank's buf,
  // the same bits on every rank.
  virtual void all_reduce_sum(Backend& be, const Tensor& buf) = 0;
  // out (size() chunks of in's length, float32 or bf16) becomes every rank's in, in rank order.
  virtual void all_gather(Backend& be, const Tensor& in, const Tensor& out) = 0;
  // in (float32) holds size() chunks of out's length; out becomes the sum over the group of
  // chunk rank() of every rank's in.
  virtual void reduce_scatter_sum(Backend& be, const Tensor& in, const Tensor& out) = 0;
};

// The ranks that split the sequences (parallel/ makes it from a communicator).
class SequenceGroup {
 public:
  virtual ~SequenceGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // out's chunk j of size() equal chunks = rank j's chunk rank() of in (in the backend's memory,
  // of one dtype, not overlapping).
  virtual void all_to_all(Backend& be, const Tensor& in, const Tensor& out) = 0;
};

// The column groups of a packed tensor whose heads split: qkv's query, key and value columns
// (each group split into size() equal parts, part j going to rank j), or ctx's one. copies[g] >
// 1 (key/value heads fewer than the ranks): group g splits into size() / copies[g] parts, ranks
// j with the same j / copies[g] receiving the same part.
struct ColumnGroups {
  std::array<int64_t, 3> width{};
  int count = 0;
  std::array<int64_t, 3> copies{1, 1, 1};
  // The columns a rank receives of all groups, of `ranks`.
  int64_t part(int64_t ranks) const;
};

// heads [B, t*N, P] = every token of this rank's part of each column group of tokens [B, t, W]
// (N = the group's size, P = columns.part(N)): the all-to-all before attention. `buffer` holds
// at least heads.numel() elements of tokens' dtype (any dtype of at least that size in bytes).
void tokens_to_heads(Backend& be, SequenceGroup& group, const Tensor& tokens, const Tensor& heads,
                     const ColumnGroups& columns, const Tensor& buffer);
// The inverse: tokens [B, t, W] (this rank's tokens, every column) from heads [B, t*N, P], the
// copies of a part summed (float32 only then); heads is overwritten.
void heads_to_tokens(Backend& be, SequenceGroup& group, const Tensor& heads, const Tensor& tokens,
                     const ColumnGroups& columns, const Tensor& buffer);

// Whether a group splits the sequences (null or one rank: no).
inline bool splits_sequences(const SequenceGroup* g) {
  return g != nullptr && g->size() > 1;
}

// A view of sequence b of x [B, ...], flat.
Tensor sequence_view(const Tensor& x, int64_t b);

// Where a rank's tokens lie in each sequence: slice `index` of `count` equal slices (Ulysses'
// sequence rank, and within it Megatron's tensor rank).
struct TokenSlice {
  int64_t index = 0, count = 1;
};
inline TokenSlice token_slice(const SequenceGroup* g) {
  return splits_sequences(g) ? TokenSlice{g->rank(), g->size()} : TokenSlice{};
}
// Slice `inner` of `within`'s tokens (Megatron's slice of a Ulysses rank's tokens).
inline TokenSlice token_slice(TokenSlice within, int64_t inner, int64_t inner_count) {
  return {within.index * inner_count + inner, within.count * inner_count};
}

// Runs op(view, key) over the sequences of x [B, t, ...] (this rank's t tokens of each, slice
// `slice` of every sequence): `view(y)` views sequence b of a tensor laid out as x, and key's
// first_element is where that sequence's tokens start in the whole [B, t * count, ...] tensor, so
// element-wise dropout draws the masks of one process holding every token. One slice: once, over
// the whole tensors, with `key`.
template <typename Op>
void per_sequence(TokenSlice slice, const Tensor& x, const RngKey& key, Op op) {
  if (slice.count == 1) {
    op([](const Tensor& y) { return y; }, key);
    return;
  }
  const int64_t B = x.dim(0), per = x.numel() / B;  // a sequence's elements on this rank
  for (int64_t b = 0; b < B; ++b) {
    RngKey k = key;
    k.first_element = static_cast<uint64_t>((b * slice.count + slice.index) * per);
    op([b](const Tensor& y) { return sequence_view(y, b); }, k);
  }
}

// Megatron's exchanges over the tensor group: full [B, t * N, W] = every rank's slice [B, t, W]
// (rank r's tokens r*t.. of each sequence), an all-gather (16-bit data of any kind: its bits);
// and slice = this rank's tokens of the sum over the group of every rank's full (float32), a
// reduce-scatter. `buffer` holds full.numel() elements of its dtype (unused for B = 1).
void gather_tokens(Backend& be, TensorGroup& group, const Tensor& slice, const Tensor& full,
                   const Tensor& buffer);
void scatter_tokens_sum(Backend& be, TensorGroup& group, const Tensor& full, const Tensor& slice,
                        const Tensor& buffer);
// slice [B, t, W] = tokens index*t.. of each sequence of full [B, t * N, W] (a local copy).
void slice_tokens(Backend& be, const Tensor& full, const Tensor& slice, int64_t index);

}  // namespace brisk
