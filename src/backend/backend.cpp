// Backend choice and the device-independent helpers of the backend interface.
#include "backend/backend.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/checked.h"

namespace brisk {

AttentionBuffers attention_buffers(Device device, int64_t batch, int64_t heads, int64_t seq,
                                   int64_t head_dim) {
  if (device == Device::cuda)  // flash attention: scratch for its delta
    return {Shape{batch, heads, seq}, Shape{batch, heads, seq}};
  return {Shape{batch, heads, seq},
          Shape{batch, heads, cpu_attention_scratch_floats(seq, head_dim)}};
}

AttentionDims attention_dims(const Tensor& qkv, int heads, int kv_heads, const char* op) {
  BRISK_CHECK(heads > 0 && kv_heads > 0 && heads % kv_heads == 0, op, ": ", heads,
              " query heads do not share ", kv_heads, " key/value heads evenly");
  const int64_t packed = heads + 2 * static_cast<int64_t>(kv_heads);
  BRISK_CHECK(qkv.rank() == 3 && qkv.dim(2) % packed == 0, op,
              ": qkv must be [B, T, (heads + 2 kv_heads) * head_dim] with ", heads, " query and ",
              kv_heads, " key/value heads, got ", qkv.shape().str());
  const int64_t D = qkv.dim(2) / packed;
  BRISK_CHECK(D > 0, op, ": qkv ", qkv.shape().str(), " has no columns");
  return {qkv.dim(0), qkv.dim(1), heads * D, heads, D, kv_heads};
}

Tensor Backend::hold_padded_weight(const Tensor&, int64_t) {
  BRISK_CHECK(false, "the ", name(), " backend does not pad held weights");
  return Tensor();
}

void Backend::check_attention_decode(const Tensor& qkv, const Tensor& k_cache,
                                     const Tensor& v_cache, int64_t past, int heads, int kv_heads,
                                     const Tensor& out, AttentionDims* dims) {
  const AttentionDims d = attention_dims(qkv, heads, kv_heads, "attention_decode");
  const int64_t KD = d.K * d.D;  // one position's key (or value) heads
  BRISK_CHECK(k_cache.rank() == 3 && k_cache.dim(0) == d.B && k_cache.dim(2) == KD &&
                  v_cache.shape() == k_cache.shape() && k_cache.dtype() == DType::f32 &&
                  v_cache.dtype() == DType::f32,
              "attention_decode: the caches must be float32 [", d.B, ", S, ", KD, "], got ",
              k_cache.shape().str(), " and ", v_cache.shape().str());
  BRISK_CHECK(past >= 0 && past + d.T <= k_cache.dim(1), "attention_decode: positions ", past, "..",
              past + d.T, " do not fit a cache of ", k_cache.dim(1));
  BRISK_CHECK(out.shape() == Shape({d.B, d.T, d.C}) && out.dtype() == DType::f32 &&
                  qkv.dtype() == DType::f32,
              "attention_decode: output ", out.shape().str(), " for [", d.B, ", ", d.T, ", ", d.C,
              "]");
  *dims = d;
}

void Backend::check_rmsnorm(const Tensor& x, const Tensor& gamma, const Tensor& rstd,
                            const Tensor& other, const char* op, bool bf16_mode) {
  BRISK_CHECK(x.rank() >= 1, op, ": the input must have at least one dimension");
  const int64_t C = x.dim(-1), rows = C ? x.numel() / C : 0;
  BRISK_CHECK(
      x.dtype() == DType::f32 && gamma.dtype() == DType::f32 && rstd.dtype() == DType::f32 &&
          (other.dtype() == DType::f32 || (bf16_mode && other.dtype() == DType::bf16)),
      op, ": every tensor must be float32", bf16_mode ? " (the output float32 or bf16)" : "");
  BRISK_CHECK(gamma.numel() == C, op, ": gamma has ", gamma.numel(), " elements for rows of ", C,
              " (input ", x.shape().str(), ")");
  BRISK_CHECK(rstd.numel() == rows, op, ": rstd has ", rstd.numel(), " elements for ", rows,
              " rows (input ", x.shape().str(), ")");
  BRISK_CHECK(other.numel() == x.numel(), op, ": element counts differ (", x.shape().str(), " vs ",
              other.shape().str(), ")");
}

void Backend::norm_forward(const Tensor& x, const Norm& n, const Tensor& y) {
  if (n.rms)
    rmsnorm_forward(x, n.gamma, n.eps, y, n.rstd);
  else
    layernorm_forward(x, n.gamma, n.beta, n.eps, y, n.mean, n.rstd);
}

void Backend::attention_forward_stored(const Tensor& qkv, const KeyMask& key_mask, bool causal,
                                       int heads, int kv_heads, float scale, float dropout_p,
                                       const RngKey& key, const Tensor& stats,
                                       const Tensor& scratch, const Tensor& out,
                                       const Tensor& stored) {
  check_stored_output(out, stored);
  attention_forward(qkv, key_mask, causal, heads, kv_heads, scale, dropout_p, key, stats, scratch,
                    out);
  cast(out, stored);
}

void Backend::check_stored_output(const Tensor& out, const Tensor& stored) {
  BRISK_CHECK(stored.shape() == out.shape() &&
                  (stored.dtype() == DType::bf16 || stored.dtype() == DType::f16),
              "attention_forward_stored: a stored output ", stored.shape().str(), " ",
              dtype_name(stored.dtype()), " for ", out.shape().str());
}

Tensor Backend::linear_activation_backward(const Tensor& x, const Tensor& w, const Tensor& dy,
                                           WeightLayout layout, Activation kind, const Tensor& pre,
                                           DType round, const Tensor& dx, const Tensor& dw,
                                           const Tensor& db, bool accumulate_dw) {
  linear_backward(x, w, dy, layout, dx, false, dw, db, accumulate_dw);
  activation_backward(kind, pre, dx, dx, round);
  return dx;
}

void Backend::norm_backward(const Tensor& dy, const Tensor& x, const Norm& n, const Tensor& dx,
                            bool accumulate_dx, const Tensor& dgamma, const Tensor& dbeta,
                            DType round_dy, const BranchDropout& branch) {
  if (round_dy != DType::f32) round_to(round_dy, dy);
  if (n.rms) {
    BRISK_CHECK(dbeta.empty(), "norm_backward: an RMSNorm has no beta");
    rmsnorm_backward(dy, x, n.gamma, n.rstd, dx, accumulate_dx, dgamma);
  } else {
    layernorm_backward(dy, x, n.gamma, n.mean, n.rstd, dx, accumulate_dx, dgamma, dbeta);
  }
  if (!branch.grad.empty()) dropout_backward(dx, branch.p, branch.key, branch.grad);
}

void Backend::check_norm(const Tensor& x, const Norm& n, const Tensor& y, const char* op,
                         bool bf16_mode) {
  check_rmsnorm(x, n.gamma, n.rstd, y, op, bf16_mode);
  if (n.rms) {
    BRISK_CHECK(n.beta.empty() && n.mean.empty(), op, ": an RMSNorm has no beta and no mean");
    return;
  }
  BRISK_CHECK(n.beta.dtype() == DType::f32 && n.mean.dtype() == DType::f32, op,
              ": beta and mean must be float32");
  BRISK_CHECK(n.beta.numel() == n.gamma.numel() && n.mean.numel() == n.rstd.numel(), op,
              ": beta or mean sizes do not match ", x.shape().str());
}

int64_t Backend::check_copy_rows(const Tensor& src, const Tensor& dst, const RowCopy& c) {
  BRISK_CHECK(src.dtype() == dst.dtype(), "copy_rows: ", dtype_name(src.dtype()), " into ",
              dtype_name(dst.dtype()));
  BRISK_CHECK(c.count >= 0 && c.rows >= 0 && c.src_at >= 0 && c.dst_at >= 0 && c.src_pitch >= 0 &&
                  c.dst_pitch >= 0,
              "copy_rows: negative extents");
  BRISK_CHECK(c.rows <= 1 || (c.src_pitch >= c.count && c.dst_pitch >= c.count),
              "copy_rows: runs of ", c.count, " elements ", c.src_pitch, " and ", c.dst_pitch,
              " apart overlap");
  if (c.count > 0 && c.rows > 0) {
    const char* what = "copy_rows' extent";
    auto end = [&](int64_t at, int64_t pitch) {
      return checked_add(checked_add(at, checked_mul(c.rows - 1, pitch, what), what), c.count,
                         what);
    };
    BRISK_CHECK(end(c.src_at, c.src_pitch) <= src.numel(), "copy_rows: runs past the source's ",
                src.numel(), " elements");
    BRISK_CHECK(end(c.dst_at, c.dst_pitch) <= dst.numel(),
                "copy_rows: runs past the destination's ", dst.numel(), " elements");
  }
  return static_cast<int64_t>(dtype_size(src.dtype()));
}

RotaryDims Backend::check_rotary(const Tensor& qkv, int heads, int kv_heads, const Tensor& cos,
                                 const Tensor& sin, int64_t first_position, const Tensor& positions,
                                 const char* op) {
  BRISK_CHECK(heads > 0 && kv_heads > 0, op, ": ", heads, " query heads and ", kv_heads,
              " key/value heads; both must be positive");
  BRISK_CHECK(qkv.rank() == 3 && qkv.dtype() == DType::f32, op,
              ": qkv must be float32 [B, T, (heads + 2 kv_heads) * head_dim], got ",
              qkv.shape().str());
  const int64_t packed = heads + 2 * static_cast<int64_t>(kv_heads);
  BRISK_CHECK(qkv.dim(2) % packed == 0, op, ": qkv's ", qkv.dim(2), " columns do not split into ",
              heads, " query, ", kv_heads, " key and ", kv_heads, " value heads");
  const int64_t D = qkv.dim(2) / packed;
  BRISK_CHECK(D % 2 == 0 && D > 0, op, ": head width ", D,
              " is odd or zero; rotary embeddings pair its two halves");
  BRISK_CHECK(cos.dtype() == DType::f32 && sin.dtype() == DType::f32 && cos.rank() == 2 &&
                  cos.shape() == sin.shape() && cos.dim(1) == D / 2,
              op, ": cos and sin must be float32 [positions, ", D / 2, "], got ", cos.shape().str(),
              " and ", sin.shape().str());
  BRISK_CHECK(qkv.device() == cos.device() && qkv.device() == sin.device(), op,
              ": the tables are not in qkv's memory");
  const int64_t T = qkv.dim(1);
  check_token_positions(positions, qkv.dim(0) * T, qkv.device(), op);
  BRISK_CHECK(positions.empty() ? first_position >= 0 && first_position + T <= cos.dim(0)
                                : first_position == 0,
              op, ": positions ", first_position, "..", first_position + T - 1,
              " lie outside tables of ", cos.dim(0), " positions");
  return {qkv.dim(0), T, heads, kv_heads, D};
}

void Backend::check_token_positions(const Tensor& positions, int64_t tokens, Device device,
                                    const char* op) {
  BRISK_CHECK(positions.empty() || (positions.dtype() == DType::i32 &&
                                    positions.numel() == tokens && positions.device() == device),
              op, ": positions must be int32 [", tokens, "] in the tokens' memory, got ",
              positions.shape().str());
}

int64_t Backend::check_swiglu(const Tensor& gate_up, const Tensor& half, const char* op,
                              bool bf16_mode) {
  auto allowed = [&](const Tensor& t) {
    return t.dtype() == DType::f32 || (bf16_mode && t.dtype() == DType::bf16);
  };
  BRISK_CHECK(allowed(gate_up) && allowed(half), op, ": gate_up and its half must be float32",
              bf16_mode ? " or bf16" : "");
  BRISK_CHECK(gate_up.rank() >= 1 && gate_up.dim(-1) % 2 == 0, op, ": gate_up ",
              gate_up.shape().str(), " does not hold a gate and an up half in its last dimension");
  const int64_t F = gate_up.dim(-1) / 2;
  BRISK_CHECK(half.rank() >= 1 && half.dim(-1) == F && half.numel() * 2 == gate_up.numel(), op,
              ": ", half.shape().str(), " is not the [..., ", F, "] half of gate_up ",
              gate_up.shape().str());
  return F;
}

void Backend::check_attention_scale(float scale, const char* op) {
  BRISK_CHECK(std::isfinite(scale), op, ": the attention scale ", scale, " is not finite");
}

void Backend::check_key_mask(const KeyMask& mask, int64_t B, int64_t T, const char* op) {
  // (Fixed names: a step's calls build no strings.)
  if (!mask.keep.empty()) expect(mask.keep, DType::i32, Shape{B, T}, "the attention's key mask");
  if (mask.lengths.empty()) return;
  BRISK_CHECK(!mask.keep.empty(), op, ": key lengths without the mask they describe");
  expect(mask.lengths, DType::i32, Shape{B}, "the attention's key lengths");
}

bool Backend::check_loss_grad(const Tensor& logits, bool write_grad, const Tensor& grad) {
  if (!write_grad || grad.empty()) return false;
  const int64_t V = logits.rank() ? logits.dim(-1) : 1;
  const int64_t gV = grad.rank() ? grad.dim(-1) : 1;
  BRISK_CHECK(gV == V && grad.numel() == logits.numel() &&
                  (grad.dtype() == DType::f32 || grad.dtype() == DType::bf16),
              "softmax_cross_entropy: gradient ", grad.shape().str(), " ", dtype_name(grad.dtype()),
              " for logits ", logits.shape().str());
  return true;
}

int64_t Backend::check_cross_entropy_shard(const Tensor& logits, const Tensor& labels,
                                           const VocabShard& shard, const Tensor& stats,
                                           int64_t stat_slots, const char* op) {
  BRISK_CHECK(logits.dtype() == DType::f32 && logits.rank() >= 1, op, ": logits ",
              logits.shape().str(), " ", dtype_name(logits.dtype()), " are not float32 rows");
  const int64_t V = logits.dim(-1), N = V > 0 ? logits.numel() / V : 0;
  BRISK_CHECK(labels.dtype() == DType::i32 && labels.numel() == N, op, ": ", labels.numel(),
              " labels for ", N, " rows of logits");
  BRISK_CHECK(
      shard.first >= 0 && shard.vocab >= 0 && (shard.vocab == 0 || shard.first < shard.vocab), op,
      ": columns from ", shard.first, " of a vocabulary of ", shard.vocab);
  const char* what = "the cross-entropy's statistics";
  BRISK_CHECK(stats.dtype() == DType::f32 && stat_slots >= 1 &&
                  stats.numel() == checked_mul(checked_mul(stat_slots, N, what), 3, what),
              op, ": statistics ", stats.shape().str(), " ", dtype_name(stats.dtype()), " for ",
              stat_slots, " x ", N, " rows of 3 float32 values");
  return shard.count(V);
}

std::pair<int64_t, int64_t> Backend::check_moe_route(const Tensor& probs, const Tensor& weights,
                                                     const Tensor& experts, const char* op) {
  BRISK_CHECK(probs.dtype() == DType::f32 && probs.rank() == 2 && probs.dim(1) >= 1, op,
              ": router probabilities ", probs.shape().str(), " ", dtype_name(probs.dtype()),
              " are not float32 [tokens, experts]");
  const int64_t N = probs.dim(0), E = probs.dim(1);
  BRISK_CHECK(weights.dtype() == DType::f32 && weights.rank() == 2 && weights.dim(0) == N &&
                  experts.dtype() == DType::i32 && experts.shape() == weights.shape(),
              op, ": weights ", weights.shape().str(), " ", dtype_name(weights.dtype()),
              " and experts ", experts.shape().str(), " ", dtype_name(experts.dtype()),
              " are not float32 and int32 [", N, ", k]");
  const int64_t k = weights.dim(1);
  BRISK_CHECK(k >= 1 && k <= E, op, ": ", k, " experts per token of ", E);
  return {E, k};
}

int64_t Backend::check_moe_dispatch(const Tensor& experts, int64_t num_experts,
                                    const Tensor& counts, const Tensor& positions) {
  BRISK_CHECK(experts.dtype() == DType::i32 && experts.rank() == 2 &&
                  positions.dtype() == DType::i32 && positions.shape() == experts.shape(),
              "moe_dispatch: experts ", experts.shape().str(), " ", dtype_name(experts.dtype()),
              " and positions ", positions.shape().str(), " ", dtype_name(positions.dtype()),
              " are not both int32 [tokens, k]");
  BRISK_CHECK(num_experts >= 1 && counts.dtype() == DType::i32 && counts.numel() == num_experts,
              "moe_dispatch: counts ", counts.shape().str(), " ", dtype_name(counts.dtype()),
              " are not int32 [", num_experts, "] (experts >= 1)");
  BRISK_CHECK(experts.numel() <= std::numeric_limits<int32_t>::max(),
              "moe_dispatch: ", experts.numel(), " routed rows exceed int32 positions");
  return experts.numel();
}

namespace {
void check_balance_mask(const Tensor& mask, int64_t N, const char* op) {
  BRISK_CHECK(mask.empty() || (mask.dtype() == DType::i32 && mask.numel() == N), op, ": mask ",
              mask.shape().str(), " ", dtype_name(mask.dtype()), " is not int32 [", N, "]");
}
}  // namespace

Backend::MoeBalance Backend::check_moe_balance_stats(const Tensor& probs, const Tensor& experts,
                                                     const Tensor& mask, const Tensor& stats) {
  const char* op = "moe_balance_stats";
  BRISK_CHECK(probs.dtype() == DType::f32 && probs.rank() == 2, op, ": probabilities ",
              probs.shape().str(), " ", dtype_name(probs.dtype()), " are not float32 [tokens, E]");
  const int64_t N = probs.dim(0), E = probs.dim(1);
  BRISK_CHECK(experts.dtype() == DType::i32 && experts.rank() == 2 && experts.dim(0) == N, op,
              ": experts ", experts.shape().str(), " ", dtype_name(experts.dtype()),
              " are not int32 [", N, ", k]");
  check_balance_mask(mask, N, op);
  BRISK_CHECK(stats.dtype() == DType::f32 && stats.numel() == 2 * E, op, ": statistics ",
              stats.shape().str(), " ", dtype_name(stats.dtype()), " are not float32 [2, ", E, "]");
  return {N, E, experts.dim(1)};
}

Backend::MoeBalance Backend::check_moe_balance_backward(const Tensor& mask, const Tensor& scale,
                                                        const Tensor& dprobs) {
  const char* op = "moe_balance_backward";
  BRISK_CHECK(dprobs.dtype() == DType::f32 && dprobs.rank() == 2, op, ": gradient ",
              dprobs.shape().str(), " ", dtype_name(dprobs.dtype()), " is not float32 [tokens, E]");
  const int64_t N = dprobs.dim(0), E = dprobs.dim(1);
  check_balance_mask(mask, N, op);
  BRISK_CHECK(scale.dtype() == DType::f32 && scale.numel() == E, op, ": scale ",
              scale.shape().str(), " ", dtype_name(scale.dtype()), " is not float32 [", E, "]");
  return {N, E, 0};
}

Backend::MoeBalance Backend::check_moe_z(const Tensor& values, const Tensor& mask, const Tensor& z,
                                         const Tensor& other, bool backward) {
  const char* op = backward ? "moe_z_backward" : "moe_z_stats";
  BRISK_CHECK(values.dtype() == DType::f32 && values.rank() == 2, op, ": ",
              backward ? "probabilities " : "logits ", values.shape().str(), " ",
              dtype_name(values.dtype()), " are not float32 [tokens, E]");
  const int64_t N = values.dim(0), E = values.dim(1);
  check_balance_mask(mask, N, op);
  BRISK_CHECK(z.dtype() == DType::f32 && z.numel() == N, op, ": z ", z.shape().str(), " ",
              dtype_name(z.dtype()), " is not float32 [", N, "]");
  const int64_t want = backward ? N * E : 1;
  BRISK_CHECK(other.dtype() == DType::f32 && other.numel() == want, op, ": ",
              backward ? "dlogits " : "sum ", other.shape().str(), " ", dtype_name(other.dtype()),
              " is not float32 of ", want, " values");
  return {N, E, 0};
}

Backend::MoeRows Backend::check_moe_rows(const Tensor& positions, const Tensor& rows,
                                         const Tensor& tokens, const Tensor& weights,
                                         const char* op) {
  BRISK_CHECK(positions.empty() || (positions.dtype() == DType::i32 && positions.rank() == 2), op,
              ": positions ", positions.shape().str(), " ", dtype_name(positions.dtype()),
              " are not int32 [tokens, k]");
  // No positions: each token's own row, k = 1.
  const int64_t N = positions.empty() ? (rows.rank() >= 1 ? rows.dim(0) : 0) : positions.dim(0);
  const int64_t k = positions.empty() ? 1 : positions.dim(1);
  BRISK_CHECK(
      tokens.dtype() == DType::f32 && tokens.rank() >= 1 && N > 0 && tokens.numel() % N == 0, op,
      ": tokens ", tokens.shape().str(), " ", dtype_name(tokens.dtype()),
      " are not float32 rows of ", N, " tokens");
  const int64_t C = tokens.numel() / N;
  BRISK_CHECK(rows.dtype() == DType::f32 && rows.numel() == checked_mul(N * k, C, op), op,
              ": rows ", rows.shape().str(), " ", dtype_name(rows.dtype()), " are not float32 [",
              N * k, ", ", C, "]");
  BRISK_CHECK(N * k <= std::numeric_limits<int32_t>::max(), op, ": ", N * k,
              " routed rows exceed int32 positions");
  BRISK_CHECK(weights.empty() || (weights.dtype() == DType::f32 && weights.numel() == N * k), op,
              ": weights ", weights.shape().str(), " ", dtype_name(weights.dtype()),
              " are not float32 [", N, ", ", k, "]");
  return {N, k, C};
}

Backend::MoeRows Backend::check_moe_gather(const Tensor& x, const Tensor& positions,
                                           const Tensor& rows) {
  BRISK_CHECK(!positions.empty(), "moe_gather: no positions");
  return check_moe_rows(positions, rows, x, Tensor(), "moe_gather");
}

Backend::MoeRows Backend::check_moe_combine_backward(const Tensor& dy, const Tensor& rows,
                                                     const Tensor& positions, const Tensor& weights,
                                                     const Tensor& drows, const Tensor& dweights) {
  const char* op = "moe_combine_backward";
  BRISK_CHECK(!weights.empty() && !dweights.empty(), op,
              ": the weights and their gradient are both needed");
  check_moe_rows(positions, drows, dy, dweights, op);
  return check_moe_rows(positions, rows, dy, weights, op);
}

void Backend::check_padding_idx(int64_t padding_idx, int64_t rows, const char* op) {
  BRISK_CHECK(padding_idx == -1 || (padding_idx >= 0 && padding_idx < rows), op, ": padding_idx ",
              padding_idx, " is neither -1 (none) nor a row of the word table of ", rows, " rows");
}

std::unique_ptr<Backend> make_backend(Device device, const Switches& switches) {
  return device == Device::cuda ? make_cuda_backend(switches) : make_cpu_backend(switches);
}

void check_param_slots(const std::vector<ParamSlot>* slots, int64_t n, const char* op) {
  BRISK_CHECK(slots != nullptr, op, ": no parameter slots");
  for (const ParamSlot& s : *slots)
    BRISK_CHECK(
        s.offset >= 0 && s.numel >= 0 && s.offset + s.numel <= n && s.rows * s.cols == s.numel, op,
        ": a parameter slot lies outside the flat buffers");
}

Tensor element_range(const Tensor& t, int64_t first, int64_t count) {
  BRISK_CHECK(first >= 0 && count >= 0 && first + count <= t.numel(), "elements ", first, "..",
              first + count, " lie outside a tensor of ", t.numel());
  return Tensor(static_cast<unsigned char*>(t.data()) + first * dtype_size(t.dtype()), Shape{count},
                t.dtype(), t.device());
}

void write_in_pieces(Backend& be, const Tensor& dst,
                     const std::function<void(const Tensor& piece, int64_t first)>& fill,
                     size_t piece_bytes, bool staged) {
  if (dst.device() == Device::cpu && !staged) {
    fill(element_range(dst, 0, dst.numel()), 0);
    return;
  }
  const int64_t per_piece =
      std::max<int64_t>(1, static_cast<int64_t>(piece_bytes / dtype_size(dst.dtype())));
  std::vector<unsigned char> staging(static_cast<size_t>(std::min(per_piece, dst.numel())) *
                                     dtype_size(dst.dtype()));
  for (int64_t first = 0; first < dst.numel(); first += per_piece) {
    const int64_t n = std::min(per_piece, dst.numel() - first);
    const Tensor piece(staging.data(), Shape{n}, dst.dtype(), Device::cpu);
    fill(piece, first);
    be.upload(piece, element_range(dst, first, n));
    be.synchronize();  // the staging buffer is reused for the next piece
  }
}

void with_host_view(Backend& be, const Tensor& t, bool read, bool write,
                    const std::function<void(const Tensor&)>& fn) {
  if (t.device() == Device::cpu) {
    fn(t);
    return;
  }
  std::vector<unsigned char> bytes(t.bytes());
  const Tensor host(bytes.data(), t.shape(), t.dtype(), Device::cpu);
  if (read) be.download(t, host);
  fn(host);
  if (write) {
    be.upload(host, t);
    be.synchronize();  // the temporary goes away on return
  }
}

}  // namespace brisk

