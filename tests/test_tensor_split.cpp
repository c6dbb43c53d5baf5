// Tensor parallelism's pieces on one process: where a rank's share of a split parameter lies in
// the full one, the attention's dropout over a slice of the heads (the masks of those heads in a
// call holding them all), and the config shares with the counts refused by name.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend_support.h"
#include "core/parameters.h"
#include "core/rng.h"
#include "models/config.h"
#include "models/model.h"
#include "parallel/split_bands.h"
#include "test_support.h"
#include "train/parallelism_config.h"
#include "trainer_support.h"

namespace brisk::testing {
namespace {

// Full element index of local element (o, k, i) of p's share: o along the dims before `dim`, k
// along it, i after it, by ParamSplit's definition (each part cut into `ranks` slices).
int64_t full_index_by_definition(const ParamInfo& p, int64_t local) {
  int64_t inner = 1;
  for (int d = p.split.dim + 1; d < p.shape.rank(); ++d) inner *= p.shape[d];
  const int64_t extent = p.shape[p.split.dim], piece = extent / p.split.pieces;
  const int64_t o = local / (extent * inner), k = local / inner % extent, i = local % inner;
  const int64_t full_k = k / piece * piece * p.split.ranks + p.split.rank * piece + k % piece;
  return (o * extent * p.split.ranks + full_k) * inner + i;
}

TEST(TensorSplit, RunsMapEveryShareElementToItsPlaceInTheFullParameter) {
  struct Case {
    Shape shape;
    int dim, pieces, ranks;
  };
  for (const Case& c : {Case{{8, 6}, 1, 3, 2}, Case{{12, 5}, 0, 1, 3}, Case{{4, 6, 2}, 1, 2, 2},
                        Case{{9}, 0, 3, 3}, Case{{6, 4}, 1, 1, 4}}) {
    std::vector<int> hits;
    for (int r = 0; r < c.ranks; ++r) {
      ParamInfo p;
      p.name = "w";
      p.shape = c.shape;
      p.split = ParamSplit{c.dim, c.pieces, r, c.ranks};
      hits.resize(static_cast<size_t>(p.full_shape().numel()), 0);
      std::vector<int64_t> mapped(static_cast<size_t>(p.shape.numel()), -1);
      // In two calls split anywhere: the runs continue across the cut.
      const int64_t cut = p.shape.numel() / 3;
      auto record = [&](int64_t local, int64_t full, int64_t length) {
        for (int64_t e = 0; e < length; ++e) mapped[static_cast<size_t>(local + e)] = full + e;
      };
      for_each_split_run(p, 0, cut, record);
      for_each_split_run(p, cut, p.shape.numel() - cut, record);
      for (int64_t e = 0; e < p.shape.numel(); ++e) {
        ASSERT_EQ(mapped[static_cast<size_t>(e)], full_index_by_definition(p, e))
            << c.shape.str() << " dim " << c.dim << " rank " << r << " element " << e;
        ++hits[static_cast<size_t>(mapped[static_cast<size_t>(e)])];
      }
    }
    for (int h : hits) EXPECT_EQ(h, 1) << "every full element belongs to one rank's share";
  }
}

// Vocabulary parallelism: 10 rows over 3 ranks of 4 rows each; the last holds 2 rows and 2 of
// padding, which have no place in the full parameter (and are never mapped).
TEST(TensorSplit, PaddedSharesMapTheirHeldRowsOnly) {
  const int64_t full = 10, rows = 4, C = 3;
  std::vector<int> hits(static_cast<size_t>(full * C), 0);
  for (int r = 0; r < 3; ++r) {
    ParamInfo p;
    p.name = "wte";
    p.shape = Shape{rows, C};
    p.split = ParamSplit{0, 1, r, 3, full};
    EXPECT_EQ(p.full_shape(), (Shape{full, C}));
    std::vector<int64_t> mapped(static_cast<size_t>(rows * C), -1);
    auto record = [&](int64_t local, int64_t at, int64_t length) {
      for (int64_t e = 0; e < length; ++e) mapped[static_cast<size_t>(local + e)] = at + e;
    };
    for_each_split_run(p, 0, 5, record);  // cut inside a row: the runs continue across it
    for_each_split_run(p, 5, rows * C - 5, record);
    const int64_t held = r == 2 ? 2 : rows;
    for (int64_t e = 0; e < rows * C; ++e) {
      const int64_t want = e < held * C ? r * rows * C + e : -1;
      ASSERT_EQ(mapped[static_cast<size_t>(e)], want) << "rank " << r << " element " << e;
      if (want >= 0) ++hits[static_cast<size_t>(want)];
    }
  }
  for (int h : hits) EXPECT_EQ(h, 1) << "every full element belongs to one rank's share";
}

// A save's banded reads give every split parameter's full tensor, read in odd pieces, from
// the slices alone, each band at most its bound (or one index of the dimensions before the split
// one): the vocabulary split with padding, packed parts split by rows and by columns, and a 3-D
// tensor split in the middle.
TEST(TensorSplit, BandedReadsGiveTheFullTensorFromTheSlices) {
  struct Case {
    Shape full;
    int dim, pieces, ranks;
    int64_t padded_full;  // ParamSplit::full, 0: none
  };
  for (const Case& c : {Case{{10, 3}, 0, 1, 3, 10}, Case{{12, 5}, 0, 3, 2, 0},
                        Case{{7, 12}, 1, 3, 2, 0}, Case{{4, 6, 5}, 1, 1, 3, 0}}) {
    SCOPED_TRACE(c.full.str() + " dim " + std::to_string(c.dim));
    // Slice s's local values: each element's index in the full tensor (-1 on padding).
    std::vector<std::vector<float>> slices;
    ParamInfo p;
    p.name = "w";
    for (int s = 0; s < c.ranks; ++s) {
      Shape local;
      for (int d = 0; d < c.full.rank(); ++d) {
        const int64_t extent = c.full[d];
        local.push_back(d != c.dim          ? extent
                        : c.padded_full > 0 ? (extent + c.ranks - 1) / c.ranks
                                            : extent / c.ranks);
      }
      p.shape = local;
      p.split = ParamSplit{c.dim, c.pieces, s, c.ranks, c.padded_full};
      std::vector<float> v(static_cast<size_t>(local.numel()), -1.f);
      for_each_split_run(p, 0, local.numel(), [&](int64_t at, int64_t full, int64_t n) {
        for (int64_t e = 0; e < n; ++e)
          v[static_cast<size_t>(at + e)] = static_cast<float>(full + e);
      });
      slices.push_back(std::move(v));
    }
    ASSERT_EQ(p.full_shape(), c.full);
    p.split.rank = 0;
    const size_t bound = 4 * 7 * sizeof(float);  // 7 values: bands cut rows and parts
    SplitBands bands(bound);
    size_t largest = 0;
    const int64_t n = c.full.numel();
    std::vector<float> got(static_cast<size_t>(n), -2.f);
    for (int64_t at = 0; at < n; at += 5) {
      const int64_t take = std::min<int64_t>(5, n - at);
      bands.read(p, sizeof(float), static_cast<size_t>(at) * 4, static_cast<size_t>(take) * 4,
                 reinterpret_cast<char*>(got.data() + at),
                 [&](int slice, size_t local, size_t count, char* dst) {
                   const auto& v = slices[static_cast<size_t>(slice)];
                   ASSERT_LE(local + count, v.size() * 4);
                   std::memcpy(dst, reinterpret_cast<const char*>(v.data()) + local, count);
                 });
      largest = std::max(largest, bands.band_size());
    }
    for (int64_t e = 0; e < n; ++e) ASSERT_EQ(got[static_cast<size_t>(e)], e) << "element " << e;
    // The smallest band: one index along the first dimension, or of those before the split one.
    int64_t unit = 1;
    for (int d = c.dim == 0 ? 1 : c.dim; d < c.full.rank(); ++d) unit *= c.full[d];
    EXPECT_LE(largest, std::max<size_t>(bound, static_cast<size_t>(unit) * 4));
  }
}

// qkv [B,T,(H+2K)*D] of the heads [h0, h0 + h) and key/value heads [k0, k0 + k).
FVec slice_heads(const FVec& qkv, int B, int T, int H, int K, int D, int h0, int h, int k0, int k) {
  FVec out;
  const int W = (H + 2 * K) * D;
  for (int bt = 0; bt < B * T; ++bt) {
    const float* row = &qkv[static_cast<size_t>(bt) * W];
    out.insert(out.end(), row + h0 * D, row + (h0 + h) * D);
    out.insert(out.end(), row + (H + k0) * D, row + (H + k0 + k) * D);
    out.insert(out.end(), row + (H + K + k0) * D, row + (H + K + k0 + k) * D);
  }
  return out;
}

struct AttentionRun {
  FVec out, dqkv;
};

// Causal attention with dropout (p 0.3) over qkv of `heads` heads and `kv` key/value heads, and
// its backward from dout, on `be`.
AttentionRun attention_with_dropout(Backend& be, const FVec& qkv, const FVec& dout, int B, int T,
                                    int heads, int kv, int D, const RngKey& key) {
  DeviceBuffers buf(be);
  const AttentionBuffers ab = attention_buffers(be.device(), B, heads, T, D);
  const Tensor in = buf.put(qkv, {B, T, (heads + 2 * kv) * D});
  const Tensor grad = buf.put(dout, {B, T, heads * D});
  const Tensor stats = buf.alloc(ab.stats), scratch = buf.alloc(ab.scratch);
  const Tensor out = buf.alloc({B, T, heads * D}), dqkv = buf.alloc(in.shape());
  be.attention_forward(in, Tensor(), true, heads, kv, 0.5f, 0.3f, key, stats, scratch, out);
  be.attention_backward(grad, in, out, stats, Tensor(), true, heads, kv, 0.5f, 0.3f, key, scratch,
                        dqkv, DType::f32, DType::f32);
  return {buf.get(out), buf.get(dqkv)};
}

// Heads [h0, h0 + h) of rows [B*T, heads*D].
FVec head_columns(const FVec& rows, int BT, int heads, int D, int h0, int h) {
  FVec out;
  for (int bt = 0; bt < BT; ++bt)
    out.insert(out.end(), rows.begin() + (bt * heads + h0) * D,
               rows.begin() + (bt * heads + h0 + h) * D);
  return out;
}

// Each rank's slice of the heads, with its place among them in the key, gives the full call's
// outputs and gradients of those heads (`tolerance` 0: bit for bit).
void expect_head_slices_draw_their_masks(Backend& be, double tolerance) {
  std::mt19937 rng(5);
  const int B = 2, T = 7, H = 4, K = 2, D = 4, ranks = 2, h = H / ranks, k = K / ranks;
  const FVec qkv = randn(int64_t{B} * T * (H + 2 * K) * D, rng);
  const FVec dout = randn(int64_t{B} * T * H * D, rng);
  const RngKey key{11, 3, 7};
  const AttentionRun full = attention_with_dropout(be, qkv, dout, B, T, H, K, D, key);
  for (int r = 0; r < ranks; ++r) {
    RngKey sliced = key;
    sliced.first_head = static_cast<uint32_t>(r * h);
    sliced.heads_total = H;
    const AttentionRun part =
        attention_with_dropout(be, slice_heads(qkv, B, T, H, K, D, r * h, h, r * k, k),
                               head_columns(dout, B * T, H, D, r * h, h), B, T, h, k, D, sliced);
    EXPECT_TRUE(near(part.out, head_columns(full.out, B * T, H, D, r * h, h), tolerance))
        << "rank " << r;
    EXPECT_TRUE(
        near(part.dqkv, slice_heads(full.dqkv, B, T, H, K, D, r * h, h, r * k, k), tolerance))
        << "rank " << r;
  }
  // Without the slice's place, its heads draw the first heads' masks: another output.
  const AttentionRun unplaced =
      attention_with_dropout(be, slice_heads(qkv, B, T, H, K, D, h, h, k, k),
                             head_columns(dout, B * T, H, D, h, h), B, T, h, k, D, key);
  EXPECT_FALSE(near(unplaced.out, head_columns(full.out, B * T, H, D, h, h), 1e-3));
}

TEST(TensorSplit, AttentionDropoutOfAHeadSliceDrawsTheMasksOfThoseHeads) {
  auto be = make_cpu_backend();
  expect_head_slices_draw_their_masks(*be, 0.0);
}

TEST(TensorSplit, CudaAttentionDropoutOfAHeadSliceDrawsTheMasksOfThoseHeads) {
  REQUIRE_GPU();
  auto be = make_cuda_backend();
  expect_head_slices_draw_their_masks(*be, 1e-6);
}

TEST(TensorSplit, ConfigSharesSplitHeadsAndWidthAndRefuseCountsThatDoNotDivide) {
  ModelConfig c = resolve_config("gpt2");
  const ModelConfig share = tensor_parallel_share(c, 1, 4);
  EXPECT_EQ(share.num_heads, 3);
  EXPECT_EQ(share.intermediate_size, 768);
  EXPECT_EQ(share.head_dim(), 64);
  EXPECT_EQ(share.tensor_rank, 1);
  expect_error([&] { tensor_parallel_share(c, 0, 5); }, "does not divide the gpt2 config's n_head");
  // Key/value heads fewer than the ranks: each held by ranks / K ranks in a row, slice r / copies
  // of the whole projection; a count neither a divisor nor a multiple of K is refused.
  ModelConfig mistral = resolve_config("mistral-7b");  // 32 heads over 8 key/value heads
  const ModelConfig copied = tensor_parallel_share(mistral, 5, 16);
  EXPECT_EQ(copied.num_heads, 2);
  EXPECT_EQ(copied.num_kv_heads, 1);
  EXPECT_EQ(copied.kv_head_copies, 2);
  const auto copy = Model::create(copied);
  const ParamInfo& k = copy->params().list()[static_cast<size_t>(
      copy->params().index("model.layers.0.self_attn.k_proj.weight"))];
  EXPECT_EQ(k.shape, (Shape{128, 4096}));
  EXPECT_EQ(k.full_shape(), (Shape{1024, 4096}));
  EXPECT_EQ(k.split.rank, 2);  // tensor ranks 4 and 5 hold the third key/value head
  EXPECT_EQ(k.split.copies, 2);
  ModelConfig qwen = resolve_config("qwen2-0.5b");  // 14 heads over 2 key/value heads
  expect_error([&] { tensor_parallel_share(qwen, 0, 7); },
               "--tp_size 7 is neither a divisor nor a multiple of the qwen2 config's "
               "num_key_value_heads = 2");
  // The shares' split parameters make up the full ones; the others are whole on each.
  const auto whole = Model::create(c);
  int64_t total = 0;
  for (int r = 0; r < 4; ++r) {
    const auto part = Model::create(tensor_parallel_share(c, r, 4));
    for (const ParamInfo& p : part->params().list()) {
      EXPECT_EQ(p.full_shape(),
                whole->params().list()[static_cast<size_t>(whole->params().index(p.name))].shape)
          << p.name;
      if (p.split.split() || r == 0)
        for_each_split_run(p, 0, p.shape.numel(),
                           [&](int64_t, int64_t, int64_t length) { total += length; });
    }
    // Vocabulary parallelism: 50257 rows as 4 x 12565, the last rank's 3 rows of padding.
    const ParamInfo& wte =
        part->params().list()[static_cast<size_t>(part->params().index("transformer.wte.weight"))];
    EXPECT_EQ(wte.shape, (Shape{12565, 768}));
    EXPECT_EQ(split_geometry(wte).held, r == 3 ? 12562 : 12565);
  }
  EXPECT_EQ(total, whole->params().total_elements());
}

// Sequence shares keep every parameter and head count and refuse, by name, head counts the ranks
// do not divide (key/value heads: neither divide nor are a multiple of) and a length that does not
// split.
TEST(TensorSplit, SequenceSharesRefuseHeadsTasksAndLengthsThatDoNotSplit) {
  ModelConfig c = resolve_config("gpt2");  // 12 heads
  const ModelConfig share = sequence_parallel_share(c, 1, 4);
  EXPECT_EQ(share.num_heads, 12);
  EXPECT_EQ(share.sequence_rank, 1);
  EXPECT_EQ(Model::create(share)->params().total_elements(),
            Model::create(c)->params().total_elements());
  expect_error([&] { sequence_parallel_share(c, 0, 5); },
               "--sp_size 5 does not divide the gpt2 config's n_head = 12");
  // Key/value heads fewer than the ranks are copied (9 ranks over SmolLM2's 3: each to 3
  // ranks); a count neither a divisor nor a multiple of them is refused.
  EXPECT_EQ(sequence_parallel_share(resolve_config("smollm2-135m"), 4, 9).sequence_rank, 4);
  ModelConfig qwen = resolve_config("qwen2-0.5b");  // 14 heads over 2 key/value heads
  expect_error([&] { sequence_parallel_share(qwen, 0, 7); },
               "--sp_size 7 is neither a divisor nor a multiple of the qwen2 config's "
               "num_key_value_heads = 2");
  EXPECT_EQ(sequence_parallel_share(resolve_config("bert-tiny"), 1, 2).sequence_rank, 1);
  // The plan: a length of 13 does not split among 2; 12 does, and each rank keeps 6 tokens.
  const auto model = Model::create(sequence_parallel_share(resolve_config("gpt2-tiny"), 1, 2));
  MemoryPlan plan;
  expect_error(
      [&] {
        model->plan(plan, {2, 13}, PlanOptions{});
      },
      "sequences of 13 tokens do not split evenly among --sp_size 2");
  MemoryPlan even;
  model->plan(even, {2, 12}, PlanOptions{});
  EXPECT_EQ(model->matmul_operands().a_rows, 2 * 6);  // the products' rows: its tokens
}

// Pipeline stages hold equal runs of the blocks, the embeddings on the first and the head on the
// last (a tied head's embeddings on both); every parameter of the whole model on one stage at
// least, numbered by its place in the whole (what its initial values are drawn from).
TEST(TensorSplit, PipelineStagesHoldRunsOfTheBlocksAndRefuseCountsThatDoNotDivide) {
  const ModelConfig c = resolve_config("gpt2");  // 12 blocks, tied head
  expect_error([&] { pipeline_share(c, 0, 5); },
               "--pp_size 5 does not divide the gpt2 config's "
               "n_layer = 12");
  const auto whole = Model::create(c);
  std::vector<int> holders(whole->params().list().size(), 0);
  for (int s = 0; s < 3; ++s) {
    const ModelConfig share = pipeline_share(c, s, 3);
    EXPECT_EQ(share.first_layer(), 4 * s);
    EXPECT_EQ(share.end_layer(), 4 * s + 4);
    const auto stage = Model::create(share);
    for (const ParamInfo& p : stage->params().list()) {
      const int i = whole->params().index(p.name);
      EXPECT_EQ(p.stream, i) << p.name;
      EXPECT_EQ(p.shape, whole->params().list()[static_cast<size_t>(i)].shape) << p.name;
      ++holders[static_cast<size_t>(i)];
    }
    EXPECT_EQ(stage->params().find("transformer.h." + std::to_string(4 * s) + ".ln_1.weight") >= 0,
              true);
    EXPECT_EQ(stage->params().find("transformer.wte.weight") >= 0, s != 1);  // tied: first, last
    EXPECT_EQ(stage->params().find("transformer.wpe.weight") >= 0, s == 0);
    EXPECT_EQ(stage->params().find("transformer.ln_f.weight") >= 0, s == 2);
  }
  for (size_t i = 0; i < holders.size(); ++i)
    EXPECT_EQ(holders[i], whole->params().list()[i].name == "transformer.wte.weight" ? 2 : 1)
        << whole->params().list()[i].name;
}

// accelerate's ParallelismConfig keys as brisk's options, and what brisk does not have refused by
// name.
TEST(TensorSplit, ParallelismConfigSetsTheDegreesAndRefusesWhatBriskLacks) {
  TempDir dir("parallelism_config");
  auto options = [&](const std::string& json) {
    std::ofstream(dir / "p.json") << json;
    TrainOptions o;
    o.parallelism_config = dir / "p.json";
    return o;
  };
  TrainOptions o = apply_parallelism_config(options(R"({"tp_size": 2, "dp_shard_size": 2})"), 4);
  EXPECT_EQ(o.tp_size, 2);
  EXPECT_EQ(o.zero_stage, 3) << "FSDP's sharding is ZeRO stage 3";
  o = apply_parallelism_config(
      options(R"({"dp_replicate_size": 3, "tp_size": 1, "cp_size": 1, "tp_handler": null})"), 3);
  EXPECT_EQ(o.tp_size, 1);
  EXPECT_EQ(o.zero_stage, 0);
  o = apply_parallelism_config(options(R"({"sp_size": 2, "dp_replicate_size": 2})"), 4);
  EXPECT_EQ(o.sp_size, 2);
  const std::pair<std::string, std::string> refused[] = {
      {R"({"cp_size": 2, "tp_size": 2})", "cp_size = 2 (context parallelism) is not in brisk"},
      {R"({"sp_size": 2})", "dp_replicate_size x dp_shard_size x tp_size x sp_size = 2 but the"},
      {R"({"tp_size": 2})", "dp_replicate_size x dp_shard_size x tp_size x sp_size = 2 but the"},
      {R"({"dp_replicate_size": 2, "dp_shard_size": 2})", "hybrid sharding"},
      {R"({"tp_sise": 4})", "unknown key 'tp_sise'"},
      {R"({"tp_size": 0})", "tp_size must be a whole number in [1, 4096], got 0"},
      {R"({"tp_size": "4"})", "tp_size must be a whole number"},
      {R"({"tp_handler": {"x": 1}, "tp_size": 4})", "tp_handler has settings"},
      {R"([4])", "not a JSON object"},
  };
  for (const auto& [json, needle] : refused) {
    SCOPED_TRACE(json);
    expect_error([&] { apply_parallelism_config(options(json), 4); }, needle);
  }
  TrainOptions given = options(R"({"tp_size": 4})");
  given.tp_size = 2;
  expect_error([&] { apply_parallelism_config(given, 4); }, "tp_size = 4 but --tp_size 2");
  given = options(R"({"dp_shard_size": 4})");
  given.zero_stage = 1;
  expect_error([&] { apply_parallelism_config(given, 4); }, "but --zero_stage 1 is given");
}

}  // namespace
}  // namespace brisk::testing
