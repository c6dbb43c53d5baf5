// BERT: token + position + token-type embeddings and LayerNorm, post-LN blocks, tanh pooler over
// the first token, dropout and a linear classifier with cross-entropy over num_labels (or, for
// regression, one output under the squared error).
#include "models/bert.h"

#include <cmath>

namespace brisk {

namespace {
constexpr uint32_t kEmbeddingSite = 1u << 30;
constexpr uint32_t kClassifierSite = kEmbeddingSite + 1;

class Bert final : public Model {
 public:
  explicit Bert(const ModelConfig& c) : Model(c) {}

 private:
  struct LayerIds {
    int qkv_w_first, qkv_w_last, qkv_b_first, qkv_b_last, proj_w, proj_b, ln_a_g, ln_a_b;
    int fc_w, fc_b, out_w, out_b, ln_b_g, ln_b_b;
  };

  void declare_params() override {
    const ModelConfig& c = config_;
    const int64_t C = c.hidden_size, F = c.intermediate_size;
    word_ = param("bert.embeddings.word_embeddings.weight", {c.vocab_size, C}, kEmbedding);
    pos_ = param("bert.embeddings.position_embeddings.weight", {c.max_position_embeddings, C},
                 kEmbedding);
    type_ =
        param("bert.embeddings.token_type_embeddings.weight", {c.type_vocab_size, C}, kEmbedding);
    emb_ln_g_ = param("bert.embeddings.LayerNorm.weight", {C}, kBiasOrNorm);
    emb_ln_b_ = param("bert.embeddings.LayerNorm.bias", {C}, kBiasOrNorm);
    for (int64_t l = 0; l < c.num_layers; ++l) {
      const std::string p = "bert.encoder.layer." + std::to_string(l) + ".";
      LayerIds ids{};
      // query, key and value lie end to end so that they act as one [3C, C] projection.
      ids.qkv_w_first = param(p + "attention.self.query.weight", {C, C}, kLinearWeight);
      param(p + "attention.self.key.weight", {C, C}, kLinearWeight);
      ids.qkv_w_last = param(p + "attention.self.value.weight", {C, C}, kLinearWeight);
      ids.qkv_b_first = param(p + "attention.self.query.bias", {C}, kBiasOrNorm);
      param(p + "attention.self.key.bias", {C}, kBiasOrNorm);
      ids.qkv_b_last = param(p + "attention.self.value.bias", {C}, kBiasOrNorm);
      ids.proj_w = param(p + "attention.output.dense.weight", {C, C}, kLinearWeight);
      ids.proj_b = param(p + "attention.output.dense.bias", {C}, kBiasOrNorm);
      ids.ln_a_g = param(p + "attention.output.LayerNorm.weight", {C}, kBiasOrNorm);
      ids.ln_a_b = param(p + "attention.output.LayerNorm.bias", {C}, kBiasOrNorm);
      ids.fc_w = param(p + "intermediate.dense.weight", {F, C}, kLinearWeight);
      ids.fc_b = param(p + "intermediate.dense.bias", {F}, kBiasOrNorm);
      ids.out_w = param(p + "output.dense.weight", {C, F}, kLinearWeight);
      ids.out_b = param(p + "output.dense.bias", {C}, kBiasOrNorm);
      ids.ln_b_g = param(p + "output.LayerNorm.weight", {C}, kBiasOrNorm);
      ids.ln_b_b = param(p + "output.LayerNorm.bias", {C}, kBiasOrNorm);
      layers_.push_back(ids);
    }
    pool_w_ = param("bert.pooler.dense.weight", {C, C}, kLinearWeight);
    pool_b_ = param("bert.pooler.dense.bias", {C}, kBiasOrNorm);
    cls_w_ = param("classifier.weight", {c.num_labels, C}, kLinearWeight);
    cls_b_ = param("classifier.bias", {c.num_labels}, kBiasOrNorm);
  }