namespace brisk {

namespace {
// Throws unless t is float32 of `rows` x `cols` elements (any shape of that count).
void check_lora_operand(const Tensor& t, int64_t rows, int64_t cols, const char* op,
                        const char* what) {
  BRISK_CHECK(t.dtype() == DType::f32 && t.numel() == checked_mul(rows, cols, op), op, ": ", what,
              " ", t.shape().str(), " ", dtype_name(t.dtype()), " is not float32 [", rows, ", ",
              cols, "]");
}
}  // namespace

Backend::LoraDims Backend::check_lora_forward(const Tensor& x, const Tensor& a, const Tensor& b,
                                              const Tensor& u, const Tensor& y, int64_t at) {
  const char* op = "lora";
  BRISK_CHECK(a.rank() == 2 && b.rank() == 2 && x.rank() >= 2 && y.rank() >= 2, op,
              ": a and b must be matrices, x and y rows");
  const int64_t r = a.dim(0), in = a.dim(1), out = b.dim(0);
  const int64_t width = y.dim(y.rank() - 1), N = y.numel() / std::max<int64_t>(width, 1);
  BRISK_CHECK(b.dim(1) == r, op, ": b ", b.shape().str(), " does not take a's rank ", r);
  BRISK_CHECK(at >= 0 && out <= width - at, op, ": columns [", at, ", ", at + out,
              ") are not within y's ", width);
  check_lora_operand(x, N, in, op, "x");
  check_lora_operand(a, r, in, op, "a");
  check_lora_operand(b, out, r, op, "b");
  check_lora_operand(u, N, r, op, "u");
  check_lora_operand(y, N, width, op, "y");
  return {N, in, r, out, width};
}

Backend::LoraDims Backend::check_lora_backward(const Tensor& x, const Tensor& a, const Tensor& b,
                                               const Tensor& u, const Tensor& dy, int64_t at,
                                               const Tensor& v, const Tensor& da, const Tensor& db,
                                               const Tensor& dx) {
  const LoraDims d = check_lora_forward(x, a, b, u, dy, at);
  check_lora_operand(v, d.N, d.r, "lora_backward", "v");
  check_lora_operand(da, d.r, d.in, "lora_backward", "da");
  check_lora_operand(db, d.out, d.r, "lora_backward", "db");
  if (!dx.empty()) check_lora_operand(dx, d.N, d.in, "lora_backward", "dx");
  return d;
}

void Backend::check_dequantize_4bit(const Quant4Tensor& q, const Tensor& out) {
  const Quant4Layout& l = q.layout;
  auto has = [](const Tensor& t, DType dtype, int64_t n) {
    return t.dtype() == dtype && t.numel() == n;
  };
  BRISK_CHECK(l.blocksize > 0 && l.blocksize % 2 == 0 && l.numel >= 0,
              "dequantize_4bit: a layout of ", l.numel, " values in blocks of ", l.blocksize);
  BRISK_CHECK(has(q.packed, DType::u8, l.packed_bytes()), "dequantize_4bit: packed is ",
              q.packed.shape().str(), " ", dtype_name(q.packed.dtype()), " for ", l.numel,
              " values");
  if (l.nested)
    BRISK_CHECK(has(q.qabsmax, DType::u8, l.blocks()) &&
                    has(q.absmax2, DType::f32, l.nested_blocks()) && has(q.code2, DType::f32, 256),
                "dequantize_4bit: nested absmaxes of another layout");
  else
    BRISK_CHECK(has(q.absmax, DType::f32, l.blocks()), "dequantize_4bit: absmax is ",
                q.absmax.shape().str(), " for ", l.blocks(), " blocks");
  BRISK_CHECK(
      q.transposed_cols >= 0 && (q.transposed_cols == 0 || l.numel % q.transposed_cols == 0),
      "dequantize_4bit: ", l.numel, " values are not rows of ", q.transposed_cols);
  BRISK_CHECK(out.numel() == l.numel && (out.dtype() == DType::f32 || out.dtype() == DType::bf16 ||
                                         out.dtype() == DType::f16),
              "dequantize_4bit: out is ", out.shape().str(), " ", dtype_name(out.dtype()), " for ",
              l.numel, " values");
}

}  // namespace brisk

