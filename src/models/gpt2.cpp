// GPT-2: token + position embeddings, pre-LN blocks with causal attention, a final LayerNorm and
// logits through the transposed token embedding (or an untied lm_head); labels are shifted so
// position t predicts t+1.
#include "models/gpt2.h"

#include <cmath>

namespace brisk {

namespace {
constexpr uint32_t kEmbeddingSite = 1u << 30;

class Gpt2 final : public Model {
 public:
  explicit Gpt2(const ModelConfig& c) : Model(c) {}

 private:
  struct LayerIds {
    int ln_a_g, ln_a_b, qkv_w, qkv_b, proj_w, proj_b, ln_b_g, ln_b_b, fc_w, fc_b, out_w, out_b;
  };

  void declare_params() override {
    const ModelConfig& c = config_;
    const int64_t C = c.hidden_size, F = c.intermediate_size;
    const int64_t QKV = c.qkv_width(), A = c.attention_width();
    wte_ = vocab_param("transformer.wte.weight", {c.vocab_size, C},
                       c.tied_lm_head ? kTiedEmbedding : kEmbedding);
    wpe_ = param("transformer.wpe.weight", {c.max_position_embeddings, C}, kEmbedding);
    for (int64_t l = 0; l < c.num_layers; ++l) {
      enter_layer(l);
      const std::string p = "transformer.h." + std::to_string(l) + ".";
      LayerIds ids{};
      ids.ln_a_g = token_param(p + "ln_1.weight", {C});
      ids.ln_a_b = token_param(p + "ln_1.bias", {C});
      // Conv1D weights are [in, out]: the packed [q | k | v] (three parts) and c_fc split by
      // output (column-parallel), the two c_proj by input (row-parallel).
      ids.qkv_w = split_param(p + "attn.c_attn.weight", {C, QKV}, kLinearWeight, 1, 3);
      ids.qkv_b = split_param(p + "attn.c_attn.bias", {QKV}, kBiasOrNorm, 0, 3);
      ids.proj_w = split_param(p + "attn.c_proj.weight", {A, C}, kLinearWeight, 0);
      ids.proj_b = param(p + "attn.c_proj.bias", {C}, kBiasOrNorm);
      ids.ln_b_g = token_param(p + "ln_2.weight", {C});
      ids.ln_b_b = token_param(p + "ln_2.bias", {C});
      ids.fc_w = split_param(p + "mlp.c_fc.weight", {C, F}, kLinearWeight, 1);
      ids.fc_b = split_param(p + "mlp.c_fc.bias", {F}, kBiasOrNorm, 0);
      ids.out_w = split_param(p + "mlp.c_proj.weight", {F, C}, kLinearWeight, 0);
      ids.out_b = param(p + "mlp.c_proj.bias", {C}, kBiasOrNorm);
      layers_.push_back(ids);
    }
    enter_head();
    lnf_g_ = param("transformer.ln_f.weight", {C}, kBiasOrNorm);
    lnf_b_ = param("transformer.ln_f.bias", {C}, kBiasOrNorm);
    // tie_word_embeddings false: the LM head has its own [V, C] weight (no bias).
    head_ = c.tied_lm_head ? wte_ : vocab_param("lm_head.weight", {c.vocab_size, C}, kLinearWeight);
  }

  float init_std(const std::string& name) const override {
    // transformers scales the residual projections by 1/sqrt(2 * n_layer).
    const float base = Model::init_std(name);
    if (name.ends_with("c_proj.weight"))
      return base / std::sqrt(2.0f * static_cast<float>(config_.num_layers));
    return base;
  }

  int64_t head_width() const override { return vocab_rows(); }
  const char* base_prefix() const override { return "transformer."; }
  bool blocks_store_linears_transposed() const override { return true; }  // Conv1D
  const char* class_name() const override { return "GPT2LMHeadModel"; }
  BatchLayout batch_layout(int64_t batch, int64_t seq) const override {
    return {batch, seq, /*token_types=*/false, /*labels_per_token=*/true};
  }

  BlockStyle block_style(bool training) const override {
    BlockStyle s = config_block_style(training);
    s.pre_norm = true;
    s.layout = WeightLayout::in_out;
    return s;
  }

  BlockProducts layer_products(int layer) const override {
    const LayerIds& i = layers_[static_cast<size_t>(layer)];
    return {{{i.qkv_w, i.qkv_w}, {i.proj_w, i.proj_w}, {i.fc_w, i.fc_w}, {i.out_w, i.out_w}}};
  }

