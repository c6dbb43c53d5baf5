// The optimizers against their references: torch's AdamW and SGD and transformers' Adafactor
// as Trainer runs them (fixtures from scripts/make_fixtures.py), bitsandbytes' 8-bit AdamW and
// its quantization map (fixture) and the same algorithm written in fp64 here; stochastic
// rounding; --optim / --optim_args validation; the optimizer state in the memory plan.
#include <gtest/gtest.h>

#include <algorithm>
#include <barrier>
#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <thread>

#include "backend/cpu/cpu_backend.h"
#include "core/quantization.h"
#include "core/step_control.h"
#include "optim/optimizer.h"
#include "test_support.h"
#include "train/schedule.h"

namespace brisk::testing {
namespace {

struct Param {
  std::string name;
  bool decay;
};

// An optimizer on the CPU over a ParameterSet of its own, with flat float32 weights and
// gradients and a plan of its state and the step's statistics and decision.
class PlannedOptimizer {
 protected:
  explicit PlannedOptimizer(const OptimizerConfig& config)
      : be_(make_cpu_backend()), opt_(make_optimizer(config)) {}
  // Once the parameters are added: the flat buffers bound, the optimizer planned and reset.
  void bind_and_plan() {
    w_.resize(static_cast<size_t>(ps_.total_elements()));
    g_.resize(w_.size());
    ps_.bind(Tensor(w_.data(), Shape{ps_.total_elements()}, DType::f32),
             Tensor(g_.data(), Shape{ps_.total_elements()}, DType::f32));
    opt_->plan(plan_, binder_, ps_);
    binder_.declare(plan_, &stats_, "stats", Category::temporaries, DType::f64, Shape{kStatsSize});
    binder_.declare(plan_, &control_, "control", Category::temporaries, DType::f32,
                    Shape{kControlSize});
    plan_.finalize();
    arena_ = std::make_unique<Arena>(plan_, Device::cpu);
    binder_.bind(*arena_);
    opt_->reset(*be_);
  }

  std::unique_ptr<Backend> be_;
  std::unique_ptr<Optimizer> opt_;
  ParameterSet ps_;
  std::vector<float> w_, g_;
  MemoryPlan plan_;
  BufferBinder binder_;
  Tensor stats_, control_;
  std::unique_ptr<Arena> arena_;
};

// An optimizer over a fixture's parameters on the CPU, stepped as Trainer steps it: the raw
// gradients, the global norm clipped to 1.0 and folded into the update by decide_step, the
// learning rate from the schedule (or constant).
class FixtureRun : PlannedOptimizer {
 public:
  FixtureRun(const SafetensorsFile& f, const std::vector<Param>& params, const std::string& init,
             const OptimizerConfig& config)
      : PlannedOptimizer(config), f_(f), params_(params) {
    for (const Param& p : params)
      ps_.add(p.name, f.get(init + p.name).shape(), p.decay ? kLinearWeight : kBiasOrNorm);
    bind_and_plan();
    for (size_t i = 0; i < params.size(); ++i)
      copy_to_f32(f.get(init + params[i].name), ps_.weight(static_cast<int>(i)), "init");
  }

  // Steps with gradients "<grads><step>.<name>", learning rate lr(step).
  template <typename Lr>
  void run(const std::string& grads, int steps, Lr&& lr) {
    for (int step = 0; step < steps; ++step) {
      for (size_t i = 0; i < params_.size(); ++i)
        copy_to_f32(f_.get(grads + std::to_string(step) + "." + params_[i].name),
                    ps_.grad(static_cast<int>(i)), "grad");
      stats_.as<double>()[kStatLoss] = 0.0;
      stats_.as<double>()[kStatGradSumSq] = 0.0;
      be_->sum_squares(ps_.flat_grads(),
                       Tensor(stats_.as<double>() + kStatGradSumSq, Shape{1}, DType::f64));
      be_->decide_step(stats_, 1.0, 1.0, control_);
      opt_->step(*be_, ps_.flat_weights(), ps_.flat_grads(), control_,
                 static_cast<float>(lr(step)));
    }
  }

  // ||(w - init) - (want - init)|| / ||want - init||: the update's error relative to the
  // update, so that a small update cannot hide behind the weights' size.
  double update_error(const std::string& param, const std::string& init,
                      const std::string& want) const {
    const int i = ps_.index(param);
    const Tensor& a = f_.get(init + param);
    const Tensor& b = f_.get(want + param);
    std::vector<float> got(a.numel()), ref(a.numel());
    for (int64_t k = 0; k < a.numel(); ++k) {
      got[k] = ps_.weight(i).f32()[k] - a.f32()[k];
      ref[k] = b.f32()[k] - a.f32()[k];
    }
    return rel_error(got.data(), ref.data(), a.numel());
  }

