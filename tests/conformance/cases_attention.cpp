// Attention: training attention (forward and backward) over packed qkv with multi-head,
// grouped-query and multi-query layouts, key masks, causality, dropout and GPT-2's score scales;
// attention over the samples of padding-free and packed batches; and incremental decoding over
// key/value caches.
//
// Tolerances: 1e-5 forward (element by element), gradients 1e-4 against finite differences,
// 1e-5 against the CPU. Decoding is checked against the fp64 causal attention of the whole
// sequence at every size (no gradients, so the reference is cheap): 1e-5 norm-wise.
#include <algorithm>
#include <cmath>
#include <string>

#include "backend_support.h"
#include "conformance/op_case.h"
#include "core/rng.h"

namespace brisk::testing {
namespace {

// Attention over packed qkv [B,T,(H+2K)*D] (H query heads, then K key heads, then K value heads)
// with scores q.k * scale; query head h reads key/value head h / (H/K). The dropout mask element
// is the flat index into the probabilities [B,H,T,T]. Every query must see at least one key.
Vec ref_attention(const Vec& qkv, const Vec& mask, bool causal, int64_t B, int64_t T, int64_t H,
                  int64_t K, int64_t D, double scale, float p, const RngKey& key) {
  const int64_t C = H * D, W = (H + 2 * K) * D, G = H / K;
  const double keep_scale = 1.0 / (1.0 - double(p));
  const uint32_t threshold = dropout_threshold(p);
  Vec out(static_cast<size_t>(B * T * C), 0.0), s(static_cast<size_t>(T));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < T; ++i) {
        const double* q = &qkv[(b * T + i) * W + h * D];
        double mx = -INFINITY;
        for (int64_t j = 0; j < T; ++j) {
          if ((!mask.empty() && mask[b * T + j] == 0) || (causal && j > i)) {
            s[j] = -INFINITY;
            continue;
          }
          const double* k = &qkv[(b * T + j) * W + C + (h / G) * D];
          double d = 0;
          for (int64_t e = 0; e < D; ++e) d += q[e] * k[e];
          s[j] = d * scale;
          mx = std::max(mx, s[j]);
        }
        double sum = 0;
        for (int64_t j = 0; j < T; ++j)
          sum += (s[j] = std::isinf(s[j]) ? 0.0 : std::exp(s[j] - mx));
        for (int64_t j = 0; j < T; ++j) {
          const uint64_t pi = static_cast<uint64_t>(((b * H + h) * T + i) * T + j);
          double w = s[j] / sum;
          if (p > 0) w = dropout_keep(key, pi, threshold) ? w * keep_scale : 0.0;
          const double* v = &qkv[(b * T + j) * W + C + (K + h / G) * D];
          double* o = &out[(b * T + i) * C + h * D];
          for (int64_t e = 0; e < D; ++e) o[e] += w * v[e];
        }
      }
  return out;
}

enum class Mask {
  none,
  // Small cases: zeros at the end of each row; key 0 always kept, so no query sees an empty row;
  // any nonzero value keeps a key.
  tail,
  // Three sequences: padding at the end of sequence 0; in sequence 1 key 0 and two others
  // hidden, so that with causality query 0 sees no key at all; sequence 2 entirely hidden. A query
  // that sees no key gets a zero output, and keys no query sees get no gradient.
  empty_rows,
};

struct AttentionShape {
  int64_t B, T, H, K, D;
};

// `held`: that much of the dropout key's step given in the backend's memory
// (RngKey::step_offset), the same masks drawn.
OpCase attention_case(AttentionShape s, double scale_factor, Mask mask, bool causal, float p,
                      bool reference, uint64_t held = 0) {
  const auto [B, T, H, K, D] = s;
  const int64_t C = H * D, W = (H + 2 * K) * D;
  const float scale = static_cast<float>(scale_factor / std::sqrt(static_cast<double>(D)));
  const RngKey key{42, 3, 5};
  const char* mask_names[] = {"", "_mask", "_empty_rows"};
  OpCase c;
  c.name = "attention_B" + std::to_string(B) + "_T" + std::to_string(T) + "_H" + std::to_string(H) +
           "_K" + std::to_string(K) + "_D" + std::to_string(D) + "_scale" +
           std::to_string(static_cast<int>(std::lround(scale_factor * 100))) +
           mask_names[static_cast<int>(mask)] + (causal ? "_causal" : "") +
           (p > 0 ? "_dropout" : "") + (held > 0 ? "_step_held" : "");
  c.inputs = [=](std::mt19937& rng) {
    Vec m;
    if (mask == Mask::tail) {
      m.assign(static_cast<size_t>(B * T), 1.0);
      for (int64_t b = 0; b < B; ++b)
        for (int64_t t = T - 1 - b % 3; t < T && t > 0; ++t) m[b * T + t] = 0.0;
      m[T / 2] = 2.0;
    } else if (mask == Mask::empty_rows) {
      m.assign(static_cast<size_t>(B * T), 1.0);
      for (int64_t t = T - 6; t < T; ++t) m[t] = 0.0;
      for (int64_t t : {int64_t{0}, int64_t{7}, int64_t{20}}) m[T + t] = 0.0;
      for (int64_t t = 0; t < T; ++t) m[2 * T + t] = 0.0;
    }
    return Values{{"qkv", randn_d(B * T * W, rng)},
                  {"mask", m},
                  {"dout", randn_d(B * T * C, rng)},
                  {"dqkv0", randn_d(B * T * W, rng)}};  // overwritten
  };
  c.run = [=, c_key = key](Backend& be, const Values& in) {
    const AttentionBuffers ab = attention_buffers(be.device(), B, H, T, D);
    DeviceBuffers d(be);
    const RngKey key = held > 0 ? d.hold_step(c_key, held) : c_key;
    const Tensor q = d.put_as(in.at("qkv"), {B, T, W});
    const Tensor m = mask == Mask::none ? Tensor() : d.put_as(in.at("mask"), {B, T}, DType::i32);
    const Tensor stats = d.alloc(ab.stats), scratch = d.alloc(ab.scratch);
    const Tensor out = d.put(FVec(B * T * C, -7.f), {B, T, C});
    const Tensor g = d.put_as(in.at("dout"), {B, T, C}), dq = d.put_as(in.at("dqkv0"), {B, T, W});
    const int h = static_cast<int>(H), k = static_cast<int>(K);
    be.attention_forward(q, m, causal, h, k, scale, p, key, stats, scratch, out);
    be.attention_backward(g, q, out, stats, m, causal, h, k, scale, p, key, scratch, dq, DType::f32,
                          DType::f32);
    Values v{{"out", d.values(out)}, {"dqkv", d.values(dq)}};
    if (mask == Mask::none) {  // a mask that hides no key: the unmasked results, exactly
      const Tensor ones = d.put(std::vector<int32_t>(static_cast<size_t>(B * T), 1), {B, T});
      const Tensor out1 = d.put(FVec(B * T * C, -7.f), {B, T, C});
      const Tensor dq1 = d.put_as(in.at("dqkv0"), {B, T, W});
      be.attention_forward(q, ones, causal, h, k, scale, p, key, stats, scratch, out1);
      be.attention_backward(g, q, out1, stats, ones, causal, h, k, scale, p, key, scratch, dq1,
                            DType::f32, DType::f32);
      v["out_all_ones_less_unmasked"] = minus(d.values(out1), v["out"]);
      v["dqkv_all_ones_less_unmasked"] = minus(d.values(dq1), v["dqkv"]);
      // The gradients rounded to bf16 by the backward (round_dout, round_dqkv) against round_to
      // before and after it.
      const Tensor g2 = d.put_as(in.at("dout"), {B, T, C}),
                   dq2 = d.put_as(in.at("dqkv0"), {B, T, W});
      const Tensor g3 = d.put_as(in.at("dout"), {B, T, C}),
                   dq3 = d.put_as(in.at("dqkv0"), {B, T, W});
      const Tensor given = be.attention_backward(g2, q, out, stats, m, causal, h, k, scale, p, key,
                                                 scratch, dq2, DType::bf16, DType::bf16);
      be.round_to(DType::bf16, g3);
      be.attention_backward(g3, q, out, stats, m, causal, h, k, scale, p, key, scratch, dq3,
                            DType::f32, DType::f32);
      be.round_to(DType::bf16, dq3);
      const FVec given_values = d.floats(given);  // bf16 where products read it so
      v["dqkv_rounded_less_passes"] =
          minus(Vec(given_values.begin(), given_values.end()), d.values(dq3));
    }
    if (mask == Mask::empty_rows) {
      const Vec &o = v["out"], &dqkv = v["dqkv"];
      v["out_of_hidden_sequence"] = Vec(o.begin() + 2 * T * C, o.end());
      v["dqkv_of_hidden_sequence"] = Vec(dqkv.begin() + 2 * T * W, dqkv.end());
      v["out_of_query_without_keys"] = Vec(o.begin() + T * C, o.begin() + T * C + C);
    }
    return v;
  };
  if (reference)
    c.reference = [=](const Values& in) {
      auto f = [&](const Vec& v) {
        return ref_attention(v, in.at("mask"), causal, B, T, H, K, D, scale, p, key);
      };
      return Values{{"out", f(in.at("qkv"))},
                    {"dqkv", fd_vjp(in.at("qkv"), f, in.at("dout"))},
                    {"out_all_ones_less_unmasked", Vec(static_cast<size_t>(B * T * C), 0.0)},
                    {"dqkv_all_ones_less_unmasked", Vec(static_cast<size_t>(B * T * W), 0.0)},
                    {"dqkv_rounded_less_passes", Vec(static_cast<size_t>(B * T * W), 0.0)}};
    };
  c.checks = {{"out", Metric::elementwise, 1e-5, 1e-5}, {"dqkv", Metric::normwise, 1e-4, 1e-5}};
  if (mask == Mask::none) {
    c.checks.push_back({"out_all_ones_less_unmasked", Metric::exact});
    c.checks.push_back({"dqkv_all_ones_less_unmasked", Metric::exact});
    c.checks.push_back({"dqkv_rounded_less_passes", Metric::exact});
  }
  if (mask == Mask::empty_rows) {  // zeros on the CPU, which the small cases check
    c.checks.push_back({"out_of_hidden_sequence", Metric::exact});
    c.checks.push_back({"dqkv_of_hidden_sequence", Metric::exact});
    if (causal) c.checks.push_back({"out_of_query_without_keys", Metric::exact});
  }
  return c;
}

// (a - b) / max(1, max |b|): a difference against the largest value, for results whose sums may
// run in another order.
Vec scaled_difference(const Vec& a, const Vec& b) {
  double largest = 1.0;
  for (double x : b) largest = std::max(largest, std::abs(x));
  Vec d = minus(a, b);
  for (double& x : d) x /= largest;
  return d;
}

// A right-padded batch: row b keeps its first {T - 1, T / 3, 1}[b % 3] keys, passed as the mask and
// its rows' key counts (KeyMask::lengths), which a backend may read instead. The outputs against
// the fp64 reference (the gradient by finite differences where `differences`, in the small cases),
// and against the same call given the mask alone: the same values to 1e-5 of the largest (a
// backend that skips the padded keys adds no terms but zeros, its products' sums in an order that
// may differ).
OpCase padded_attention_case(AttentionShape s, bool causal, float p, bool differences) {
  const auto [B, T, H, K, D] = s;
  const int64_t C = H * D, W = (H + 2 * K) * D;
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));
  const RngKey key{42, 3, 5};
  OpCase c;
  c.name = "attention_B" + std::to_string(B) + "_T" + std::to_string(T) + "_H" + std::to_string(H) +
           "_K" + std::to_string(K) + "_D" + std::to_string(D) + "_padded" +
           (causal ? "_causal" : "") + (p > 0 ? "_dropout" : "");
  auto kept = [=](int64_t b) {
    return b % 3 == 0 ? T - 1 : b % 3 == 1 ? std::max<int64_t>(1, T / 3) : 1;
  };
  c.inputs = [=](std::mt19937& rng) {
    Vec m(static_cast<size_t>(B * T), 0.0);
    for (int64_t b = 0; b < B; ++b) std::fill(m.begin() + b * T, m.begin() + b * T + kept(b), 1.0);
    return Values{{"qkv", randn_d(B * T * W, rng)}, {"mask", m}, {"dout", randn_d(B * T * C, rng)}};
  };
  c.run = [=](Backend& be, const Values& in) {
    const AttentionBuffers ab = attention_buffers(be.device(), B, H, T, D);
    DeviceBuffers d(be);
    std::vector<int32_t> n(static_cast<size_t>(B));
    for (int64_t b = 0; b < B; ++b) n[static_cast<size_t>(b)] = static_cast<int32_t>(kept(b));
    const Tensor q = d.put_as(in.at("qkv"), {B, T, W});
    const Tensor m = d.put_as(in.at("mask"), {B, T}, DType::i32);
    const KeyMask padded(m, d.put(n, {B}));
    const Tensor stats = d.alloc(ab.stats), scratch = d.alloc(ab.scratch);
    const Tensor g = d.put_as(in.at("dout"), {B, T, C});
    const int h = static_cast<int>(H), k = static_cast<int>(K);
    Values v;
    for (const KeyMask* mask : {&padded, static_cast<const KeyMask*>(nullptr)}) {
      const Tensor out = d.put(FVec(B * T * C, -7.f), {B, T, C});
      const Tensor dq = d.put(FVec(B * T * W, -7.f), {B, T, W});
      const KeyMask& used = mask ? *mask : KeyMask(m);
      be.attention_forward(q, used, causal, h, k, scale, p, key, stats, scratch, out);
      be.attention_backward(g, q, out, stats, used, causal, h, k, scale, p, key, scratch, dq,
                            DType::f32, DType::f32);
      if (mask) {
        v["out"] = d.values(out);
        v["dqkv"] = d.values(dq);
      } else {
        v["out_padded_less_masked"] = scaled_difference(v["out"], d.values(out));
        v["dqkv_padded_less_masked"] = scaled_difference(v["dqkv"], d.values(dq));
      }
    }
    return v;
  };
  c.reference = [=](const Values& in) {
    auto f = [&](const Vec& v) {
      return ref_attention(v, in.at("mask"), causal, B, T, H, K, D, scale, p, key);
    };
    Values want{{"out", f(in.at("qkv"))},
                {"out_padded_less_masked", Vec(static_cast<size_t>(B * T * C), 0.0)},
                {"dqkv_padded_less_masked", Vec(static_cast<size_t>(B * T * W), 0.0)}};
    if (differences) want["dqkv"] = fd_vjp(in.at("qkv"), f, in.at("dout"));
    return want;
  };
  c.checks = {{"out", Metric::elementwise, 1e-5, 1e-5},
              {"out_padded_less_masked", Metric::elementwise, 1e-5, 1e-5},
              {"dqkv_padded_less_masked", Metric::elementwise, 1e-5, 1e-5}};
  if (differences) c.checks.push_back({"dqkv", Metric::normwise, 1e-4, 1e-5});
  return c;
}