  BlockParams layer_params(int layer, bool grads) const override {
    const LayerIds& i = layers_[layer];
    auto t = [&](int id) { return grads ? g(id) : w(id); };
    return BlockParams{t(i.qkv_w), t(i.qkv_b), t(i.proj_w), t(i.proj_b), t(i.ln_a_g), t(i.ln_a_b),
                       t(i.fc_w),  t(i.fc_b),  t(i.out_w),  t(i.out_b),  t(i.ln_b_g), t(i.ln_b_b)};
  }

  void declare_buffers(MemoryPlan& plan, const BatchShape& s) override {
    const int64_t B = s.batch, T = s.seq, C = config_.hidden_size;
    declare_input(plan, &batch_.labels, &dev_batch_.labels, "batch.labels", {B, T});
    declare_input(plan, &targets_host_, &targets_, "batch.shifted_labels", {B, T});
    declare(plan, &lnf_out_, "ln_f.out", Category::activations, DType::f32, {B, T, C});
    declare(plan, &lnf_mean_, "ln_f.mean", Category::activations, DType::f32, {B, T});
    declare(plan, &lnf_rstd_, "ln_f.rstd", Category::activations, DType::f32, {B, T});
    declare_lm_logits(plan, s, head_, false);
  }

  void validate_batch() const override {
    check_ids(batch_.input_ids, config_.vocab_size, "token id");
    check_token_labels();
  }

  void embed_forward(Backend& be, const StepOptions& o) override {
    const Tensor& out = embedding_output();
    embed_tokens(be, dev_batch_.input_ids, wte_, position_rows(w(wpe_)), Tensor(), Tensor(), out);
    token_dropout(be, out, o.training ? config_.embedding_dropout : 0.0f, site(o, kEmbeddingSite),
                  out);
  }

  void prepare_batch() override { shift_labels(targets_host_); }

  void head_forward(Backend& be, const StepOptions& o) override {
    be.layernorm_forward(head_input(), w(lnf_g_), w(lnf_b_), config_.layer_norm_eps, lnf_out_,
                         lnf_mean_, lnf_rstd_);
    lm_head_forward(be, o, lnf_out_, head_, -1, targets_);
  }

  void head_backward(Backend& be, const StepOptions&) override {
    be.layernorm_backward(lm_head_dx(), head_input(), w(lnf_g_), lnf_mean_, lnf_rstd_,
                          head_input_grad(), false, g(lnf_g_), g(lnf_b_));
  }

  void embed_backward(Backend& be, const StepOptions& o) override {
    const Tensor& d = embedding_grad();
    token_dropout(be, d, o.training ? config_.embedding_dropout : 0.0f, site(o, kEmbeddingSite), d,
                  /*backward=*/true);
    embed_tokens_backward(be, d, dev_batch_.input_ids, /*padding_idx=*/-1, Tensor(), wte_,
                          position_rows(g(wpe_)), Tensor());
  }

  bool causal_lm() const override { return true; }
  bool head_reads_embeddings() const override { return head_ >= 0 && head_ == wte_; }

  void embed_at(Backend& be, const Tensor& ids, int64_t first, const Tensor& out) const override {
    const Tensor rows = position_rows(w(wpe_), first, ids.dim(1), "n_positions");
    be.embedding_forward(ids, w(wte_), rows, Tensor(), Tensor(), out, {}, Tensor());
  }

  void next_token_logits(Backend& be, const Tensor& hidden, const Tensor& normed,
                         const Tensor& mean, const Tensor& rstd,
                         const Tensor& logits) const override {
    be.layernorm_forward(hidden, w(lnf_g_), w(lnf_b_), config_.layer_norm_eps, normed, mean, rstd);
    be.linear_forward(normed, w(head_), Tensor(), WeightLayout::out_in, logits);
  }

  int wte_ = 0, wpe_ = 0, lnf_g_ = 0, lnf_b_ = 0, head_ = 0;
  std::vector<LayerIds> layers_;
  Tensor targets_host_, targets_, lnf_out_, lnf_mean_, lnf_rstd_;
};
}  // namespace

std::unique_ptr<Model> make_gpt2(const ModelConfig& config) {
  return std::make_unique<Gpt2>(config);
}

}  // namespace brisk
