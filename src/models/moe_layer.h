// A sparse mixture-of-experts MLP as transformers' Mixtral, Qwen2-MoE and OLMoE blocks compute it:
// a router (a bias-free linear layer to E logits), each token's top-k experts (Backend::
// moe_route_forward), and each chosen expert's SwiGLU MLP on that token, summed with the routing
// weights; with Qwen2-MoE's shared expert, a SwiGLU MLP every token goes through, scaled by
// sigmoid(x . shared_gate), added. Dropless: every routed pair is computed. The pairs are grouped
// by expert (moe_dispatch), so each expert's two products run on its own rows only, and the routing
// of a micro-batch fixes no buffer size: the N k routed rows are N k whatever the routing.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "models/product_adapters.h"

namespace brisk {

struct MoeShape {
  int64_t tokens = 0, hidden = 0, inner = 0, experts = 0, top_k = 0;
  bool normalize = true;     // norm_topk_prob (Mixtral: always)
  int64_t shared_inner = 0;  // shared_expert_intermediate_size S (Qwen2-MoE); 0: none
  bool z_loss = false;       // ST-MoE's router z-loss (opt-in): saved.z is kept
  // Switch Transformer's expert capacity (opt-in): each expert computes its first `capacity`
  // routed rows (in the tokens' order, then their slots'); a pair past it is dropped: it adds
  // nothing to its token's output and gets no gradient. 0: dropless.
  int64_t capacity = 0;
  // Expert parallelism: the ranks of an ExpertGroup hold the experts between them, E / ranks
  // each (rank r experts [r E / ranks, (r + 1) E / ranks)); the weights the layer is given are this
  // rank's experts'. 1: every expert here.
  int64_t expert_ranks = 1;
  // The most tokens a rank of the group routes at once (the planned micro-batch's: ranks may pass
  // shorter ones, of different lengths); 0: tokens.
  int64_t peer_tokens = 0;
  // The capacity of such a micro-batch (peer_tokens'); 0: capacity.
  int64_t peer_capacity = 0;
};

// This rank's experts (E / expert_ranks).
int64_t moe_local_experts(const MoeShape& s);
// The rows this rank's experts compute in a micro-batch, at most: the N k routed rows with every
// expert here; under expert parallelism what the group's ranks may send them, ranks x N x
// min(k, local experts) (a token sends at most that many of its rows to one rank), N the most
// tokens a rank routes (peer_tokens); with a capacity, at most E x the capacity (of peer_tokens):
// each rank sends each expert only the rows within it.
int64_t moe_expert_rows(const MoeShape& s);

// Expert parallelism's group (parallel/ makes it from a communicator): the ranks that hold a
// layer's experts between them, each routing its own tokens and sending each routed row to the
// rank of its expert, which sends the expert's output back.
class ExpertGroup {
 public:
  virtual ~ExpertGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Every rank's `counts` (host; the same length on every rank), laid end to end in rank order.
  virtual std::vector<int32_t> all_gather(const std::vector<int32_t>& counts) = 0;
  // in's pieces to each rank and out's from each (float32 in the backend's memory; counts in
  // elements), as Communicator::all_to_all_v passes them.
  virtual void all_to_all_v(Backend& be, const Tensor& in, const std::vector<int64_t>& send,
                            const Tensor& out, const std::vector<int64_t>& receive) = 0;
};

// The routed pairs past the experts' capacity (0 where dropless), from the forward's counts.
int64_t moe_dropped(const MoeShape& s, const std::vector<int32_t>& counts);
// Switch's capacity for N tokens: ceil(factor x N k / E) rows per expert (0 for factor 0).
int64_t moe_capacity(double factor, int64_t tokens, int64_t top_k, int64_t experts);

// Weights (or their gradients, laid out alike), out_in: router [E, C]; gate_up [E, 2F, C], each
// expert's gate then up rows (transformers 5's packed gate_up_proj); down [E, C, F]. The shared
// expert's: shared_gate_up [2S, C] (gate_proj then up_proj), shared_down [C, S], shared_gate
// [1, C].
// A LoRA of the experts' fused gate_up or down weights (PEFT's target_parameters): expert e's
// A [r, in] is rows [e r, (e + 1) r) of a [E r, in] (PEFT's lora_A as it is), its B [out, r]
// rows [e out, (e + 1) out) of b [E out, r] (PEFT's lora_B [out, r E] holds B_e's column k at
// k E + e); the products' y = x W_e^T + scale x A_e^T B_e^T. u [R, r] (each routed row's
// scale x A_e^T, kept for backward) and v [R, r] (scratch) are the weights' alone; a gradient's
// a and b are empty where nothing is trained.
struct MoeLora {
  Tensor a, b, u, v;
  float scale = 0;
  int64_t r = 0;
  bool on() const { return r > 0; }
};

struct MoeWeights {
  Tensor router, gate_up, down;
  Tensor shared_gate_up, shared_down, shared_gate;
  MoeLora gate_up_lora, down_lora;
};

// What the forward keeps for the backward, float32 unless named: probs [N, E], weights [N, k],
// experts and positions [N, k] (int32), counts [E] (int32), rows [R, C] (the rows this rank's
// experts compute: the tokens as routed, or as the group sent them; R = moe_expert_rows), gate_up
// [R, 2F], act [R, F], out [N k, C] (each expert's output per routed row); the shared
// expert's gate logit and scale [N, 1], gate_up [N, 2S], act [N, S] and out [N, C]; with the
// router z-loss, z [N] (Backend::moe_z_stats').
struct MoeSaved {
  Tensor probs, weights, experts, positions, counts, rows, gate_up, act, out;
  Tensor shared_logit, shared_scale, shared_gate_up, shared_act, shared_out;
  Tensor z;
};

// The router z-loss's arguments (MoeShape::z_loss): the forward's token mask (int32 [N]; empty:
// every token) and where it writes the sum of z^2 ([1]); the backward's scale (the gradient of
// scale x that sum is added to the router logits').
struct MoeZLoss {
  Tensor mask, sum;
  float scale = 0.0f;
};

// The backward's temporaries: logits [N, E] (the forward's too), d_out [N k, C], dweights [N, k],
// d_act [R, F], d_gate_up [R, 2F], d_rows [R, C]; the shared expert's d_out [N, C], d_scale
// [N, 1], d_act [N, S], d_gate_up [N, 2S]. Under expert parallelism, expert_out [R, C]: the
// experts' outputs before they go back (the forward's) and their gradients as they arrive; with a
// capacity too, sent [N k, C]: the rows within it packed, as sent and as they come back.
struct MoeScratch {
  Tensor logits, d_out, dweights, d_act, d_gate_up, d_rows, expert_out, sent;
  Tensor d_shared_out, d_shared_scale, d_shared_act, d_shared_gate_up;
};

// Declares MoeSaved's and MoeScratch's tensors (the shared expert's only where there is one):
// declare(tensor, name, dtype, shape) for each, named "saved.<field>" and "scratch.<field>";
// experts, positions and counts are int32, the rest float32.
using MoeDeclare = std::function<void(Tensor*, const std::string&, DType, Shape)>;
void declare_moe_saved(const MoeShape& s, MoeSaved& saved, const MoeDeclare& declare);
void declare_moe_scratch(const MoeShape& s, MoeScratch& scratch, const MoeDeclare& declare);

// The first `tokens` tokens' part of buffers declared for more (counts whole), for a forward over
// fewer tokens.
MoeSaved moe_saved_rows(const MoeSaved& saved, int64_t tokens, int64_t top_k);

// y [N, C] = the layer's output for x [N, C]; `counts` receives each expert's routed rows (read
// back to the host: the products need them) and, under expert parallelism (`group`, of
// s.expert_ranks ranks), after those E the rows each rank of the group sent each of this rank's
// experts (rank after rank). `adapters`: LoRAs on the router's and the shared expert's products
// (ProductSite::router, shared_fc, shared_out, shared_gate), added to their float32 outputs.
void moe_forward(Backend& be, const MoeShape& s, const MoeWeights& w, const Tensor& x,
                 const MoeSaved& saved, const MoeScratch& scratch, const Tensor& y,
                 std::vector<int32_t>& counts, const MoeZLoss& z = {}, ExpertGroup* group = nullptr,
                 const LayerAdapters& adapters = {});

// From dy [N, C]: dx [N, C] written, the weights' gradients g written (or added to where
// accumulate_dw), with `counts` and `group` as the forward had them: under expert parallelism
// this rank's experts' gradients over the rows of every rank of the group. dprobs [N, E], unless
// empty, is added to the router probabilities' gradient (the load-balancing loss's).
void moe_backward(Backend& be, const MoeShape& s, const MoeWeights& w, const MoeWeights& g,
                  const Tensor& x, const MoeSaved& saved, const MoeScratch& scratch,
                  const std::vector<int32_t>& counts, const Tensor& dy, const Tensor& dprobs,
                  const Tensor& dx, bool accumulate_dw, const MoeZLoss& z = {},
                  ExpertGroup* group = nullptr, const LayerAdapters& adapters = {});

// For benchmarks (bench/moe_cpu.cpp): `hook(phase)` is called after each phase of moe_forward and
// moe_backward ran: "router" (the router's product and the routing; backward: theirs), "dispatch"
// (the rows grouped by expert and gathered; backward: the rows' gradients summed per token),
// "experts" (their products and activation), "combine", "shared" (the shared expert). Empty: none.
void set_moe_phase_hook(std::function<void(const char* phase)> hook);

// transformers' load-balancing loss (load_balancing_loss_func) over a micro-batch's L sparse
// layers, from each layer's Backend::moe_balance_stats ([2, E], read back) and the count of
// unmasked tokens: loss = E * sum_e F_e P_e, with F_e the pairs routed to expert e and P_e the sum
// of its probabilities, each over L * tokens. scale[e] = coef * E * F_e / (L * tokens) is the
// gradient of coef * loss by a layer's probability of e for an unmasked token
// (moe_balance_backward spreads it).
struct MoeBalanceLoss {
  double loss = 0;
  std::vector<float> scale;
};
MoeBalanceLoss moe_balance_loss(const std::vector<std::vector<float>>& stats, int64_t experts,
                                int64_t tokens, double coef);

}  // namespace brisk
