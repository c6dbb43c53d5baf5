// The measurement switches (see switches.h): one table, the only place they are read.
#include "core/switches.h"

#include <cstdlib>

#include "core/error.h"

namespace brisk {
namespace {

// The variable's value: "" when unset; refused, naming it, unless one of `values` (a "0 or 1"
// switch takes "0" and "1").
std::string value_of(const char* name, const char* values) {
  const char* v = std::getenv(name);
  const std::string value = v ? v : "";
  const bool on_off = std::string(values) == "0 or 1";
  const bool taken = value.empty() || (on_off ? value == "0" || value == "1"
                                              : value == "openblas" || value == "onednn");
  BRISK_CHECK(taken, "environment variable ", name, "=", excerpt(value), ": the switch takes ",
              values, " (or leave it unset)");
  return value;
}

}  // namespace

Switches read_switches() {
  Switches s;
  struct OnUnlessOff {
    const char* name;
    bool Switches::*field;
  };
  constexpr OnUnlessOff kOff[] = {
      {"BRISK_ATTENTION_BF16_IO", &Switches::attention_bf16_io},
      {"BRISK_ATTENTION_DETERMINISTIC", &Switches::attention_deterministic},
      {"BRISK_BF16_ACTIVATIONS", &Switches::bf16_activations},
      {"BRISK_BF16_ACTIVATION_GRADIENT", &Switches::bf16_activation_gradient},
      {"BRISK_BLOCKED_4BIT_WEIGHTS", &Switches::blocked_4bit_weights},
      {"BRISK_HALF_FROZEN_BASE", &Switches::half_frozen_base},
      {"BRISK_BF16_HEAD_GRAD", &Switches::bf16_head_grad},
      {"BRISK_FUSED_ACTIVATION_GRADIENT", &Switches::fused_activation_gradient},
      {"BRISK_FUSED_ATTENTION", &Switches::fused_attention},
      {"BRISK_FUSED_RESIDUAL_NORM", &Switches::fused_residual_norm},
      {"BRISK_KEY_LENGTHS", &Switches::key_lengths},
      {"BRISK_LABELLED_ROWS_ONLY", &Switches::labelled_rows_only},
      {"BRISK_PAD_HEAD", &Switches::pad_head},
      {"BRISK_RECOMPUTE_ACTIVATION", &Switches::recompute_activation},
      {"BRISK_UNMASKED_ATTENTION", &Switches::unmasked_attention},
  };
  for (const OnUnlessOff& o : kOff) s.*o.field = value_of(o.name, "0 or 1") != "0";
  s.bf16_product_output = value_of("BRISK_BF16_PRODUCT_OUTPUT", "0 or 1") == "1";
  s.recorded_steps = value_of("BRISK_RECORDED_STEPS", "0 or 1") == "1";
  s.cpu_products = value_of("BRISK_CPU_PRODUCTS", "openblas or onednn");
  return s;
}

}  // namespace brisk