  int64_t head_width() const override { return config_.hidden_size; }
  const char* base_prefix() const override { return "bert."; }
  const char* class_name() const override { return "BertForSequenceClassification"; }
  BatchLayout batch_layout(int64_t batch, int64_t seq) const override {
    return {batch, seq, /*token_types=*/true, /*labels_per_token=*/false, config_.regression};
  }

  BlockStyle block_style(bool training) const override {
    BlockStyle s;
    s.pre_norm = false;
    s.causal = false;
    s.layout = WeightLayout::out_in;
    s.activation = config_.activation;
    s.eps = config_.layer_norm_eps;
    s.attention_dropout = training ? config_.attention_dropout : 0.0f;
    s.residual_dropout = training ? config_.hidden_dropout : 0.0f;
    s.heads = static_cast<int>(config_.num_heads);
    s.attention_scale = 1.0f / std::sqrt(static_cast<float>(config_.head_dim()));
    return s;
  }

  BlockParams layer_params(int layer, bool grads) const override {
    const LayerIds& i = layers_[layer];
    const int64_t C = config_.hidden_size;
    auto t = [&](int id) { return grads ? g(id) : w(id); };
    BlockParams b;
    b.qkv_w = grads ? params_.grad_span(i.qkv_w_first, i.qkv_w_last, {3 * C, C})
                    : params_.weight_span(i.qkv_w_first, i.qkv_w_last, {3 * C, C});
    b.qkv_b = grads ? params_.grad_span(i.qkv_b_first, i.qkv_b_last, {3 * C})
                    : params_.weight_span(i.qkv_b_first, i.qkv_b_last, {3 * C});
    b.proj_w = t(i.proj_w);
    b.proj_b = t(i.proj_b);
    b.ln_a_g = t(i.ln_a_g);
    b.ln_a_b = t(i.ln_a_b);
    b.fc_w = t(i.fc_w);
    b.fc_b = t(i.fc_b);
    b.out_w = t(i.out_w);
    b.out_b = t(i.out_b);
    b.ln_b_g = t(i.ln_b_g);
    b.ln_b_b = t(i.ln_b_b);
    return b;
  }

  void declare_buffers(MemoryPlan& plan, const BatchShape& s) override {
    const int64_t B = s.batch, T = s.seq, C = config_.hidden_size;
    declare_input(plan, &batch_.token_type_ids, &dev_batch_.token_type_ids, "batch.token_type_ids",
                  {B, T});
    if (config_.regression)
      declare_input(plan, &batch_.label_values, &dev_batch_.label_values, "batch.label_values", {B},
                    DType::f32);
    else
      declare_input(plan, &batch_.labels, &dev_batch_.labels, "batch.labels", {B});
    declare(plan, &emb_sum_, "embeddings.sum", Category::activations, DType::f32, {B, T, C});
    declare(plan, &emb_mean_, "embeddings.mean", Category::activations, DType::f32, {B, T});
    declare(plan, &emb_rstd_, "embeddings.rstd", Category::activations, DType::f32, {B, T});
    declare(plan, &first_, "pooler.first", Category::activations, DType::f32, {B, C});
    declare(plan, &pooled_, "pooler.out", Category::activations, DType::f32, {B, C});
    declare(plan, &dropped_, "classifier.in", Category::activations, DType::f32, {B, C});
    declare(plan, &logits_, "logits", Category::activations, DType::f32, {B, config_.num_labels});
    declare(plan, &d_pool_, "grad.pool", Category::temporaries, DType::f32, {B, C});
    declare(plan, &d_first_, "grad.first", Category::temporaries, DType::f32, {B, C});
  }

