// The BERT family's encoder with its task heads (see encoder.h).
#include "models/encoder.h"

#include <algorithm>
#include <cmath>

namespace brisk {

namespace {
constexpr uint32_t kEmbeddingSite = 1u << 30;
constexpr uint32_t kClassifierSite = kEmbeddingSite + 1;

class Encoder final : public Model {
 public:
  Encoder(const ModelConfig& c, const EncoderNames& n) : Model(c), n_(n) {
    BRISK_CHECK(!masked_lm() || n.masked_lm_class, "brisk has no masked-LM head for ",
                c.type_name(), " models (only BertForMaskedLM)");
  }

 private:
  struct LayerIds {
    int qkv_w_first, qkv_w_last, qkv_b_first, qkv_b_last, proj_w, proj_b, ln_a_g, ln_a_b;
    int fc_w, fc_b, out_w, out_b, ln_b_g, ln_b_b;
  };

  bool token_types() const { return n_.token_type != nullptr; }
  bool masked_lm() const { return config_.task == ModelTask::masked_lm; }

  void declare_params() override {
    const ModelConfig& c = config_;
    const int64_t C = c.hidden_size, F = c.intermediate_size, A = c.attention_width();
    const std::string base = n_.base;
    // split: the dimension of the [out, in] weight tensor parallelism splits (-1: none); the
    // bias is split with the output.
    auto linear = [&](const std::string& name, Shape w_shape, int split = -1) {
      const int w = split < 0 ? param(name + ".weight", w_shape, kLinearWeight)
                              : split_param(name + ".weight", w_shape, kLinearWeight, split);
      if (split == 0)
        split_param(name + ".bias", {w_shape[0]}, kBiasOrNorm, 0);
      else
        param(name + ".bias", {w_shape[0]}, kBiasOrNorm);
      return w;  // the bias is w + 1
    };
    auto norm = [&](const std::string& name) {
      const int gamma = param(name + ".weight", {C}, kBiasOrNorm);
      param(name + ".bias", {C}, kBiasOrNorm);
      return gamma;
    };
    auto block_norm = [&](const std::string& name) {
      const int gamma = token_param(name + ".weight", {C});
      token_param(name + ".bias", {C});
      return gamma;
    };
    // The masked-LM decoder multiplies by the word embeddings: a tied product operand.
    word_ = vocab_param(base + n_.word + ".weight", {c.vocab_size, C},
                        masked_lm() ? kTiedEmbedding : kEmbedding);
    pos_ = param(base + n_.position + ".weight", {c.max_position_embeddings, C}, kEmbedding);
    if (token_types())
      type_ = param(base + n_.token_type + ".weight", {c.type_vocab_size, C}, kEmbedding);
    emb_ln_g_ = norm(base + n_.embedding_norm);
    if (c.pad_token_id >= 0) set_padded_embedding(word_);
    for (int64_t l = 0; l < c.num_layers; ++l) {
      enter_layer(l);
      const std::string p = base + n_.layer + std::to_string(l) + ".";
      LayerIds ids{};
      // query, key and value weights lie end to end, then their biases, so that each group acts
      // as one [3C, C] projection (or [3C] bias).
      // Tensor parallelism splits query, key, value and the intermediate layer by output
      // (column-parallel), the attention output and output layers by input (row-parallel).
      ids.qkv_w_first = split_param(p + n_.query + ".weight", {A, C}, kLinearWeight, 0);
      split_param(p + n_.key + ".weight", {A, C}, kLinearWeight, 0);
      ids.qkv_w_last = split_param(p + n_.value + ".weight", {A, C}, kLinearWeight, 0);
      ids.qkv_b_first = split_param(p + n_.query + ".bias", {A}, kBiasOrNorm, 0);
      split_param(p + n_.key + ".bias", {A}, kBiasOrNorm, 0);
      ids.qkv_b_last = split_param(p + n_.value + ".bias", {A}, kBiasOrNorm, 0);
      ids.proj_w = linear(p + n_.attention_output, {C, A}, 1);
      ids.ln_a_g = block_norm(p + n_.attention_norm);
      ids.fc_w = linear(p + n_.intermediate, {F, C}, 0);
      ids.out_w = linear(p + n_.output, {C, F}, 1);
      ids.ln_b_g = block_norm(p + n_.output_norm);
      ids.proj_b = ids.proj_w + 1;
      ids.ln_a_b = ids.ln_a_g + 1;
      ids.fc_b = ids.fc_w + 1;
      ids.out_b = ids.out_w + 1;
      ids.ln_b_b = ids.ln_b_g + 1;
      layers_.push_back(ids);
    }
    enter_head();
    if (masked_lm()) {
      // In BERT's order: the decoder's bias, then the transform.
      mlm_bias_ = vocab_param(n_.mlm_bias, {c.vocab_size}, kBiasOrNorm);
      head_w_ = linear(n_.mlm_dense, {C, C});
      mlm_ln_g_ = norm(n_.mlm_norm);
      return;
    }
    head_w_ = linear(n_.head_dense, {C, C});
    cls_w_ = linear(n_.classifier, {c.num_labels, C});
  }

