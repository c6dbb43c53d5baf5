#include "models/moe_layer.h"

#include <algorithm>
#include <cmath>

#include "core/checked.h"

namespace brisk {

namespace {

std::function<void(const char*)>& phase_hook() {
  static std::function<void(const char*)> hook;
  return hook;
}

void phase_done(const char* phase) {
  if (phase_hook()) phase_hook()(phase);
}

// Expert e's [rows, cols] matrix of a [E, rows, cols] tensor (none of none: a frozen weight's
// gradient).
Tensor expert_matrix(const Tensor& t, int64_t e) {
  if (t.empty()) return Tensor();
  return Tensor(element_range(t, e * t.dim(1) * t.dim(2), t.dim(1) * t.dim(2)).data(),
                Shape{t.dim(1), t.dim(2)}, t.dtype(), t.device());
}

// Expert e's A [r, in] and B [out, r] of a LoRA (MoeLora).
Tensor lora_a(const MoeLora& l, int64_t e) {
  return row_range(l.a, e * l.r, l.r);
}
Tensor lora_b(const MoeLora& l, int64_t e) {
  const int64_t out = l.b.dim(0) / (l.a.dim(0) / l.r);
  return row_range(l.b, e * out, out);
}

// y (expert e's n rows from `first`) += its LoRA's term of x, u kept.
void lora_rows_forward(Backend& be, const MoeLora& l, int64_t e, int64_t first, int64_t n,
                       const Tensor& x, const Tensor& y) {
  if (!l.on() || n == 0) return;
  be.lora_forward(x, lora_a(l, e), lora_b(l, e), l.scale, row_range(l.u, first, n), y, 0);
}

// Its backward: the gradients of A_e and B_e added to (where trained), dx += the term's.
void lora_rows_backward(Backend& be, const MoeLora& l, const MoeLora& g, int64_t e, int64_t first,
                        int64_t n, const Tensor& x, const Tensor& dy, const Tensor& dx) {
  if (!l.on() || n == 0) return;
  const bool trained = !g.a.empty();
  be.lora_backward(x, lora_a(l, e), lora_b(l, e), l.scale, row_range(l.u, first, n), dy, 0,
                   row_range(l.v, first, n), trained ? lora_a(g, e) : Tensor(),
                   trained ? lora_b(g, e) : Tensor(), dx, true);
}

// The rows expert e computes of the `count` routed to it.
int64_t kept_rows(const MoeShape& s, int64_t count) {
  return s.capacity > 0 ? std::min(count, s.capacity) : count;
}

// f(e, e's first routed row, the rows it computes) for every expert, in order.
template <typename F>
void for_each_expert(const MoeShape& s, const std::vector<int32_t>& counts, F f) {
  int64_t first = 0;
  for (size_t e = 0; e < static_cast<size_t>(s.experts); ++e) {
    f(static_cast<int64_t>(e), first, kept_rows(s, counts[e]));
    first += counts[e];
  }
}

// f(local expert, its block's first row, the block's rows, whether it is the expert's first block)
// for each block of rows this rank's experts compute, in row order (counts as moe_forward gives
// them): each expert's routed rows with every expert here; under expert parallelism each rank's
// rows for each local expert, rank after rank.
template <typename F>
void for_each_block(const MoeShape& s, const std::vector<int32_t>& counts, F f) {
  if (s.expert_ranks == 1) {
    for_each_expert(s, counts, [&](int64_t e, int64_t first, int64_t n) { f(e, first, n, true); });
    return;
  }
  const int64_t local = moe_local_experts(s);
  int64_t first = 0;
  for (int64_t r = 0; r < s.expert_ranks; ++r)
    for (int64_t e = 0; e < local; ++e) {
      const int64_t n = counts[static_cast<size_t>(s.experts + r * local + e)];
      f(e, first, n, r == 0);
      first += n;
    }
}

// Expert parallelism's traffic in rows (counts as moe_forward gives them): send[r], this rank's
// routed rows for rank r's experts (one run of the rows grouped by expert); receive[r], rank r's
// for this rank's experts.
struct Traffic {
  std::vector<int64_t> send, receive;
  int64_t received = 0;
};
Traffic traffic(const MoeShape& s, const std::vector<int32_t>& counts) {
  const int64_t local = moe_local_experts(s);
  Traffic t{std::vector<int64_t>(static_cast<size_t>(s.expert_ranks), 0),
            std::vector<int64_t>(static_cast<size_t>(s.expert_ranks), 0)};
  for (int64_t r = 0; r < s.expert_ranks; ++r)
    for (int64_t e = 0; e < local; ++e) {
      t.send[static_cast<size_t>(r)] += kept_rows(s, counts[static_cast<size_t>(r * local + e)]);
      t.receive[static_cast<size_t>(r)] += counts[static_cast<size_t>(s.experts + r * local + e)];
    }
  for (const int64_t n : t.receive) t.received += n;
  return t;
}

// The rows this rank sends.
int64_t sent_rows(const Traffic& t) {
  int64_t n = 0;
  for (const int64_t r : t.send) n += r;
  return n;
}

// After this rank's E routed counts, what every rank of the group sends this rank's experts (the
// rows it routed to them, those within its capacity where there is one).
void count_received(const MoeShape& s, ExpertGroup& group, std::vector<int32_t>& counts) {
  std::vector<int32_t> sent(counts);
  for (int32_t& n : sent) n = static_cast<int32_t>(kept_rows(s, n));
  const std::vector<int32_t> all = group.all_gather(sent);
  const int64_t local = moe_local_experts(s), mine = group.rank() * local;
  for (int64_t r = 0; r < s.expert_ranks; ++r)
    for (int64_t e = 0; e < local; ++e)
      counts.push_back(all[static_cast<size_t>(r * s.experts + mine + e)]);
}

// Rows [.., C] to the ranks and from them (counts in rows).
void exchange_rows(Backend& be, ExpertGroup& group, const Tensor& in,
                   const std::vector<int64_t>& send, const Tensor& out,
                   const std::vector<int64_t>& receive) {
  const int64_t C = in.dim(1);
  std::vector<int64_t> send_elements, receive_elements;
  for (const int64_t n : send) send_elements.push_back(n * C);
  for (const int64_t n : receive) receive_elements.push_back(n * C);
  group.all_to_all_v(be, in, send_elements, out, receive_elements);
}

// Under expert parallelism with a capacity, the rows each rank sends are its kept ones: those of
// `sorted` (this rank's routed rows grouped by expert) packed one after another into `packed`, and
// back (the dropped rows zeroed). Without a capacity, `sorted` itself.
Tensor pack_kept(Backend& be, const MoeShape& s, const std::vector<int32_t>& counts,
                 const Tensor& sorted, const Tensor& packed) {
  if (s.capacity == 0) return sorted;
  int64_t at = 0;
  for_each_expert(s, counts, [&](int64_t, int64_t first, int64_t kept) {
    if (kept > 0) be.copy(row_range(sorted, first, kept), row_range(packed, at, kept));
    at += kept;
  });
  return row_range(packed, 0, at);
}
void zero_dropped(Backend& be, const MoeShape& s, const std::vector<int32_t>& counts,
                  const Tensor& t);
void unpack_kept(Backend& be, const MoeShape& s, const std::vector<int32_t>& counts,
                 const Tensor& packed, const Tensor& sorted) {
  if (s.capacity == 0) return;
  int64_t at = 0;
  for_each_expert(s, counts, [&](int64_t, int64_t first, int64_t kept) {
    if (kept > 0) be.copy(row_range(packed, at, kept), row_range(sorted, first, kept));
    at += kept;
  });
  zero_dropped(be, s, counts, sorted);
}

// Zeroes rows [.., C] of `t` (this rank's routed rows, grouped by expert: the first E counts) that
// their experts dropped (past the capacity).
void zero_dropped(Backend& be, const MoeShape& s, const std::vector<int32_t>& counts,
                  const Tensor& t) {
  if (s.capacity == 0) return;
  int64_t first = 0;
  for (int64_t e = 0; e < s.experts; ++e) {
    const int32_t count = counts[static_cast<size_t>(e)];
    const int64_t kept = kept_rows(s, count);
    if (kept < count) be.fill(row_range(t, first + kept, count - kept), 0.0f);
    first += count;
  }
}

void check_moe(const MoeShape& s, const MoeWeights& w, const Tensor& x, const ExpertGroup* group,
               const char* op) {
  BRISK_CHECK(s.experts >= 1 && s.top_k >= 1 && s.top_k <= s.experts, op, ": top ", s.top_k, " of ",
              s.experts, " experts");
  BRISK_CHECK(s.expert_ranks >= 1 && s.experts % s.expert_ranks == 0, op, ": ", s.experts,
              " experts over ", s.expert_ranks, " ranks");
  BRISK_CHECK(s.expert_ranks == 1 || (group && group->size() == s.expert_ranks), op,
              ": expert parallelism over ", s.expert_ranks, " ranks needs their group");
  const int64_t E = moe_local_experts(s);
  BRISK_CHECK(x.numel() == checked_mul(s.tokens, s.hidden, op), op, ": input ", x.shape().str(),
              " is not [", s.tokens, ", ", s.hidden, "]");
  BRISK_CHECK(w.router.shape() == Shape({s.experts, s.hidden}) &&
                  w.gate_up.shape() == Shape({E, 2 * s.inner, s.hidden}) &&
                  w.down.shape() == Shape({E, s.hidden, s.inner}),
              op, ": expert weights ", w.router.shape().str(), ", ", w.gate_up.shape().str(), ", ",
              w.down.shape().str(), " do not fit ", s.experts, " experts (", E, " here) of ",
              s.hidden, " -> ", s.inner);
  const int64_t S = s.shared_inner;
  BRISK_CHECK(S == 0 || (w.shared_gate_up.shape() == Shape({2 * S, s.hidden}) &&
                         w.shared_down.shape() == Shape({s.hidden, S}) &&
                         w.shared_gate.shape() == Shape({1, s.hidden})),
              op, ": shared expert weights ", w.shared_gate_up.shape().str(), ", ",
              w.shared_down.shape().str(), ", ", w.shared_gate.shape().str(), " do not fit ",
              s.hidden, " -> ", S);
}

// y += sigmoid(x . shared_gate) * the shared expert's SwiGLU MLP of x, row by row (moe_combine
// without positions: each token's own row); the products' adapters added to them.
void shared_forward(Backend& be, const MoeWeights& w, const Tensor& x, const MoeSaved& saved,
                    const Tensor& y, const LayerAdapters& a) {
  const WeightLayout out_in = WeightLayout::out_in;
  be.linear_forward(x, w.shared_gate_up, Tensor(), out_in, saved.shared_gate_up);
  a.forward(be, ProductSite::shared_fc, x, saved.shared_gate_up);
  be.swiglu_forward(saved.shared_gate_up, saved.shared_act);
  be.linear_forward(saved.shared_act, w.shared_down, Tensor(), out_in, saved.shared_out);
  a.forward(be, ProductSite::shared_out, saved.shared_act, saved.shared_out);
  be.linear_forward(x, w.shared_gate, Tensor(), out_in, saved.shared_logit);
  a.forward(be, ProductSite::shared_gate, x, saved.shared_logit);
  be.activation_forward(Activation::sigmoid, saved.shared_logit, saved.shared_scale);
  be.moe_combine(saved.shared_out, Tensor(), saved.shared_scale, y, true);
}

// shared_forward's backward: its gradients written (or added to), dx added to.
void shared_backward(Backend& be, const MoeWeights& w, const MoeWeights& g, const Tensor& x,
                     const MoeSaved& saved, const MoeScratch& scratch, const Tensor& dy,
                     const Tensor& dx, bool accumulate_dw, const LayerAdapters& a) {
  const WeightLayout out_in = WeightLayout::out_in;
  be.moe_combine_backward(dy, saved.shared_out, Tensor(), saved.shared_scale, scratch.d_shared_out,
                          scratch.d_shared_scale);
  be.activation_backward(Activation::sigmoid, saved.shared_logit, scratch.d_shared_scale,
                         scratch.d_shared_scale, DType::f32);
  a.linear_backward(be, ProductSite::shared_out, saved.shared_act, w.shared_down,
                    scratch.d_shared_out, out_in, scratch.d_shared_act, false, g.shared_down,
                    Tensor(), accumulate_dw);
  be.swiglu_backward(saved.shared_gate_up, scratch.d_shared_act, scratch.d_shared_gate_up,
                     DType::f32);
  a.linear_backward(be, ProductSite::shared_fc, x, w.shared_gate_up, scratch.d_shared_gate_up,
                    out_in, dx, true, g.shared_gate_up, Tensor(), accumulate_dw);
  a.linear_backward(be, ProductSite::shared_gate, x, w.shared_gate, scratch.d_shared_scale, out_in,
                    dx, true, g.shared_gate, Tensor(), accumulate_dw);
}

}  // namespace

int64_t moe_local_experts(const MoeShape& s) {
  return s.expert_ranks > 1 ? s.experts / s.expert_ranks : s.experts;
}

int64_t moe_expert_rows(const MoeShape& s) {
  if (s.expert_ranks == 1) return checked_mul(s.tokens, s.top_k, "moe rows");
  const int64_t per_token = std::min(s.top_k, moe_local_experts(s));
  const int64_t tokens = std::max(s.tokens, s.peer_tokens);
  const int64_t rows =
      checked_mul(checked_mul(s.expert_ranks, tokens, "moe rows"), per_token, "moe rows");
  // With a capacity each rank sends each expert at most its capacity's rows.
  const int64_t capacity = std::max(s.capacity, s.peer_capacity);
  if (capacity == 0) return rows;
  return std::min(rows, checked_mul(s.experts, capacity, "moe rows"));
}

void declare_moe_saved(const MoeShape& s, MoeSaved& m, const MoeDeclare& declare) {
  const int64_t N = s.tokens, k = s.top_k, E = s.experts, rows = checked_mul(N, k, "moe rows");
  const int64_t R = moe_expert_rows(s);
  auto f32 = [&](Tensor* t, const char* name, Shape shape) {
    declare(t, std::string("saved.") + name, DType::f32, shape);
  };
  f32(&m.probs, "probs", {N, E});
  f32(&m.weights, "weights", {N, k});
  declare(&m.experts, "saved.experts", DType::i32, {N, k});
  declare(&m.positions, "saved.positions", DType::i32, {N, k});
  declare(&m.counts, "saved.counts", DType::i32, {E});
  f32(&m.rows, "rows", {R, s.hidden});
  f32(&m.gate_up, "gate_up", {R, 2 * s.inner});
  f32(&m.act, "act", {R, s.inner});
  f32(&m.out, "out", {rows, s.hidden});
  if (s.z_loss) f32(&m.z, "z", {N});
  if (s.shared_inner == 0) return;
  f32(&m.shared_logit, "shared_logit", {N, 1});
  f32(&m.shared_scale, "shared_scale", {N, 1});
  f32(&m.shared_gate_up, "shared_gate_up", {N, 2 * s.shared_inner});
  f32(&m.shared_act, "shared_act", {N, s.shared_inner});
  f32(&m.shared_out, "shared_out", {N, s.hidden});
}

void declare_moe_scratch(const MoeShape& s, MoeScratch& m, const MoeDeclare& declare) {
  const int64_t N = s.tokens, k = s.top_k, rows = checked_mul(N, k, "moe rows");
  const int64_t R = moe_expert_rows(s);
  auto f32 = [&](Tensor* t, const char* name, Shape shape) {
    declare(t, std::string("scratch.") + name, DType::f32, shape);
  };
  f32(&m.logits, "logits", {N, s.experts});
  f32(&m.d_out, "d_out", {rows, s.hidden});
  f32(&m.dweights, "dweights", {N, k});
  f32(&m.d_act, "d_act", {R, s.inner});
  f32(&m.d_gate_up, "d_gate_up", {R, 2 * s.inner});
  f32(&m.d_rows, "d_rows", {R, s.hidden});
  if (s.expert_ranks > 1) f32(&m.expert_out, "expert_out", {R, s.hidden});
  if (s.expert_ranks > 1 && s.capacity > 0) f32(&m.sent, "sent", {rows, s.hidden});
  if (s.shared_inner == 0) return;
  f32(&m.d_shared_out, "d_shared_out", {N, s.hidden});
  f32(&m.d_shared_scale, "d_shared_scale", {N, 1});
  f32(&m.d_shared_act, "d_shared_act", {N, s.shared_inner});
  f32(&m.d_shared_gate_up, "d_shared_gate_up", {N, 2 * s.shared_inner});
}

int64_t moe_dropped(const MoeShape& s, const std::vector<int32_t>& counts) {
  int64_t dropped = 0;
  for (int64_t e = 0; e < s.experts; ++e) {
    const int32_t count = counts.at(static_cast<size_t>(e));
    dropped += count - kept_rows(s, count);
  }
  return dropped;
}

int64_t moe_capacity(double factor, int64_t tokens, int64_t top_k, int64_t experts) {
  if (factor <= 0) return 0;
  const double rows = std::ceil(factor * static_cast<double>(tokens) * static_cast<double>(top_k) /
                                static_cast<double>(experts));
  // An expert takes a token once at most: N rows is no cap.
  return rows >= static_cast<double>(tokens) ? tokens
                                             : std::max<int64_t>(1, static_cast<int64_t>(rows));
}

void set_moe_phase_hook(std::function<void(const char*)> hook) {
  phase_hook() = std::move(hook);
}

MoeSaved moe_saved_rows(const MoeSaved& m, int64_t tokens, int64_t top_k) {
  auto first = [](const Tensor& t, int64_t n) { return t.empty() ? t : row_range(t, 0, n); };
  const int64_t N = tokens, rows = checked_mul(tokens, top_k, "moe rows");
  return {first(m.probs, N),
          first(m.weights, N),
          first(m.experts, N),
          first(m.positions, N),
          m.counts,
          first(m.rows, rows),
          first(m.gate_up, rows),
          first(m.act, rows),
          first(m.out, rows),
          first(m.shared_logit, N),
          first(m.shared_scale, N),
          first(m.shared_gate_up, N),
          first(m.shared_act, N),
          first(m.shared_out, N),
          first(m.z, N)};
}

MoeBalanceLoss moe_balance_loss(const std::vector<std::vector<float>>& stats, int64_t experts,
                                int64_t tokens, double coef) {
  const int64_t E = experts;
  BRISK_CHECK(!stats.empty() && tokens > 0, "the load-balancing loss needs a layer and a token");
  std::vector<double> routed(E, 0.0), prob(E, 0.0);
  for (const std::vector<float>& s : stats) {
    BRISK_CHECK(static_cast<int64_t>(s.size()) == 2 * E, "load-balancing statistics of ", s.size(),
                " values for ", E, " experts");
    for (int64_t e = 0; e < E; ++e) {
      routed[e] += s[e];
      prob[e] += s[E + e];
    }
  }
  const double denom = static_cast<double>(stats.size()) * static_cast<double>(tokens);
  MoeBalanceLoss out;
  out.scale.resize(E);
  for (int64_t e = 0; e < E; ++e) {
    const double f = routed[e] / denom;
    out.loss += static_cast<double>(E) * f * (prob[e] / denom);
    out.scale[e] = static_cast<float>(coef * static_cast<double>(E) * f / denom);
  }
  return out;
}

void moe_forward(Backend& be, const MoeShape& s, const MoeWeights& w, const Tensor& x,
                 const MoeSaved& saved, const MoeScratch& scratch, const Tensor& y,
                 std::vector<int32_t>& counts, const MoeZLoss& z, ExpertGroup* group,
                 const LayerAdapters& adapters) {
  check_moe(s, w, x, group, "moe_forward");
  const WeightLayout out_in = WeightLayout::out_in;
  be.linear_forward(x, w.router, Tensor(), out_in, scratch.logits);
  adapters.forward(be, ProductSite::router, x, scratch.logits);
  if (s.z_loss) be.moe_z_stats(scratch.logits, z.mask, saved.z, z.sum);
  be.moe_route_forward(scratch.logits, s.normalize, saved.probs, saved.weights, saved.experts);
  phase_done("router");
  be.moe_dispatch(saved.experts, s.experts, saved.counts, saved.positions);
  counts.assign(s.experts, 0);
  be.download(saved.counts, Tensor(counts.data(), Shape{s.experts}, DType::i32, Device::cpu));
  // Under expert parallelism the routed rows are gathered into `out` (free until their outputs
  // come back) and sent to their experts' ranks.
  const bool across = s.expert_ranks > 1;
  be.moe_gather(x, saved.positions, across ? saved.out : saved.rows);
  Traffic t;
  if (across) {
    count_received(s, *group, counts);
    t = traffic(s, counts);
    exchange_rows(be, *group, pack_kept(be, s, counts, saved.out, scratch.sent), t.send,
                  row_range(saved.rows, 0, t.received), t.receive);
  }
  const int64_t R = across ? t.received : s.tokens * s.top_k;
  phase_done("dispatch");
  const Tensor out = across ? scratch.expert_out : saved.out;
  for_each_block(s, counts, [&](int64_t e, int64_t first, int64_t n, bool) {
    if (n == 0) return;
    const Tensor rows = row_range(saved.rows, first, n),
                 gate_up = row_range(saved.gate_up, first, n);
    be.linear_forward(rows, expert_matrix(w.gate_up, e), Tensor(), out_in, gate_up);
    lora_rows_forward(be, w.gate_up_lora, e, first, n, rows, gate_up);
  });
  if (R > 0) be.swiglu_forward(row_range(saved.gate_up, 0, R), row_range(saved.act, 0, R));
  for_each_block(s, counts, [&](int64_t e, int64_t first, int64_t n, bool) {
    if (n == 0) return;
    const Tensor act = row_range(saved.act, first, n), rows_out = row_range(out, first, n);
    be.linear_forward(act, expert_matrix(w.down, e), Tensor(), out_in, rows_out);
    lora_rows_forward(be, w.down_lora, e, first, n, act, rows_out);
  });
  phase_done("experts");
  // Under expert parallelism each rank drops its own pairs past the capacity (as data
  // parallelism's ranks do) and sends only the rest; a dropped pair adds nothing.
  if (across) {
    const Tensor back = s.capacity > 0 ? row_range(scratch.sent, 0, sent_rows(t)) : saved.out;
    exchange_rows(be, *group, row_range(out, 0, R), t.receive, back, t.send);
    unpack_kept(be, s, counts, back, saved.out);
  } else {
    zero_dropped(be, s, counts, saved.out);
  }
  be.moe_combine(saved.out, saved.positions, saved.weights, y, false);
  phase_done("combine");
  if (s.shared_inner == 0) return;
  shared_forward(be, w, x, saved, y, adapters);
  phase_done("shared");
}

void moe_backward(Backend& be, const MoeShape& s, const MoeWeights& w, const MoeWeights& g,
                  const Tensor& x, const MoeSaved& saved, const MoeScratch& scratch,
                  const std::vector<int32_t>& counts, const Tensor& dy, const Tensor& dprobs,
                  const Tensor& dx, bool accumulate_dw, const MoeZLoss& z, ExpertGroup* group,
                  const LayerAdapters& adapters) {
  check_moe(s, w, x, group, "moe_backward");
  const bool across = s.expert_ranks > 1;
  // E routed counts, and under expert parallelism ranks x E / ranks received.
  const size_t want = static_cast<size_t>(s.experts) * (across ? 2 : 1);
  BRISK_CHECK(counts.size() == want, "moe_backward: ", counts.size(), " expert counts, ", want,
              " expected");
  const WeightLayout out_in = WeightLayout::out_in;
  be.moe_combine_backward(dy, saved.out, saved.positions, saved.weights, scratch.d_out,
                          scratch.dweights);
  phase_done("combine");
  // Under expert parallelism the outputs' gradients go to the experts' ranks, and the rows'
  // gradients come back into d_out (free once sent).
  const Traffic t = across ? traffic(s, counts) : Traffic{};
  const int64_t R = across ? t.received : s.tokens * s.top_k;
  const Tensor d_out = across ? row_range(scratch.expert_out, 0, R) : scratch.d_out;
  if (across)
    exchange_rows(be, *group, pack_kept(be, s, counts, scratch.d_out, scratch.sent), t.send, d_out,
                  t.receive);
  // An expert without rows still writes its gradients (zeros) unless they are added to.
  for_each_block(s, counts, [&](int64_t e, int64_t first, int64_t n, bool first_block) {
    const Tensor act = row_range(saved.act, first, n), dy = row_range(d_out, first, n);
    const Tensor d_act = row_range(scratch.d_act, first, n);
    be.linear_backward(act, expert_matrix(w.down, e), dy, out_in, d_act, false,
                       expert_matrix(g.down, e), Tensor(), accumulate_dw || !first_block);
    lora_rows_backward(be, w.down_lora, g.down_lora, e, first, n, act, dy, d_act);
  });
  if (!across)
    zero_dropped(be, s, counts, scratch.d_act);  // (what the activation's backward reads)
  if (R > 0)
    be.swiglu_backward(row_range(saved.gate_up, 0, R), row_range(scratch.d_act, 0, R),
                       row_range(scratch.d_gate_up, 0, R), DType::f32);
  for_each_block(s, counts, [&](int64_t e, int64_t first, int64_t n, bool first_block) {
    const Tensor rows = row_range(saved.rows, first, n),
                 dy = row_range(scratch.d_gate_up, first, n);
    const Tensor d_rows = row_range(scratch.d_rows, first, n);
    be.linear_backward(rows, expert_matrix(w.gate_up, e), dy, out_in, d_rows, false,
                       expert_matrix(g.gate_up, e), Tensor(), accumulate_dw || !first_block);
    lora_rows_backward(be, w.gate_up_lora, g.gate_up_lora, e, first, n, rows, dy, d_rows);
  });
  if (!across) zero_dropped(be, s, counts, scratch.d_rows);  // a dropped pair's input: none
  phase_done("experts");
  if (across) {  // a dropped pair's input gets no gradient
    const Tensor back = s.capacity > 0 ? row_range(scratch.sent, 0, sent_rows(t)) : scratch.d_out;
    exchange_rows(be, *group, row_range(scratch.d_rows, 0, R), t.receive, back, t.send);
    unpack_kept(be, s, counts, back, scratch.d_out);
  }
  be.moe_combine(across ? scratch.d_out : scratch.d_rows, saved.positions, Tensor(), dx, false);
  phase_done("dispatch");
  be.moe_route_backward(saved.probs, saved.weights, saved.experts, scratch.dweights, dprobs,
                        s.normalize, scratch.logits);
  if (s.z_loss && z.scale != 0.0f) be.moe_z_backward(saved.probs, saved.z, z.scale, scratch.logits);
  adapters.linear_backward(be, ProductSite::router, x, w.router, scratch.logits, out_in, dx, true,
                           g.router, Tensor(), accumulate_dw);
  phase_done("router");
  if (s.shared_inner == 0) return;
  shared_backward(be, w, g, x, saved, scratch, dy, dx, accumulate_dw, adapters);
  phase_done("shared");
}

}  // namespace brisk
