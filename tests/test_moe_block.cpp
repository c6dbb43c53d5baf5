// A block whose MLP is a sparse one (BlockStyle::sparse_mlp, transformer_block.h): a mixture of
// one expert, chosen by every token with weight 1, is the dense SwiGLU MLP, so the block with that
// sparse MLP over the dense MLP's weights must give the dense block's output, input gradient and
// every parameter gradient (the expert's gate_up and down are fc and out; the router's gradient
// is zero: one expert's softmax is constant). The same operations in the same order on the same
// rows, so within float32 rounding of the combine (1e-6). Layers the sparse MLP does not claim
// stay dense. On the CPU and, where there is one, on a GPU.
#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "backend_support.h"
#include "core/memory_plan.h"
#include "models/moe_layer.h"
#include "models/transformer_block.h"

namespace brisk::testing {
namespace {

constexpr int64_t B = 2, T = 5, C = 8, F = 6, H = 2, K = 1, D = 4;

// One expert on every token: the dense MLP's weights as the expert's.
class OneExpert final : public SparseMlp {
 public:
  OneExpert(DeviceBuffers& d, const Tensor& fc_w, const Tensor& out_w, int sparse_layer)
      : layer_(sparse_layer) {
    std::mt19937 rng(3);
    w_ = {d.put(randn(C, rng), {1, C}), view(fc_w, {1, 2 * F, C}), view(out_w, {1, C, F})};
    g_ = {d.alloc({1, C}), d.alloc({1, 2 * F, C}), d.alloc({1, C, F})};
    const auto alloc = [&](Tensor* t, const std::string&, DType dtype, Shape shape) {
      *t = d.alloc(shape, dtype);
    };
    declare_moe_saved(shape_, saved_, alloc);
    declare_moe_scratch(shape_, scratch_, alloc);
  }
  bool sparse(int layer) const override { return layer == layer_; }
  void forward(Backend& be, int, const Tensor& x, const Tensor& y,
               const LayerAdapters& a) override {
    moe_forward(be, shape_, w_, rows(x), saved_, scratch_, rows(y), counts_, {}, nullptr, a);
  }
  void backward(Backend& be, int, const Tensor& x, const Tensor& dy, const Tensor& dx,
                bool accumulate_dw, const LayerAdapters& a) override {
    moe_backward(be, shape_, w_, g_, rows(x), saved_, scratch_, counts_, rows(dy), Tensor(),
                 rows(dx), accumulate_dw, {}, nullptr, a);
  }
  std::vector<std::pair<ProductSite, Tensor>> products(int) const override {
    return {{ProductSite::router, w_.router}};
  }
  // The tests here decode nothing.
  void declare_inference(const Declare&, int64_t) override {}
  void infer(Backend&, int, const Tensor&, const Tensor&) override {
    throw Error("OneExpert does not decode");
  }
  const MoeWeights& grads() const { return g_; }

