// The optimizer step's ops: sum_squares and decide_step (the step control), AdamW and SGD over
// flat buffers with weight-decay ranges, Adafactor and 8-bit AdamW over parameter slots; each
// over several steps and then a skipped one, which must change nothing.
//
// Tolerances: squares of floats are exact in double, so sums of squares differ by the order of
// double sums only: 1e-11. The updates are float32 per element in the same order on every
// backend (fused multiply-adds may differ in the last bit): 1e-6 between backends; against the
// fp64 reference (torch's formulas in double) the float32 rounding of a few steps: 1e-5.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "backend_support.h"
#include "conformance/op_case.h"
#include "core/quantization.h"
#include "core/step_control.h"
#include "optim/optimizer.h"

namespace brisk::testing {
namespace {

// ---- sum_squares ----

// Adds the sum of squares to an accumulator that starts at 7.25; `special`: an inf, or a NaN,
// planted in the middle (the sum is then +inf, or NaN).
OpCase sum_squares_case(int64_t n, const char* special) {
  const double start = 7.25;
  const std::string sp = special;
  OpCase c;
  c.name = "sum_squares_n" + std::to_string(n) + (sp.empty() ? "" : "_" + sp);
  c.inputs = [=](std::mt19937& rng) {
    Values v{{"x", randn_d(n, rng)}};
    if (sp == "inf") v["x"][n / 2] = std::numeric_limits<double>::infinity();
    if (sp == "nan") v["x"][n / 2] = std::numeric_limits<double>::quiet_NaN();
    return v;
  };
  c.run = [=](Backend& be, const Values& in) {
    DeviceBuffers d(be);
    const Tensor x = d.put_as(in.at("x"), {n}), acc = d.put(std::vector<double>{start}, {1});
    be.sum_squares(x, acc);
    return Values{{"sum", {d.values(acc)[0] - start}}};
  };
  c.reference = [=](const Values& in) {
    double s = 0;
    for (double x : in.at("x")) s += x * x;
    return Values{{"sum", {s}}};
  };
  c.checks = {{"sum", Metric::normwise, 1e-11, 1e-11}};
  return c;
}

// ---- decide_step ----

// Every branch of the decision: no clipping, clipping, scaled fp16 gradients clipped after
// unscaling, no clipping asked for, and the skips (inf or NaN sum of squares, NaN or inf loss).
OpCase decide_step_case() {
  const double inf = std::numeric_limits<double>::infinity(), nan = std::nan("");
  struct Decision {
    double loss, sumsq, loss_scale, max_norm;
  };
  const std::vector<Decision> decisions = {
      {2.5, 0.25, 1, 1}, {2.5, 400, 1, 1},     {2.5, 400.0 * 65536 * 65536, 65536, 1},
      {2.5, 400, 1, 0},  {2.5, inf, 65536, 1}, {2.5, nan, 1, 1},
      {nan, 1, 1, 1},    {inf, 1, 1, 1}};
  OpCase c;
  c.name = "decide_step";
  c.inputs = [](std::mt19937&) { return Values(); };
  c.run = [=](Backend& be, const Values&) {
    Values out;
    DeviceBuffers d(be);
    for (size_t i = 0; i < decisions.size(); ++i) {
      const Decision& k = decisions[i];
      const Tensor stats = d.put(std::vector<double>{k.loss, k.sumsq}, {kStatsSize});
      const Tensor control = d.put(FVec{-7.f, -7.f}, {kControlSize});
      be.decide_step(stats, k.loss_scale, k.max_norm, control);
      const Vec got = d.values(control);
      out["multiplier"].push_back(got[kControlMultiplier]);
      out["skip"].push_back(got[kControlSkip]);
    }
    return out;
  };
  // torch's clip_grad_norm_ (max_norm / (norm + 1e-6) above max_norm) and GradScaler's unscaling.
  c.reference = [=](const Values&) {
    Values want;
    for (const Decision& k : decisions) {
      const bool skip = !std::isfinite(k.loss) || !std::isfinite(k.sumsq);
      const double norm = std::sqrt(k.sumsq) / k.loss_scale;
      const double clip = k.max_norm > 0 && norm > k.max_norm ? k.max_norm / (norm + 1e-6) : 1.0;
      want["multiplier"].push_back(skip ? 0.0 : clip / k.loss_scale);
      want["skip"].push_back(skip ? 1.0 : 0.0);
    }
    return want;
  };
  c.checks = {{"multiplier", Metric::elementwise, 1e-6, 1e-7}, {"skip", Metric::exact}};
  return c;
}

// ---- AdamW and SGD ----

// Decay ranges at the start, of one element, adjacent, and at the end; for the large buffers
// also across the end of the first pass of a GPU's grid-stride loop (4096 blocks x 256 threads).
std::vector<int64_t> decay_ranges(int64_t n) {
  if (n < 2000) return {0, 100, 500, 501, 600, 600, 700, 900, n - 31, n};
  return {0,       1000,    5000,    5001,    10007,   300000, 600000,
          1048570, 1048580, 1048600, 1048600, 1049000, n - 13, n};
}

bool decayed(const std::vector<int64_t>& ranges, int64_t i) {
  for (size_t r = 0; r + 1 < ranges.size(); r += 2)
    if (i >= ranges[r] && i < ranges[r + 1]) return true;
  return false;
}

constexpr int kSteps = 4;  // then a fifth, skipped (an inf gradient)

// ||a - b|| / ||b||
double rel_error_of(const Vec& a, const Vec& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return std::sqrt(num / den);
}

// How many elements of the state `after` a skipped step differ, bit for bit, from `before`.
Vec changes(const Values& before, const Values& after) {
  double n = 0;
  for (const auto& [name, v] : after)
    for (size_t i = 0; i < v.size(); ++i)
      n += std::memcmp(&v[i], &before.at(name)[i], sizeof(double)) != 0;
  return {n};
}

// The weights and moments after kSteps steps, as the trainer chains the ops: the statistics
// (a loss, the gradients' sum of squares at loss scale 4), decide_step with clipping at 1, the
// update; then a step with an inf gradient, which must change nothing.
OpCase adamw_case(int64_t n, bool reference) {
  const std::vector<int64_t> ranges = decay_ranges(n);
  const int64_t R = static_cast<int64_t>(ranges.size()) / 2;
  const float beta1 = 0.9f, beta2 = 0.98f, eps = 1e-6f, wd = 0.1f;
  auto lr_at = [](int64_t t) { return 1e-2f / static_cast<float>(t); };
  OpCase c;
  c.name = "adamw_n" + std::to_string(n);
  c.inputs = [=](std::mt19937& rng) {
    Values v{{"w", randn_d(n, rng)}};
    for (int t = 1; t <= kSteps; ++t) v["g" + std::to_string(t)] = randn_d(n, rng, 0.3, 0.01 * t);
    return v;
  };
  c.run = [=](Backend& be, const Values& in) {
    DeviceBuffers d(be);
    const Tensor w = d.put_as(in.at("w"), {n}), m = d.put(FVec(n, 0.f), {n});
    const Tensor v = d.put(FVec(n, 0.f), {n}), g = d.alloc({n});
    const Tensor decay = d.put(ranges, {R, 2});
    const Tensor stats = d.alloc({kStatsSize}, DType::f64), control = d.alloc({kControlSize});
    const Tensor sumsq =
        Tensor(stats.as<double>() + kStatGradSumSq, Shape{1}, DType::f64, stats.device());
    auto step = [&](const Vec& gv, int64_t t) {
      d.set(g, FVec(gv.begin(), gv.end()));
      d.set(stats, std::vector<double>{0.5, 0.0});
      be.sum_squares(g, sumsq);
      be.decide_step(stats, 4.0, 1.0, control);
      AdamWUpdate u{w, g, m, v, decay, control};
      u.lr = lr_at(t);
      u.beta1 = beta1;
      u.beta2 = beta2;
      u.eps = eps;
      u.weight_decay = wd;
      u.step = t;
      be.adamw_update(u);
    };
    for (int t = 1; t <= kSteps; ++t) step(in.at("g" + std::to_string(t)), t);
    Values out{{"w", d.values(w)}, {"exp_avg", d.values(m)}, {"exp_avg_sq", d.values(v)}};
    Vec bad = in.at("g1");
    bad[n / 3] = std::numeric_limits<double>::infinity();
    step(bad, kSteps + 1);
    out["skipped_step_changes"] =
        changes(out, {{"w", d.values(w)}, {"exp_avg", d.values(m)}, {"exp_avg_sq", d.values(v)}});
    return out;
  };
  if (reference)
    c.reference = [=](const Values& in) {
      Vec w = in.at("w"), m(static_cast<size_t>(n), 0.0), v(static_cast<size_t>(n), 0.0);
      for (int t = 1; t <= kSteps; ++t) {
        const Vec& g = in.at("g" + std::to_string(t));
        double sumsq = 0;
        for (double x : g) sumsq += x * x;
        const double norm = std::sqrt(sumsq) / 4.0;  // as scaled by 4
        const double mult = (norm > 1.0 ? 1.0 / (norm + 1e-6) : 1.0) / 4.0;
        const double lr = lr_at(t), bc1 = 1 - std::pow(double(beta1), t);
        const double bc2 = 1 - std::pow(double(beta2), t);
        for (int64_t i = 0; i < n; ++i) {  // torch.optim.AdamW
          const double gi = g[i] * mult;
          if (decayed(ranges, i)) w[i] *= 1 - lr * wd;
          m[i] = beta1 * m[i] + (1 - double(beta1)) * gi;
          v[i] = beta2 * v[i] + (1 - double(beta2)) * gi * gi;
          w[i] -= lr / bc1 * m[i] / (std::sqrt(v[i] / bc2) + eps);
        }
      }
      return Values{{"w", w}, {"exp_avg", m}, {"exp_avg_sq", v}, {"skipped_step_changes", {0.0}}};
    };
  // Decay on the wrong elements would show at lr * weight_decay = 1e-3 relative per step.
  c.checks = {{"w", Metric::elementwise, 1e-5, 1e-6},
              {"exp_avg", Metric::normwise, 1e-5, 1e-6},
              {"exp_avg_sq", Metric::normwise, 1e-5, 1e-6},
              {"skipped_step_changes", Metric::exact}};
  return c;
}

// torch.optim.SGD: no momentum; heavy ball with dampening; Nesterov. The control multiplier is
// set directly (0.75), then a skipped step.
OpCase sgd_case(int64_t n, float momentum, float dampening, bool nesterov, bool reference) {
  const std::vector<int64_t> ranges = decay_ranges(n);
  const int64_t R = static_cast<int64_t>(ranges.size()) / 2;
  const float wd = 0.1f, multiplier = 0.75f;
  const bool with_buffer = momentum > 0;
  auto lr_at = [](int t) { return 0.05f / static_cast<float>(t); };
  OpCase c;
  c.name = "sgd_n" + std::to_string(n) + (with_buffer ? "_momentum" : "") +
           (dampening > 0 ? "_dampening" : "") + (nesterov ? "_nesterov" : "");
  c.inputs = [=](std::mt19937& rng) {
    Values v{{"w", randn_d(n, rng)}};
    for (int t = 1; t <= kSteps; ++t) v["g" + std::to_string(t)] = randn_d(n, rng, 0.1, 0.01 * t);
    return v;
  };
  c.run = [=](Backend& be, const Values& in) {
    DeviceBuffers d(be);
    const Tensor w = d.put_as(in.at("w"), {n}), g = d.alloc({n});
    const Tensor buf =
        with_buffer ? d.put(FVec(n, -7.f), {n}) : Tensor();  // the first step sets it
    const Tensor decay = d.put(ranges, {R, 2}), control = d.alloc({kControlSize});
    auto step = [&](const Vec& gv, float mult, float skip, int t) {
      d.set(g, FVec(gv.begin(), gv.end()));
      d.set(control, FVec{mult, skip});  // {kControlMultiplier, kControlSkip}
      SgdUpdate u{w, g, buf, decay, control};
      u.lr = lr_at(t);
      u.momentum = momentum;
      u.dampening = dampening;
      u.weight_decay = wd;
      u.nesterov = nesterov;
      u.first_step = t == 1;
      be.sgd_update(u);
    };
    for (int t = 1; t <= kSteps; ++t) step(in.at("g" + std::to_string(t)), multiplier, 0.f, t);
    Values out{{"w", d.values(w)}, {"buffer", with_buffer ? d.values(buf) : Vec()}};
    Vec bad = in.at("g1");
    bad[n / 3] = std::numeric_limits<double>::infinity();
    step(bad, 0.f, 1.f, kSteps + 1);
    out["skipped_step_changes"] =
        changes(out, {{"w", d.values(w)}, {"buffer", with_buffer ? d.values(buf) : Vec()}});
    return out;
  };
  if (reference)
    c.reference = [=](const Values& in) {
      Vec w = in.at("w"), b(with_buffer ? static_cast<size_t>(n) : 0, 0.0);
      for (int t = 1; t <= kSteps; ++t) {
        const Vec& g = in.at("g" + std::to_string(t));
        for (int64_t i = 0; i < n; ++i) {
          double di = g[i] * multiplier + (decayed(ranges, i) ? wd * w[i] : 0.0);
          if (with_buffer) {
            b[i] = t == 1 ? di : momentum * b[i] + (1 - double(dampening)) * di;
            di = nesterov ? di + momentum * b[i] : b[i];
          }
          w[i] -= double(lr_at(t)) * di;
        }
      }
      return Values{{"w", w}, {"buffer", b}, {"skipped_step_changes", {0.0}}};
    };
  c.checks = {{"w", Metric::elementwise, 1e-5, 1e-6},
              {"buffer", Metric::normwise, 1e-5, 1e-6},
              {"skipped_step_changes", Metric::exact}};
  return c;
}

// ---- per-tensor optimizers: Adafactor, 8-bit AdamW ----

// Parameter tensors within flat buffers, three untouched elements after each (an optimizer must
// not write outside its slots). `matrix`: two or more dimensions, as param_slots sets factored.
struct SlotShape {
  int64_t rows, cols;
  bool matrix, decay;
};
// Vectors, matrices whose sides are not multiples of 32 (wide, tall, more rows than a GPU's
// row kernels' grid, more elements than one pass of a grid-stride loop), and matrices of one row
// and of one column.
const SlotShape kSlotShapes[] = {{1, 37, false, false},   {45, 77, true, true},
                                 {129, 33, true, true},   {1, 1000, false, true},
                                 {5000, 40, true, false}, {1100, 1037, true, true},
                                 {2, 256, true, true},    {3, 1, true, false},
                                 {1, 100, true, true},    {1, 300, false, false}};
constexpr int64_t kSlotGap = 3;
constexpr int kSlotSteps = 3;  // steps before the skipped one

std::vector<ParamSlot> slots_of(int64_t* n) {
  std::vector<ParamSlot> slots;
  *n = 0;
  for (const SlotShape& sh : kSlotShapes) {
    ParamSlot s;
    s.offset = *n;
    s.rows = sh.rows;
    s.cols = sh.cols;
    s.numel = sh.rows * sh.cols;
    s.factored = sh.matrix;
    s.decay = sh.decay;
    slots.push_back(s);
    *n += s.numel + kSlotGap;
  }
  return slots;
}

// Weights, and gradients for kSlotSteps steps with per-row and per-column scales (so that the
// factored statistics are far from uniform), then an inf gradient for a skipped step.
Values slot_inputs(const std::vector<ParamSlot>& slots, int64_t n, std::mt19937& rng) {
  Values v{{"w", randn_d(n, rng)}};
  for (int t = 1; t <= kSlotSteps; ++t) {
    Vec g = randn_d(n, rng, 0.01);
    for (const ParamSlot& s : slots) {
      const Vec rs = randn_d(s.rows, rng), cs = randn_d(s.cols, rng);
      for (int64_t r = 0; r < s.rows; ++r)
        for (int64_t c = 0; c < s.cols; ++c)
          g[s.offset + r * s.cols + c] = static_cast<float>(
              g[s.offset + r * s.cols + c] * (1 + std::abs(rs[r])) * (0.2 + std::abs(cs[c])));
    }
    v["g" + std::to_string(t)] = std::move(g);
  }
  v["bad"] = v["g1"];
  v["bad"][slots[1].offset + 5] = std::numeric_limits<double>::infinity();
  return v;
}

// The weights in the gaps between slots, which are not parameters.
Vec gaps(const std::vector<ParamSlot>& slots, const Vec& w) {
  Vec out;
  for (const ParamSlot& s : slots)
    out.insert(out.end(), w.begin() + s.offset + s.numel,
               w.begin() + s.offset + s.numel + kSlotGap);
  return out;
}

const FVec kApplyControl = {0.75f, 0.f};  // {kControlMultiplier, kControlSkip}
const FVec kSkipControl = {0.f, 1.f};

// transformers' Adafactor: its Trainer default (no first moment, no scaling), or every option on
// with a clip threshold that clips. No fp64 reference here (test_optim.cpp checks the CPU
// against transformers' Adafactor): the sums (the statistics' means, the row mean, the update's
// and the weights' RMS) are double reductions in another order on another backend, which moves
// the float results they feed by an ulp or so: 1e-5; the statistics relative to themselves.
OpCase adafactor_case(bool scale_parameter, float beta1, float clip_threshold, float wd) {
  const bool first_moment = beta1 >= 0;
  OpCase c;
  c.name = std::string("adafactor") + (scale_parameter ? "_scale_parameter" : "") +
           (first_moment ? "_beta1" : "") + (wd > 0 ? "_decay" : "");
  c.inputs = [](std::mt19937& rng) {
    int64_t n = 0;
    const std::vector<ParamSlot> slots = slots_of(&n);
    return slot_inputs(slots, n, rng);
  };
  c.run = [=](Backend& be, const Values& in) {
    int64_t n = 0;
    std::vector<ParamSlot> slots = slots_of(&n);
    int64_t state = 0;
    for (ParamSlot& s : slots) {
      s.state = state;
      state += s.factored ? s.rows + s.cols : s.numel;
    }
    DeviceBuffers d(be);
    d.workspace(1);  // the backend's reduction scratch
    const Tensor w = d.put_as(in.at("w"), {n}), g = d.alloc({n});
    const Tensor v = d.put(FVec(state, 0.f), {state});
    const Tensor m = first_moment ? d.put(FVec(n, 0.f), {n}) : Tensor();
    const Tensor control = d.alloc({kControlSize});
    auto step = [&](const Vec& gv, const FVec& cv, int t) {
      d.set(g, FVec(gv.begin(), gv.end()));
      d.set(control, cv);
      AdafactorUpdate u;
      u.weights = w;
      u.grads = g;
      u.second_moment = v;
      u.exp_avg = m;
      u.control = control;
      u.slots = &slots;
      u.step_size = 1e-2f;
      u.beta2t = static_cast<float>(1.0 - std::pow(double(t), -0.8));  // 0 on the first step
      u.clip_threshold = clip_threshold;
      u.beta1 = std::max(beta1, 0.f);
      u.weight_decay = wd;
      u.scale_parameter = scale_parameter;
      be.adafactor_update(u);
    };
    for (int t = 1; t <= kSlotSteps; ++t) step(in.at("g" + std::to_string(t)), kApplyControl, t);
    Values out{{"w", d.values(w)},
               {"second_moment", d.values(v)},
               {"exp_avg", first_moment ? d.values(m) : Vec()}};
    out["moved"] = {rel_error_of(out["w"], in.at("w")) > 1e-4 ? 1.0 : 0.0};
    out["gaps"] = gaps(slots, out["w"]);
    step(in.at("bad"), kSkipControl, kSlotSteps + 1);
    out["skipped_step_changes"] = changes(out, {{"w", d.values(w)},
                                                {"second_moment", d.values(v)},
                                                {"exp_avg", first_moment ? d.values(m) : Vec()}});
    return out;
  };
  c.reference = [](const Values& in) {
    int64_t n = 0;
    const std::vector<ParamSlot> slots = slots_of(&n);
    return Values{
        {"moved", {1.0}}, {"gaps", gaps(slots, in.at("w"))}, {"skipped_step_changes", {0.0}}};
  };
  c.checks = {{"w", Metric::elementwise, 0, 1e-5},
              {"second_moment", Metric::relative, 0, 1e-5},
              {"exp_avg", Metric::normwise, 0, 1e-5},
              {"moved", Metric::exact},
              {"gaps", Metric::exact},
              {"skipped_step_changes", Metric::exact}};
  return c;
}

// 8-bit AdamW (bitsandbytes' blockwise dynamic quantization): 8-bit state for the matrices
// (45x77: 13 full blocks and 137 values; 2x256: exactly two blocks; 1x100: less than one; 3x1)
// and the 1000-element vector, 32-bit for the rest. Entry `step` t runs step t from the CPU's
// state after t - 1 steps (made in the inputs), so that a code rounded the other way on another
// backend is not carried into later steps, where its dequantized moment would differ by a whole
// quantization step; t > kSlotSteps is a skipped step after kSlotSteps. Between backends: the
// weights 1e-5, the 32-bit moments 1e-6, the block maxima 1e-6 of themselves, and codes equal in
// 99.9% of positions (a moment on the midpoint between two codes may round either way when one
// backend fuses a multiply-add the other rounds twice). The CPU is checked against bitsandbytes
// and an fp64 version in test_optim.cpp.
struct EightBit {
  std::vector<ParamSlot> slots;
  int64_t n = 0, n8 = 0, n32 = 0, blocks = 0;
  FVec qmaps;  // signed then unsigned
  EightBit() {
    slots = slots_of(&n);
    const std::vector<bool> eight_bit = {false, true, true, true, true,
                                         true,  true, true, true, false};
    const QuantizedStateSizes sizes = place_8bit_state(slots, eight_bit);
    n8 = sizes.values8;
    n32 = sizes.values32;
    blocks = sizes.blocks;
    for (bool is_signed : {true, false})
      for (float q : dynamic_quant_map(is_signed)) qmaps.push_back(q);
  }
  static constexpr const char* kState[] = {"w",       "exp_avg32", "exp_avg_sq32", "absmax1",
                                           "absmax2", "codes1",    "codes2"};
  // One step on `be` from the state in `s` (kState names).
  Values step(Backend& be, const Values& s, const Vec& g, const FVec& control, int64_t t) const {
    DeviceBuffers d(be);
    const Tensor q = d.put(qmaps, {2, 256});
    AdamW8bitUpdate u;
    u.weights = d.put_as(s.at("w"), {n});
    u.grads = d.put_as(g, {n});
    u.control = d.put(control, {kControlSize});
    u.exp_avg32 = d.put_as(s.at("exp_avg32"), {n32});
    u.exp_avg_sq32 = d.put_as(s.at("exp_avg_sq32"), {n32});
    u.exp_avg8 = d.put_as(s.at("codes1"), {n8}, DType::u8);
    u.exp_avg_sq8 = d.put_as(s.at("codes2"), {n8}, DType::u8);
    u.absmax1 = d.put_as(s.at("absmax1"), {blocks});
    u.absmax2 = d.put_as(s.at("absmax2"), {blocks});
    u.qmap_signed = Tensor(q.f32(), Shape{256}, DType::f32, q.device());
    u.qmap_unsigned = Tensor(q.f32() + 256, Shape{256}, DType::f32, q.device());
    u.slots = &slots;
    u.lr = 1e-3f;
    u.beta1 = 0.9f;
    u.beta2 = 0.95f;
    u.eps = 1e-8f;
    u.weight_decay = 0.1f;
    u.step = t;
    be.adamw_8bit_update(u);
    return Values{{"w", d.values(u.weights)},
                  {"exp_avg32", d.values(u.exp_avg32)},
                  {"exp_avg_sq32", d.values(u.exp_avg_sq32)},
                  {"absmax1", d.values(u.absmax1)},
                  {"absmax2", d.values(u.absmax2)},
                  {"codes1", d.values(u.exp_avg8)},
                  {"codes2", d.values(u.exp_avg_sq8)}};
  }
};

OpCase adamw_8bit_case(int step) {
  const bool skipped = step > kSlotSteps;
  OpCase c;
  c.name = skipped ? "adamw_8bit_skipped_step" : "adamw_8bit_step" + std::to_string(step);
  c.inputs = [=](std::mt19937& rng) {
    const EightBit e;
    Values v = slot_inputs(e.slots, e.n, rng);
    // The reset state (zero maxima dequantize every code to zero), then the CPU's steps.
    Values s{{"w", v["w"]},
             {"exp_avg32", Vec(e.n32, 0.0)},
             {"exp_avg_sq32", Vec(e.n32, 0.0)},
             {"absmax1", Vec(e.blocks, 0.0)},
             {"absmax2", Vec(e.blocks, 0.0)},
             {"codes1", Vec(e.n8, 0.0)},
             {"codes2", Vec(e.n8, 0.0)}};
    const auto cpu = make_cpu_backend();
    for (int t = 1; t < std::min(step, kSlotSteps + 1); ++t)
      s = e.step(*cpu, s, v["g" + std::to_string(t)], kApplyControl, t);
    for (const auto& [name, values] : s) v["state." + name] = values;
    return v;
  };
  c.run = [=](Backend& be, const Values& in) {
    const EightBit e;
    Values s;
    for (const char* name : EightBit::kState) s[name] = in.at(std::string("state.") + name);
    Values out = skipped ? e.step(be, s, in.at("bad"), kSkipControl, step)
                         : e.step(be, s, in.at("g" + std::to_string(step)), kApplyControl, step);
    if (skipped) return Values{{"skipped_step_changes", changes(s, out)}};
    out["gaps"] = gaps(e.slots, out["w"]);
    return out;
  };
  if (skipped) {
    c.reference = [](const Values&) { return Values{{"skipped_step_changes", {0.0}}}; };
    c.checks = {{"skipped_step_changes", Metric::exact}};
    return c;
  }
  c.reference = [](const Values& in) {
    const EightBit e;
    return Values{{"gaps", gaps(e.slots, in.at("state.w"))}};
  };
  c.checks = {
      {"w", Metric::elementwise, 0, 1e-5},         {"exp_avg32", Metric::normwise, 0, 1e-6},
      {"exp_avg_sq32", Metric::normwise, 0, 1e-6}, {"absmax1", Metric::relative, 0, 1e-6},
      {"absmax2", Metric::relative, 0, 1e-6},      {"codes1", Metric::mostly_exact, 0, 1e-3},
      {"codes2", Metric::mostly_exact, 0, 1e-3},   {"gaps", Metric::exact}};
  return c;
}

}  // namespace

std::vector<OpCase> optim_cases() {
  std::vector<OpCase> cases;
  for (int64_t n : {37, 1'000'003}) cases.push_back(sum_squares_case(n, ""));
  cases.push_back(sum_squares_case(100'003, "inf"));
  cases.push_back(sum_squares_case(100'003, "nan"));
  cases.push_back(decide_step_case());
  // Small against torch's formulas; more than one pass of a GPU's grid-stride loop.
  for (int64_t n : {1031, 1'100'003}) {
    cases.push_back(adamw_case(n, n < 2000));
    cases.push_back(sgd_case(n, 0.f, 0.f, false, n < 2000));
    cases.push_back(sgd_case(n, 0.9f, 0.1f, false, n < 2000));
    cases.push_back(sgd_case(n, 0.9f, 0.f, true, n < 2000));
  }
  cases.push_back(adafactor_case(false, -1, 1.0f, 0));
  cases.push_back(adafactor_case(true, 0.9f, 0.5f, 0.01f));
  for (int step = 1; step <= kSlotSteps + 1; ++step) cases.push_back(adamw_8bit_case(step));
  return cases;
}

}  // namespace brisk::testing
