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
  int64_t B, t, N, W, part;  // part = W / N: a rank's columns
  int64_t chunk() const { return B * t * part; }
};

ExchangeDims exchange_dims(SequenceGroup& group, const Tensor& tokens, const Tensor& heads,
                           const ColumnGroups& columns, const Tensor& buffer) {
  const int64_t N = group.size();
  BRISK_CHECK(tokens.rank() == 3 && heads.rank() == 3, "sequence exchange: [B, T, W] tensors");
  const ExchangeDims d{tokens.dim(0), tokens.dim(1), N, tokens.dim(2), tokens.dim(2) / N};
  int64_t sum = 0;
  for (int g = 0; g < columns.count; ++g) {
    BRISK_CHECK(columns.width[g] % N == 0, "sequence exchange: ", columns.width[g],
                " columns do not split among ", N, " ranks");
    sum += columns.width[g];
  }
  BRISK_CHECK(sum == d.W && heads.shape() == Shape({d.B, d.t * N, d.part}) &&
                  heads.dtype() == tokens.dtype(),
              "sequence exchange: ", tokens.shape().str(), " tokens for ", heads.shape().str(),
              " heads");
  BRISK_CHECK(buffer.bytes() >= tokens.bytes(), "sequence exchange: a buffer of ", buffer.bytes(),
              " bytes for ", tokens.bytes());
  return d;
}

// Between [B, t, W] (every column) and a rank's chunk [B, t, W/N] of its columns, for each
// rank j: `to_chunks` copies tokens' columns into chunk j of `chunks`, else back.
void columns_and_chunks(Backend& be, const ExchangeDims& d, const ColumnGroups& columns,
                        const Tensor& tokens, const Tensor& chunks, bool to_chunks) {
  for (int64_t j = 0; j < d.N; ++j) {
    int64_t start = 0, at = 0;  // the group's first column in tokens, and in a chunk
    for (int g = 0; g < columns.count; ++g) {
      const int64_t w = columns.width[g] / d.N;
      const int64_t column = start + j * w, chunk = j * d.chunk() + at;
      if (to_chunks)
        be.copy_rows(tokens, chunks, {column, d.W, chunk, d.part, w, d.B * d.t});
      else
        be.copy_rows(chunks, tokens, {chunk, d.part, column, d.W, w, d.B * d.t});
      start += columns.width[g];
      at += w;
    }
  }
}

// Between heads [B, t*N, W/N] and chunks [N][B, t, W/N], chunk i holding rank i's tokens:
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

void tokens_to_heads(Backend& be, SequenceGroup& group, const Tensor& tokens, const Tensor& heads,
                     const ColumnGroups& columns, const Tensor& buffer) {
  const ExchangeDims d = exchange_dims(group, tokens, heads, columns, buffer);
  const Tensor send = flat(heads, heads.numel(), heads.dtype());
  const Tensor received = flat(buffer, tokens.numel(), tokens.dtype());
  columns_and_chunks(be, d, columns, tokens, send, true);
  group.all_to_all(be, send, received);
  tokens_and_chunks(be, d, heads, received, false);
}

void heads_to_tokens(Backend& be, SequenceGroup& group, const Tensor& heads, const Tensor& tokens,
                     const ColumnGroups& columns, const Tensor& buffer) {
  const ExchangeDims d = exchange_dims(group, tokens, heads, columns, buffer);
  const Tensor send = flat(tokens, tokens.numel(), tokens.dtype());
  const Tensor received = flat(buffer, tokens.numel(), tokens.dtype());
  tokens_and_chunks(be, d, heads, send, true);
  group.all_to_all(be, send, received);
  columns_and_chunks(be, d, columns, tokens, received, false);
}

Tensor sequence_view(const Tensor& x, int64_t b) {
  const int64_t per = x.numel() / x.dim(0);
  const auto bytes = static_cast<size_t>(per * static_cast<int64_t>(dtype_size(x.dtype())));
  return Tensor(static_cast<char*>(x.data()) + static_cast<size_t>(b) * bytes, Shape{per},
                x.dtype(), x.device());
}

}  // namespace brisk