namespace brisk {

int64_t Backend::Quant4Matrix::rows() const {
  int64_t n = 0;
  for (const Quant4Part& p : parts) n += cols > 0 ? p.q.layout.numel / cols : 0;
  return n;
}

void Backend::check_quant4_matrix(const Quant4Matrix& w, const char* op) const {
  BRISK_CHECK(w.cols > 0 && !w.parts.empty(), op, ": a 4-bit weight without parts or columns");
  for (const Quant4Part& p : w.parts) {
    const int64_t n = p.q.layout.numel;
    check_dequantize_4bit(p.q, Tensor(nullptr, Shape{n}, DType::f32));
    BRISK_CHECK(p.q.transposed_cols == 0 && n % w.cols == 0, op, ": a part of ", n,
                " values is not rows of ", w.cols);
    BRISK_CHECK(p.dtype == DType::f32 || p.dtype == DType::bf16 || p.dtype == DType::f16, op,
                ": values rounded to ", dtype_name(p.dtype));
  }
  checked_mul(w.rows(), w.cols, op);  // the products' sizes come from it: refused on overflow
}

Tensor Backend::dequantize_matrix(const Quant4Matrix& w) {
  const Tensor buffer = dequantized_buffer();
  const int64_t rows = w.rows();
  const int64_t bytes =
      checked_mul(checked_mul(rows, w.cols, "a 4-bit weight"), int64_t{4}, "a 4-bit weight");
  BRISK_CHECK(static_cast<int64_t>(buffer.bytes()) >= bytes, "internal error: a [", rows, ", ",
              w.cols, "] 4-bit weight and ", buffer.bytes(),
              " bytes planned to dequantize it into (MatmulOperands::quantized)");
  const Tensor flat(buffer.data(), Shape{rows * w.cols}, DType::f32, buffer.device());
  int64_t at = 0;
  for (const Quant4Part& p : w.parts) {
    const Tensor part = element_range(flat, at, p.q.layout.numel);
    dequantize_4bit(p.q, part);
    if (p.dtype != DType::f32) round_to(p.dtype, part, part);
    if (w.fp16) round_to(DType::f16, part, part);
    at += p.q.layout.numel;
  }
  return Tensor(buffer.data(), Shape{rows, w.cols}, DType::f32, buffer.device());
}

void Backend::quantized_linear_forward(const Tensor& x, const Quant4Matrix& w, const Tensor& b,
                                       const Tensor& y) {
  check_quant4_matrix(w, "quantized_linear_forward");
  linear_forward(x, dequantize_matrix(w), b, WeightLayout::out_in, y);
}

void Backend::quantized_linear_backward(const Tensor& dy, const Quant4Matrix& w, const Tensor& dx,
                                        bool accumulate_dx) {
  check_quant4_matrix(w, "quantized_linear_backward");
  // No weight gradient: dx stands for the input, whose shape is all linear_backward reads of it.
  linear_backward(dx, dequantize_matrix(w), dy, WeightLayout::out_in, dx, accumulate_dx, Tensor(),
                  Tensor(), false);
}

}  // namespace brisk