  Optimizer& optimizer() { return *opt_; }
  const ParameterSet& params() const { return ps_; }
  const MemoryPlan& plan() const { return plan_; }
  Tensor state(const std::string& name) const {
    for (const auto& [n, t] : opt_->state())
      if (n == name) return t;
    ADD_FAILURE() << "no state named " << name;
    return {};
  }

 private:
  const SafetensorsFile& f_;
  std::vector<Param> params_;
};

const std::vector<Param> kParams = {
    {"w.weight", true}, {"w.bias", false}, {"norm.weight", false}, {"emb.weight", true}};

OptimizerConfig config(const std::string& name, const std::string& args, double wd) {
  OptimizerConfig c;
  c.name = name;
  c.args = args;
  c.weight_decay = wd;
  return c;
}

double linear_lr(int step) {
  return 1e-2 * Schedule{"linear", 3, 10}.factor(step);
}

TEST(Optimizers, AdamWScheduleAndClippingMatchPyTorch) {
  SafetensorsFile f(fixture("adamw/steps.safetensors"));
  OptimizerConfig c = config("adamw_torch", "", 0.1);
  c.beta2 = 0.98;
  c.epsilon = 1e-6;
  FixtureRun r(f, kParams, "init.", c);
  r.run("grad.", 10, linear_lr);
  for (const Param& p : kParams)
    EXPECT_LE(r.update_error(p.name, "init.", "final."), 5e-5) << p.name;  // measured <= 9e-6
}

// Tolerances: the fp64 re-implementation of the fixture script matches torch within 5e-7 of
// the weights; float32 weights of size ~1 carry 6e-8 of rounding per step against updates of
// ~1e-2, so the update's relative error is ~1e-5 (measured: at most 9e-6). The "relative"
// Adafactor variant moves the weights by ~4e-5 only, where the same rounding weighs more.
TEST(Optimizers, AdafactorMatchesTransformers) {
  SafetensorsFile f(fixture("optim/adafactor.safetensors"));
  struct Variant {
    std::string name, args;
    double wd;
    bool scheduled;
    double tol;
  };
  for (const Variant& v :
       {Variant{"trainer", "", 0.1, true, 1e-4},
        Variant{"beta1_scale", "scale_parameter=true,beta1=0.9", 0.1, true, 1e-4},
        Variant{"relative", "scale_parameter=true,relative_step=true,warmup_init=true", 0.0, false,
                1e-3}}) {
    FixtureRun r(f, kParams, "init.", config("adafactor", v.args, v.wd));
    r.run("grad.", 10, [&](int step) { return v.scheduled ? linear_lr(step) : 1e-2; });
    for (const Param& p : kParams)
      EXPECT_LE(r.update_error(p.name, "init.", "final." + v.name + "."), v.tol)
          << v.name << " " << p.name;
    if (v.name != "trainer") continue;
    // The factored state: w.weight's 5 row and 7 column statistics, then w.bias' full one.
    const Tensor s = r.state("exp_avg_sq");
    const Tensor& row = f.get("state.trainer.w.weight.exp_avg_sq_row");
    const Tensor& col = f.get("state.trainer.w.weight.exp_avg_sq_col");
    const Tensor& bias = f.get("state.trainer.w.bias.exp_avg_sq");
    EXPECT_LE(rel_error(s.f32(), row.f32(), 5), 1e-5);
    EXPECT_LE(rel_error(s.f32() + 5, col.f32(), 7), 1e-5);
    EXPECT_LE(rel_error(s.f32() + 12, bias.f32(), 5), 1e-5);
  }
}

// Tensor parallelism's optimizers whose step reads a whole parameter: two shares of each split
// parameter, stepped on two threads whose group sums and maxima pass between them, against the
// whole parameters stepped alone. Each parameter split in two by `dim` (-1: not split), the
// second share padded where the dimension is odd (a row or column with no place).
struct SplitSpec {
  std::string name;
  Shape whole;
  int dim;
  ParamRole role;
};

// An optimizer over one rank's shares (ranks 0 and 1 of 2; rank -1: the whole parameters), with
// the whole parameters' weights and gradients taken into its shares (padding: zeros).
class ShareRun : PlannedOptimizer {
 public:
  ShareRun(int rank, const std::vector<SplitSpec>& specs, const OptimizerConfig& config)
      : PlannedOptimizer(config), rank_(rank), specs_(specs) {
    for (const SplitSpec& p : specs) {
      const bool split_here = rank >= 0 && p.dim >= 0;
      Shape shape;  // a share: half the split dimension, rounded up (the last share padded)
      for (int d = 0; d < p.whole.rank(); ++d)
        shape.push_back(split_here && d == p.dim ? (p.whole[d] + 1) / 2 : p.whole[d]);
      ParamSplit split;
      if (split_here) split = ParamSplit{p.dim, 1, rank, 2, p.whole[p.dim], 1};
      ps_.add(p.name, shape, p.role, 0, split);
    }
    bind_and_plan();
    control_.f32()[kControlMultiplier] = 1.0f;
    control_.f32()[kControlSkip] = 0.0f;
  }
  Optimizer& optimizer() { return *opt_; }

