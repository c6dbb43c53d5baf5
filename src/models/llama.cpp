// The llama family (see llama.h). Names as transformers': model.embed_tokens,
// model.layers.N.{input_layernorm, self_attn.{q,k,v,o}_proj, post_attention_layernorm,
// mlp.{gate,up,down}_proj}, model.norm, lm_head; OLMoE's self_attn.{q,k}_norm. Which linear layers
// have biases comes from the config (llama: attention_bias, mlp_bias; qwen2: q/k/v only; mistral:
// none).
#include "models/llama.h"

#include <algorithm>
#include <memory>

#include "models/moe_mlps.h"

namespace brisk {

namespace {
class Llama final : public Model {
 public:
  explicit Llama(const ModelConfig& c) : Model(c) {}

 private:
  // Parameter indices; -1 for a bias the config leaves out. q/k/v (weights, then biases) and
  // gate/up lie end to end so that each group acts as one product.
  struct LayerIds {
    int ln_a = -1, q_w = -1, v_w = -1, q_b = -1, v_b = -1, o_w = -1, o_b = -1, ln_b = -1;
    int gate_w = -1, up_w = -1, gate_b = -1, up_b = -1, down_w = -1, down_b = -1;
    int q_norm = -1, k_norm = -1;
  };

  // A sparse layer's router, experts and shared expert, in transformers' names (Mixtral's
  // block_sparse_moe.experts.<e>.w1/w3/w2; Qwen2-MoE's and OLMoE's mlp.experts.<e>.gate_proj/
  // up_proj/down_proj), declared so that the experts' gate and up projections lie as one [E, 2F, C]
  // and their down projections as one [E, C, F] (MoeLayerIds).
  MoeLayerIds declare_experts(const std::string& p) {
    const ModelConfig& c = config_;
    const int64_t C = c.hidden_size, F = c.moe.inner, S = c.moe.shared_inner;
    const bool mixtral = c.model_type == ModelType::mixtral;
    const std::string m = p + (mixtral ? "block_sparse_moe." : "mlp.");
    auto expert = [&](int64_t e, const char* name) {
      return m + "experts." + std::to_string(e) + "." + name + ".weight";
    };
    auto in_mlp = [&](int64_t e, const char* name) {
      return p + "mlp.experts." + std::to_string(e) + "." + name + ".weight";
    };
    // transformers 5's packed layout, which a file may hold instead (Mixtral's router as mlp.gate).
    // Under expert parallelism, this rank's experts only.
    const int64_t E = c.moe.experts, first = c.moe.first_expert();
    const int64_t end = first + c.moe.local_experts();
    const std::string gate_up = p + "mlp.experts.gate_up_proj", down = p + "mlp.experts.down_proj";
    MoeLayerIds ids;
    ids.router = param(m + "gate.weight", {E, C}, kLinearWeight);
    also_packed_in(ids.router, p + "mlp.gate.weight", {E, C}, 0);
    // Another rank's experts: skipped in the order (their initial values drawn there).
    auto held = [&](int64_t e, int count) {
      if (e >= first && e < end) return true;
      for (int i = 0; i < count; ++i) skip_param();
      return false;
    };
    for (int64_t e = 0; e < E; ++e) {
      if (!held(e, 2)) continue;
      const int gate = param(expert(e, mixtral ? "w1" : "gate_proj"), {F, C}, kExpertWeight);
      ids.gate_last = param(expert(e, mixtral ? "w3" : "up_proj"), {F, C}, kExpertWeight);
      if (mixtral) {  // the spelling of transformers 5's converter, under mlp.
        also_named(gate, in_mlp(e, "w1"));
        also_named(ids.gate_last, in_mlp(e, "w3"));
      }
      also_packed_in(gate, gate_up, {E, 2 * F, C}, 2 * e * F * C);
      also_packed_in(ids.gate_last, gate_up, {E, 2 * F, C}, (2 * e + 1) * F * C);
      if (e == first) ids.gate_first = gate;
    }
    for (int64_t e = 0; e < E; ++e) {
      if (!held(e, 1)) continue;
      ids.down_last = param(expert(e, mixtral ? "w2" : "down_proj"), {C, F}, kExpertWeight);
      if (mixtral) also_named(ids.down_last, in_mlp(e, "w2"));
      also_packed_in(ids.down_last, down, {E, C, F}, e * C * F);
      if (e == first) ids.down_first = ids.down_last;
    }
    if (S == 0) return ids;
    ids.shared_first = param(m + "shared_expert.gate_proj.weight", {S, C}, kLinearWeight);
    param(m + "shared_expert.up_proj.weight", {S, C}, kLinearWeight);
    ids.shared_down = param(m + "shared_expert.down_proj.weight", {C, S}, kLinearWeight);
    ids.shared_gate = param(m + "shared_expert_gate.weight", {1, C}, kLinearWeight);
    return ids;
  }

