// Token, position and token-type embeddings on the CPU: a gather forward, a scatter-add backward
// parallel over columns so that repeated ids never race; a packed batch's positions read from
// memory.
#include <algorithm>

#include "backend/cpu/cpu_backend.h"

namespace brisk {

namespace {
void check_ids(const Tensor& ids, int64_t rows, const char* what) {
  const int32_t* p = ids.i32();
  for (int64_t i = 0, n = ids.numel(); i < n; ++i)
    BRISK_CHECK(p[i] >= 0 && p[i] < rows, what, " ", p[i], " at position ", i,
                " is outside the table of ", rows, " rows");
}

// The tokens' positions where given (each checked to be a row of `table`), else null.
const int32_t* position_ids(const Tensor& positions, const Tensor& table, int64_t tokens,
                            const char* op) {
  Backend::check_token_positions(positions, tokens, Device::cpu, op);
  if (positions.empty() || table.empty()) return nullptr;
  const int32_t* p = positions.i32();
  for (int64_t i = 0; i < tokens; ++i)
    BRISK_CHECK(p[i] >= 0 && p[i] < table.dim(0), op, ": position ", p[i], " of token ", i,
                " is outside the position table of ", table.dim(0), " rows");
  return p;
}
}  // namespace

void CpuBackend::embedding_forward(const Tensor& ids, const Tensor& word, const Tensor& pos,
                                   const Tensor& type_ids, const Tensor& type_table,
                                   const Tensor& out, const VocabShard& shard,
                                   const Tensor& positions) {
  BRISK_CHECK(ids.rank() == 2, "embedding_forward: ids must be [batch, seq]");
  const int64_t B = ids.dim(0), T = ids.dim(1), C = word.dim(1);
  expect(out, DType::f32, Shape{B, T, C}, "embedding_forward output");
  const int64_t first = shard.first, held = shard.count(word.dim(0));
  check_ids(ids, shard.vocab == 0 ? word.dim(0) : shard.vocab, "token id");
  const int32_t* at = position_ids(positions, pos, B * T, "embedding_forward");
  BRISK_CHECK(pos.empty() || at || pos.dim(0) >= T, "sequence length ", T,
              " exceeds the position table of ", pos.empty() ? 0 : pos.dim(0));
  const bool typed = !type_ids.empty();
  if (typed) check_ids(type_ids, type_table.dim(0), "token type id");
  const int32_t* id = ids.i32();
  const int32_t* tid = typed ? type_ids.i32() : nullptr;
  const float* w = word.f32();
  const float* p = pos.empty() ? nullptr : pos.f32();
  const float* tt = typed ? type_table.f32() : nullptr;
  float* o = out.f32();
#pragma omp parallel for schedule(static)
  for (int64_t bt = 0; bt < B * T; ++bt) {
    const int64_t t = at ? at[bt] : bt % T;
    const int64_t row = id[bt] - first;
    float* orow = o + bt * C;
    if (row >= 0 && row < held)
      for (int64_t c = 0; c < C; ++c) orow[c] = w[row * C + c];
    else
      for (int64_t c = 0; c < C; ++c) orow[c] = 0.0f;
    if (p)
      for (int64_t c = 0; c < C; ++c) orow[c] += p[t * C + c];
    if (tt)
      for (int64_t c = 0; c < C; ++c) orow[c] += tt[static_cast<int64_t>(tid[bt]) * C + c];
  }
}

void CpuBackend::embedding_backward(const Tensor& dout, const Tensor& ids, int64_t padding_idx,
                                    const Tensor& type_ids, const Tensor& dword, const Tensor& dpos,
                                    const Tensor& dtype_table, const VocabShard& shard,
                                    const Tensor& positions) {
  const int64_t B = ids.dim(0), T = ids.dim(1), C = dword.dim(1);
  expect(dout, DType::f32, Shape{B, T, C}, "embedding_backward gradient");
  const int32_t* at = position_ids(positions, dpos, B * T, "embedding_backward");
  const int64_t first = shard.first, held = shard.count(dword.dim(0));
  check_padding_idx(padding_idx, shard.vocab == 0 ? dword.dim(0) : shard.vocab,
                    "embedding_backward");
  const int32_t* id = ids.i32();
  const int32_t* tid = type_ids.empty() ? nullptr : type_ids.i32();
  const float* g = dout.f32();
  float* dw = dword.f32();
  float* dp = dpos.empty() ? nullptr : dpos.f32();
  float* dt = (dtype_table.empty() || !tid) ? nullptr : dtype_table.f32();
  constexpr int64_t kBlock = 32;
#pragma omp parallel for schedule(static)
  for (int64_t c0 = 0; c0 < C; c0 += kBlock) {
    const int64_t c1 = std::min(C, c0 + kBlock);
    for (int64_t bt = 0; bt < B * T; ++bt) {
      const float* gr = g + bt * C;
      const int64_t row = id[bt] - first;
      if (id[bt] != padding_idx && row >= 0 && row < held) {
        float* wr = dw + row * C;
        for (int64_t c = c0; c < c1; ++c) wr[c] += gr[c];
      }
      if (dp) {
        float* pr = dp + (at ? at[bt] : bt % T) * C;
        for (int64_t c = c0; c < c1; ++c) pr[c] += gr[c];
      }
      if (dt) {
        float* tr = dt + static_cast<int64_t>(tid[bt]) * C;
        for (int64_t c = c0; c < c1; ++c) tr[c] += gr[c];
      }
    }
  }
}

}  // namespace brisk