  // Whole parameter k's element (r, c) (a vector's c) for each of this rank's elements of it, as
  // f(the element's place among the flat parameters, its place in the whole one or -1).
  template <typename F>
  void each(size_t k, F f) const {
    const ParamInfo& p = ps_.list()[k];
    const int64_t cols = p.shape[p.shape.rank() - 1];
    const int64_t rows = p.shape.numel() / cols;
    const SplitSpec& spec = specs_[k];
    const int64_t whole_cols = spec.whole[spec.whole.rank() - 1];
    const int64_t whole_rows = spec.whole.numel() / whole_cols;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        int64_t wr = r, wc = c;
        if (p.split.split() && spec.whole.rank() == 2 && spec.dim == 0) wr += rank_ * rows;
        if (p.split.split() && (spec.whole.rank() == 1 || spec.dim == 1)) wc += rank_ * cols;
        f(p.offset + r * cols + c,
          wr < whole_rows && wc < whole_cols ? wr * whole_cols + wc : int64_t{-1});
      }
  }
  // One step from the whole parameters' gradients, after taking their weights (step 0).
  void step(const std::vector<std::vector<float>>& weights,
            const std::vector<std::vector<float>>& grads, bool first) {
    for (size_t k = 0; k < specs_.size(); ++k)
      each(k, [&](int64_t i, int64_t whole) {
        if (first) w_[i] = whole < 0 ? 0.0f : weights[k][whole];
        g_[i] = whole < 0 ? 0.0f : grads[k][whole];
      });
    opt_->step(*be_, ps_.flat_weights(), ps_.flat_grads(), control_, 0.05f);
  }
  float weight(int64_t i) const { return w_[i]; }
  // The whole run's (rank -1) element `at` of parameter k.
  float whole_weight(size_t k, int64_t at) const { return w_[ps_.list()[k].offset + at]; }
  Tensor state(size_t i) const { return opt_->state()[i].second; }

 private:
  int rank_;
  std::vector<SplitSpec> specs_;
};

// Two threads' group: each call combines both threads' buffers (a float64 sum, a float32
// maximum) into both.
class PairGroup {
 public:
  Optimizer::SplitGroup member(int rank) {
    return {[this, rank](const Tensor& t) { combine<double>(rank, t, std::plus<double>()); },
            [this, rank](const Tensor& t) {
              combine<float>(rank, t, [](float a, float b) { return std::max(a, b); });
            },
            rank};
  }

 private:
  template <typename T, typename Op>
  void combine(int rank, const Tensor& t, Op op) {
    const auto n = static_cast<size_t>(t.numel());
    parts_[rank].assign(t.as<T>(), t.as<T>() + n);
    barrier_.arrive_and_wait();
    for (size_t i = 0; i < n; ++i) t.as<T>()[i] = static_cast<T>(op(parts_[0][i], parts_[1][i]));
    barrier_.arrive_and_wait();  // both read before either writes again
  }
  std::vector<double> parts_[2];
  std::barrier<> barrier_{2};
};

// Three steps of the two shares (on two threads) and of the whole parameters from normal weights
// and gradients; each share's weights are the whole run's. Returns the runs: whole, share 0, 1.
std::array<std::unique_ptr<ShareRun>, 3> step_shares(const std::vector<SplitSpec>& specs,
                                                     const OptimizerConfig& config) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  auto draw = [&] {
    std::vector<std::vector<float>> values;
    for (const SplitSpec& p : specs) {
      values.emplace_back(static_cast<size_t>(p.whole.numel()));
      for (float& x : values.back()) x = normal(rng);
    }
    return values;
  };
  const auto weights = draw();
  std::vector<std::vector<std::vector<float>>> grads;
  for (int t = 0; t < 3; ++t) grads.push_back(draw());
  std::array<std::unique_ptr<ShareRun>, 3> runs;
  for (int r = -1; r < 2; ++r)
    runs[static_cast<size_t>(r + 1)] = std::make_unique<ShareRun>(r, specs, config);
  ShareRun &whole = *runs[0], &share0 = *runs[1], &share1 = *runs[2];
  PairGroup pair;
  share0.optimizer().join_split_group(pair.member(0));
  share1.optimizer().join_split_group(pair.member(1));
  for (int t = 0; t < 3; ++t) {
    whole.step(weights, grads[t], t == 0);
    std::thread other([&] { share1.step(weights, grads[t], t == 0); });
    share0.step(weights, grads[t], t == 0);
    other.join();
  }
  for (const ShareRun* share : {&share0, &share1})
    for (size_t k = 0; k < specs.size(); ++k) {
      SCOPED_TRACE(specs[k].name);
      share->each(k, [&](int64_t i, int64_t at) {
        if (at < 0) return;
        EXPECT_NEAR(share->weight(i), whole.whole_weight(k, at), 1e-6);
      });
    }
  return runs;
}

