// The precision policy of a training run. In fp32 nothing changes. With bf16 or fp16 the
// optimizer updates float32 master weights (category master_weights) and the model computes with
// weights rounded to the 16-bit type after every update; fp16 also scales the loss dynamically.
// That compute copy stays in a float32 container holding 16-bit values; the saved activations
// are 16-bit for real (see Model::plan). bf16 keeps no compute copy where the device allows it and
// it holds less (float32_weights; train/assembly.cpp decides): the model computes with the float32
// weights themselves, as autocast does: the matrix products round their operands to bf16 (the CPU's
// as they pack them, a GPU's from a bf16 copy of the weights made once per optimizer step,
// Backend::hold_weights), every other op reads the float32 weights, and the optimizer updates them
// as in fp32 (no master copy, 4 bytes a parameter less).
#pragma once

#include "backend/backend.h"
#include "core/memory_plan.h"
#include "core/parameters.h"
#include "precision/loss_scaler.h"

namespace brisk {

class MixedPrecision {
 public:
  // master_weights false (bf16 only): no fp32 master copy; the optimizer updates the bf16
  // weights (in their float32 container) and refresh_weights rounds them stochastically.
  // float32_weights: see above; bf16 with master weights only.
  explicit MixedPrecision(DType compute, bool master_weights = true, LossScalerOptions scaler = {},
                          bool float32_weights = false)
      : compute_(compute),
        master_weights_(master_weights),
        float32_weights_(float32_weights),
        scaler_(scaler) {
    BRISK_CHECK(master_weights || compute == DType::bf16,
                "--bf16_master_weights false applies to --bf16 training only");
    BRISK_CHECK(!float32_weights || (compute == DType::bf16 && master_weights),
                "internal error: float32 weights apply to bf16 with master weights only");
  }
  // Whether a bf16 run computes with float32 weights: where the device's products round their
  // operands themselves (DeviceTraits::products_round_operands or bf16_weights_copy: both the
  // CPU and a GPU) no compute copy is needed.
  static bool float32_weights_on(bool products_round, DType compute, bool master_weights) {
    return products_round && compute == DType::bf16 && master_weights;
  }
  // Inference in the 16-bit type (fp16_full_eval, bf16_full_eval): the weights rounded once, no
  // master copy; never updated.
  struct NoMaster {};
  static constexpr NoMaster kNoMaster{};
  MixedPrecision(DType compute, NoMaster)
      : compute_(compute), master_weights_(false), float32_weights_(false) {}

  // offload_optimizer: the master copy in host memory (before plan), where the optimizer updates
  // it on the CPU; every precision then has one, fp32 too, and refresh_weights uploads it to the
  // compute weights. Needs master weights (not bf16 without them).
  void offload_master();

  DType compute_dtype() const { return compute_; }
  bool enabled() const { return compute_ != DType::f32; }
  bool uses_loss_scaling() const { return compute_ == DType::f16; }
  bool has_master() const {
    return offload_ || (enabled() && master_weights_ && !float32_weights_);
  }
  // bf16 with no compute copy: the weights are float32, updated as in fp32.
  bool float32_weights() const { return float32_weights_; }

  // `shard`: the master copy holds only these elements of the parameters (a ZeRO partition's
  // run, or the trained parameters' where the others are frozen); by default all of them.
  void plan(MemoryPlan& plan, BufferBinder& binder, int64_t num_params,
            ElementRange shard = {0, -1});
  // Whether the master copy holds only a run of the parameters (partitioned, with a master
  // copy).
  bool sharded_master() const { return has_master() && shard_.count >= 0; }
  // Weights kept in shards: the compute weights this rank keeps are `shard`, its run of them (the
  // plan's run), not the model's buffer, which holds gathered blocks in turn. Without a master copy
  // the optimizer updates it.
  void use_weight_shard(const Tensor& shard);
  // Whether master() holds only this rank's run of the parameters (a sharded master copy, or
  // the weight shard of stage 3).
  bool sharded() const { return sharded_master() || !weight_shard_.empty(); }
  // The parameters' elements the master copy holds.
  ElementRange master_elements(const ParameterSet& params) const {
    return sharded_master() ? shard_ : ElementRange{0, params.total_elements()};
  }
  // Takes the model's freshly initialized or loaded weights as the master copy (its run of
  // them) and rounds the model's compute weights.
  void adopt_model_weights(Backend& be, const ParameterSet& params);
  // The float32 weights the optimizer updates and checkpoints save: master_elements() of them.
  const Tensor& master(const ParameterSet& params) const {
    return has_master() ? master_ : compute_weights(params);
  }
  // The float32 weights one process's optimizer steps (not partitioned): the master copy, or
  // the compute weights' run that `shard` gave plan (the trained parameters', where some are
  // frozen), all of them by default.
  Tensor stepped(const ParameterSet& params) const {
    if (has_master()) return master_;
    if (shard_.count < 0) return compute_weights(params);
    return element_range(compute_weights(params), shard_.offset, shard_.count);
  }
  // After an optimizer step: compute weights = master rounded to the 16-bit type (the master's
  // run of them; offloaded: uploaded, then rounded where they hold 16-bit values), or without a
  // master copy the updated weights rounded stochastically to bf16 with the RNG at `key` (with
  // float32 weights: nothing).
  void refresh_weights(Backend& be, const ParameterSet& params, const RngKey& key);

  double loss_scale() const { return uses_loss_scaling() ? scaler_.scale() : 1.0; }
  DynamicLossScaler& scaler() { return scaler_; }

 private:
  DType compute_;
  bool master_weights_;
  bool float32_weights_;
  bool offload_ = false;
  DynamicLossScaler scaler_;
  Tensor master_;
  ElementRange shard_{0, -1};  // count -1: the whole parameters
  Tensor weight_shard_;        // weights kept in shards
  // The compute weights this rank keeps: all of them, or the weight shard.
  const Tensor& compute_weights(const ParameterSet& params) const {
    return weight_shard_.empty() ? params.flat_weights() : weight_shard_;
  }
  // The compute weights of the master's elements.
  Tensor compute_run(const ParameterSet& params) const;
};

}  // namespace brisk
