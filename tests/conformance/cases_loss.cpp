// Embeddings, first-token pooling and the losses (softmax cross-entropy, mean squared error).
//
// Tolerances: embedding forward is the same float32 additions in the same order on every backend
// (exact between them; 1e-6 against fp64). Word and token-type rows of the embedding gradient are
// scatter-added, with atomics on a GPU, in any order: 1e-6 between backends for word rows, 1e-4
// for the two token-type rows, each a sum of ~B*T/2 = 67 rows of |x| ~ 0.8 (reordering moves it
// by up to n*u*sum|x| ~ 2e-4, typically ~3e-5; a missed or doubled row would be off by ~1).
// Position rows are summed over the batch in a fixed order: exact between backends (a packed
// batch's, scatter-added by atomics on a GPU: 1e-4, as the type rows). Losses are
// float64 sums of float32 terms: 1e-5 relative; their gradients 1e-4 against finite
// differences, 1e-5 (cross-entropy) and 1e-6 (squared error) between backends.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "backend_support.h"
#include "conformance/op_case.h"

namespace brisk::testing {
namespace {

enum class Tables { word_pos_type, word_pos, word_only };

// `scale` as a recorded step gives it: a factor of 1 times the scale held in the backend's memory.
GradScale held_in(DeviceBuffers& d, double scale) {
  GradScale s(1.0f);
  s.held = static_cast<const float*>(d.put(FVec{static_cast<float>(scale)}, {1}).data());
  return s;
}

// Word, position (a table longer than T) and token-type embeddings, with repeated ids; with a
// padding_idx the last 7 tokens of each sequence are that id (which also occurs elsewhere), and
// its row gets no gradient while the positions and types of those tokens still get theirs.
// `packed`: each token at its position in a packed batch's sample (packed_positions, read from
// memory; its position rows scatter-added, by atomics on a GPU).
OpCase embedding_case(int64_t B, int64_t T, int64_t V, int64_t C, Tables tables, bool padding,
                      bool packed = false) {
  const int64_t P = T + 19, NT = 2, pad_id = 1;
  const bool with_pos = tables != Tables::word_only, with_type = tables == Tables::word_pos_type;
  const char* table_names[] = {"word_pos_type", "word_pos", "word"};
  const Vec positions = packed_positions(B * T);
  auto position = [=](int64_t bt) {
    return packed ? static_cast<int64_t>(positions[static_cast<size_t>(bt)]) : bt % T;
  };
  OpCase c;
  c.name = "embedding_B" + std::to_string(B) + "_T" + std::to_string(T) + "_V" + std::to_string(V) +
           "_C" + std::to_string(C) + "_" + table_names[static_cast<int>(tables)] +
           (padding ? "_padding" : "") + (packed ? "_packed" : "");
  c.inputs = [=](std::mt19937& rng) {
    IVec ids = randint(B * T, 0, static_cast<int32_t>(V), rng);
    const IVec types = randint(B * T, 0, static_cast<int32_t>(NT), rng);
    if (padding)
      for (int64_t b = 0; b < B; ++b)
        for (int64_t t = std::max<int64_t>(0, T - 7); t < T; ++t) ids[b * T + t] = pad_id;
    return Values{{"ids", Vec(ids.begin(), ids.end())}, {"types", Vec(types.begin(), types.end())},
                  {"word", randn_d(V * C, rng)},        {"pos", randn_d(P * C, rng)},
                  {"type_table", randn_d(NT * C, rng)}, {"dout", randn_d(B * T * C, rng)},
                  {"dword0", randn_d(V * C, rng)},      {"dpos0", randn_d(P * C, rng)},
                  {"dtype0", randn_d(NT * C, rng)}};
  };
  c.run = [=](Backend& be, const Values& in) {
    DeviceBuffers d(be);
    const Tensor ids = d.put_as(in.at("ids"), {B, T}, DType::i32);
    const Tensor types = d.put_as(in.at("types"), {B, T}, DType::i32);
    const Tensor w = d.put_as(in.at("word"), {V, C}), p = d.put_as(in.at("pos"), {P, C});
    const Tensor t = d.put_as(in.at("type_table"), {NT, C});
    const Tensor out = d.put(FVec(B * T * C, -7.f), {B, T, C});
    const Tensor g = d.put_as(in.at("dout"), {B, T, C}), dw = d.put_as(in.at("dword0"), {V, C});
    const Tensor dp = d.put_as(in.at("dpos0"), {P, C}), dt = d.put_as(in.at("dtype0"), {NT, C});
    const Tensor at = packed ? d.put_as(positions, {B * T}, DType::i32) : Tensor();
    be.embedding_forward(ids, w, with_pos ? p : Tensor(), with_type ? types : Tensor(),
                         with_type ? t : Tensor(), out, {}, at);
    be.embedding_backward(g, ids, padding ? pad_id : -1, with_type ? types : Tensor(), dw,
                          with_pos ? dp : Tensor(), with_type ? dt : Tensor(), {}, at);
    return Values{{"out", d.values(out)},
                  {"dword", d.values(dw)},
                  {"dpos", d.values(dp)},
                  {"dtype", d.values(dt)}};
  };
  c.reference = [=](const Values& in) {
    const Vec &ids = in.at("ids"), &types = in.at("types"), &dout = in.at("dout");
    Vec out(static_cast<size_t>(B * T * C)), dw(static_cast<size_t>(V * C), 0.0);
    Vec dp(static_cast<size_t>(P * C), 0.0), dt(static_cast<size_t>(NT * C), 0.0);
    for (int64_t bt = 0; bt < B * T; ++bt) {
      const auto id = static_cast<int64_t>(ids[bt]), ty = static_cast<int64_t>(types[bt]);
      for (int64_t j = 0; j < C; ++j) {
        double v = in.at("word")[id * C + j];
        if (with_pos) v += in.at("pos")[position(bt) * C + j];
        if (with_type) v += in.at("type_table")[ty * C + j];
        out[bt * C + j] = v;
        const double g = dout[bt * C + j];
        if (!padding || id != pad_id) dw[id * C + j] += g;
        if (with_pos) dp[position(bt) * C + j] += g;
        if (with_type) dt[ty * C + j] += g;
      }
    }
    return Values{{"out", out}, {"dword", dw}, {"dpos", dp}, {"dtype", dt}};
  };
  c.checks = {{"out", Metric::elementwise, 1e-6, 0},
              {"dword", Metric::elementwise, 1e-5, 1e-6, "dword0"},
              {"dpos", Metric::elementwise, 1e-5, packed ? 1e-4 : 0, "dpos0"},
              {"dtype", Metric::elementwise, 1e-5, 1e-4, "dtype0"}};
  return c;
}

// Vocabulary parallelism: `ranks` shards of a word table of V rows (ceil(V / ranks) each, the
// last padded), the first adding positions and types. The shards' outputs summed are the whole
// table's embeddings, their gradients laid end to end the whole's (padding_idx 1 and the padding
// rows getting none); a shard's word part of an id it does not hold is zero.
OpCase embedding_shard_case(int64_t B, int64_t T, int64_t V, int64_t C, int ranks) {
  const int64_t P = T + 3, NT = 2, pad_id = 1, rows = (V + ranks - 1) / ranks;
  OpCase c;
  c.name = "embedding_shards_B" + std::to_string(B) + "_T" + std::to_string(T) + "_V" +
           std::to_string(V) + "_C" + std::to_string(C) + "_ranks" + std::to_string(ranks);
  c.inputs = [=](std::mt19937& rng) {
    IVec ids = randint(B * T, 0, static_cast<int32_t>(V), rng);
    ids[0] = static_cast<int32_t>(V - 1);
    ids[1] = pad_id;
    const IVec types = randint(B * T, 0, static_cast<int32_t>(NT), rng);
    return Values{{"ids", Vec(ids.begin(), ids.end())}, {"types", Vec(types.begin(), types.end())},
                  {"word", randn_d(V * C, rng)},        {"pos", randn_d(P * C, rng)},
                  {"type_table", randn_d(NT * C, rng)}, {"dout", randn_d(B * T * C, rng)}};
  };
  c.run = [=](Backend& be, const Values& in) {
    DeviceBuffers d(be);
    const Tensor ids = d.put_as(in.at("ids"), {B, T}, DType::i32);
    const Tensor types = d.put_as(in.at("types"), {B, T}, DType::i32);
    const Tensor p = d.put_as(in.at("pos"), {P, C}), t = d.put_as(in.at("type_table"), {NT, C});
    const Tensor g = d.put_as(in.at("dout"), {B, T, C});
    Vec sum(static_cast<size_t>(B * T * C), 0.0), dword, padding_grad;
    for (int r = 0; r < ranks; ++r) {
      const VocabShard shard{r * rows, V};
      const int64_t held = shard.count(rows);
      Vec table(in.at("word").begin() + r * rows * C,
                in.at("word").begin() + (r * rows + held) * C);
      table.resize(static_cast<size_t>(rows * C), 0.0);  // padding rows
      const Tensor w = d.put_as(table, {rows, C}), dw = d.put(FVec(rows * C, 0.f), {rows, C});
      const Tensor out = d.put(FVec(B * T * C, -7.f), {B, T, C});
      const bool first = r == 0;
      be.embedding_forward(ids, w, first ? p : Tensor(), first ? types : Tensor(),
                           first ? t : Tensor(), out, shard, Tensor());
      be.embedding_backward(g, ids, pad_id, types, dw, Tensor(), Tensor(), shard, Tensor());
      const Vec o = d.values(out), dwv = d.values(dw);
      for (size_t i = 0; i < o.size(); ++i) sum[i] += o[i];
      dword.insert(dword.end(), dwv.begin(), dwv.begin() + held * C);
      padding_grad.insert(padding_grad.end(), dwv.begin() + held * C, dwv.end());
    }
    return Values{{"out", sum}, {"dword", dword}, {"padding_grad", padding_grad}};
  };
  c.reference = [=](const Values& in) {
    const Vec &ids = in.at("ids"), &types = in.at("types"), &dout = in.at("dout");
    Vec out(static_cast<size_t>(B * T * C)), dw(static_cast<size_t>(V * C), 0.0);
    for (int64_t bt = 0; bt < B * T; ++bt) {
      const auto id = static_cast<int64_t>(ids[bt]), ty = static_cast<int64_t>(types[bt]);
      for (int64_t j = 0; j < C; ++j) {
        out[bt * C + j] = in.at("word")[id * C + j] + in.at("pos")[(bt % T) * C + j] +
                          in.at("type_table")[ty * C + j];
        if (id != pad_id) dw[id * C + j] += dout[bt * C + j];
      }
    }
    return Values{{"out", out},
                  {"dword", dw},
                  {"padding_grad", Vec(static_cast<size_t>((rows * ranks - V) * C), 0.0)}};
  };
  c.checks = {{"out", Metric::elementwise, 1e-6, 1e-6},
              {"dword", Metric::elementwise, 1e-5, 1e-6},
              {"padding_grad", Metric::exact}};
  return c;
}

// first_token takes position 0 of each sequence; its backward adds into position 0 only.
// `packed`: the first tokens of a packed batch's B - 1 samples (the last row past them zero),
// where they start read from memory.
OpCase first_token_case(int64_t B, int64_t T, int64_t C, bool packed = false) {
  std::vector<int64_t> first(static_cast<size_t>(B), -1);  // sequence b's first token
  for (int64_t b = 0; b < B; ++b) first[b] = packed ? (b < B - 1 ? b * T + b + 1 : -1) : b * T;
  if (packed) first[0] = 0;
  OpCase c;
  c.name = "first_token_B" + std::to_string(B) + "_T" + std::to_string(T) + "_C" +
           std::to_string(C) + (packed ? "_packed" : "");
  c.inputs = [=](std::mt19937& rng) {
    return Values{{"x", randn_d(B * T * C, rng)},
                  {"dout", randn_d(B * C, rng)},
                  {"dx0", randn_d(B * T * C, rng)}};
  };
  c.run = [=](Backend& be, const Values& in) {
    DeviceBuffers d(be);
    const Tensor x = d.put_as(in.at("x"), {B, T, C}), out = d.put(FVec(B * C, -7.f), {B, C});
    const Tensor g = d.put_as(in.at("dout"), {B, C}), dx = d.put_as(in.at("dx0"), {B, T, C});
    Vec starts(first.begin(), first.end() - 1);  // the samples' starts, then the tokens' end
    starts.push_back(static_cast<double>(B * T));
    const Tensor at = packed ? d.put_as(starts, {B}, DType::i32) : Tensor();
    be.first_token(x, out, at);
    be.first_token_backward(g, dx, at);
    return Values{{"out", d.values(out)}, {"dx", d.values(dx)}};
  };
  c.reference = [=](const Values& in) {
    Vec out(static_cast<size_t>(B * C), 0.0), dx(static_cast<size_t>(B * T * C), 0.0);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t j = 0; first[b] >= 0 && j < C; ++j) {
        out[b * C + j] = in.at("x")[first[b] * C + j];
        dx[first[b] * C + j] = in.at("dout")[b * C + j];
      }
    return Values{{"out", out}, {"dx", dx}};
  };
  c.checks = {{"out", Metric::exact}, {"dx", Metric::elementwise, 1e-6, 0, "dx0"}};
  return c;
}

// Summed cross-entropy over rows whose label is not kIgnoreIndex.
double ref_cross_entropy(const Vec& logits, const Vec& labels, int64_t V) {
  double loss = 0;
  for (size_t n = 0; n < labels.size(); ++n) {
    if (labels[n] == kIgnoreIndex) continue;
    const double* r = &logits[n * V];
    const double mx = *std::max_element(r, r + V);
    double sum = 0;
    for (int64_t v = 0; v < V; ++v) sum += std::exp(r[v] - mx);
    loss += mx + std::log(sum) - r[static_cast<int64_t>(labels[n])];
  }
  return loss;
}

// Logits [N, V] (scale 3) and labels at both ends of the vocabulary, rows `ignored` without one,
// row 5 with hidden vocabulary entries (-inf logits, as a masked vocabulary has).
Values cross_entropy_inputs(int64_t N, int64_t V, const std::vector<int64_t>& ignored,
                            std::mt19937& rng) {
  Vec logits = randn_d(N * V, rng, 3.0);
  IVec labels = randint(N, 0, static_cast<int32_t>(V), rng);
  labels[0] = 0;
  labels[1] = static_cast<int32_t>(V - 1);
  for (int64_t r : ignored) labels[r] = kIgnoreIndex;
  for (int64_t j = 0; j < V; j += 3)
    if (j != labels[5]) logits[5 * V + j] = -std::numeric_limits<double>::infinity();
  return Values{{"logits", logits}, {"labels", Vec(labels.begin(), labels.end())}};
}

// A pass without gradients (the loss added to the accumulator, logits left alone), then one with
// (the loss again, the gradient over the logits scaled by 1/count). Labels at both ends of the
// vocabulary; rows 2, 9 and 30 ignored (their gradient exactly zero); row 5 with hidden
// vocabulary entries (-inf logits), as a masked vocabulary has. all_ignored: every row ignored,
// nothing added, zero gradient.
OpCase cross_entropy_case(int64_t N, int64_t V, bool all_ignored, bool reference) {
  const double start = 1.5;  // the accumulator's value before: the op adds to it
  const std::vector<int64_t> ignored = {2, N / 3 + 1, N - 1};
  OpCase c;
  c.name = "cross_entropy_N" + std::to_string(N) + "_V" + std::to_string(V) +
           (all_ignored ? "_all_ignored" : "");
  c.inputs = [=](std::mt19937& rng) {
    Values v = cross_entropy_inputs(N, V, ignored, rng);
    if (all_ignored) std::fill(v["labels"].begin(), v["labels"].end(), kIgnoreIndex);
    return v;
  };
  const double scale = all_ignored ? 1.0 : 1.0 / static_cast<double>(N - 3);
  c.run = [=](Backend& be, const Values& in) {
    DeviceBuffers d(be);
    const Tensor z = d.put_as(in.at("logits"), {N, V});
    const Tensor y = d.put_as(in.at("labels"), {N}, DType::i32);
    const Tensor loss = d.put(std::vector<double>{start}, {1});
    be.softmax_cross_entropy(z, y, false, 1.f, loss, Tensor());
    const double l1 = d.values(loss)[0] - start;
    const Vec z1 = d.values(z);
    be.softmax_cross_entropy(z, y, true, static_cast<float>(scale), loss, Tensor());
    const double l2 = d.values(loss)[0] - start - l1;
    const Vec grad = d.values(z);
    // The gradient written apart, in float32 and in bf16, from fresh logits, its scale held in
    // memory: the same float32 bits, and those bits rounded to nearest even (the loss added as
    // before).
    Vec apart_differences;
    for (const DType t : {DType::f32, DType::bf16}) {
      const Tensor z2 = d.put_as(in.at("logits"), {N, V});
      const Tensor g2 = d.alloc({N, V}, t);
      be.softmax_cross_entropy(z2, y, true, held_in(d, scale), loss, g2);
      const Vec got = d.values(g2);
      for (int64_t i = 0; i < N * V; ++i) {
        const float want = static_cast<float>(grad[i]);
        apart_differences.push_back(t == DType::f32 ? got[i] - want : got[i] - float_to_bf16(want));
      }
    }
    Vec ignored_rows;
    for (int64_t r : ignored)
      ignored_rows.insert(ignored_rows.end(), &grad[r * V], &grad[r * V + V]);
    return Values{{"loss", {l1}},
                  {"logits_after_loss_only", z1},
                  {"loss_with_grad", {l2}},
                  {"grad", grad},
                  {"grad_of_ignored_rows", ignored_rows},
                  {"grad_apart_differences", apart_differences}};
  };
  if (reference)
    c.reference = [=](const Values& in) {
      const Vec& labels = in.at("labels");
      const double loss = ref_cross_entropy(in.at("logits"), labels, V);
      const Vec grad = fd_grad(
          in.at("logits"), [&](const Vec& v) { return scale * ref_cross_entropy(v, labels, V); });
      return Values{{"loss", {loss}},
                    {"logits_after_loss_only", in.at("logits")},
                    {"loss_with_grad", {loss}},
                    {"grad", grad},
                    {"grad_of_ignored_rows", Vec(ignored.size() * V, 0.0)},
                    {"grad_apart_differences", Vec(2 * N * V, 0.0)}};
    };
  // The loss relative to itself: a sum of N terms of a few each.
  c.checks = {
      {"loss", Metric::normwise, 1e-5, 1e-5},           {"logits_after_loss_only", Metric::exact},
      {"loss_with_grad", Metric::normwise, 1e-5, 1e-5}, {"grad", Metric::normwise, 1e-4, 1e-5},
      {"grad_of_ignored_rows", Metric::exact},          {"grad_apart_differences", Metric::exact}};
  return c;
}

// Vocabulary-parallel cross-entropy: the logits' columns in `ranks` shards (ceil(V / ranks)
// each, the last padded with columns of garbage that must not count), each shard's statistics
// at its place of a [ranks, N, 3] sum, then each shard's loss and gradient from that sum (odd
// shards' gradient scale held in memory): every
// shard's loss is the whole rows', the gradients laid end to end the whole's (zero on the
// padding columns and on ignored rows 2 and N - 1). Row 5 hides entries with -inf logits.
OpCase cross_entropy_shard_case(int64_t N, int64_t V, int ranks) {
  const int64_t cols = (V + ranks - 1) / ranks;
  const std::vector<int64_t> ignored = {2, N - 1};
  const double scale = 1.0 / static_cast<double>(N - 2);
  OpCase c;
  c.name = "cross_entropy_shards_N" + std::to_string(N) + "_V" + std::to_string(V) + "_ranks" +
           std::to_string(ranks);
  c.inputs = [=](std::mt19937& rng) { return cross_entropy_inputs(N, V, ignored, rng); };
  c.run = [=](Backend& be, const Values& in) {
    DeviceBuffers d(be);
    const Tensor y = d.put_as(in.at("labels"), {N}, DType::i32);
    // Shard r's columns of the logits, its padding columns large (they must not count).
    auto shard_logits = [&](int r) {
      Vec z(static_cast<size_t>(N * cols), 50.0);
      const int64_t held = VocabShard{r * cols, V}.count(cols);
      for (int64_t n = 0; n < N; ++n)
        for (int64_t j = 0; j < held; ++j) z[n * cols + j] = in.at("logits")[n * V + r * cols + j];
      return d.put_as(z, {N, cols});
    };
    Vec stats(static_cast<size_t>(ranks * N * 3), 0.0);
    for (int r = 0; r < ranks; ++r) {
      const Tensor st = d.put(FVec(N * 3, -7.f), {N, 3});
      be.cross_entropy_stats(shard_logits(r), y, VocabShard{r * cols, V}, st);
      const Vec v = d.values(st);
      std::copy(v.begin(), v.end(), stats.begin() + r * N * 3);
    }
    const Tensor summed = d.put_as(stats, {ranks, N, 3});
    Vec losses, grad(static_cast<size_t>(N * V)), padding_grad;
    for (int r = 0; r < ranks; ++r) {
      const VocabShard shard{r * cols, V};
      const Tensor z = shard_logits(r), loss = d.put(std::vector<double>{0.0}, {1});
      // Odd shards' scale held in memory.
      const GradScale gs = r % 2 ? held_in(d, scale) : GradScale(static_cast<float>(scale));
      be.cross_entropy_from_stats(z, y, shard, summed, true, gs, loss, Tensor());
      losses.push_back(d.values(loss)[0]);
      const Vec g = d.values(z);
      const int64_t held = shard.count(cols);
      for (int64_t n = 0; n < N; ++n) {
        for (int64_t j = 0; j < held; ++j) grad[n * V + r * cols + j] = g[n * cols + j];
        for (int64_t j = held; j < cols; ++j) padding_grad.push_back(g[n * cols + j]);
      }
    }
    Vec ignored_rows;
    for (int64_t r : ignored)
      ignored_rows.insert(ignored_rows.end(), &grad[r * V], &grad[r * V + V]);
    return Values{{"loss_of_each_shard", losses},
                  {"grad", grad},
                  {"grad_of_ignored_rows", ignored_rows},
                  {"padding_grad", padding_grad}};
  };
  c.reference = [=](const Values& in) {
    const Vec& labels = in.at("labels");
    const double loss = ref_cross_entropy(in.at("logits"), labels, V);
    const Vec grad = fd_grad(in.at("logits"),
                             [&](const Vec& v) { return scale * ref_cross_entropy(v, labels, V); });
    return Values{{"loss_of_each_shard", Vec(static_cast<size_t>(ranks), loss)},
                  {"grad", grad},
                  {"grad_of_ignored_rows", Vec(ignored.size() * V, 0.0)},
                  {"padding_grad", Vec(static_cast<size_t>(N * (cols * ranks - V)), 0.0)}};
  };
  c.checks = {{"loss_of_each_shard", Metric::normwise, 1e-5, 1e-5},
              {"grad", Metric::normwise, 1e-4, 1e-5},
              {"grad_of_ignored_rows", Metric::exact},
              {"padding_grad", Metric::exact}};
  return c;
}

// Squared error summed over labelled rows (row 1's target is NaN: unlabelled, its gradient
// exactly zero); without gradients the predictions stay; the scale held in memory gives the same
// gradient bits.
OpCase mse_case(int64_t N) {
  const double start = 0.5;
  OpCase c;
  c.name = "mse_N" + std::to_string(N);
  c.inputs = [=](std::mt19937& rng) {
    Values v{{"pred", randn_d(N, rng, 2.0)}, {"targets", randn_d(N, rng, 1.0)}};
    v["targets"][1] = std::numeric_limits<double>::quiet_NaN();
    return v;
  };
  const double scale = 1.0 / static_cast<double>(N - 1);
  c.run = [=](Backend& be, const Values& in) {
    DeviceBuffers d(be);
    const Tensor p = d.put_as(in.at("pred"), {N, 1}), y = d.put_as(in.at("targets"), {N});
    const Tensor loss = d.put(std::vector<double>{start}, {1});
    be.mse_loss(p, y, false, 1.f, loss);
    const double l1 = d.values(loss)[0] - start;
    const Vec p1 = d.values(p);
    be.mse_loss(p, y, true, static_cast<float>(scale), loss);
    const Vec grad = d.values(p);
    // Again from the predictions, the scale held in memory: the same bits.
    const Tensor p2 = d.put_as(in.at("pred"), {N, 1});
    be.mse_loss(p2, y, true, held_in(d, scale), loss);
    Vec held_differences = d.values(p2);
    for (int64_t r = 0; r < N; ++r) held_differences[r] -= grad[r];
    return Values{{"loss", {l1}},
                  {"pred_after_loss_only", p1},
                  {"grad", grad},
                  {"grad_of_unlabelled_row", {grad[1]}},
                  {"grad_held_differences", held_differences}};
  };
  c.reference = [=](const Values& in) {
    const Vec& t = in.at("targets");
    auto sse = [&](const Vec& p) {
      double s = 0;
      for (int64_t r = 0; r < N; ++r)
        if (!std::isnan(t[r])) s += (p[r] - t[r]) * (p[r] - t[r]);
      return s;
    };
    return Values{{"loss", {sse(in.at("pred"))}},
                  {"pred_after_loss_only", in.at("pred")},
                  {"grad", fd_grad(in.at("pred"), [&](const Vec& v) { return scale * sse(v); })},
                  {"grad_of_unlabelled_row", {0.0}},
                  {"grad_held_differences", Vec(static_cast<size_t>(N), 0.0)}};
  };
  c.checks = {{"loss", Metric::normwise, 1e-5, 1e-6},
              {"pred_after_loss_only", Metric::exact},
              {"grad", Metric::normwise, 1e-4, 1e-6},
              {"grad_of_unlabelled_row", Metric::exact},
              {"grad_held_differences", Metric::exact}};
  return c;
}

}  // namespace