// Adafactor (the path AdafactorMatchesTransformers checks): a matrix split by rows (5 as 3 + 2),
// one by columns, a split vector and a whole one; the first moment, scale_parameter and clipping
// on. Each rank keeps the whole second moments, the whole run's.
TEST(Optimizers, AdafactorSplitSharesStepAsTheWholeParameters) {
  const auto runs =
      step_shares({{"rows.weight", Shape{5, 6}, 0, kLinearWeight},
                   {"cols.weight", Shape{4, 6}, 1, kLinearWeight},
                   {"split.bias", Shape{6}, 0, kBiasOrNorm},
                   {"norm.weight", Shape{6}, -1, kBiasOrNorm}},
                  config("adafactor", "beta1=0.9,scale_parameter=true,clip_threshold=0.5", 0.01));
  for (size_t r = 1; r < 3; ++r) {
    const Tensor a = runs[r]->state(0), b = runs[0]->state(0);
    ASSERT_EQ(a.numel(), b.numel());
    EXPECT_LE(rel_error(a.f32(), b.f32(), a.numel()), 1e-6);
  }
}

// 8-bit AdamW (the path AdamW8bitMatchesBitsandbytes checks): the quantization blocks (256
// values) are the whole parameter's, across the shares' rows and columns, so each share's codes
// are the whole run's codes of its elements and each rank's block maxima the whole run's. A
// matrix split by rows (45 as 23 + 22), one by columns, a split vector and a whole one in 8 bits
// (min_8bit_size=256), and a split vector too small for them.
TEST(Optimizers, EightBitAdamWSplitSharesStepAsTheWholeParameters) {
  const std::vector<SplitSpec> specs = {{"rows.weight", Shape{45, 20}, 0, kLinearWeight},
                                        {"cols.weight", Shape{24, 30}, 1, kLinearWeight},
                                        {"split.bias", Shape{600}, 0, kBiasOrNorm},
                                        {"norm.weight", Shape{300}, -1, kBiasOrNorm},
                                        {"small.bias", Shape{6}, 0, kBiasOrNorm}};
  const auto runs = step_shares(specs, config("adamw_8bit", "min_8bit_size=256", 0.1));
  for (size_t r = 1; r < 3; ++r) {
    for (size_t i : {size_t{2}, size_t{3}}) {  // the moments' block maxima
      const Tensor a = runs[r]->state(i), b = runs[0]->state(i);
      ASSERT_EQ(a.numel(), b.numel());
      EXPECT_EQ(std::vector<float>(a.f32(), a.f32() + a.numel()),
                std::vector<float>(b.f32(), b.f32() + b.numel()));
    }
    for (size_t i : {size_t{0}, size_t{1}}) {  // the codes, 8-bit parameter after parameter
      const uint8_t* share = runs[r]->state(i).as<uint8_t>();
      const uint8_t* whole = runs[0]->state(i).as<uint8_t>();
      int64_t share_at = 0, whole_at = 0;
      for (size_t k = 0; k + 1 < specs.size(); ++k) {
        int64_t held = 0;
        runs[r]->each(k, [&](int64_t, int64_t at) {
          if (at >= 0) EXPECT_EQ(share[share_at + held], whole[whole_at + at]) << specs[k].name;
          ++held;
        });
        share_at += held;
        whole_at += specs[k].whole.numel();
      }
    }
  }
}