  void declare_params() override {
    const ModelConfig& c = config_;
    if (c.moe.experts > 0)
      moe_ = std::make_unique<MoeMlps>(c.moe, params_, c.hidden_size, c.num_layers);
    const int64_t C = c.hidden_size, F = c.intermediate_size;
    const int64_t QD = c.attention_width(), KD = c.kv_heads() * c.head_dim();
    embed_ = vocab_param("model.embed_tokens.weight", {c.vocab_size, C},
                         c.tied_lm_head ? kTiedEmbedding : kEmbedding);
    if (c.pad_token_id >= 0) set_padded_embedding(embed_);
    for (int64_t l = 0; l < c.num_layers; ++l) {
      enter_layer(l);
      const std::string p = "model.layers." + std::to_string(l) + ".";
      const std::string a = p + "self_attn.", m = p + "mlp.";
      LayerIds ids;
      ids.ln_a = token_param(p + "input_layernorm.weight", {C});
      // [out, in] weights: q/k/v and gate/up split by output (column-parallel), o_proj and
      // down_proj by input (row-parallel); k/v copied where the ranks outnumber their heads.
      ids.q_w = split_param(a + "q_proj.weight", {QD, C}, kLinearWeight, 0);
      kv_param(a + "k_proj.weight", {KD, C}, kLinearWeight);
      ids.v_w = kv_param(a + "v_proj.weight", {KD, C}, kLinearWeight);
      if (c.qkv_bias) {
        ids.q_b = split_param(a + "q_proj.bias", {QD}, kBiasOrNorm, 0);
        kv_param(a + "k_proj.bias", {KD}, kBiasOrNorm);
        ids.v_b = kv_param(a + "v_proj.bias", {KD}, kBiasOrNorm);
      }
      ids.o_w = split_param(a + "o_proj.weight", {C, QD}, kLinearWeight, 1);
      if (c.attn_out_bias) ids.o_b = param(a + "o_proj.bias", {C}, kBiasOrNorm);
      if (c.qk_norm) {
        ids.q_norm = param(a + "q_norm.weight", {QD}, kBiasOrNorm);
        ids.k_norm = param(a + "k_norm.weight", {KD}, kBiasOrNorm);
      }
      ids.ln_b = token_param(p + "post_attention_layernorm.weight", {C});
      if (c.moe.sparse(l)) {
        moe_->add_layer(l, declare_experts(p));
        layers_.push_back(ids);
        continue;
      }
      ids.gate_w = split_param(m + "gate_proj.weight", {F, C}, kLinearWeight, 0);
      ids.up_w = split_param(m + "up_proj.weight", {F, C}, kLinearWeight, 0);
      if (c.mlp_bias) {
        ids.gate_b = split_param(m + "gate_proj.bias", {F}, kBiasOrNorm, 0);
        ids.up_b = split_param(m + "up_proj.bias", {F}, kBiasOrNorm, 0);
      }
      ids.down_w = split_param(m + "down_proj.weight", {C, F}, kLinearWeight, 1);
      if (c.mlp_bias) ids.down_b = param(m + "down_proj.bias", {C}, kBiasOrNorm);
      layers_.push_back(ids);
    }
    enter_head();
    norm_ = param("model.norm.weight", {C}, kBiasOrNorm);
    head_ =
        c.tied_lm_head ? embed_ : vocab_param("lm_head.weight", {c.vocab_size, C}, kLinearWeight);
  }

