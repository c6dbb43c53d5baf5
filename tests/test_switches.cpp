// The measurement switches: each variable read into its field of one Switches value, and that
// value, not the environment at the time of a call, deciding what a backend made with it does.
#include <gtest/gtest.h>

#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_matmul_dnnl.h"
#include "core/switches.h"
#include "test_support.h"

namespace brisk::testing {
namespace {

TEST(Switches, EachVariableSetsItsField) {
  EXPECT_TRUE(read_switches().fused_attention);
  const std::vector<std::pair<const char*, bool Switches::*>> off = {
      {"BRISK_ATTENTION_BF16_IO", &Switches::attention_bf16_io},
      {"BRISK_ATTENTION_DETERMINISTIC", &Switches::attention_deterministic},
      {"BRISK_BF16_ACTIVATIONS", &Switches::bf16_activations},
      {"BRISK_BF16_ACTIVATION_GRADIENT", &Switches::bf16_activation_gradient},
      {"BRISK_BLOCKED_4BIT_WEIGHTS", &Switches::blocked_4bit_weights},
      {"BRISK_BF16_HEAD_GRAD", &Switches::bf16_head_grad},
      {"BRISK_FUSED_ACTIVATION_GRADIENT", &Switches::fused_activation_gradient},
      {"BRISK_FUSED_ATTENTION", &Switches::fused_attention},
      {"BRISK_FUSED_RESIDUAL_NORM", &Switches::fused_residual_norm},
      {"BRISK_KEY_LENGTHS", &Switches::key_lengths},
      {"BRISK_LABELLED_ROWS_ONLY", &Switches::labelled_rows_only},
      {"BRISK_PAD_HEAD", &Switches::pad_head},
      {"BRISK_RECOMPUTE_ACTIVATION", &Switches::recompute_activation},
      {"BRISK_UNMASKED_ATTENTION", &Switches::unmasked_attention}};
  for (const auto& [name, field] : off) {
    SCOPED_TRACE(name);
    EXPECT_TRUE(read_switches().*field);
    set_switch(name, "0");
    const Switches s = read_switches();
    set_switch(name, nullptr);
    EXPECT_FALSE(s.*field);
    EXPECT_EQ(Switches().*field, true);  // on by default
  }
  for (const auto& [name, field] : std::vector<std::pair<const char*, bool Switches::*>>{
           {"BRISK_BF16_PRODUCT_OUTPUT", &Switches::bf16_product_output},
           {"BRISK_RECORDED_STEPS", &Switches::recorded_steps}}) {
    SCOPED_TRACE(name);
    set_switch(name, "1");
    EXPECT_TRUE(read_switches().*field);
    set_switch(name, "0");
    EXPECT_FALSE(read_switches().*field);
    set_switch(name, nullptr);
    EXPECT_FALSE(read_switches().*field);
  }
  set_switch("BRISK_CPU_PRODUCTS", "openblas");
  EXPECT_EQ(read_switches().cpu_products, "openblas");
  set_switch("BRISK_CPU_PRODUCTS", "mkl");
  expect_error([] { read_switches(); },
               "environment variable BRISK_CPU_PRODUCTS=mkl: the switch takes openblas or onednn");
  set_switch("BRISK_CPU_PRODUCTS", nullptr);
  EXPECT_EQ(read_switches().cpu_products, "");
}

// A CPU backend multiplies by the library its switches named when it was made, whatever the
// environment says later.
TEST(Switches, ACpuBackendKeepsTheLibraryItWasMadeWith) {
  if (!DnnlMatmul::available(DType::f32))
    GTEST_SKIP() << "this build's oneDNN has no float32 kernels";
  std::vector<float> x(64 * 64, 0.5f), w(64 * 64, 0.25f), y(64 * 64);
  auto product = [&](Backend& be) {
    const uint64_t before = DnnlMatmul::calls();
    be.linear_forward(Tensor(x.data(), Shape{64, 64}, DType::f32),
                      Tensor(w.data(), Shape{64, 64}, DType::f32), Tensor(), WeightLayout::out_in,
                      Tensor(y.data(), Shape{64, 64}, DType::f32));
    EXPECT_FLOAT_EQ(y[0], 64 * 0.5f * 0.25f);
    return DnnlMatmul::calls() - before;
  };
  Switches onednn, openblas;
  onednn.cpu_products = "onednn";
  openblas.cpu_products = "openblas";
  auto by_onednn = make_cpu_backend(onednn), by_openblas = make_cpu_backend(openblas);
  set_switch("BRISK_CPU_PRODUCTS", "openblas");
  EXPECT_GT(product(*by_onednn), 0u);
  set_switch("BRISK_CPU_PRODUCTS", "onednn");
  EXPECT_EQ(product(*by_openblas), 0u);
  set_switch("BRISK_CPU_PRODUCTS", nullptr);
}

}  // namespace
}  // namespace brisk::testing