TEST(Optimizers, SgdMatchesPyTorch) {
  SafetensorsFile f(fixture("optim/sgd.safetensors"));
  const std::vector<std::tuple<std::string, std::string, double>> variants = {
      {"nesterov", "momentum=0.9,nesterov=true", 0.1},
      {"dampening", "momentum=0.9,dampening=0.1", 0.1},
      {"plain", "", 0.0}};
  for (const auto& [name, args, wd] : variants) {
    FixtureRun r(f, kParams, "init.", config("sgd", args, wd));
    r.run("grad.", 10, linear_lr);
    for (const Param& p : kParams)
      EXPECT_LE(r.update_error(p.name, "init.", "final." + name + "."), 1e-4)
          << name << " " << p.name;
    if (name == "nesterov") {
      const Tensor& want = f.get("state.nesterov.w.weight.momentum_buffer");
      EXPECT_LE(rel_error(r.state("momentum_buffer").f32(), want.f32(), want.numel()), 1e-5);
    }
    if (name == "plain") EXPECT_TRUE(r.optimizer().state().empty());  // no buffer without momentum
  }
}

TEST(Optimizers, QuantizationMapsAreBitsandbytesDynamicMaps) {
  SafetensorsFile f(fixture("optim/adamw8bit.safetensors"));
  for (bool is_signed : {true, false}) {
    const auto map = dynamic_quant_map(is_signed);
    const Tensor& want = f.get(is_signed ? "qmap.signed" : "qmap.unsigned");
    ASSERT_EQ(want.numel(), 256);
    // bitsandbytes computes the steps, midpoints and decade scaling in float32 (three
    // roundings), this map in double: at most two float32 units in the last place apart.
    for (int i = 0; i < 256; ++i)
      EXPECT_LE(std::abs(map[i] - want.f32()[i]),
                2 * std::abs(want.f32()[i]) * std::numeric_limits<float>::epsilon())
          << is_signed << " " << i;
  }
}

TEST(Optimizers, QuantizationPicksTheNearestCode) {
  std::mt19937 rng(5);
  for (bool is_signed : {true, false}) {
    const auto map = dynamic_quant_map(is_signed);
    std::uniform_real_distribution<float> x(is_signed ? -1.2f : -0.1f, 1.2f);
    double worst = 0;
    for (int k = 0; k < 20000; ++k) {
      // Mostly small magnitudes, where the map is densest in relative terms.
      const float v = k % 2 ? x(rng) : x(rng) * std::pow(10.0f, -static_cast<float>(k % 7));
      const uint8_t q = quantize_nearest(map.data(), v);
      double best = 1e30;
      for (float m : map) best = std::min(best, std::abs(static_cast<double>(m) - v));
      EXPECT_EQ(std::abs(static_cast<double>(map[q]) - v), best) << v;
      // Round-trip bound: within the top decade [0.1, 1] the codes are at most 0.9/64 apart
      // (signed) or 0.9/128 (unsigned), so the error is at most half of that.
      if (std::abs(v) >= 0.1f && std::abs(v) <= 1.0f && (is_signed || v >= 0))
        worst = std::max(worst, best);
    }
    EXPECT_LE(worst, (is_signed ? 0.9 / 64 : 0.9 / 128) / 2 + 1e-7) << is_signed;
  }
  const auto map = dynamic_quant_map(true);
  EXPECT_EQ(map[quantize_nearest(map.data(), 0.0f)], 0.0f);
  EXPECT_EQ(quantize_nearest(map.data(), 5.0f), 255);
  EXPECT_EQ(quantize_nearest(map.data(), -5.0f), 0);
}

// The CPU's requantization row (quantize_row: 16 lanes at a time on AVX-512, the scalar search in
// the tail) gives quantize_nearest's code for every value: each map value, the float32 ties
// between neighbours and the floats either side of them, values around each code, out-of-range
// values, +-0, infinities and NaN, with a scale of 1 and another, from two alignments.
TEST(Optimizers, QuantizeRowGivesQuantizeNearestsCodes) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> wide(-1.3f, 1.3f), unit(0.0f, 1.0f);
  for (bool is_signed : {true, false}) {
    const auto map = dynamic_quant_map(is_signed);
    std::vector<float> x = {0.0f,
                            -0.0f,
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(),
                            2.0f,
                            -2.0f};
    for (int i = 0; i < 256; ++i) {
      x.push_back(map[i]);
      x.push_back(std::nextafter(map[i], -2.0f));
      x.push_back(std::nextafter(map[i], 2.0f));
      if (i < 255) {
        const float tie = map[i] + (map[i + 1] - map[i]) / 2;
        for (float t : {tie, std::nextafter(tie, -2.0f), std::nextafter(tie, 2.0f)}) x.push_back(t);
        x.push_back(map[i] + (map[i + 1] - map[i]) * unit(rng));
      }
    }
    for (int k = 0; k < 4000; ++k)
      x.push_back(wide(rng) * std::pow(10.0f, -static_cast<float>(k % 8)));
    for (const float scale : {1.0f, 1.0f / 0.37f}) {
      for (const size_t start : {size_t{0}, size_t{1}}) {
        const int64_t n = static_cast<int64_t>(x.size() - start);
        std::vector<uint8_t> got(x.size() + 1, 77);
        quantize_row(map.data(), x.data() + start, scale, n, got.data());
        for (int64_t j = 0; j < n; ++j)
          ASSERT_EQ(got[static_cast<size_t>(j)],
                    quantize_nearest(map.data(), x[start + static_cast<size_t>(j)] * scale))
              << (is_signed ? "signed" : "unsigned") << " map, x = " << x[start + j] << ", scale "
              << scale;
        EXPECT_EQ(got[static_cast<size_t>(n)], 77) << "nothing written past the row";
      }
    }
  }
}