  int64_t head_width() const override { return vocab_rows(); }
  const char* base_prefix() const override { return "model."; }
  const char* class_name() const override {
    switch (config_.model_type) {
      case ModelType::mistral:
        return "MistralForCausalLM";
      case ModelType::qwen2:
        return "Qwen2ForCausalLM";
      case ModelType::mixtral:
        return "MixtralForCausalLM";
      case ModelType::qwen2_moe:
        return "Qwen2MoeForCausalLM";
      case ModelType::olmoe:
        return "OlmoeForCausalLM";
      default:
        return "LlamaForCausalLM";
    }
  }
  BatchLayout batch_layout(int64_t batch, int64_t seq) const override {
    return {batch, seq, /*token_types=*/false, /*labels_per_token=*/true};
  }

  BlockStyle block_style(bool training) const override {
    BlockStyle s = config_block_style(training);
    s.pre_norm = true;
    s.layout = WeightLayout::out_in;
    s.rms_norm = true;
    s.gated_mlp = true;
    s.qk_norm = config_.qk_norm;
    // Every planned position's row (the views hold the batch's length): a packed batch's samples
    // may be longer than its rows.
    s.rope_cos = planned_rows(rope_cos_);
    s.rope_sin = planned_rows(rope_sin_);
    s.sparse_mlp = moe_.get();
    return s;
  }

  BlockProducts layer_products(int layer) const override {
    const LayerIds& i = layers_[static_cast<size_t>(layer)];
    return {{{i.q_w, i.v_w}, {i.o_w, i.o_w}, {i.gate_w, i.up_w}, {i.down_w, i.down_w}}};
  }

  BlockParams layer_params(int layer, bool grads) const override {
    const ModelConfig& c = config_;
    const LayerIds& i = layers_[layer];
    const int64_t C = c.hidden_size, F = c.intermediate_size, QKV = c.qkv_width();
    auto t = [&](int id) { return id < 0 ? Tensor() : grads ? g(id) : w(id); };
    auto span = [&](int first, int last, Shape shape) {
      if (first < 0) return Tensor();
      return grads ? params_.grad_span(first, last, shape)
                   : params_.weight_span(first, last, shape);
    };
    BlockParams b;
    b.qkv_w = span(i.q_w, i.v_w, {QKV, C});
    b.qkv_b = span(i.q_b, i.v_b, {QKV});
    b.proj_w = t(i.o_w);
    b.proj_b = t(i.o_b);
    b.ln_a_g = t(i.ln_a);
    b.fc_w = span(i.gate_w, i.up_w, {2 * F, C});
    b.fc_b = span(i.gate_b, i.up_b, {2 * F});
    b.out_w = t(i.down_w);
    b.out_b = t(i.down_b);
    b.ln_b_g = t(i.ln_b);
    b.q_norm = t(i.q_norm);
    b.k_norm = t(i.k_norm);
    return b;
  }

  // The rotary tables for the planned length (the decoder's plan: the whole sequence).
  void declare_constants(MemoryPlan& plan, const BatchShape& s) override {
    const ModelConfig& c = config_;
    BRISK_CHECK(c.sliding_window == 0 || s.seq <= c.sliding_window, "sequences of ", s.seq,
                " tokens are longer than the ", c.type_name(),
                " config's sliding_window = ", c.sliding_window,
                ", which brisk does not implement; use --max_seq_length / ",
                "--block_size of at most ", c.sliding_window);
    const Shape table{s.seq, c.head_dim() / 2};
    declare_constant(plan, &rope_cos_host_, &rope_cos_, "rope.cos", table, DType::f32);
    declare_constant(plan, &rope_sin_host_, &rope_sin_, "rope.sin", table, DType::f32);
  }

