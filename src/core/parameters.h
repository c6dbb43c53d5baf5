// The parameters of a model: names exactly as transformers' state-dict names, shapes, whether
// weight decay applies, and their place in one flat buffer (weights and gradients alike), so that
// optimizers and checkpoint code see one contiguous span.
#pragma once

#include <algorithm>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/tensor.h"

namespace brisk {

// What a parameter is to the code around the model, declared by the model that owns it.
struct ParamRole {
  bool decay = true;       // takes weight decay (false for biases and LayerNorm parameters)
  bool embedding = false;  // an embedding table (nn.Embedding in transformers)
  bool product = false;    // an operand of a matrix product (linear weights, a tied LM head)
  bool expert = false;     // a routed expert's weight (a mixture of experts)
};
inline constexpr ParamRole kLinearWeight{true, false, true};
inline constexpr ParamRole kExpertWeight{true, false, true, true};
inline constexpr ParamRole kBiasOrNorm{false, false, false};
inline constexpr ParamRole kEmbedding{true, true, false};
inline constexpr ParamRole kTiedEmbedding{true, true, true};  // also the LM head's weight

// Tensor parallelism: a parameter that is one rank's slice of a whole one. The whole is cut along
// dimension `dim` into `pieces` equal parts (the query, key and value of one packed matrix are
// three), and each part into `ranks` equal slices; this rank holds slice `rank` of every part,
// laid end to end. dim < 0: the parameter is whole on every rank (replicated). `full` > 0 (one
// part only): the whole's extent along dim, which the slices exceed together (a vocabulary the
// ranks do not divide): the places of a slice past it are padding, no element of the whole.
// `copies` > 1: each slice is held alike by that many tensor ranks in a row (key/value heads
// fewer than the ranks): tensor rank r holds slice r / copies (`rank`), and `ranks` counts the
// slices (1: every tensor rank holds the whole, which split() does not call split).
struct ParamSplit {
  int dim = -1;
  int pieces = 1;
  int rank = 0, ranks = 1;
  int64_t full = 0;
  int copies = 1;
  // Whole on every rank (dim < 0), but each rank's gradient is only its tokens' part (a block's
  // norm under Megatron's sequence parallelism): the group sums them.
  bool partial = false;
  bool split() const { return dim >= 0 && ranks > 1; }
};

struct ParamInfo {
  std::string name;
  Shape shape;
  bool decay = true;       // false for biases and LayerNorm parameters
  int64_t offset = 0;      // in elements, within the flat buffer
  bool embedding = false;  // an embedding table (nn.Embedding in transformers)
  bool product = false;    // an operand of a matrix product
  // A piece of a parameter (a rank's partition of it, parallel/zero.h): the whole parameter's
  // elements;
  // 0 for a whole parameter.
  int64_t whole_elements = 0;
  int64_t whole_numel() const { return whole_elements > 0 ? whole_elements : shape.numel(); }
  ParamSplit split;  // tensor parallelism: this rank's slice of the full parameter
  // Its place among the whole model's parameters, where a pipeline stage holds only some: what
  // its initial values are drawn from (-1: its place in this set).
  int stream = -1;
  bool expert = false;  // a routed expert's weight (ParamRole::expert)
  // Not trained (a LoRA's base): no gradient, no optimizer state (ParameterSet::freeze).
  bool frozen = false;
  // The full parameter's shape (shape itself unless split).
  Shape full_shape() const;
};

// Tensor parallelism: the elements [first, first + n) of p (a split parameter, or a whole one) as
// runs that lie together in the full parameter too: run(local, full, length) for each, local and
// full being element offsets within p and within the full parameter, in order.
template <typename Run>
void for_each_split_run(const ParamInfo& p, int64_t first, int64_t n, Run run);

class ParameterSet {
 public:
  // `whole_elements`: for a piece of a parameter, the whole one's elements (ParamInfo); `split`:
  // tensor parallelism's slice (shape is the slice's).
  int add(std::string name, Shape shape, ParamRole role, int64_t whole_elements = 0,
          ParamSplit split = {});
  int64_t total_elements() const { return total_; }
  // Freezes parameter i (before bind): it gets no gradient; the gradient buffer then holds the
  // trained parameters only, in their order (trained_offsets), and a frozen one's grad() is empty.
  void freeze(int i);
  bool frozen() const { return trainable_ != total_; }
  int64_t trainable_elements() const { return trainable_; }
  // Each parameter's place in a gradient buffer of the trained ones (-1: frozen).
  std::vector<int64_t> trained_offsets() const;
  // The trained parameters as one run of the list, [first, last), and of the flat buffer
  // (every parameter when none is frozen). Fails where frozen ones lie between trained ones:
  // whoever freezes keeps the trained together (Model::add_adapters declares them last).
  struct Run {
    int first = 0, last = 0;
    ElementRange elements;
  };
  Run trained_run() const;
  // The element of the parameters a gradient buffer's first element is: 0, or where some are
  // frozen the trained run's first (its gradients lie in its order from there).
  int64_t gradient_origin() const { return frozen() ? trained_run().elements.offset : 0; }
  // Parameter i's ParamInfo::stream.
  void set_stream(int i, int stream) { params_.at(static_cast<size_t>(i)).stream = stream; }
  const std::vector<ParamInfo>& list() const { return params_; }
  int find(const std::string& name) const;   // -1 when absent
  int index(const std::string& name) const;  // throws when absent