// Block-wise 8-bit AdamW written in fp64 (exact nearest codes): the algorithm the float32 kernel
// implements, for one parameter with 8-bit state.
struct AdamW8bitReference {
  std::vector<uint8_t> c1, c2;
  std::vector<double> a1, a2;
  std::array<float, 256> qs = dynamic_quant_map(true), qu = dynamic_quant_map(false);
  explicit AdamW8bitReference(int64_t n) : c1(n), c2(n), a1((n + 255) / 256), a2((n + 255) / 256) {}
  static uint8_t nearest(const std::array<float, 256>& map, double x) {
    int best = 0;
    for (int i = 1; i < 256; ++i)
      if (std::abs(map[i] - x) < std::abs(map[best] - x)) best = i;
    return static_cast<uint8_t>(best);
  }
  void step(std::vector<double>& w, const float* g, double mult, double lr, double wd, int t) {
    const double b1 = 0.9, b2 = 0.999, eps = 1e-8;
    const int64_t n = static_cast<int64_t>(w.size());
    for (int64_t b = 0; b * 256 < n; ++b) {
      const int64_t end = std::min(n, b * 256 + 256);
      std::vector<double> m, v;
      double max1 = 0, max2 = 0;
      for (int64_t i = b * 256; i < end; ++i) {
        const double gi = g[i] * mult;
        m.push_back(b1 * qs[c1[i]] * a1[b] + (1 - b1) * gi);
        v.push_back(b2 * qu[c2[i]] * a2[b] + (1 - b2) * gi * gi);
        const double mh = m.back() / (1 - std::pow(b1, t)), vh = v.back() / (1 - std::pow(b2, t));
        w[i] = w[i] * (1 - lr * wd) - lr * mh / (std::sqrt(vh) + eps);
        max1 = std::max(max1, std::abs(m.back()));
        max2 = std::max(max2, v.back());
      }
      a1[b] = max1;
      a2[b] = max2;
      for (int64_t i = b * 256; i < end; ++i) {
        c1[i] = nearest(qs, max1 > 0 ? m[i - b * 256] / max1 : 0);
        c2[i] = nearest(qu, max2 > 0 ? v[i - b * 256] / max2 : 0);
      }
    }
  }
};

int64_t count_equal(const uint8_t* a, const uint8_t* b, int64_t n) {
  int64_t same = 0;
  for (int64_t i = 0; i < n; ++i) same += a[i] == b[i];
  return same;
}

