// The parameters of a model: names exactly as transformers' state-dict names, shapes, whether
// weight decay applies, and their place in one flat buffer (weights and gradients alike), so that
// optimizers and checkpoint code see one contiguous span.
#pragma once

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
};
inline constexpr ParamRole kLinearWeight{true, false, true};
inline constexpr ParamRole kBiasOrNorm{false, false, false};
inline constexpr ParamRole kEmbedding{true, true, false};
inline constexpr ParamRole kTiedEmbedding{true, true, true};  // also the LM head's weight

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
};

class ParameterSet {
 public:
  // `whole_elements`: for a piece of a parameter, the whole one's elements (ParamInfo).
  int add(std::string name, Shape shape, ParamRole role, int64_t whole_elements = 0);
  int64_t total_elements() const { return total_; }
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
  int64_t total_ = 0;
  Tensor weights_, grads_;
  // Empty: laid out as the parameters.
  std::vector<int64_t> weight_offsets_, grad_offsets_;
};

}  // namespace brisk