  void fill_constants() override {
    const ModelConfig& c = config_;
    const RopeTables t =
        rope_tables(c.head_dim(), c.rope_theta, rope_cos_host_.dim(0), c.rope_scaling);
    std::copy(t.cos.begin(), t.cos.end(), rope_cos_host_.f32());
    std::copy(t.sin.begin(), t.sin.end(), rope_sin_host_.f32());
  }

  void declare_buffers(MemoryPlan& plan, const BatchShape& s) override {
    const int64_t B = s.batch, T = s.seq, C = config_.hidden_size;
    declare_input(plan, &batch_.labels, &dev_batch_.labels, "batch.labels", {B, T});
    declare_input(plan, &targets_host_, &targets_, "batch.shifted_labels", {B, T});
    declare(plan, &norm_out_, "norm.out", Category::activations, DType::f32, {B, T, C});
    declare(plan, &norm_rstd_, "norm.rstd", Category::activations, DType::f32, {B, T});
    declare_lm_logits(plan, s, head_, false);
    if (moe_) declare_experts_buffers(plan, s);
  }

  // Mixture of experts: one rank, for now; in mixed precision the experts compute in float32
  // from their widened inputs.
  void declare_experts_buffers(MemoryPlan& plan, const BatchShape& s) {
    const ModelConfig& c = config_;
    BRISK_CHECK(c.tensor_ranks == 1 && c.sequence_ranks == 1 && c.pipeline_stages == 1,
                c.type_name(),
                ": mixture-of-experts layers do not run under tensor, sequence or pipeline "
                "parallelism yet");
    moe_->declare([&](Tensor* t, const std::string& name, Category category, DType dtype,
                      Shape shape) { declare(plan, t, name, category, dtype, shape); },
                  s.batch * s.seq, activation_dtype() != DType::f32);
  }

  void validate_batch() const override {
    check_ids(batch_.input_ids, config_.vocab_size, "token id");
    check_token_labels();
  }

  void prepare_batch() override { shift_labels(targets_host_); }

  void embed_forward(Backend& be, const StepOptions&) override {
    if (moe_) moe_->set_mask(dev_batch_.attention_mask);
    if (moe_) moe_->set_group(expert_group());
    embed_tokens(be, dev_batch_.input_ids, embed_, Tensor(), Tensor(), Tensor(),
                 embedding_output());
  }

  void head_forward(Backend& be, const StepOptions& o) override {
    if (moe_) add_router_losses(be, o);
    if (moe_ && o.compute_grad) moe_->tally();
    be.rmsnorm_forward(head_input(), w(norm_), config_.layer_norm_eps, norm_out_, norm_rstd_);
    lm_head_forward(be, o, norm_out_, head_, -1, targets_);
  }

  // The router losses over the unmasked tokens (transformers' load-balancing loss, the z-loss
  // where asked for), added to the summed loss as this micro-batch's share of the batch's mean
  // (its targets' share; one micro-batch: the loss plus coef x aux, as transformers adds it), their
  // gradients taken alike.
  void add_router_losses(Backend& be, const StepOptions& o) {
    const int32_t* mask = batch_.attention_mask.i32();
    int64_t unmasked = 0;
    for (int64_t i = 0; i < batch_.attention_mask.numel(); ++i) unmasked += mask[i] != 0;
    const auto targets = static_cast<double>(count_targets());
    BRISK_CHECK(o.loss_grad_scale.held == nullptr, "internal error: a held scale for routing");
    const double aux = moe_->router_losses(be, unmasked, o.loss_grad_scale.value * targets);
    if (aux != 0.0) add_to_loss(be, aux * targets);
  }

  void head_backward(Backend& be, const StepOptions&) override {
    be.rmsnorm_backward(lm_head_dx(), head_input(), w(norm_), norm_rstd_, head_input_grad(), false,
                        g(norm_));
  }

  void embed_backward(Backend& be, const StepOptions&) override {
    embed_tokens_backward(be, embedding_grad(), dev_batch_.input_ids, config_.pad_token_id,
                          Tensor(), embed_, Tensor(), Tensor());
  }