TEST(Optimizers, AdamW8bitFollowsBitsandbytesAndTheFp64Algorithm) {
  SafetensorsFile f(fixture("optim/adamw8bit.safetensors"));
  const std::vector<Param> params = {
      {"big.weight", true}, {"small.weight", true}, {"big.bias", false}};
  OptimizerConfig c = config("adamw_bnb_8bit", "", 0.01);
  FixtureRun r(f, params, "init8.", c);
  const int64_t big = 70 * 75;
  // The plan: big.weight (5250 >= 4096 values) in 8 bits with 21 blocks; the others in 32 bits.
  EXPECT_EQ(r.state("exp_avg_codes").numel(), big);
  EXPECT_EQ(r.state("exp_avg_absmax").numel(), 21);
  EXPECT_EQ(r.state("exp_avg_32bit").numel(), 20 * 30 + 70);

  // The fp64 reference runs big.weight alongside, with the same clipped gradients.
  AdamW8bitReference ref(big);
  std::vector<double> w64(f.get("init8.big.weight").f32(), f.get("init8.big.weight").f32() + big);
  for (int t = 1; t <= 10; ++t) {
    double sq = 0;
    for (const Param& p : params) {
      const Tensor& g = f.get("grad8." + std::to_string(t - 1) + "." + p.name);
      for (int64_t i = 0; i < g.numel(); ++i) sq += static_cast<double>(g.f32()[i]) * g.f32()[i];
    }
    const double mult = clip_coefficient(std::sqrt(sq), 1.0);
    ref.step(w64, f.get("grad8." + std::to_string(t - 1) + ".big.weight").f32(), mult, 1e-3, 0.01,
             t);
  }
  r.run("grad8.", 10, [](int) { return 1e-3; });

  // 32-bit state: AdamW exactly (as bitsandbytes' 32-bit path).
  EXPECT_LE(r.update_error("small.weight", "init8.", "final8."), 3e-4);  // measured 6e-5
  EXPECT_LE(r.update_error("big.bias", "init8.", "final8."), 3e-4);
  // Against the fp64 algorithm: the same codes but where a moment sits within float32
  // rounding of the midpoint between two codes; the update within float32 noise.
  std::vector<float> w32(w64.begin(), w64.end());
  const Tensor got = r.params().weight(r.params().index("big.weight"));
  const Tensor& init = f.get("init8.big.weight");
  std::vector<float> d_got(big), d_ref(big);
  for (int64_t i = 0; i < big; ++i) {
    d_got[i] = got.f32()[i] - init.f32()[i];
    d_ref[i] = w32[i] - init.f32()[i];
  }
  EXPECT_LE(rel_error(d_got.data(), d_ref.data(), big), 5e-4);  // measured 4e-5
  EXPECT_GE(count_equal(r.state("exp_avg_codes").as<uint8_t>(), ref.c1.data(), big),
            big * 998 / 1000);
  EXPECT_GE(count_equal(r.state("exp_avg_sq_codes").as<uint8_t>(), ref.c2.data(), big),
            big * 998 / 1000);
  // Against bitsandbytes: its CPU kernel picks codes through a 65536-entry table instead of the
  // exact nearest code (26 and 48 of 5250 codes differ after 10 steps, measured when the fixture
  // was made), which moves the weights by up to 2.3e-4 of an update of ~1e-2.
  EXPECT_LE(r.update_error("big.weight", "init8.", "final8."), 1e-2);  // measured 1.5e-3
  EXPECT_GE(count_equal(r.state("exp_avg_codes").as<uint8_t>(),
                        f.get("state8.big.weight.state1").as<uint8_t>(), big),
            big * 98 / 100);
  EXPECT_GE(count_equal(r.state("exp_avg_sq_codes").as<uint8_t>(),
                        f.get("state8.big.weight.state2").as<uint8_t>(), big),
            big * 98 / 100);
  EXPECT_LE(
      rel_error(r.state("exp_avg_absmax").f32(), f.get("state8.big.weight.absmax1").f32(), 21),
      1e-2);
  EXPECT_LE(
      rel_error(r.state("exp_avg_sq_absmax").f32(), f.get("state8.big.weight.absmax2").f32(), 21),
      1e-2);
}

TEST(Optimizers, StochasticRoundingIsUnbiasedAndReproducible) {
  auto be = make_cpu_backend();
  const int64_t n = 200003;
  const float gap = std::ldexp(1.0f, -7);  // bf16 spacing in [1, 2)
  std::vector<float> x(n), y;
  for (int64_t i = 0; i < n; ++i) x[i] = i % 2 ? 1.0f + 0.3f * gap : -(1.0f + 0.7f * gap);
  x[5] = 1.5f;  // exactly representable: stays
  x[7] = std::numeric_limits<float>::infinity();
  y = x;
  const RngKey key{3, 11, 0x80000000u};
  be->stochastic_round(DType::bf16, Tensor(y.data(), Shape{n}, DType::f32), key);
  int64_t up_pos = 0, up_neg = 0, pos = 0, neg = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (i == 5 || i == 7) continue;
    const float lo = i % 2 ? 1.0f : -1.0f, hi = i % 2 ? 1.0f + gap : -(1.0f + gap);
    ASSERT_TRUE(y[i] == lo || y[i] == hi) << i << " " << y[i];
    (i % 2 ? pos : neg) += 1;
    (i % 2 ? up_pos : up_neg) += y[i] == hi;
  }
  EXPECT_EQ(y[5], 1.5f);
  EXPECT_TRUE(std::isinf(y[7]));
  // Rounded away from zero with probability 0.3 (and 0.7): 6 standard deviations.
  EXPECT_NEAR(static_cast<double>(up_pos) / pos, 0.3, 6 * std::sqrt(0.21 / pos));
  EXPECT_NEAR(static_cast<double>(up_neg) / neg, 0.7, 6 * std::sqrt(0.21 / neg));
  // Same key: same result; another step: another draw.
  std::vector<float> again = x, other = x;
  be->stochastic_round(DType::bf16, Tensor(again.data(), Shape{n}, DType::f32), key);
  be->stochastic_round(DType::bf16, Tensor(other.data(), Shape{n}, DType::f32),
                       RngKey{3, 12, key.site});
  EXPECT_EQ(again, y);
  EXPECT_NE(other, y);
}

