// The linears a model declares: each nn.Linear (or GPT-2's Conv1D) as transformers names its
// module, which adapters (LoRA) may wrap from outside the model.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace brisk {

struct LinearDecl {
  std::string module;  // transformers' module name: "model.layers.0.self_attn.q_proj"
  int param = -1;      // its weight among the model's parameters
  // Its features, of the whole linear (a tensor-parallel rank holds a slice of its weight).
  int64_t in = 0, out = 0;
  // The weight stored [in, out] (transformers' Conv1D, PEFT's fan_in_fan_out), not [out, in].
  bool fan_in_fan_out = false;
  int layer = -1;       // its block; -1 outside the blocks
  bool output = false;  // the model's output layer (an LM head, a classifier or score head)
  // A routed expert's (a mixture's): transformers 5 holds the experts fused, not as linears.
  bool expert = false;
  // A mixture's router, named as transformers 5 names its module ("model.layers.0.mlp.gate"):
  // a module of its own there, no nn.Linear, which PEFT adapts only as a parameter
  // (target_parameters "gate.weight", without dropout) and bitsandbytes does not quantize.
  bool router = false;
};

// A mixture's routed experts' fused weights as transformers 5 names them, which PEFT adapts
// through target_parameters: a sparse layer's "model.layers.<l>.mlp.experts.gate_up_proj"
// [E, 2F, C] (each expert's gate then up rows) and ".down_proj" [E, C, F].
struct ExpertWeightsDecl {
  std::string name;
  int layer = -1;
  bool down = false;  // the down projections (else the gate and up ones)
  int64_t experts = 0, in = 0, out = 0;
  int first = -1, last = -1;  // the model's parameters that hold it, expert after expert
};

// The module names of `linears`, in their order.
std::vector<std::string> module_names(const std::vector<LinearDecl>& linears);

}  // namespace brisk