  bool causal_lm() const override { return true; }

  // Mixture of experts: the routed pairs per expert over the sparse layers (this rank's tokens)
  // and their balance, the busiest expert's pairs over the mean (1: even); with a capacity, the
  // pairs dropped.
  nlohmann::json take_log_statistics() override {
    if (!moe_) return nlohmann::json::object();
    const MoeMlps::Tally t = moe_->take_tally();
    if (t.pairs.empty()) return nlohmann::json::object();
    int64_t sum = 0, most = 0;
    for (int64_t n : t.pairs) sum += n, most = std::max(most, n);
    const double mean = static_cast<double>(sum) / static_cast<double>(t.pairs.size());
    nlohmann::json j{{"expert_tokens", t.pairs}, {"expert_balance", mean > 0 ? most / mean : 0.0}};
    if (config_.moe.capacity_factor > 0) j["expert_dropped"] = t.dropped;
    return j;
  }
  bool head_reads_embeddings() const override { return head_ >= 0 && head_ == embed_; }

  std::vector<ExpertWeightsDecl> expert_weights() const override {
    std::vector<ExpertWeightsDecl> out;
    const ModelConfig& c = config_;
    const int64_t E = c.moe.local_experts(), C = c.hidden_size, F = c.moe.inner;
    for (int l = 0; moe_ && l < static_cast<int>(c.num_layers); ++l) {
      if (!moe_->sparse(l)) continue;
      const std::string p = "model.layers." + std::to_string(l) + ".mlp.experts.";
      const MoeLayerIds& ids = moe_->layer_ids(l);
      out.push_back({p + "gate_up_proj", l, false, E, C, 2 * F, ids.gate_first, ids.gate_last});
      out.push_back({p + "down_proj", l, true, E, F, C, ids.down_first, ids.down_last});
    }
    return out;
  }
  void mark_routers(std::vector<LinearDecl>& linears) const override {
    for (LinearDecl& l : linears) {
      if (!moe_ || !moe_->sparse(l.layer) || moe_->layer_ids(l.layer).router != l.param) continue;
      l.router = true;
      l.module = "model.layers." + std::to_string(l.layer) + ".mlp.gate";
    }
  }
  void adapt_experts(const ExpertWeightsDecl& w, int a, int b, int64_t r, float scale) override {
    moe_->add_lora(w.layer, w.down, a, b, r, scale);
  }

  void embed_at(Backend& be, const Tensor& ids, int64_t first, const Tensor& out) const override {
    const int64_t T = ids.dim(1);
    BRISK_CHECK(first >= 0 && first + T <= rope_cos_.dim(0), "positions ", first, "..", first + T,
                " exceed the ", rope_cos_.dim(0), " the model was planned for");
    be.embedding_forward(ids, w(embed_), Tensor(), Tensor(), Tensor(), out, {}, Tensor());
  }

  void next_token_logits(Backend& be, const Tensor& hidden, const Tensor& normed, const Tensor&,
                         const Tensor& rstd, const Tensor& logits) const override {
    be.rmsnorm_forward(hidden, w(norm_), config_.layer_norm_eps, normed, rstd);
    be.linear_forward(normed, w(head_), Tensor(), WeightLayout::out_in, logits);
  }

  int embed_ = 0, norm_ = 0, head_ = 0;
  std::vector<LayerIds> layers_;
  std::unique_ptr<MoeMlps> moe_;  // mixture-of-experts decoders' sparse MLPs
  Tensor targets_host_, targets_, norm_out_, norm_rstd_;
  Tensor rope_cos_host_, rope_cos_, rope_sin_host_, rope_sin_;
  Tensor planned_rows(const Tensor& table) const {
    return Tensor(table.data(), Shape{planned_shape().seq, table.dim(1)}, table.dtype(),
                  table.device());
  }
};
}  // namespace

std::unique_ptr<Model> make_llama(const ModelConfig& config) {
  return std::make_unique<Llama>(config);
}

}  // namespace brisk
