// Runs the op table (op_case.h) on every backend: each entry against its fp64 reference, and on
// backends other than the CPU against the CPU backend too. A backend this machine cannot run
// (no GPU) skips its entries, saying why.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "backend_support.h"
#include "conformance/op_case.h"

namespace brisk::testing {

Vec randn_d(int64_t n, std::mt19937& rng, double scale, double shift) {
  const FVec v = randn(n, rng, static_cast<float>(scale), static_cast<float>(shift));
  return Vec(v.begin(), v.end());
}

double dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) s += a[i] * b[i];
  return s;
}

Vec fd_grad(Vec x, const std::function<double(const Vec&)>& loss, double h) {
  Vec g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double saved = x[i];
    x[i] = saved + h;
    const double lp = loss(x);
    x[i] = saved - h;
    const double lm = loss(x);
    x[i] = saved;
    g[i] = (lp - lm) / (2 * h);
  }
  return g;
}

Vec fd_vjp(const Vec& x, const std::function<Vec(const Vec&)>& f, const Vec& upstream, double h) {
  return fd_grad(
      x, [&](const Vec& v) { return dot(f(v), upstream); }, h);
}

Vec minus(const Vec& a, const Vec& b) {
  Vec r(a);
  for (size_t i = 0; i < r.size() && i < b.size(); ++i) r[i] -= b[i];
  return r;
}

std::string shape_name(const Shape& s) {
  std::string n;
  for (int i = 0; i < s.rank(); ++i) n += (i ? "x" : "") + std::to_string(s[i]);
  return n;
}

Vec packed_positions(int64_t tokens) {
  const int64_t lengths[] = {4, 1, 7, 2, 11, 3};
  Vec p(static_cast<size_t>(tokens));
  for (int64_t i = 0, s = 0, at = 0; i < tokens; ++i, ++at) {
    if (at == lengths[s % 6]) at = 0, ++s;
    p[static_cast<size_t>(i)] = static_cast<double>(at);
  }
  return p;
}

namespace {

::testing::AssertionResult compare(const Vec& got, const Vec& want, Metric metric, double tol) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << "size " << got.size() << " vs " << want.size();
  if (metric == Metric::mostly_exact) {
    size_t differ = 0;
    for (size_t i = 0; i < got.size(); ++i)
      differ += got[i] != want[i] && !(std::isnan(got[i]) && std::isnan(want[i]));
    if (static_cast<double>(differ) <= tol * static_cast<double>(got.size()))
      return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure()
           << differ << " of " << got.size() << " elements differ, more than a fraction " << tol;
  }
  size_t at = 0;  // the worst element
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const bool nan_g = std::isnan(got[i]), nan_w = std::isnan(want[i]);
    if (nan_g || nan_w) {
      if (nan_g && nan_w) continue;
      return ::testing::AssertionFailure()
             << "element " << i << ": got " << got[i] << ", want " << want[i];
    }
    if (got[i] == want[i]) continue;  // equal infinities included
    if (metric == Metric::exact)
      return ::testing::AssertionFailure() << "element " << i << " of " << got.size() << ": got "
                                           << got[i] << ", want exactly " << want[i];
    const double d = std::abs(got[i] - want[i]);
    const double e = metric == Metric::elementwise ? d / std::max(1.0, std::abs(want[i]))
                     : metric == Metric::relative  ? d / std::abs(want[i])
                                                   : d;
    if (!(e <= worst)) worst = e, at = i;
  }
  double error = worst;
  if (metric == Metric::normwise) {
    double num = 0, den = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      if (got[i] != want[i] && !(std::isnan(got[i]) && std::isnan(want[i])))
        num += (got[i] - want[i]) * (got[i] - want[i]);  // inf where one side is infinite
      if (std::isfinite(want[i])) den += want[i] * want[i];
    }
    error = std::sqrt(num) / std::max(std::sqrt(den), 1e-6);
  }
  if (metric == Metric::exact || error <= tol) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << (metric == Metric::normwise ? "relative error " : "error ") << error << " > " << tol
         << "; worst element " << at << " of " << got.size() << ": got " << got[at] << ", want "
         << want[at];
}

// The output a check looks at, less its starting value where it accumulates.
Vec checked(const Values& out, const Values& in, const Check& c, const char* side) {
  const auto it = out.find(c.output);
  BRISK_CHECK(it != out.end(), side, " has no output \"", c.output, "\"");
  return c.less.empty() ? it->second : minus(it->second, in.at(c.less));
}

struct Param {
  OpCase op;
  Device device;
};

std::string backend_name(Device d) {
  return d == Device::cpu ? "cpu" : "cuda";
}

// gtest would print a parameter as bytes; the test's name says it all.
void PrintTo(const Param& p, std::ostream* os) {
  *os << backend_name(p.device) << " " << p.op.name;
}

// A seed of the case's name (FNV-1a), so that each case has its own inputs whatever the order.
uint32_t seed_of(const std::string& name) {
  uint32_t h = 2166136261u;
  for (unsigned char c : name) h = (h ^ c) * 16777619u;
  return h;
}

std::vector<Param> table() {
  std::vector<OpCase> ops;
  for (auto cases : {linear_cases, norm_cases, elementwise_cases, attention_cases, loss_cases,
                     optim_cases, cast_cases, stored_cases, moe_cases, lora_cases, quant4_cases})
    for (OpCase& c : cases()) ops.push_back(std::move(c));
  std::vector<Param> params;
  for (Device device : {Device::cpu, Device::cuda})
    for (const OpCase& op : ops)
      if (device != Device::cpu || op.reference) params.push_back({op, device});
  return params;
}

class BackendOps : public ::testing::TestWithParam<Param> {};

TEST_P(BackendOps, MatchTheReference) {
  const OpCase& op = GetParam().op;
  const Device device = GetParam().device;
  if (device == Device::cuda) REQUIRE_GPU();
  std::mt19937 rng(seed_of(op.name));
  const Values in = op.inputs(rng);
  // The switches as the environment sets them (Ops.CpuProductsBy_*: BRISK_CPU_PRODUCTS).
  const Switches switches = read_switches();
  const std::unique_ptr<Backend> be = make_backend(device, switches);
  const Values got = op.run(*be, in);
  const Values want = op.reference ? op.reference(in) : Values();
  const Values cpu = device != Device::cpu ? op.run(*make_cpu_backend(switches), in) : Values();
  for (const Check& c : op.checks) {
    SCOPED_TRACE(c.output + (c.less.empty() ? "" : " - " + c.less));
    const Vec g = checked(got, in, c, "the run");
    if (want.contains(c.output))
      EXPECT_TRUE(compare(g, want.at(c.output), c.metric, c.vs_reference))
          << "against the fp64 reference";
    if (device != Device::cpu)
      EXPECT_TRUE(compare(g, checked(cpu, in, c, "the CPU run"), c.metric, c.vs_cpu))
          << "against the CPU backend";
  }
}

INSTANTIATE_TEST_SUITE_P(Ops, BackendOps, ::testing::ValuesIn(table()),
                         [](const ::testing::TestParamInfo<Param>& p) {
                           return backend_name(p.param.device) + "_" + p.param.op.name;
                         });

}  // namespace

}  // namespace brisk::testing
