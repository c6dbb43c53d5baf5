// The sparse MLPs of a mixture-of-experts decoder (Mixtral, Qwen2-MoE): each sparse layer's
// moe_layer over its parameters, as the block's SparseMlp, what each layer keeps for its backward,
// and transformers' load-balancing loss over the layers, added to the model's loss.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "core/memory_plan.h"
#include "core/parameters.h"
#include "models/config.h"
#include "models/moe_layer.h"
#include "models/transformer_block.h"

namespace brisk {

// One sparse layer's parameters (indices into the model's ParameterSet): the router [E, C]; the
// experts' gate and up projections [F, C] each, expert after expert (gate_first .. gate_last, so
// together [E, 2F, C]); their down projections [C, F] (down_first .. down_last: [E, C, F]); the
// shared expert's gate and up [S, C] (shared_first, shared_first + 1), down [C, S] and gate
// [1, C] (-1 without one).
struct MoeLayerIds {
  int router = -1, gate_first = -1, gate_last = -1, down_first = -1, down_last = -1;
  int shared_first = -1, shared_down = -1, shared_gate = -1;
};

class MoeMlps final : public SparseMlp {
 public:
  using Declare = std::function<void(Tensor*, const std::string&, Category, DType, Shape)>;
  MoeMlps(const MoeConfig& c, const ParameterSet& params, int64_t hidden, int64_t layers);

  void add_layer(int64_t layer, const MoeLayerIds& ids);
  // A LoRA of sparse layer `layer`'s experts' gate_up weights (`down`: their down weights): its
  // A and B parameters, laid out as MoeLora's, its rank and scale. Before declare.
  void add_lora(int64_t layer, bool down, int a, int b, int64_t r, float scale);
  // Buffers for micro-batches of `tokens` tokens: each sparse layer's saved tensors, the shared
  // temporaries, and the router losses' statistics of every sparse layer and gradient scale. In
  // mixed precision (`widened`: the blocks hand the MLPs 16-bit inputs) each layer also keeps
  // its input widened to float32: the experts compute in float32, their products in the
  // backend's product dtype.
  void declare(const Declare& declare, int64_t tokens, bool widened = false);
  // The micro-batch's attention mask [B, T] int32 (empty: every token counts), for the router
  // losses; set before the forward. Its token count is the planned one (declare, again for each
  // length).
  void set_mask(const Tensor& mask) { mask_ = mask; }
  // Expert parallelism's group (MoeConfig::expert_ranks of them; null: every expert here); set
  // before the forward.
  void set_group(ExpertGroup* group) { group_ = group; }

  bool sparse(int layer) const override;
  const MoeLayerIds& layer_ids(int layer) const {
    return layers_.at(static_cast<size_t>(layer)).ids;
  }
  void forward(Backend& be, int layer, const Tensor& x, const Tensor& y,
               const LayerAdapters& adapters) override;
  void backward(Backend& be, int layer, const Tensor& x, const Tensor& dy, const Tensor& dx,
                bool accumulate_dw, const LayerAdapters& adapters) override;
  std::vector<std::pair<ProductSite, Tensor>> products(int layer) const override;
  void declare_inference(const SparseMlp::Declare& declare, int64_t tokens) override;
  void infer(Backend& be, int layer, const Tensor& x, const Tensor& y) override;

  // After every layer's forward: the router losses the config asks for over the micro-batch's
  // unmasked tokens (`unmasked`), their gradients taken times `grad_weight` by the layers'
  // backward: coef x transformers' load-balancing loss (MoeConfig::aux_loss), plus the router
  // z-loss (MoeConfig::z_loss_coef). Returns 0 without them.
  double router_losses(Backend& be, int64_t unmasked, double grad_weight);

  // After a training micro-batch's forward: its routed pairs per expert, summed over the sparse
  // layers, and the pairs past the experts' capacity, added to the log window's; take_tally hands
  // those over (no pairs: no micro-batch since) and starts a new window.
  void tally();
  struct Tally {
    std::vector<int64_t> pairs;
    int64_t dropped = 0;
  };
  Tally take_tally();

 private:
  struct Lora {
    int a = -1, b = -1;
    int64_t r = 0;
    float scale = 0;
    Tensor u;  // [R, r]: MoeLora::u
  };
  struct Layer {
    MoeLayerIds ids;
    Lora gate_up_lora, down_lora;
    MoeSaved saved;
    Tensor input;      // float32 [N, C], where the blocks' inputs are 16-bit
    int64_t slot = 0;  // among the sparse layers
  };
  MoeShape shape() const;
  MoeWeights weights(const MoeLayerIds& ids, bool grads) const;
  // The layer's weights with its experts' LoRAs.
  MoeWeights weights(const Layer& l, bool grads) const;
  MoeLora lora(const Lora& l, bool grads) const;
  Tensor flat_mask() const;
  // x [.., C] as float32 rows: x itself, or widened into l.input (`widen`: the forward's; the
  // backward reads what it wrote).
  Tensor float32_input(Backend& be, const Layer& l, const Tensor& x, bool widen) const;
  MoeZLoss z_loss(const Layer& l) const;
  double balance_loss(Backend& be, int64_t unmasked, double grad_weight);
  double router_z_loss(int64_t unmasked, double grad_weight);

  MoeConfig c_;
  const ParameterSet& params_;
  int64_t hidden_;
  std::vector<Layer> layers_;  // by layer index; a dense layer's router is -1
  std::vector<std::vector<int32_t>> counts_;
  MoeScratch scratch_;
  Tensor lora_v_;  // [R, the largest rank]: MoeLora::v, shared by the layers
  // The router losses' statistics, read back at once: every sparse layer's [2, E] of the balance
  // loss, then every sparse layer's z-loss sum; the balance loss's gradient [E] scale (the same for
  // every layer) and dprobs [N, E]; their host copies.
  int64_t sparse_layers_ = 0;
  Tensor stats_, scale_, dprobs_;
  std::vector<float> stats_flat_, scale_host_;
  std::vector<std::vector<float>> stats_host_;
  Tensor mask_;
  ExpertGroup* group_ = nullptr;
  int64_t tokens_ = 0;
  // Under expert parallelism, the planned micro-batch's tokens: what another rank may route at
  // once (a shorter length's plan keeps the expert side's buffers for it).
  int64_t peer_tokens_ = 0;
  // balance_loss gave this micro-batch's layers a gradient (a forward run again in backward, as
  // gradient checkpointing runs it, keeps it).
  bool balanced_ = false;
  float z_scale_ = 0.0f;  // the z-loss's gradient scale (0: none)
  std::vector<int64_t> tally_;
  int64_t dropped_ = 0;
  // Inference's buffers, for up to infer_tokens_ tokens, shared by the layers.
  MoeSaved infer_saved_;
  Tensor infer_logits_;
  std::vector<int32_t> infer_counts_;
  int64_t infer_tokens_ = 0;
};

}  // namespace brisk