// A prompt and then further chunks fed to attention_decode over caches of S positions: each
// chunk's output is the causal attention of the whole sequence at its positions, and the caches
// hold every position's key and value (zeros after).
OpCase decode_case(int64_t B, int64_t H, int64_t K, int64_t D, int64_t S,
                   std::vector<int64_t> chunks, double scale_factor) {
  const int64_t C = H * D, KD = K * D, W = C + 2 * KD;
  int64_t T = 0;
  for (int64_t n : chunks) T += n;
  const float scale = static_cast<float>(scale_factor / std::sqrt(static_cast<double>(D)));
  OpCase c;
  c.name = "decode_B" + std::to_string(B) + "_H" + std::to_string(H) + "_K" + std::to_string(K) +
           "_D" + std::to_string(D) + "_prompt" + std::to_string(chunks[0]) + "_T" +
           std::to_string(T) + "_scale" + std::to_string(static_cast<int>(scale_factor * 100));
  c.inputs = [=](std::mt19937& rng) { return Values{{"qkv", randn_d(B * T * W, rng)}}; };
  c.run = [=](Backend& be, const Values& in) {
    DeviceBuffers d(be);
    const Tensor kc = d.put(FVec(B * S * KD, 0.f), {B, S, KD});
    const Tensor vc = d.put(FVec(B * S * KD, 0.f), {B, S, KD});
    Values outs;
    int64_t past = 0;
    for (int64_t n : chunks) {
      Vec chunk;
      for (int64_t b = 0; b < B; ++b)
        chunk.insert(chunk.end(), in.at("qkv").begin() + (b * T + past) * W,
                     in.at("qkv").begin() + (b * T + past + n) * W);
      const Tensor out = d.put(FVec(B * n * C, -7.f), {B, n, C});
      be.attention_decode(d.put_as(chunk, {B, n, W}), kc, vc, past, static_cast<int>(H),
                          static_cast<int>(K), scale, out);
      outs["out_from_" + std::to_string(past)] = d.values(out);
      past += n;
    }
    outs["k_cache"] = d.values(kc);
    outs["v_cache"] = d.values(vc);
    return outs;
  };
  c.reference = [=](const Values& in) {
    const Vec& qkv = in.at("qkv");
    const Vec all = ref_attention(qkv, Vec(), true, B, T, H, K, D, scale, 0.f, RngKey{});
    Values want;
    int64_t past = 0;
    for (int64_t n : chunks) {
      Vec& o = want["out_from_" + std::to_string(past)];
      for (int64_t b = 0; b < B; ++b)
        o.insert(o.end(), all.begin() + (b * T + past) * C, all.begin() + (b * T + past + n) * C);
      past += n;
    }
    Vec kc(static_cast<size_t>(B * S * KD), 0.0), vc(kc.size(), 0.0);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t)
        for (int64_t j = 0; j < KD; ++j) {
          kc[(b * S + t) * KD + j] = qkv[(b * T + t) * W + C + j];
          vc[(b * S + t) * KD + j] = qkv[(b * T + t) * W + C + KD + j];
        }
    want["k_cache"] = kc;
    want["v_cache"] = vc;
    return want;
  };
  int64_t past = 0;
  for (int64_t n : chunks) {
    c.checks.push_back({"out_from_" + std::to_string(past), Metric::normwise, 1e-5, 1e-5});
    past += n;
  }
  c.checks.push_back({"k_cache", Metric::exact});
  c.checks.push_back({"v_cache", Metric::exact});
  return c;
}