  int64_t head_width() const override { return masked_lm() ? vocab_rows() : config_.hidden_size; }
  const char* base_prefix() const override { return n_.base; }
  const char* class_name() const override {
    return masked_lm() ? n_.masked_lm_class : n_.class_name;
  }
  BatchLayout batch_layout(int64_t batch, int64_t seq) const override {
    if (masked_lm()) return {batch, seq, token_types(), /*labels_per_token=*/true};
    return {batch, seq, token_types(), /*labels_per_token=*/false, config_.regression};
  }

  BlockStyle block_style(bool training) const override {
    BlockStyle s = config_block_style(training);
    s.pre_norm = false;
    s.layout = WeightLayout::out_in;
    return s;
  }

  BlockProducts layer_products(int layer) const override {
    const LayerIds& i = layers_[static_cast<size_t>(layer)];
    return {{{i.qkv_w_first, i.qkv_w_last},
             {i.proj_w, i.proj_w},
             {i.fc_w, i.fc_w},
             {i.out_w, i.out_w}}};
  }

  BlockParams layer_params(int layer, bool grads) const override {
    const LayerIds& i = layers_[layer];
    const int64_t C = config_.hidden_size;
    auto t = [&](int id) { return grads ? g(id) : w(id); };
    BlockParams b;
    const int64_t QKV = config_.qkv_width();
    b.qkv_w = grads ? params_.grad_span(i.qkv_w_first, i.qkv_w_last, {QKV, C})
                    : params_.weight_span(i.qkv_w_first, i.qkv_w_last, {QKV, C});
    b.qkv_b = grads ? params_.grad_span(i.qkv_b_first, i.qkv_b_last, {QKV})
                    : params_.weight_span(i.qkv_b_first, i.qkv_b_last, {QKV});
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
    if (token_types())
      declare_input(plan, &batch_.token_type_ids, &dev_batch_.token_type_ids,
                    "batch.token_type_ids", {B, T});
    if (masked_lm()) {
      declare_input(plan, &batch_.labels, &dev_batch_.labels, "batch.labels", {B, T});
      if (labelled_rows_only()) {
        declare_input(plan, &rows_host_, &rows_, "batch.mlm_rows", {B * T});
        declare_input(plan, &row_labels_host_, &row_labels_, "batch.mlm_row_labels", {B * T});
      }
    } else if (config_.regression)
      declare_input(plan, &batch_.label_values, &dev_batch_.label_values, "batch.label_values", {B},
                    DType::f32);
    else
      declare_input(plan, &batch_.labels, &dev_batch_.labels, "batch.labels", {B});
    declare(plan, &emb_sum_, "embeddings.sum", Category::activations, DType::f32, {B, T, C});
    declare(plan, &emb_mean_, "embeddings.mean", Category::activations, DType::f32, {B, T});
    declare(plan, &emb_rstd_, "embeddings.rstd", Category::activations, DType::f32, {B, T});
    if (masked_lm()) {
      declare(plan, &head_pre_, "mlm.dense", Category::activations, DType::f32, {B, T, C});
      declare(plan, &head_act_, "mlm.act", Category::activations, DType::f32, {B, T, C});
      declare(plan, &mlm_out_, "mlm.norm", Category::activations, DType::f32, {B, T, C});
      declare(plan, &mlm_mean_, "mlm.mean", Category::activations, DType::f32, {B, T});
      declare(plan, &mlm_rstd_, "mlm.rstd", Category::activations, DType::f32, {B, T});
      declare_lm_logits(plan, s, word_, mlm_bias_ >= 0);
      return;
    }
    declare(plan, &first_, "pooler.first", Category::activations, DType::f32, {B, C});
    // tanh's gradient needs only its output, computed in place; ReLU's needs its input.
    if (!n_.tanh_head)
      declare(plan, &head_pre_, "pooler.dense", Category::activations, DType::f32, {B, C});
    declare(plan, &head_act_, "pooler.out", Category::activations, DType::f32, {B, C});
    declare(plan, &dropped_, "classifier.in", Category::activations, DType::f32, {B, C});
    declare(plan, &logits_, "logits", Category::activations, DType::f32, {B, config_.num_labels});
    declare(plan, &d_head_, "grad.pool", Category::temporaries, DType::f32, {B, C});
    declare(plan, &d_first_, "grad.first", Category::temporaries, DType::f32, {B, C});
  }

