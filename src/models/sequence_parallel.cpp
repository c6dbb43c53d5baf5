// The all-to-all exchanges of sequence parallelism: packed with strided copies, sent in one
// all-to-all, unpacked with strided copies.
#include "models/sequence_parallel.h"

namespace brisk {

namespace {

// A tensor's elements as one flat run, in `dtype` (buffer: its first `numel` elements).
Tensor flat(const Tensor& t, int64_t numel, DType dtype) {
  return Tensor(t.data(), Shape{numel}, dtype, t.device());
}

struct ExchangeDims {
  int64_t B, t, N, W, part;  // part: the columns a rank receives
  int64_t chunk() const { return B * t * part; }
};

ExchangeDims exchange_dims(SequenceGroup& group, const Tensor& tokens, const Tensor& heads,
                           const ColumnGroups& columns, const Tensor& buffer) {
  const int64_t N = group.size();
  BRISK_CHECK(tokens.rank() == 3 && heads.rank() == 3, "sequence exchange: [B, T, W] tensors");
  int64_t sum = 0;
  for (int g = 0; g < columns.count; ++g) {
    const int64_t c = columns.copies[g];
    BRISK_CHECK(c >= 1 && N % c == 0 && columns.width[g] * c % N == 0,
                "sequence exchange: ", columns.width[g], " columns do not split among ", N,
                " ranks in copies of ", c);
    sum += columns.width[g];
  }
  const ExchangeDims d{tokens.dim(0), tokens.dim(1), N, tokens.dim(2), columns.part(N)};
  BRISK_CHECK(sum == d.W && heads.shape() == Shape({d.B, d.t * N, d.part}) &&
                  heads.dtype() == tokens.dtype(),
              "sequence exchange: ", tokens.shape().str(), " tokens for ", heads.shape().str(),
              " heads");
  BRISK_CHECK(buffer.bytes() >= heads.bytes(), "sequence exchange: a buffer of ", buffer.bytes(),
              " bytes for ", heads.bytes());
  return d;
}

// Rank j's part of column group g: its first column in tokens, and its width.
struct GroupPart {
  int64_t column, width;
};
GroupPart group_part(const ExchangeDims& d, const ColumnGroups& columns, int g, int64_t j) {
  int64_t start = 0;
  for (int k = 0; k < g; ++k) start += columns.width[k];
  const int64_t w = columns.width[g] * columns.copies[g] / d.N;
  return {start + j / columns.copies[g] * w, w};
}

// tokens' [B, t, W] columns into each rank j's chunk [B, t, part] of `chunks`.
void columns_to_chunks(Backend& be, const ExchangeDims& d, const ColumnGroups& columns,
                       const Tensor& tokens, const Tensor& chunks) {
  for (int64_t j = 0; j < d.N; ++j) {
    int64_t at = 0;  // the group's first column in a chunk
    for (int g = 0; g < columns.count; ++g) {
      const GroupPart p = group_part(d, columns, g, j);
      be.copy_rows(tokens, chunks, {p.column, d.W, j * d.chunk() + at, d.part, p.width, d.B * d.t});
      at += p.width;
    }
  }
}

// Back: each rank j's chunk into its columns of tokens; the copies of a part (ranks j with the
// same j / copies) summed in `scratch` (2 B t part elements, float32) first.
void chunks_to_columns(Backend& be, const ExchangeDims& d, const ColumnGroups& columns,
                       const Tensor& chunks, const Tensor& tokens, const Tensor& scratch) {
  int64_t at = 0;  // the group's first column in a chunk
  for (int g = 0; g < columns.count; ++g) {
    const int64_t c = columns.copies[g];
    for (int64_t j = 0; j < d.N; j += c) {
      const GroupPart p = group_part(d, columns, g, j);
      const RowCopy into_tokens{j * d.chunk() + at, d.part, p.column, d.W, p.width, d.B * d.t};
      if (c == 1) {
        be.copy_rows(chunks, tokens, into_tokens);
        continue;
      }
      BRISK_CHECK(chunks.dtype() == DType::f32, "sequence exchange: copies of ",
                  dtype_name(chunks.dtype()), " columns cannot be summed");
      const int64_t n = d.B * d.t * p.width;
      const Tensor sum = element_range(scratch, 0, n), next = element_range(scratch, n, n);
      for (int64_t k = 0; k < c; ++k) {
        const RowCopy copy{(j + k) * d.chunk() + at, d.part, 0, p.width, p.width, d.B * d.t};
        be.copy_rows(chunks, k == 0 ? sum : next, copy);
        if (k > 0) be.add_inplace(sum, next);
      }
      be.copy_rows(sum, tokens, {0, p.width, p.column, d.W, p.width, d.B * d.t});
    }
    at += group_part(d, columns, g, 0).width;
  }
}

// Between heads [B, t*N, part] and chunks [N][B, t, part], chunk i holding rank i's tokens:
// `to_chunks` copies heads' tokens into chunks, else back.
void tokens_and_chunks(Backend& be, const ExchangeDims& d, const Tensor& heads,
                       const Tensor& chunks, bool to_chunks) {
  const int64_t run = d.t * d.part;  // a sequence's tokens of one rank
  for (int64_t i = 0; i < d.N; ++i) {
    if (to_chunks)
      be.copy_rows(heads, chunks, {i * run, d.N * run, i * d.chunk(), run, run, d.B});
    else
      be.copy_rows(chunks, heads, {i * d.chunk(), run, i * run, d.N * run, run, d.B});
  }
}

}  // namespace

int64_t ColumnGroups::part(int64_t ranks) const {
  int64_t sum = 0;
  for (int g = 0; g < count; ++g) sum += width[g] * copies[g] / ranks;
  return sum;
}

void tokens_to_heads(Backend& be, SequenceGroup& group, const Tensor& tokens, const Tensor& heads,
                     const ColumnGroups& columns, const Tensor& buffer) {
  const ExchangeDims d = exchange_dims(group, tokens, heads, columns, buffer);
  const Tensor send = flat(heads, heads.numel(), heads.dtype());
  const Tensor received = flat(buffer, heads.numel(), tokens.dtype());
  columns_to_chunks(be, d, columns, tokens, send);
  group.all_to_all(be, send, received);
  tokens_and_chunks(be, d, heads, received, false);
}

void heads_to_tokens(Backend& be, SequenceGroup& group, const Tensor& heads, const Tensor& tokens,
                     const ColumnGroups& columns, const Tensor& buffer) {
  const ExchangeDims d = exchange_dims(group, tokens, heads, columns, buffer);
  const Tensor send = flat(buffer, heads.numel(), tokens.dtype());
  const Tensor received = flat(heads, heads.numel(), heads.dtype());
  tokens_and_chunks(be, d, heads, send, true);
  group.all_to_all(be, send, received);
  chunks_to_columns(be, d, columns, received, tokens, send);
}

namespace {
// `t` as a gather moves it: 16-bit data as bf16 (only its bits travel), its shape kept.
Tensor gathered_as(const Tensor& t) {
  const DType d = dtype_size(t.dtype()) == 2 ? DType::bf16 : t.dtype();
  return Tensor(t.data(), t.shape(), d, t.device());
}

// The [B, t * N, W] token layout against N chunks [B, t, W] laid end to end (chunk r: rank r's
// tokens): copies the chunks' tokens into `full`, or with `to_chunks` full's into the chunks.
void full_and_chunks(Backend& be, const Tensor& full, const Tensor& chunks, int64_t N,
                     bool to_chunks) {
  const int64_t B = full.dim(0), run = full.numel() / B / N, chunk = B * run;
  for (int64_t i = 0; i < N; ++i) {
    if (to_chunks)
      be.copy_rows(full, chunks, {i * run, N * run, i * chunk, run, run, B});
    else
      be.copy_rows(chunks, full, {i * chunk, run, i * run, N * run, run, B});
  }
}

void check_token_slices(const TensorGroup& group, const Tensor& slice, const Tensor& full,
                        const Tensor& buffer) {
  const int64_t N = group.size();
  BRISK_CHECK(slice.rank() == 3 && full.rank() == 3 && slice.dim(0) == full.dim(0) &&
                  slice.dim(1) * N == full.dim(1) && slice.dim(2) == full.dim(2) &&
                  slice.dtype() == full.dtype(),
              "token slices: ", slice.shape().str(), " is not a slice of ", full.shape().str(),
              " among ", N, " ranks");
  BRISK_CHECK(full.dim(0) == 1 || buffer.bytes() >= full.bytes(), "token slices: a buffer of ",
              buffer.bytes(), " bytes for ", full.bytes());
}
}  // namespace

void gather_tokens(Backend& be, TensorGroup& group, const Tensor& slice, const Tensor& full,
                   const Tensor& buffer) {
  check_token_slices(group, slice, full, buffer);
  const Tensor in = gathered_as(slice), out = gathered_as(full);
  const Tensor in_flat = flat(in, in.numel(), in.dtype());
  if (full.dim(0) == 1) return group.all_gather(be, in_flat, flat(out, out.numel(), out.dtype()));
  const Tensor chunks = flat(buffer, out.numel(), out.dtype());
  group.all_gather(be, in_flat, chunks);
  full_and_chunks(be, out, chunks, group.size(), false);
}

void scatter_tokens_sum(Backend& be, TensorGroup& group, const Tensor& full, const Tensor& slice,
                        const Tensor& buffer) {
  check_token_slices(group, slice, full, buffer);
  BRISK_CHECK(full.dtype() == DType::f32, "token slices: sums of ", dtype_name(full.dtype()));
  const Tensor out = flat(slice, slice.numel(), DType::f32);
  if (full.dim(0) == 1)
    return group.reduce_scatter_sum(be, flat(full, full.numel(), DType::f32), out);
  const Tensor chunks = flat(buffer, full.numel(), DType::f32);
  full_and_chunks(be, full, chunks, group.size(), true);
  group.reduce_scatter_sum(be, chunks, out);
}

void slice_tokens(Backend& be, const Tensor& full, const Tensor& slice, int64_t index) {
  const int64_t B = slice.dim(0), run = slice.numel() / B, N = full.numel() / slice.numel();
  BRISK_CHECK(full.dim(0) == B && full.numel() == N * slice.numel() && index >= 0 && index < N,
              "token slices: slice ", index, " of ", full.shape().str(), " as ",
              slice.shape().str());
  be.copy_rows(full, slice, {index * run, N * run, 0, run, run, B});
}

Tensor sequence_view(const Tensor& x, int64_t b) {
  const int64_t per = x.numel() / x.dim(0);
  const auto bytes = static_cast<size_t>(per * static_cast<int64_t>(dtype_size(x.dtype())));
  return Tensor(static_cast<char*>(x.data()) + static_cast<size_t>(b) * bytes, Shape{per},
                x.dtype(), x.device());
}

}  // namespace brisk