// A padding-free or packed batch: rows of T tokens holding samples of the given lengths end to end
// (a row's lengths sum to T). Each sample against the fp64 attention of that sample alone (its
// dropout stream: the key's seed plus (s + 1) x 0x9E3779B97F4A7C15, packed_attention_forward's
// contract), the gradient by finite differences; and the gradient rounded to bf16 by the backward
// against round_to after it.
OpCase packed_attention_case(std::vector<std::vector<int64_t>> rows, int64_t H, int64_t K,
                             int64_t D, bool causal, float p) {
  const int64_t B = static_cast<int64_t>(rows.size());
  int64_t T = 0;
  for (int64_t n : rows[0]) T += n;
  const int64_t C = H * D, W = (H + 2 * K) * D;
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));
  const RngKey key{42, 3, 5};
  PackedSamples samples{{0}};
  for (const auto& row : rows)
    for (int64_t n : row) samples.starts.push_back(samples.starts.back() + n);
  OpCase c;
  c.name = "packed_attention_B" + std::to_string(B) + "_T" + std::to_string(T) + "_S" +
           std::to_string(samples.count()) + "_H" + std::to_string(H) + "_K" + std::to_string(K) +
           "_D" + std::to_string(D) + (causal ? "_causal" : "") + (p > 0 ? "_dropout" : "");
  c.inputs = [=](std::mt19937& rng) {
    return Values{{"qkv", randn_d(B * T * W, rng)}, {"dout", randn_d(B * T * C, rng)}};
  };
  c.run = [=](Backend& be, const Values& in) {
    const AttentionBuffers ab = attention_buffers(be.device(), B, H, T, D);
    DeviceBuffers d(be);
    const Tensor q = d.put_as(in.at("qkv"), {B, T, W});
    const Tensor stats = d.alloc(ab.stats), scratch = d.alloc(ab.scratch);
    const Tensor out = d.put(FVec(B * T * C, -7.f), {B, T, C});
    const Tensor g = d.put_as(in.at("dout"), {B, T, C});
    const Tensor dq = d.put(FVec(B * T * W, -7.f), {B, T, W});
    const Tensor dq16 = d.put(FVec(B * T * W, -7.f), {B, T, W});
    const int h = static_cast<int>(H), k = static_cast<int>(K);
    be.packed_attention_forward(q, samples, causal, h, k, scale, p, key, stats, scratch, out);
    be.packed_attention_backward(g, q, out, stats, samples, causal, h, k, scale, p, key, scratch,
                                 dq, DType::f32, DType::f32);
    be.packed_attention_backward(g, q, out, stats, samples, causal, h, k, scale, p, key, scratch,
                                 dq16, DType::f32, DType::bf16);
    Values v{{"out", d.values(out)}, {"dqkv", d.values(dq)}};
    be.round_to(DType::bf16, dq);
    v["dqkv_rounded_less_passes"] = minus(d.values(dq16), d.values(dq));
    return v;
  };
  c.reference = [=](const Values& in) {
    auto f = [&](const Vec& x) {
      Vec out(static_cast<size_t>(B * T * C), 0.0);
      for (int64_t s = 0; s < samples.count(); ++s) {
        const int64_t first = samples.starts[static_cast<size_t>(s)], len = samples.length(s);
        RngKey ks = key;
        ks.seed = key.seed + static_cast<uint64_t>(s + 1) * 0x9E3779B97F4A7C15ull;
        const Vec one(x.begin() + first * W, x.begin() + (first + len) * W);
        const Vec o = ref_attention(one, Vec(), causal, 1, len, H, K, D, scale, p, ks);
        std::copy(o.begin(), o.end(), out.begin() + first * C);
      }
      return out;
    };
    return Values{{"out", f(in.at("qkv"))},
                  {"dqkv", fd_vjp(in.at("qkv"), f, in.at("dout"))},
                  {"dqkv_rounded_less_passes", Vec(static_cast<size_t>(B * T * W), 0.0)}};
  };
  c.checks = {{"out", Metric::elementwise, 1e-5, 1e-5},
              {"dqkv", Metric::normwise, 1e-4, 1e-5},
              {"dqkv_rounded_less_passes", Metric::exact}};
  return c;
}

}  // namespace

