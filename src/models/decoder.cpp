// Incremental decoding (see decoder.h).
#include "models/decoder.h"

#include <algorithm>

namespace brisk {

namespace {
// The first n positions of a [1, max, ...] buffer, as [1, n, ...].
Tensor first_positions(const Tensor& t, int64_t n) {
  Shape s = t.shape();
  Shape out{1, n};
  for (int i = 2; i < s.rank(); ++i) out.push_back(s[i]);
  return Tensor(t.data(), out, t.dtype(), t.device());
}
}  // namespace

Decoder::Decoder(const Model& model, int64_t max_tokens, int64_t max_chunk)
    : model_(model), max_tokens_(max_tokens), max_chunk_(max_chunk) {
  const ModelConfig& c = model.config();
  BRISK_CHECK(model.causal_lm(), "a ", model.class_name(),
              " does not generate text: it is not a causal language model");
  BRISK_CHECK(c.tensor_ranks == 1 && c.pipeline_stages == 1 && c.sequence_ranks == 1,
              "generation runs on one process, with the whole model");
  BRISK_CHECK(max_chunk >= 1 && max_chunk <= max_tokens, "decoding chunks of ", max_chunk,
              " tokens for a cache of ", max_tokens);
  BRISK_CHECK(
      max_tokens <= c.max_position_embeddings, max_tokens,
      " positions exceed the model's max_position_embeddings = ", c.max_position_embeddings);
}

void Decoder::plan(MemoryPlan& plan, BufferBinder& binder) {
  const ModelConfig& c = model_.config();
  const int64_t S = max_tokens_, T = max_chunk_, C = c.hidden_size, F = c.intermediate_size;
  // The caches hold the key/value heads only: fewer than the query heads under grouped-query
  // attention.
  const BlockStyle style = model_.inference_style();
  const int64_t KD = c.kv_heads() * c.head_dim();
  const int64_t fc_width = style.gated_mlp ? 2 * F : F;
  k_cache_.assign(c.num_layers, Tensor());
  v_cache_.assign(c.num_layers, Tensor());
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const std::string p = "decode.cache." + std::to_string(l);
    binder.declare(plan, &k_cache_[l], p + ".keys", Category::activations, DType::f32, {1, S, KD});
    binder.declare(plan, &v_cache_[l], p + ".values", Category::activations, DType::f32,
                   {1, S, KD});
  }
  binder.declare(plan, &ids_host_, "decode.ids", Category::data, DType::i32, {1, T},
                 Placement::host);
  binder.declare(plan, &ids_, "decode.ids.device", Category::data, DType::i32, {1, T});
  auto work = [&](Tensor* t, const char* name, Shape shape) {
    binder.declare(plan, t, std::string("decode.") + name, Category::temporaries, DType::f32,
                   shape);
  };
  work(&x_, "x", {1, T, C});
  work(&y_, "y", {1, T, C});
  work(&scratch_.a, "a", {1, T, C});
  work(&scratch_.mean, "mean", {1, T});
  work(&scratch_.rstd, "rstd", {1, T});
  work(&scratch_.qkv, "qkv", {1, T, c.qkv_width()});
  work(&scratch_.ctx, "ctx", {1, T, c.attention_width()});
  work(&scratch_.res, "res", {1, T, C});
  work(&scratch_.fc, "fc", {1, T, fc_width});
  work(&scratch_.fc_act, "fc_act", {1, T, F});
  work(&scratch_.tmp, "tmp", {1, T, C});
  if (style.sparse_mlp != nullptr)
    style.sparse_mlp->declare_inference(
        [&](Tensor* t, const std::string& name, DType dtype, Shape shape) {
          binder.declare(plan, t, "decode." + name, Category::temporaries, dtype, shape);
        },
        T);
  work(&last_, "last", {1, 1, C});
  work(&normed_, "normed", {1, 1, C});
  work(&mean_, "head_mean", {1, 1});
  work(&rstd_, "head_rstd", {1, 1});
  work(&logits_, "logits", {1, 1, c.vocab_size});
  binder.declare(plan, &logits_host_, "decode.logits.host", Category::data, DType::f32,
                 {c.vocab_size}, Placement::host);
}

const float* Decoder::feed(Backend& be, const std::vector<int32_t>& ids) {
  const ModelConfig& c = model_.config();
  const int64_t n = static_cast<int64_t>(ids.size());
  BRISK_CHECK(n >= 1 && n <= max_chunk_, "feeding ", n, " tokens at once (at most ", max_chunk_,
              ")");
  BRISK_CHECK(position_ + n <= max_tokens_, "the sequence would grow past ", max_tokens_,
              " tokens, the cache's length");
  for (int32_t id : ids)
    BRISK_CHECK(id >= 0 && id < c.vocab_size, "token id ", id, " is outside the vocabulary of ",
                c.vocab_size);
  std::copy(ids.begin(), ids.end(), ids_host_.i32());
  const Tensor ids_in = first_positions(ids_, n);
  be.upload(first_positions(ids_host_, n), ids_in);
  const Tensor x = first_positions(x_, n), y = first_positions(y_, n);
  DecodeScratch s;
  s.a = first_positions(scratch_.a, n);
  s.mean = first_positions(scratch_.mean, n);
  s.rstd = first_positions(scratch_.rstd, n);
  s.qkv = first_positions(scratch_.qkv, n);
  s.ctx = first_positions(scratch_.ctx, n);
  s.res = first_positions(scratch_.res, n);
  s.fc = first_positions(scratch_.fc, n);
  s.fc_act = first_positions(scratch_.fc_act, n);
  s.tmp = first_positions(scratch_.tmp, n);
  model_.upload_constants(be);
  model_.embed_at(be, ids_in, position_, x);
  const BlockStyle style = model_.inference_style();
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const Tensor& in = l % 2 == 0 ? x : y;
    const Tensor& out = l % 2 == 0 ? y : x;
    block_decode(be, style, static_cast<int>(l), model_.layer_weights(static_cast<int>(l)), in,
                 k_cache_[l], v_cache_[l], position_, s, out);
  }
  const Tensor& last_out = c.num_layers % 2 == 0 ? x : y;
  be.copy(Tensor(static_cast<float*>(last_out.data()) + (n - 1) * c.hidden_size,
                 Shape{1, 1, c.hidden_size}, DType::f32, last_out.device()),
          last_);
  model_.next_token_logits(be, last_, normed_, mean_, rstd_, logits_);
  be.download(Tensor(logits_.data(), Shape{c.vocab_size}, DType::f32, logits_.device()),
              logits_host_);
  position_ += n;
  return logits_host_.f32();
}

}  // namespace brisk