  // Points the set at flat float32 buffers of total_elements() values laid out as the
  // parameters or, when offsets (one per parameter) are given, each parameter at its own offset
  // there: staged gradients let the blocks' gradients share the slots of one or two blocks
  // (PlanOptions::gradient_slots), staged weights their weights (PlanOptions::weight_slots).
  void bind(const Tensor& flat_weights, const Tensor& flat_grads,
            std::vector<int64_t> weight_offsets = {}, std::vector<int64_t> grad_offsets = {});
  void unbind() { weights_ = grads_ = Tensor(); }
  // The buffers bound; staged (offsets given), they do not hold every parameter at once.
  const Tensor& flat_weights() const { return weights_; }
  const Tensor& flat_grads() const { return grads_; }
  // Parameters the weight buffer does not hold (bound at offset -1: kept elsewhere, QLoRA's
  // 4-bit linears): one alone is seen at `landing`, where its values are written in turn to be
  // kept; a span of them is empty.
  void set_landing(const Tensor& landing) { landing_ = landing; }
  Tensor weight(int i) const { return view(weights_, i, i); }
  Tensor grad(int i) const { return view(grads_, i, i, {}, true); }
  // Parameters first..last laid end to end, seen as one tensor of `shape` (e.g. BERT's query,
  // key and value weights as one [3C, C] matrix).
  Tensor weight_span(int first, int last, Shape shape) const;
  Tensor grad_span(int first, int last, Shape shape) const;

 private:
  Tensor view(const Tensor& flat, int first, int last, Shape shape = {}, bool grads = false) const;
  std::vector<ParamInfo> params_;
  std::unordered_map<std::string, int> by_name_;  // name -> index: declaring stays linear
  int64_t total_ = 0, trainable_ = 0;
  Tensor weights_, grads_, landing_;
  // Empty: laid out as the parameters.
  std::vector<int64_t> weight_offsets_, grad_offsets_;
};

// A split parameter's geometry: along its dimension, `extent` elements (the slice's), `piece`
// per part, each element of the dimension `inner` elements apart; `full` along it in the whole,
// of which the slice holds the first `held` of each part (the rest padding).
struct SplitGeometry {
  int64_t extent, piece, inner, full, held;
};
SplitGeometry split_geometry(const ParamInfo& p);

template <typename Run>
void for_each_split_run(const ParamInfo& p, int64_t first, int64_t n, Run run) {
  if (!p.split.split()) {
    if (n > 0) run(first, first, n);
    return;
  }
  const SplitGeometry g = split_geometry(p);
  const int64_t full_piece = g.piece * p.split.ranks;  // a part's elements along dim, full
  const int64_t row = g.extent * g.inner;              // one index of the dims before `dim`
  for (int64_t at = first; at < first + n;) {
    const int64_t outer = at / row, in_row = at % row;
    const int64_t k = in_row / g.inner, part = k / g.piece, offset = k % g.piece;
    const int64_t within = in_row % g.inner;
    if (offset >= g.held) {  // padding to the end of this part's slice: no place in the full
      at += std::min((g.piece - offset) * g.inner - within, first + n - at);
      continue;
    }
    // Elements to the end of this part's slice along dim (they lie together in the full too).
    const int64_t left = (g.held - offset) * g.inner - within;
    const int64_t length = std::min(left, first + n - at);
    const int64_t full_k = part * full_piece + p.split.rank * g.piece + offset;
    run(at, (outer * g.full + full_k) * g.inner + within, length);
    at += length;
  }
}

}  // namespace brisk
