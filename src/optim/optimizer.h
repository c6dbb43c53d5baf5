// The optimizers brisk offers under --optim (transformers' names), behind one interface that the
// trainer, checkpoints and `brisk estimate` use: state declared in the memory plan, one update
// over the flat parameter and gradient buffers (a backend op reading the step decision from
// device memory), and named state for checkpoints.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "core/memory_plan.h"
#include "core/parameters.h"

namespace brisk {

// What an optimizer is built from: --optim, --optim_args ("key=value,key=value") and the
// TrainingArguments it shares with AdamW.
struct OptimizerConfig {
  std::string name = "adamw_torch";
  std::string args;
  double beta1 = 0.9, beta2 = 0.999, epsilon = 1e-8;  // adam_beta1, adam_beta2, adam_epsilon
  double weight_decay = 0;                            // on the parameters that take it
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // The canonical name (aliases resolved): adamw_torch, adafactor, adamw_8bit or sgd.
  virtual std::string name() const = 0;
  // Where ZeRO's ranks may split parameter p: only at multiples of this many elements from its
  // start (p's elements or more: only at its ends). 1 where each element's state and update
  // depend on that element alone (AdamW, SGD); a block for 8-bit AdamW's quantized moments;
  // whole parameters for Adafactor's per-matrix statistics (the default).
  virtual int64_t shard_granule(const ParamInfo& p) const { return p.whole_numel(); }
  // Where plan puts the state and tables (before plan): host memory for an optimizer that steps
  // on the CPU while the model runs on a GPU (offload_optimizer; update and reset are then given
  // the CPU's backend).
  void keep_state_in(Placement placement) { placement_ = placement; }
  // Declares the state (category optimizer_state) and the optimizer's tables.
  virtual void plan(MemoryPlan& plan, BufferBinder& binder, const ParameterSet& params) = 0;
  // Zero state, step 0, tables filled (after the arena is bound).
  virtual void reset(Backend& be) = 0;
  // Updates `weights` (the flat float32 weights the optimizer owns: the model's, or the fp32
  // master copy) from control[kControlMultiplier] * `grads`, unless control[kControlSkip] is set
  // (core/step_control.h). Counts the step either way; a skipped step is taken back with
  // undo_step once the host knows of it. `lr` is the scheduled learning rate.
  void step(Backend& be, const Tensor& weights, const Tensor& grads, const Tensor& control,
            float lr) {
    ++step_;
    update(be, weights, grads, control, lr);
  }
  void undo_step() { --step_; }
  int64_t steps() const { return step_; }
  void set_steps(int64_t steps) { step_ = steps; }
  // The state a checkpoint saves and restores bit for bit, by name (tables that reset rebuilds
  // are not part of it).
  virtual std::vector<std::pair<std::string, Tensor>> state() const = 0;
  // The elements of state tensor i (in state()'s order) that whole parameter p's state takes:
  // plan lays each tensor out parameter after parameter, in order, so these place any set of
  // whole parameters' state (a pipeline stage's among the whole model's). p's elements where the
  // state is one value per element (the default).
  virtual int64_t state_elements(size_t /*i*/, const ParamInfo& p) const { return p.shape.numel(); }
  // Tensor parallelism: whether state tensor i holds, for p (a tensor rank's share of a split
  // parameter), one value per element of the share (the default), or the full parameter's whole
  // state, alike on every tensor rank (as state_elements counts it).
  virtual bool state_per_element(size_t /*i*/, const ParamInfo& /*p*/) const { return true; }
  // Tensor parallelism, for an optimizer whose state is not one value per element: whether it
  // steps a tensor rank's share of a split parameter as the whole would be stepped, summing its
  // whole-parameter statistics over the group (join_split_group), on backend `be`.
  virtual bool steps_split_parameters(const Backend& /*be*/) const { return false; }
  // The group holding the other shares of this rank's split parameters: a float64 buffer's sum
  // over it, and this rank's place in it. Before the first step.
  struct SplitGroup {
    std::function<void(const Tensor&)> sum;  // float64
    std::function<void(const Tensor&)> max;  // float32, each element the largest of the group's
    int rank = 0;
  };
  virtual void join_split_group(const SplitGroup& /*group*/) {}
  // Where element `element` of whole parameter p (an element a partition may start p's piece
  // at: shard_granule's multiples) starts its state in tensor i, from where p's starts.
  virtual int64_t state_offset(size_t /*i*/, const ParamInfo& /*p*/, int64_t element) const {
    return element;
  }