std::vector<OpCase> attention_cases() {
  std::vector<OpCase> cases;
  // Small, against finite differences. Scales: the usual 1/sqrt(D), 1 (GPT-2 with
  // scale_attn_weights false: sqrt(D) times the usual) and 1/(3 sqrt(D)) (GPT-2's
  // scale_attn_by_inverse_layer_idx in its third layer).
  const AttentionShape mha{2, 5, 3, 3, 4};
  for (double scale : {1.0, 2.0, 1.0 / 3})
    for (Mask mask : {Mask::none, Mask::tail})
      for (bool causal : {false, true})
        for (float p : {0.f, 0.3f})
          cases.push_back(attention_case(mha, scale, mask, causal, p, true));
  // Grouped-query ratios 2 and 3 and multi-query, odd head widths.
  for (const AttentionShape& s : {AttentionShape{2, 5, 4, 2, 3}, AttentionShape{2, 5, 6, 2, 5},
                                  AttentionShape{2, 5, 3, 1, 4}})
    for (bool causal : {false, true})
      for (float p : {0.f, 0.2f})
        cases.push_back(attention_case(s, 1.0, Mask::tail, causal, p, true));
  // A GPU's tiles: T = 45 leaves partial tiles (64 queries forward, 32 backward), 130 takes
  // several; D = 80 uses a wide-head path with idle feature slots; D = 33 is odd, 128 Llama's.
  for (int64_t T : {45, 130})
    for (int64_t D : {16, 64, 80})
      for (bool causal : {false, true})
        for (float p : {0.f, 0.1f})
          cases.push_back(attention_case({3, T, 2, 2, D}, T == 45 ? 1.0 : 0.5, Mask::empty_rows,
                                         causal, p, false));
  for (int64_t T : {45, 130})
    for (int64_t D : {33, 128})
      for (const auto& [H, K] : {std::pair<int64_t, int64_t>{4, 2}, {6, 2}, {3, 1}})
        for (bool causal : {false, true})
          cases.push_back(
              attention_case({2, T, H, K, D}, 1.0, Mask::none, causal, causal ? 0.1f : 0.f, false));
  // Dropout's step in the backend's memory: small, and a GPU's tiles.
  for (bool causal : {false, true})
    cases.push_back(attention_case(mha, 1.0, Mask::tail, causal, 0.3f, true, 2));
  cases.push_back(attention_case({3, 130, 2, 2, 64}, 0.5, Mask::empty_rows, true, 0.1f, false, 2));
  // Right-padded batches given with their rows' key counts: small against finite differences; a
  // CPU's several blocks of queries (T = 130), odd key counts (15, 43).
  for (bool causal : {false, true})
    for (float p : {0.f, 0.3f}) cases.push_back(padded_attention_case(mha, causal, p, true));
  cases.push_back(padded_attention_case({2, 5, 4, 2, 3}, true, 0.2f, true));
  for (int64_t T : {45, 130})
    for (bool causal : {false, true})
      cases.push_back(padded_attention_case({3, T, 2, 2, 64}, causal, causal ? 0.1f : 0.f, false));
  // Decoding: a prompt, one token, more tokens; at the usual scale and another.
  // Padding-free (one row of samples) and packed (rows of samples with a padding sample) batches:
  // samples of one token, a row that is one sample, grouped-query heads.
  for (bool causal : {false, true}) {
    cases.push_back(packed_attention_case({{3, 1, 5, 2}}, 3, 3, 4, causal, 0.f));
    cases.push_back(packed_attention_case({{4, 2, 1}, {7}}, 4, 2, 3, causal, 0.f));
    cases.push_back(packed_attention_case({{2, 5}, {1, 4, 2}}, 2, 2, 4, causal, 0.25f));
  }
  cases.push_back(decode_case(2, 3, 3, 5, 12, {4, 1, 4}, 1.0));
  cases.push_back(decode_case(2, 3, 3, 5, 12, {4, 1, 4}, std::sqrt(5.0)));
  cases.push_back(decode_case(2, 6, 2, 3, 9, {3, 1, 3}, 1.0));
  // More keys than a GPU kernel's block (several chunks of the value pass), a head width above
  // its block (several columns per thread), GQA and MQA caches.
  cases.push_back(decode_case(2, 2, 2, 160, 300, {5, 1, 1, 1}, 1.0));
  cases.push_back(decode_case(2, 2, 2, 160, 300, {250, 1, 1, 1}, 0.5));
  cases.push_back(decode_case(2, 4, 2, 72, 200, {150, 1, 1, 3}, 1.0));
  cases.push_back(decode_case(2, 6, 1, 72, 200, {150, 1, 1, 3}, 1.0));
  return cases;
}

}  // namespace brisk::testing