TEST(Optimizers, RefuseBadNamesAndOptimArgs) {
  expect_error([] { make_optimizer(config("adam", "", 0)); },
               "unknown optim \"adam\" (valid: adamw_torch, adamw_torch_fused, adafactor, "
               "adamw_8bit, adamw_bnb_8bit, sgd)");
  expect_error([] { make_optimizer(config("sgd", "momentum", 0)); },
               "\"momentum\" is not key=value");
  expect_error([] { make_optimizer(config("sgd", "momentum=fast", 0)); },
               "momentum must be a number, got \"fast\"");
  expect_error([] { make_optimizer(config("sgd", "nesterov=true", 0)); },
               "nesterov momentum requires a momentum and zero dampening");
  expect_error([] { make_optimizer(config("sgd", "momentum=0.9,nesterov=maybe", 0)); },
               "nesterov must be true or false");
  expect_error([] { make_optimizer(config("sgd", "momentum=0.9,momentum=0.8", 0)); },
               "\"momentum\" is given twice");
  expect_error([] { make_optimizer(config("adafactor", "warmup_init=true", 0)); },
               "warmup_init requires relative_step=true");
  expect_error([] { make_optimizer(config("adafactor", "beta1=1.5", 0)); },
               "beta1 must lie in [0, 1)");
  expect_error([] { make_optimizer(config("adamw_torch", "momentum=0.9", 0)); },
               "\"momentum\" is not a setting of adamw_torch");
  expect_error([] { make_optimizer(config("adamw_8bit", "min_8bit_size=0", 0)); },
               "min_8bit_size must be a positive whole number");
  EXPECT_EQ(make_optimizer(config("adamw_torch_fused", "", 0))->name(), "adamw_torch");
  EXPECT_EQ(make_optimizer(config("adamw_bnb_8bit", " ", 0))->name(), "adamw_8bit");
  // transformers spells flags true/1/yes in any case.
  EXPECT_EQ(make_optimizer(config("sgd", "momentum=0.9,nesterov=Yes", 0))->name(), "sgd");
}

// Optimizer-state bytes in the plan of bert-base, from the rules stated in the issue and the
// model's parameter list (independently of the optimizers' own bookkeeping).
TEST(Optimizers, StateBytesFollowEachOptimizersRule) {
  auto model = Model::create(resolve_config("bert-base-uncased"));
  const ParameterSet& ps = model->params();
  const int64_t n = ps.total_elements();
  int64_t ranges = 0, factored = 0, bits8 = 0, blocks = 0, bits32 = 0;
  bool prev_decay = false;
  for (const ParamInfo& p : ps.list()) {
    ranges += p.decay && !prev_decay;
    prev_decay = p.decay;
    factored += p.shape.rank() >= 2
                    ? p.shape.numel() / p.shape[p.shape.rank() - 1] + p.shape[p.shape.rank() - 1]
                    : p.shape.numel();
    const bool is8 = p.shape.numel() >= 4096 && p.name.find("embeddings.") == std::string::npos;
    (is8 ? bits8 : bits32) += p.shape.numel();
    blocks += is8 ? (p.shape.numel() + 255) / 256 : 0;
  }
  auto state_bytes = [&](const std::string& name, const std::string& args) {
    MemoryPlan plan;
    BufferBinder binder;
    make_optimizer(config(name, args, 0))->plan(plan, binder, ps);
    return static_cast<int64_t>(
        plan.bytes_by_category()[static_cast<int>(Category::optimizer_state)]);
  };
  const int64_t table = 16 * ranges;  // int64 [begin, end) per run of decayed parameters
  EXPECT_EQ(state_bytes("adamw_torch", ""), 8 * n + table);
  EXPECT_EQ(state_bytes("sgd", "momentum=0.9"), 4 * n + table);
  EXPECT_EQ(state_bytes("sgd", ""), table);
  EXPECT_EQ(state_bytes("adafactor", ""), 4 * factored);
  EXPECT_EQ(state_bytes("adafactor", "beta1=0.9"), 4 * factored + 4 * n);
  EXPECT_EQ(state_bytes("adamw_8bit", ""), 2 * bits8 + 8 * blocks + 8 * bits32 + 2 * 256 * 4);
  // The orders of magnitude the Hugging Face guides quote: 8 bytes per parameter for AdamW, about 2
  // for 8-bit AdamW (its 32-bit embeddings and small tensors aside), a sliver for Adafactor.
  EXPECT_LT(static_cast<double>(2 * bits8 + 8 * blocks) / bits8, 2.04);
  EXPECT_LT(4.0 * factored / n, 0.05);
}

}  // namespace
}  // namespace brisk::testing