  void validate_batch() const override {
    check_ids(batch_.input_ids, config_.vocab_size, "token id");
    if (token_types()) check_ids(batch_.token_type_ids, config_.type_vocab_size, "token type id");
    if (masked_lm()) {
      const int32_t* y = batch_.labels.i32();
      for (int64_t i = 0; i < batch_.labels.numel(); ++i)
        BRISK_CHECK(y[i] == kIgnoreIndex || (y[i] >= 0 && y[i] < config_.vocab_size), "label ",
                    y[i], " at position ", i, " is outside the vocabulary of ", config_.vocab_size);
      return;
    }
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

  // Sparse prediction: in steps that compute gradients, the decoder of a masked LM over the
  // labelled rows alone (PlanOptions::labelled_rows_only), as the loss reads no other row.
  bool labelled_rows_only() const {
    const PlanOptions& o = plan_options();
    return masked_lm() && o.gradients && o.labelled_rows_only && config_.tensor_ranks == 1 &&
           config_.sequence_ranks == 1;
  }

  // Each token's row among the decoder's (rows_host_): the labelled first, in order, then the
  // rest; row_labels_host_ their labels. The decoder takes the labelled rows, rounded up to a
  // multiple of 64 (fewer product shapes; at least 64, so that every step writes the head's
  // gradient), those past them ignored.
  void prepare_batch() override {
    if (!labelled_rows_only()) return;
    const int64_t n = batch_.labels.numel();
    const int32_t* y = batch_.labels.i32();
    int32_t* row = rows_host_.i32();
    int32_t* label = row_labels_host_.i32();
    int32_t next = 0;
    auto place = [&](bool labelled) {
      for (int64_t i = 0; i < n; ++i)
        if ((y[i] != kIgnoreIndex) == labelled) {
          row[i] = next;
          label[next++] = y[i];
        }
    };
    place(true);
    const int64_t count = next;
    place(false);
    decoder_rows_ = std::min(n, std::max<int64_t>(64, (count + 63) / 64 * 64));
  }
  void add_step_signature(std::vector<int64_t>& s) const override {
    if (labelled_rows_only()) s.push_back(decoder_rows_);
  }

  Tensor type_table(bool grads) const {
    if (!token_types()) return Tensor();
    return grads ? g(type_) : w(type_);
  }

  void embed_forward(Backend& be, const StepOptions& o) override {
    embed_tokens(be, dev_batch_.input_ids, word_, position_rows(w(pos_)), dev_batch_.token_type_ids,
                 type_table(false), emb_sum_);
    be.layernorm_forward(emb_sum_, w(emb_ln_g_), w(emb_ln_g_ + 1), config_.layer_norm_eps,
                         embedding_output(), emb_mean_, emb_rstd_);
    token_dropout(be, embedding_output(), dropout(config_.embedding_dropout, o),
                  site(o, kEmbeddingSite), embedding_output());
  }

  void head_forward(Backend& be, const StepOptions& o) override {
    if (masked_lm()) return masked_lm_forward(be, o);
    pool_first_tokens(be);
    if (n_.tanh_head) {
      be.linear_forward(first_, w(head_w_), w(head_w_ + 1), WeightLayout::out_in, head_act_);
      be.tanh_forward(head_act_, head_act_);
    } else {
      be.linear_forward(first_, w(head_w_), w(head_w_ + 1), WeightLayout::out_in, head_pre_);
      be.activation_forward(Activation::relu, head_pre_, head_act_);
    }
    be.dropout_forward(head_act_, dropout(config_.classifier_dropout, o), site(o, kClassifierSite),
                       dropped_);
    be.linear_forward(dropped_, w(cls_w_), w(cls_w_ + 1), WeightLayout::out_in, logits_);
    if (config_.regression)
      be.mse_loss(logits_, dev_batch_.label_values, o.compute_grad, o.loss_grad_scale, loss_sum());
    else
      be.softmax_cross_entropy(logits_, dev_batch_.labels, o.compute_grad, o.loss_grad_scale,
                               loss_sum(), Tensor());
  }

  void head_backward(Backend& be, const StepOptions& o) override {
    const bool accumulate = !o.first_micro_batch;
    if (masked_lm()) return masked_lm_backward(be, accumulate);
    be.linear_backward(dropped_, w(cls_w_), logits_, WeightLayout::out_in, d_head_, false,
                       g(cls_w_), g(cls_w_ + 1), accumulate);
    be.dropout_backward(d_head_, dropout(config_.classifier_dropout, o), site(o, kClassifierSite),
                        d_head_);
    if (n_.tanh_head)
      be.tanh_backward(head_act_, d_head_, d_head_);
    else
      be.activation_backward(Activation::relu, head_pre_, d_head_, d_head_, DType::f32);
    be.linear_backward(first_, w(head_w_), d_head_, WeightLayout::out_in, d_first_, false,
                       g(head_w_), g(head_w_ + 1), accumulate);
    be.fill(head_input_grad(), 0.0f);
    be.first_token_backward(d_first_, head_input_grad(), pooled_starts());
  }

  // Each sequence's first token [B, C]: row b's, or a padding-free batch's sample b's (rows past
  // its samples zero; their labels are ignored), where they start read from memory.
  void pool_first_tokens(Backend& be) { be.first_token(head_input(), first_, pooled_starts()); }

  // A padding-free batch's starts of the samples that are sequences (the first B: a padding
  // sample may follow them); empty for rows.
  Tensor pooled_starts() const {
    const PackedSamples* samples = packed_samples();
    if (samples == nullptr) return Tensor();
    return element_range(samples->at, 0, std::min(first_.dim(0), samples->count()) + 1);
  }

  // BertLMPredictionHead: logits = LN(act(dense(h))) W_word^T + bias, over every position, or
  // with labelled_rows_only the decoder over the labelled rows, gathered into the block
  // scratch's tmp (free while the head runs; lm_head_forward computes its backward too).
  void masked_lm_forward(Backend& be, const StepOptions& o) {
    be.linear_forward(head_input(), w(head_w_), w(head_w_ + 1), WeightLayout::out_in, head_pre_);
    be.activation_forward(config_.activation, head_pre_, head_act_);
    be.layernorm_forward(head_act_, w(mlm_ln_g_), w(mlm_ln_g_ + 1), config_.layer_norm_eps,
                         mlm_out_, mlm_mean_, mlm_rstd_);
    if (!labelled_rows_only() || !o.compute_grad)
      return lm_head_forward(be, o, mlm_out_, word_, mlm_bias_, dev_batch_.labels);
    const int64_t n = rows_.numel();
    be.moe_gather(row_range(mlm_out_, 0, n), token_rows(), row_range(scratch_.tmp, 0, n));
    lm_head_forward(be, o, row_range(scratch_.tmp, 0, decoder_rows_), word_, mlm_bias_,
                    row_range(row_labels_, 0, decoder_rows_));
  }

  Tensor token_rows() const {
    return Tensor(rows_.data(), Shape{rows_.numel(), 1}, DType::i32, rows_.device());
  }

  // The transform's output gradient: the decoder's input gradient, or with labelled_rows_only
  // its rows moved back to their tokens (the rows past the decoder's zero) into tmp.
  Tensor mlm_output_grad(Backend& be) {
    if (!labelled_rows_only()) return lm_head_dx();
    const int64_t n = rows_.numel();
    const Tensor dx = row_range(lm_head_dx(), 0, n);
    be.fill(row_range(dx, decoder_rows_, n - decoder_rows_), 0.0f);
    const Tensor d_out = row_range(scratch_.tmp, 0, n);
    be.moe_combine(dx, token_rows(), Tensor(), d_out, false);
    return Tensor(d_out.data(), head_act_.shape(), DType::f32, d_out.device());
  }

  // The block scratch is free while the rest of the head runs: tmp2 holds its gradient.
  void masked_lm_backward(Backend& be, bool accumulate_dw) {
    const Tensor& d_act = scratch_.tmp2;
    be.layernorm_backward(mlm_output_grad(be), head_act_, w(mlm_ln_g_), mlm_mean_, mlm_rstd_, d_act,
                          false, g(mlm_ln_g_), g(mlm_ln_g_ + 1));
    be.activation_backward(config_.activation, head_pre_, d_act, d_act, DType::f32);
    be.linear_backward(head_input(), w(head_w_), d_act, WeightLayout::out_in, head_input_grad(),
                       false, g(head_w_), g(head_w_ + 1), accumulate_dw);
  }

  void embed_backward(Backend& be, const StepOptions& o) override {
    const Tensor& d = embedding_grad();
    token_dropout(be, d, dropout(config_.embedding_dropout, o), site(o, kEmbeddingSite), d,
                  /*backward=*/true);
    be.layernorm_backward(d, emb_sum_, w(emb_ln_g_), emb_mean_, emb_rstd_, scratch_.tmp, false,
                          g(emb_ln_g_), g(emb_ln_g_ + 1));
    embed_tokens_backward(be, scratch_.tmp, dev_batch_.input_ids, config_.pad_token_id,
                          dev_batch_.token_type_ids, word_, position_rows(g(pos_)),
                          type_table(true));
  }

  // DistilBERT's sinusoidal_pos_embds: the position table starts as sin/cos of
  // pos / 10000^(2*(j/2)/dim) (even columns sin, odd cos), then trains like any other weight
  // (transformers 5 copies the values into the parameter without freezing it).
  void init_extra(Backend& be, int param) override {
    if (!config_.sinusoidal_positions || param != pos_) return;
    const int64_t C = config_.hidden_size;
    write_in_pieces(be, w(pos_), [&](const Tensor& piece, int64_t first) {
      float* x = piece.f32();
      for (int64_t i = 0; i < piece.numel(); ++i) {
        const int64_t pos = (first + i) / C, j = (first + i) % C;
        const double angle =
            static_cast<double>(pos) / std::pow(10000.0, static_cast<double>(2 * (j / 2)) / C);
        x[i] = static_cast<float>(j % 2 == 0 ? std::sin(angle) : std::cos(angle));
      }
    });
  }

  bool head_reads_embeddings() const override {  // the tied decoder, where the stage has it
    return masked_lm() && config_.last_stage();
  }
  bool embed_backward_reads_weights() const override { return true; }  // the LayerNorm

  static float dropout(float p, const StepOptions& o) { return o.training ? p : 0.0f; }

  const EncoderNames& n_;
  int word_ = 0, pos_ = 0, type_ = -1, emb_ln_g_ = 0, head_w_ = 0, cls_w_ = 0;
  int mlm_bias_ = 0, mlm_ln_g_ = 0;  // masked LM
  std::vector<LayerIds> layers_;
  Tensor emb_sum_, emb_mean_, emb_rstd_, first_, head_pre_, head_act_, dropped_, d_head_, d_first_;
  Tensor mlm_out_, mlm_mean_, mlm_rstd_;  // masked LM: the transform's LayerNorm
  // labelled_rows_only: each token's decoder row and the rows' labels (prepare_batch), on the
  // host and the device; how many rows the decoder takes.
  Tensor rows_host_, rows_, row_labels_host_, row_labels_;
  int64_t decoder_rows_ = 0;
};
}  // namespace

std::unique_ptr<Model> make_encoder(const ModelConfig& config, const EncoderNames& names) {
  return std::make_unique<Encoder>(config, names);
}

}  // namespace brisk
