// The backend conformance suite: every op as table entries (OpCase), each run on every backend
// present and checked against an fp64 reference and, on the other backends, against the CPU
// backend on the same inputs (test_backend_ops.cpp runs them). Adding an op, or a backend, means
// adding entries here, not tests.
//
// An entry names its inputs, runs the op on a backend (forward and backward, into buffers that
// start with garbage or with the values an accumulating output adds to), and lists its checks:
// which output, which metric, and the tolerance against the reference and against the CPU.
// The reference computes in double: forward results directly, gradients by central finite
// differences of that forward (or analytically where the op is linear). Entries at the sizes
// that exercise a GPU's tiling have no fp64 reference (finite differences would take minutes):
// the CPU backend, checked by the small entries, is their reference.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace brisk::testing {

using Vec = std::vector<double>;
// Inputs and outputs by name, as doubles: float32, int32 and 16-bit bit patterns all hold exactly.
using Values = std::map<std::string, Vec>;

enum class Metric {
  elementwise,   // |got - want| <= tol * max(1, |want|) at every element
  normwise,      // ||got - want|| / max(||want||, 1e-6) <= tol: sums over many terms, gradients
  exact,         // equal at every element (NaN equals NaN); the tolerances are ignored
  relative,      // |got - want| <= tol * |want| at every element: state whose scale is far from 1
  mostly_exact,  // equal at all but a fraction tol of the elements (quantization codes)
};

struct Check {
  std::string output;
  Metric metric = Metric::elementwise;
  double vs_reference = 1e-5;  // against the fp64 reference
  double vs_cpu = 1e-5;        // against the CPU backend, on the other backends
  // When set, the input this output started from, subtracted from both sides before comparing:
  // what an accumulating op added is checked, not diluted by what was there.
  std::string less = "";
};

struct OpCase {
  std::string name;  // letters, digits and underscores: part of the test's name
  std::function<Values(std::mt19937&)> inputs;
  std::function<Values(Backend&, const Values&)> run;
  // fp64 expected outputs (gradients as what the op adds when `less` is set), for every check or
  // for some (the others are checked against the CPU only); empty: the CPU backend is the
  // reference and the case runs on the other backends only.
  std::function<Values(const Values&)> reference;
  std::vector<Check> checks;
};

// ---- for writing cases ----

Vec randn_d(int64_t n, std::mt19937& rng, double scale = 1.0, double shift = 0.0);
double dot(const Vec& a, const Vec& b);
// Central finite differences of loss at x, one element at a time.
Vec fd_grad(Vec x, const std::function<double(const Vec&)>& loss, double h = 1e-4);
// The gradient of sum(f(x) * upstream) with respect to x, by finite differences of f.
Vec fd_vjp(const Vec& x, const std::function<Vec(const Vec&)>& f, const Vec& upstream,
           double h = 1e-4);
// a - b element by element (over the shorter): what one way of computing an output differs from
// another by, checked against zeros.
Vec minus(const Vec& a, const Vec& b);
// A part of a case's name: "37x75" for a shape.
std::string shape_name(const Shape& s);
// Each of `tokens` tokens' position in its sample, as a packed batch lays them (PackedSamples:
// samples of 4, 1, 7, 2, 11 and 3 tokens in turn, the last cut short), so from 0 to 10.
Vec packed_positions(int64_t tokens);

// ---- the table, by file ----

std::vector<OpCase> linear_cases();       // cases_linear.cpp
std::vector<OpCase> norm_cases();         // cases_norm.cpp: layernorm, rmsnorm, rotary
std::vector<OpCase> elementwise_cases();  // cases_elementwise.cpp
std::vector<OpCase> attention_cases();    // cases_attention.cpp
std::vector<OpCase> loss_cases();         // cases_loss.cpp: embedding, pooling, losses
std::vector<OpCase> optim_cases();        // cases_optim.cpp: the optimizer step
std::vector<OpCase> cast_cases();         // cases_cast.cpp: float32 <-> bf16, fp16
std::vector<OpCase> stored_cases();       // cases_stored.cpp: ops on bf16 saved activations
std::vector<OpCase> moe_cases();          // cases_moe.cpp: mixture-of-experts routing
std::vector<OpCase> lora_cases();         // cases_lora.cpp: LoRA's low-rank products
std::vector<OpCase> quant4_cases();       // cases_quant4.cpp: 4-bit weights' dequantization

}  // namespace brisk::testing