 private:
  static Tensor view(const Tensor& t, Shape shape) {
    return Tensor(t.data(), shape, t.dtype(), t.device());
  }
  static Tensor rows(const Tensor& t) { return view(t, {B * T, C}); }
  MoeShape shape_{B * T, C, F, 1, 1, true};
  int layer_;
  MoeWeights w_, g_;
  MoeSaved saved_;
  MoeScratch scratch_;
  std::vector<int32_t> counts_;
};

struct BlockRun {
  FVec out, dx, qkv_w, proj_w, ln_a, fc_w, out_w, ln_b, router;
};

// A block's saved tensors and scratch for style st, in the backend's memory.
struct BlockBuffers {
  MemoryPlan plan;
  BufferBinder binder;
  BlockSaved saved;
  BlockScratch scratch;
  std::unique_ptr<Arena> arena;
  BlockBuffers(Backend& be, const BlockStyle& st) {
    const BlockDims dims{B, T, C, F, H, K, D, true, attention_buffers(be.device(), B, H, T, D)};
    declare_block_saved(plan, binder, saved, "block.", st, dims);
    declare_block_scratch(plan, binder, scratch, dims);
    plan.finalize();
    arena = std::make_unique<Arena>(plan, be.device_memory(), be.staging_memory());
    binder.bind(*arena);
  }
};

BlockRun run_block(Backend& be, int layer, bool with_one_expert) {
  BlockStyle st;
  st.pre_norm = st.causal = st.rms_norm = st.gated_mlp = true;
  st.activation = Activation::silu;
  st.eps = 1e-6f;
  st.heads = H;
  st.kv_heads = K;
  st.attention_scale = 0.5f;
  const BlockBuffers bufs(be, st);
  const BlockSaved& saved = bufs.saved;
  const BlockScratch& scratch = bufs.scratch;

  DeviceBuffers d(be);
  d.workspace(B * T * std::max<int64_t>(2 * F, (H + 2 * K) * D));
  std::mt19937 rng(7);
  const int64_t QKV = (H + 2 * K) * D;
  BlockParams w, g;
  w.qkv_w = d.put(randn(QKV * C, rng, 0.3f), {QKV, C});
  w.proj_w = d.put(randn(C * H * D, rng, 0.3f), {C, H * D});
  w.ln_a_g = d.put(randn(C, rng, 0.1f, 1.0f), {C});
  w.fc_w = d.put(randn(2 * F * C, rng, 0.3f), {2 * F, C});
  w.out_w = d.put(randn(C * F, rng, 0.3f), {C, F});
  w.ln_b_g = d.put(randn(C, rng, 0.1f, 1.0f), {C});
  // Gradients start as NaNs: those the block writes must all be written.
  const float nan = std::nanf("");
  g.qkv_w = d.put(FVec(QKV * C, nan), {QKV, C});
  g.proj_w = d.put(FVec(C * H * D, nan), {C, H * D});
  g.ln_a_g = d.put(FVec(C, nan), {C});
  g.fc_w = d.put(FVec(2 * F * C, nan), {2 * F, C});
  g.out_w = d.put(FVec(C * F, nan), {C, F});
  g.ln_b_g = d.put(FVec(C, nan), {C});
  const Tensor x = d.put(randn(B * T * C, rng), {B, T, C}), out = d.alloc({B, T, C});
  const Tensor dh = d.put(randn(B * T * C, rng), {B, T, C});
  std::unique_ptr<OneExpert> one;
  if (with_one_expert) one = std::make_unique<OneExpert>(d, w.fc_w, w.out_w, 0);
  st.sparse_mlp = one.get();
  block_forward(be, st, w, x, Tensor(), out, saved, scratch, RngKey{}, layer);
  BlockRun r;
  r.out = d.get(out);
  block_backward(be, st, w, g, x, Tensor(), saved, scratch, dh, RngKey{}, layer, false);
  r.dx = d.get(dh);
  r.qkv_w = d.get(g.qkv_w);
  r.proj_w = d.get(g.proj_w);
  r.ln_a = d.get(g.ln_a_g);
  r.ln_b = d.get(g.ln_b_g);
  const bool claimed = one && one->sparse(layer);
  r.fc_w = d.get(claimed ? one->grads().gate_up : g.fc_w);
  r.out_w = d.get(claimed ? one->grads().down : g.out_w);
  if (claimed) r.router = d.get(one->grads().router);
  return r;
}

class MoeBlockOn : public ::testing::TestWithParam<Device> {
 protected:
  void SetUp() override {
    if (GetParam() == Device::cuda) REQUIRE_GPU();
    be_ = make_backend(GetParam());
  }
  std::unique_ptr<Backend> be_;
};

TEST_P(MoeBlockOn, AOneExpertSparseMlpIsTheDenseBlock) {
  for (int layer : {0, 1}) {  // the sparse MLP claims layer 0 only
    SCOPED_TRACE("layer " + std::to_string(layer));
    const BlockRun dense = run_block(*be_, layer, false);
    const BlockRun sparse = run_block(*be_, layer, true);
    EXPECT_TRUE(near(sparse.out, dense.out, 1e-6)) << "out";
    EXPECT_TRUE(near(sparse.dx, dense.dx, 1e-6)) << "dx";
    EXPECT_TRUE(near(sparse.qkv_w, dense.qkv_w, 1e-6)) << "qkv";
    EXPECT_TRUE(near(sparse.proj_w, dense.proj_w, 1e-6)) << "proj";
    EXPECT_TRUE(near(sparse.ln_a, dense.ln_a, 1e-6)) << "ln_a";
    EXPECT_TRUE(near(sparse.ln_b, dense.ln_b, 1e-6)) << "ln_b";
    EXPECT_TRUE(near(sparse.fc_w, dense.fc_w, 1e-6)) << "fc / gate_up";
    EXPECT_TRUE(near(sparse.out_w, dense.out_w, 1e-6)) << "out / down";
    if (layer == 0) EXPECT_TRUE(near(sparse.router, FVec(C, 0.0f), 1e-6)) << "router";
  }
}

// The block refuses a sparse MLP where its style is not one the sparse path serves.
TEST_P(MoeBlockOn, ASparseMlpNeedsAPreNormBlock) {
  DeviceBuffers d(*be_);
  const Tensor w = d.alloc({2 * F, C}), o = d.alloc({C, F});
  OneExpert one(d, w, o, 0);
  BlockStyle st;
  st.pre_norm = false;
  st.sparse_mlp = &one;
  const BlockBuffers bufs(*be_, st);
  BlockParams p;
  p.qkv_w = d.alloc({(H + 2 * K) * D, C});
  p.proj_w = d.alloc({C, H * D});
  p.ln_a_g = p.ln_b_g = p.ln_a_b = p.ln_b_b = d.alloc({C});
  p.fc_w = w;
  p.out_w = o;
  st.heads = H;
  st.kv_heads = K;
  st.attention_scale = 0.5f;
  d.workspace(B * T * 2 * F);
  const Tensor x = d.alloc({B, T, C}), out = d.alloc({B, T, C});
  expect_error(
      [&] { block_forward(*be_, st, p, x, Tensor(), out, bufs.saved, bufs.scratch, RngKey{}, 0); },
      "pre-norm block without tensor parallelism");
}

INSTANTIATE_TEST_SUITE_P(Every, MoeBlockOn, ::testing::Values(Device::cpu, Device::cuda),
                         [](const ::testing::TestParamInfo<Device>& p) {
                           return std::string(p.param == Device::cuda ? "cuda" : "cpu");
                         });

}  // namespace
}  // namespace brisk::testing