  void validate_batch() const override {
    check_ids(batch_.input_ids, config_.vocab_size, "token id");
    check_ids(batch_.token_type_ids, config_.type_vocab_size, "token type id");
    if (config_.regression) {
      const float* v = batch_.label_values.f32();
      for (int64_t b = 0; b < shape_.batch; ++b)
        BRISK_CHECK(no_label_value(v[b]) || std::isfinite(v[b]), "label ", v[b], " of sequence ", b,
                    " is not a finite number");
      return;
    }
    const int32_t* y = batch_.labels.i32();
    for (int64_t b = 0; b < shape_.batch; ++b)
      BRISK_CHECK(y[b] == kIgnoreIndex || (y[b] >= 0 && y[b] < config_.num_labels), "label ", y[b],
                  " of sequence ", b, " is outside [0, ", config_.num_labels, ")");
  }

  void embed_forward(Backend& be, const StepOptions& o) override {
    be.embedding_forward(dev_batch_.input_ids, w(word_), w(pos_), dev_batch_.token_type_ids,
                         w(type_), emb_sum_);
    be.layernorm_forward(emb_sum_, w(emb_ln_g_), w(emb_ln_b_), config_.layer_norm_eps, hidden_[0],
                         emb_mean_, emb_rstd_);
    be.dropout_forward(hidden_[0], dropout(config_.embedding_dropout, o), site(o, kEmbeddingSite),
                       hidden_[0]);
  }

  void head_forward(Backend& be, const StepOptions& o) override {
    be.first_token(hidden_[config_.num_layers], first_);
    be.linear_forward(first_, w(pool_w_), w(pool_b_), WeightLayout::out_in, pooled_);
    be.tanh_forward(pooled_, pooled_);
    be.dropout_forward(pooled_, dropout(config_.classifier_dropout, o), site(o, kClassifierSite),
                       dropped_);
    be.linear_forward(dropped_, w(cls_w_), w(cls_b_), WeightLayout::out_in, logits_);
    if (config_.regression)
      be.mse_loss(logits_, dev_batch_.label_values, o.compute_grad, o.loss_grad_scale, loss_sum());
    else
      be.softmax_cross_entropy(logits_, dev_batch_.labels, o.compute_grad, o.loss_grad_scale,
                               loss_sum());
  }

  void head_backward(Backend& be, const StepOptions& o) override {
    be.linear_backward(dropped_, w(cls_w_), logits_, WeightLayout::out_in, d_pool_, false,
                       g(cls_w_), g(cls_b_));
    be.dropout_backward(d_pool_, dropout(config_.classifier_dropout, o), site(o, kClassifierSite),
                        d_pool_);
    be.tanh_backward(pooled_, d_pool_, d_pool_);
    be.linear_backward(first_, w(pool_w_), d_pool_, WeightLayout::out_in, d_first_, false,
                       g(pool_w_), g(pool_b_));
    be.fill(d_hidden_, 0.0f);
    be.first_token_backward(d_first_, d_hidden_);
  }

  void embed_backward(Backend& be, const StepOptions& o) override {
    be.dropout_backward(d_hidden_, dropout(config_.embedding_dropout, o), site(o, kEmbeddingSite),
                        d_hidden_);
    be.layernorm_backward(d_hidden_, emb_sum_, w(emb_ln_g_), emb_mean_, emb_rstd_, scratch_.tmp,
                          false, g(emb_ln_g_), g(emb_ln_b_));
    be.embedding_backward(scratch_.tmp, dev_batch_.input_ids, /*padding_idx=*/-1,
                          dev_batch_.token_type_ids, g(word_), g(pos_), g(type_));
  }

  static float dropout(float p, const StepOptions& o) { return o.training ? p : 0.0f; }

  int word_ = 0, pos_ = 0, type_ = 0, emb_ln_g_ = 0, emb_ln_b_ = 0;
  int pool_w_ = 0, pool_b_ = 0, cls_w_ = 0, cls_b_ = 0;
  std::vector<LayerIds> layers_;
  Tensor emb_sum_, emb_mean_, emb_rstd_, first_, pooled_, dropped_, d_pool_, d_first_;
};
}  // namespace

std::unique_ptr<Model> make_bert(const ModelConfig& config) {
  return std::make_unique<Bert>(config);
}

}  // namespace brisk