std::vector<OpCase> loss_cases() {
  std::vector<OpCase> cases;
  for (Tables t : {Tables::word_pos_type, Tables::word_pos, Tables::word_only})
    for (bool padding : {false, true}) {
      cases.push_back(embedding_case(2, 9, 6, 7, t, padding));
      cases.push_back(embedding_case(3, 45, 50, 75, t, padding));
    }
  cases.push_back(embedding_shard_case(2, 9, 7, 5, 2));
  cases.push_back(embedding_shard_case(3, 45, 50, 75, 3));
  cases.push_back(embedding_case(2, 9, 6, 7, Tables::word_pos_type, true, true));
  cases.push_back(embedding_case(3, 45, 50, 75, Tables::word_pos, false, true));
  cases.push_back(first_token_case(2, 5, 7));
  cases.push_back(first_token_case(3, 45, 75));
  cases.push_back(first_token_case(2, 5, 7, true));
  cases.push_back(first_token_case(3, 45, 75, true));
  for (bool none : {false, true}) {
    cases.push_back(cross_entropy_case(7, 11, none, true));
    cases.push_back(cross_entropy_case(37, 129, none, false));
    // The wide-block path for vocabulary-sized rows.
    cases.push_back(cross_entropy_case(37, 8193, none, false));
  }
  cases.push_back(cross_entropy_shard_case(7, 11, 2));
  cases.push_back(cross_entropy_shard_case(9, 13, 4));  // the last shard holds 1 of its 4 columns
  cases.push_back(mse_case(6));
  cases.push_back(mse_case(300));  // more rows than a GPU kernel's threads
  return cases;
}

}  // namespace brisk::testing
