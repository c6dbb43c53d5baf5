// The environment's measurement switches: a variable set to "0" turns a path off to compare
// against (BRISK_FUSED_ATTENTION, BRISK_BF16_ACTIVATIONS, BRISK_RECOMPUTE_ACTIVATION,
// BRISK_LABELLED_ROWS_ONLY, ...), one set to "1" opts into a path that is off by default
// (BRISK_BF16_PRODUCT_OUTPUT, BRISK_RECORDED_STEPS); BRISK_CPU_PRODUCTS names a library. They
// are read here only, into one Switches value a run resolves once and passes down: to its
// backend (make_backend) and to its model's plan (PlanOptions). A value a switch does not take
// is refused, naming the variable.
#pragma once

#include <string>

namespace brisk {

struct Switches {
  // Paths on unless their variable is "0".
  bool attention_bf16_io = true;          // BRISK_ATTENTION_BF16_IO
  bool attention_deterministic = true;    // BRISK_ATTENTION_DETERMINISTIC
  bool bf16_activations = true;           // BRISK_BF16_ACTIVATIONS
  bool bf16_activation_gradient = true;   // BRISK_BF16_ACTIVATION_GRADIENT
  bool blocked_4bit_weights = true;       // BRISK_BLOCKED_4BIT_WEIGHTS
  bool half_frozen_base = true;           // BRISK_HALF_FROZEN_BASE
  bool bf16_head_grad = true;             // BRISK_BF16_HEAD_GRAD
  bool fused_activation_gradient = true;  // BRISK_FUSED_ACTIVATION_GRADIENT
  bool fused_attention = true;            // BRISK_FUSED_ATTENTION
  bool fused_residual_norm = true;        // BRISK_FUSED_RESIDUAL_NORM
  bool key_lengths = true;                // BRISK_KEY_LENGTHS
  bool labelled_rows_only = true;         // BRISK_LABELLED_ROWS_ONLY
  bool pad_head = true;                   // BRISK_PAD_HEAD
  bool recompute_activation = true;       // BRISK_RECOMPUTE_ACTIVATION
  bool unmasked_attention = true;         // BRISK_UNMASKED_ATTENTION
  // Paths off unless their variable is "1".
  bool bf16_product_output = false;  // BRISK_BF16_PRODUCT_OUTPUT
  bool recorded_steps = false;       // BRISK_RECORDED_STEPS
  // BRISK_CPU_PRODUCTS: "openblas" or "onednn" forces the CPU's product library; "" lets the
  // backend choose.
  std::string cpu_products;
};

// The switches as the environment sets them now, each checked.
Switches read_switches();
// read_switches, for its refusals alone: at start, before any work, so that a switch of a path
// the run never reaches is still checked.
inline void check_switches() {
  read_switches();
}

}  // namespace brisk