 protected:
  virtual void update(Backend& be, const Tensor& weights, const Tensor& grads,
                      const Tensor& control, float lr) = 0;
  int64_t step_ = 0;
  Placement placement_ = Placement::device;
};

// The optimizer --optim names; refuses an unknown name (listing the valid ones), unknown or
// malformed optim_args and contradicting settings, each with one message.
std::unique_ptr<Optimizer> make_optimizer(const OptimizerConfig& config);
// The name an --optim value stands for (adamw_torch_fused -> adamw_torch,
// adamw_bnb_8bit -> adamw_8bit); throws on an unknown name.
std::string canonical_optimizer_name(const std::string& name);
inline constexpr const char* kOptimizerNames =
    "adamw_torch, adamw_torch_fused, adafactor, adamw_8bit, adamw_bnb_8bit, sgd";

// --optim_args as "key=value" pairs separated by commas; each optimizer takes the keys it knows
// and `finish` refuses the rest.
class OptimArgs {
 public:
  OptimArgs(const std::string& text, std::string optimizer);
  double number(const std::string& key, double fallback);
  bool flag(const std::string& key, bool fallback);
  // Throws naming the first key no one took.
  void finish() const;

 private:
  std::string optimizer_;
  std::map<std::string, std::string> values_;
};

// Helpers for the implementations.
// Maximal runs of consecutive parameters that take weight decay, as [begin, end) pairs.
std::vector<int64_t> decay_ranges(const ParameterSet& params);
// One slot per parameter (offset, size, matrix view, decay); state and blocks left for the
// optimizer to fill.
std::vector<ParamSlot> param_slots(const ParameterSet& params);
// Tensor parallelism: slot `index` (s, of parameter p, a tensor rank's share of a split
// parameter), marked a share, as AdafactorUpdate::split describes it: the whole row and column of
// each of its rows and columns (padding -1); counted and sums_at left for the optimizer.
SplitSlot split_slot(const ParamInfo& p, ParamSlot& s, size_t index);
// Declares the decay table as an int64 [R,2] buffer and fills it in reset (fill_decay_ranges).
void declare_decay_ranges(MemoryPlan& plan, BufferBinder& binder, const ParameterSet& params,
                          Tensor* view, const std::string& name, Placement placement);
void fill_decay_ranges(Backend& be, const ParameterSet& params, const Tensor& table);

// 8-bit AdamW's state layout: slots with eight_bit[i] get 8-bit codes from `state` and absmax
// blocks from `blocks` (block_counts[i] of them: a split parameter's whole ones; null: the
// slot's); the others float32 moments from `state` (blocks = -1). Returns the sizes.
struct QuantizedStateSizes {
  int64_t values8 = 0, blocks = 0, values32 = 0;
};
QuantizedStateSizes place_8bit_state(std::vector<ParamSlot>& slots,
                                     const std::vector<bool>& eight_bit,
                                     const std::vector<int64_t>* block_counts = nullptr);

std::unique_ptr<Optimizer> make_sgd(const OptimizerConfig& config, OptimArgs& args);
std::unique_ptr<Optimizer> make_adafactor(const OptimizerConfig& config, OptimArgs& args);
std::unique_ptr<Optimizer> make_adamw_8bit(const OptimizerConfig& config, OptimArgs& args);

}  // namespace brisk
