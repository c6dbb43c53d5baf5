#include "models/moe_mlps.h"

#include <algorithm>

#include "core/checked.h"

namespace brisk {

MoeMlps::MoeMlps(const MoeConfig& c, const ParameterSet& params, int64_t hidden, int64_t layers)
    : c_(c),
      params_(params),
      hidden_(hidden),
      layers_(static_cast<size_t>(layers)),
      counts_(static_cast<size_t>(layers)) {}

void MoeMlps::add_layer(int64_t layer, const MoeLayerIds& ids) {
  layers_.at(static_cast<size_t>(layer)).ids = ids;
}

void MoeMlps::add_lora(int64_t layer, bool down, int a, int b, int64_t r, float scale) {
  Layer& l = layers_.at(static_cast<size_t>(layer));
  BRISK_CHECK(l.ids.router >= 0, "internal error: a LoRA of layer ", layer, "'s experts: none");
  (down ? l.down_lora : l.gate_up_lora) = Lora{a, b, r, scale, Tensor()};
}

bool MoeMlps::sparse(int layer) const {
  return layer >= 0 && layer < static_cast<int>(layers_.size()) &&
         layers_[static_cast<size_t>(layer)].ids.router >= 0;
}

MoeShape MoeMlps::shape() const {
  return {tokens_,
          hidden_,
          c_.inner,
          c_.experts,
          c_.top_k,
          c_.normalize,
          c_.shared_inner,
          c_.z_loss_coef > 0,
          moe_capacity(c_.capacity_factor, tokens_, c_.top_k, c_.experts),
          c_.expert_ranks,
          peer_tokens_,
          moe_capacity(c_.capacity_factor, peer_tokens_, c_.top_k, c_.experts)};
}

void MoeMlps::declare(const Declare& declare, int64_t tokens, bool widened) {
  tokens_ = tokens;
  peer_tokens_ = std::max(peer_tokens_, tokens);  // the first plan's: the planned length
  const MoeShape s = shape();
  int64_t sparse_layers = 0, widest_rank = 0;
  for (size_t l = 0; l < layers_.size(); ++l) {
    if (!sparse(static_cast<int>(l))) continue;
    layers_[l].slot = sparse_layers++;
    const std::string p = "moe." + std::to_string(l) + ".";
    declare_moe_saved(s, layers_[l].saved,
                      [&](Tensor* t, const std::string& name, DType dtype, Shape shape) {
                        declare(t, p + name, Category::activations, dtype, shape);
                      });
    if (widened)
      declare(&layers_[l].input, p + "input", Category::activations, DType::f32, {tokens, hidden_});
    for (Lora* lora : {&layers_[l].gate_up_lora, &layers_[l].down_lora}) {
      if (lora->r == 0) continue;
      declare(&lora->u, p + (lora == &layers_[l].down_lora ? "down" : "gate_up") + "_lora_u",
              Category::activations, DType::f32, {moe_expert_rows(s), lora->r});
      widest_rank = std::max(widest_rank, lora->r);
    }
  }
  if (widest_rank > 0)
    declare(&lora_v_, "moe.lora_v", Category::temporaries, DType::f32,
            {moe_expert_rows(s), widest_rank});
  declare_moe_scratch(s, scratch_,
                      [&](Tensor* t, const std::string& name, DType dtype, Shape shape) {
                        declare(t, "moe." + name, Category::temporaries, dtype, shape);
                      });
  sparse_layers_ = sparse_layers;
  const int64_t E = c_.aux_loss ? c_.experts : 0, z = s.z_loss ? 1 : 0;
  if (E + z == 0) return;
  const int64_t stats = checked_mul(sparse_layers, 2 * E + z, "router loss statistics");
  declare(&stats_, "moe.router_loss_stats", Category::activations, DType::f32, {stats});
  stats_flat_.resize(static_cast<size_t>(stats));  // (stats_ is bound later)
  if (E == 0) return;
  declare(&scale_, "moe.balance_scale", Category::activations, DType::f32, {E});
  declare(&dprobs_, "moe.balance_dprobs", Category::temporaries, DType::f32, {tokens, E});
  stats_host_.assign(static_cast<size_t>(sparse_layers), std::vector<float>(2 * E));
  scale_host_.resize(static_cast<size_t>(E));
}

MoeZLoss MoeMlps::z_loss(const Layer& l) const {
  if (c_.z_loss_coef <= 0) return {};
  const int64_t at = sparse_layers_ * (c_.aux_loss ? 2 * c_.experts : 0) + l.slot;
  return {flat_mask(), Tensor(stats_.f32() + at, Shape{1}, DType::f32, stats_.device()), z_scale_};
}

MoeLora MoeMlps::lora(const Lora& l, bool grads) const {
  if (l.r == 0) return {};
  auto of = [&](int id) { return grads ? params_.grad(id) : params_.weight(id); };
  const Tensor v = lora_v_.empty() ? Tensor()
                                   : Tensor(lora_v_.data(), Shape{lora_v_.dim(0), l.r}, DType::f32,
                                            lora_v_.device());
  return {of(l.a), of(l.b), l.u, v, l.scale, l.r};
}

MoeWeights MoeMlps::weights(const Layer& l, bool grads) const {
  MoeWeights w = weights(l.ids, grads);
  w.gate_up_lora = lora(l.gate_up_lora, grads);
  w.down_lora = lora(l.down_lora, grads);
  return w;
}

MoeWeights MoeMlps::weights(const MoeLayerIds& i, bool grads) const {
  auto one = [&](int id) {
    return id < 0 ? Tensor() : grads ? params_.grad(id) : params_.weight(id);
  };
  auto span = [&](int first, int last, Shape shape) {
    return grads ? params_.grad_span(first, last, shape) : params_.weight_span(first, last, shape);
  };
  const int64_t C = hidden_, F = c_.inner, E = c_.local_experts(), S = c_.shared_inner;
  MoeWeights w{one(i.router), span(i.gate_first, i.gate_last, {E, 2 * F, C}),
               span(i.down_first, i.down_last, {E, C, F})};
  if (i.shared_first >= 0) {
    w.shared_gate_up = span(i.shared_first, i.shared_first + 1, {2 * S, C});
    w.shared_down = one(i.shared_down);
    w.shared_gate = one(i.shared_gate);
  }
  return w;
}

namespace {
Tensor as_rows(const Tensor& t, int64_t cols) {
  return Tensor(t.data(), Shape{t.numel() / cols, cols}, t.dtype(), t.device());
}
}  // namespace

Tensor MoeMlps::float32_input(Backend& be, const Layer& l, const Tensor& x, bool widen) const {
  if (x.dtype() == DType::f32) return as_rows(x, hidden_);
  BRISK_CHECK(!l.input.empty(), "a mixture-of-experts layer given ", dtype_name(x.dtype()),
              " inputs was planned for float32 ones");
  if (widen) be.cast(x, l.input);
  return l.input;
}

void MoeMlps::forward(Backend& be, int layer, const Tensor& x, const Tensor& y,
                      const LayerAdapters& adapters) {
  Layer& l = layers_.at(static_cast<size_t>(layer));
  // This micro-batch's tokens: a length whose shapes use_seq found before plans nothing again.
  tokens_ = x.numel() / hidden_;
  moe_forward(be, shape(), weights(l, false), float32_input(be, l, x, true), l.saved, scratch_,
              as_rows(y, hidden_), counts_[static_cast<size_t>(layer)], z_loss(l), group_,
              adapters);
}

std::vector<std::pair<ProductSite, Tensor>> MoeMlps::products(int layer) const {
  if (!sparse(layer)) return {};
  const MoeWeights w = weights(layers_[static_cast<size_t>(layer)].ids, false);
  return {{ProductSite::router, w.router},
          {ProductSite::shared_fc, w.shared_gate_up},
          {ProductSite::shared_out, w.shared_down},
          {ProductSite::shared_gate, w.shared_gate}};
}

void MoeMlps::backward(Backend& be, int layer, const Tensor& x, const Tensor& dy, const Tensor& dx,
                       bool accumulate_dw, const LayerAdapters& adapters) {
  const Layer& l = layers_.at(static_cast<size_t>(layer));
  if (balanced_) be.moe_balance_backward(flat_mask(), scale_, dprobs_);
  moe_backward(be, shape(), weights(l, false), weights(l, true), float32_input(be, l, x, false),
               l.saved, scratch_, counts_[static_cast<size_t>(layer)], as_rows(dy, hidden_),
               balanced_ ? dprobs_ : Tensor(), as_rows(dx, hidden_), accumulate_dw, z_loss(l),
               group_, adapters);
}

void MoeMlps::declare_inference(const SparseMlp::Declare& declare, int64_t tokens) {
  BRISK_CHECK(c_.expert_ranks == 1,
              "generation under expert parallelism (--ep_size) is not supported yet");
  infer_tokens_ = tokens;
  MoeShape s = shape();
  s.tokens = tokens;
  declare_moe_saved(s, infer_saved_,
                    [&](Tensor* t, const std::string& name, DType dtype, Shape shape) {
                      declare(t, "moe.infer." + name, dtype, shape);
                    });
  declare(&infer_logits_, "moe.infer.logits", DType::f32, {tokens, c_.experts});
}

void MoeMlps::infer(Backend& be, int layer, const Tensor& x, const Tensor& y) {
  const Layer& l = layers_.at(static_cast<size_t>(layer));
  MoeShape s = shape();
  s.tokens = x.numel() / hidden_;
  s.z_loss = false;
  s.capacity = 0;  // generation routes dropless
  BRISK_CHECK(l.gate_up_lora.r == 0 && l.down_lora.r == 0,
              "internal error: generation with the experts' adapters unmerged");
  BRISK_CHECK(s.tokens >= 1 && s.tokens <= infer_tokens_, "mixture-of-experts inference on ",
              s.tokens, " tokens; buffers for ", infer_tokens_);
  MoeScratch scratch;
  scratch.logits = row_range(infer_logits_, 0, s.tokens);
  moe_forward(be, s, weights(l.ids, false), as_rows(x, hidden_),
              moe_saved_rows(infer_saved_, s.tokens, s.top_k), scratch, as_rows(y, hidden_),
              infer_counts_);
}

Tensor MoeMlps::flat_mask() const {
  return mask_.empty() ? Tensor()
                       : Tensor(mask_.data(), Shape{mask_.numel()}, DType::i32, mask_.device());
}

void MoeMlps::tally() {
  tally_.resize(static_cast<size_t>(c_.experts), 0);
  const MoeShape s = shape();
  for (size_t l = 0; l < layers_.size(); ++l) {
    if (!sparse(static_cast<int>(l))) continue;
    for (size_t e = 0; e < tally_.size(); ++e) tally_[e] += counts_[l][e];
    dropped_ += moe_dropped(s, counts_[l]);
  }
}

MoeMlps::Tally MoeMlps::take_tally() {
  Tally t{std::move(tally_), dropped_};
  tally_.clear();
  dropped_ = 0;
  return t;
}

double MoeMlps::router_losses(Backend& be, int64_t unmasked, double grad_weight) {
  balanced_ = false;
  z_scale_ = 0.0f;
  if ((!c_.aux_loss && c_.z_loss_coef <= 0) || unmasked == 0) return 0.0;
  const int64_t E = c_.experts;
  if (c_.aux_loss)  // the sparse layers' statistics, side by side, beside the z-loss sums
    for (const Layer& l : layers_)
      if (l.ids.router >= 0)
        be.moe_balance_stats(
            l.saved.probs, l.saved.experts, flat_mask(),
            Tensor(stats_.f32() + 2 * E * l.slot, Shape{2, E}, DType::f32, stats_.device()));
  be.download(stats_, Tensor(stats_flat_.data(), stats_.shape(), DType::f32, Device::cpu));
  const double balance = c_.aux_loss ? balance_loss(be, unmasked, grad_weight) : 0.0;
  return balance + router_z_loss(unmasked, grad_weight);
}

// The z-loss's mean over the sparse layers and unmasked tokens from the downloaded sums.
double MoeMlps::router_z_loss(int64_t unmasked, double grad_weight) {
  if (c_.z_loss_coef <= 0) return 0.0;
  const auto first = stats_flat_.end() - sparse_layers_;
  double sum = 0.0;
  for (auto it = first; it != stats_flat_.end(); ++it) sum += *it;
  const double tokens = static_cast<double>(sparse_layers_) * static_cast<double>(unmasked);
  z_scale_ = static_cast<float>(c_.z_loss_coef * grad_weight / tokens);
  return c_.z_loss_coef * sum / tokens;
}

// The load-balancing loss from the downloaded statistics; its gradient's scale uploaded.
double MoeMlps::balance_loss(Backend& be, int64_t unmasked, double grad_weight) {
  const int64_t E = c_.experts;
  for (size_t l = 0; l < stats_host_.size(); ++l)
    std::copy_n(stats_flat_.begin() + static_cast<int64_t>(l) * 2 * E, 2 * E,
                stats_host_[l].begin());
  const MoeBalanceLoss b = moe_balance_loss(stats_host_, E, unmasked, c_.aux_loss_coef);
  for (size_t e = 0; e < scale_host_.size(); ++e)
    scale_host_[e] = static_cast<float>(b.scale[e] * grad_weight);
  be.upload(Tensor(scale_host_.data(), Shape{E}, DType::f32, Device::cpu), scale_);
  balanced_ = true;
  return c_.aux_loss_coef * b.loss;
}

}  // namespace brisk
