// Master weights and their compute copies.
#include "precision/mixed_precision.h"

namespace brisk {

void MixedPrecision::plan(MemoryPlan& plan, BufferBinder& binder, int64_t num_params,
                          ElementRange shard) {
  BRISK_CHECK(shard.count < 0 || (shard.offset >= 0 && shard.offset + shard.count <= num_params),
              "internal error: a master shard outside the parameters");
  shard_ = shard;
  if (has_master())
    binder.declare(plan, &master_, shard.count >= 0 ? "master.weights_shard" : "master.weights",
                   Category::master_weights, DType::f32,
                   Shape{shard.count >= 0 ? shard.count : num_params},
                   offload_ ? Placement::host : Placement::device);
}

void MixedPrecision::offload_master() {
  BRISK_CHECK(master_weights_,
              "offload_optimizer needs the float32 master copy (leave "
              "--bf16_master_weights on)");
  offload_ = true;
}

void MixedPrecision::use_weight_shard(const Tensor& shard) {
  BRISK_CHECK(shard_.count >= 0 && shard.numel() == shard_.count,
              "internal error: a weight shard of ", shard.numel(), " elements for a run of ",
              shard_.count);
  BRISK_CHECK(has_master() || compute_ == DType::f32 || float32_weights_,
              "internal error: bf16 weights kept in shards need the float32 master copy "
              "(validate_options refuses the run)");
  weight_shard_ = shard;
}

Tensor MixedPrecision::compute_run(const ParameterSet& params) const {
  if (!weight_shard_.empty()) return weight_shard_;
  const ElementRange e = master_elements(params);
  return element_range(params.flat_weights(), e.offset, e.count);
}

void MixedPrecision::adopt_model_weights(Backend& be, const ParameterSet& params) {
  if (has_master()) {
    if (offload_)
      be.download(compute_run(params), master_);
    else
      be.copy(compute_run(params), master_);
  }
  if (enabled() && !float32_weights_) be.round_to(compute_, compute_weights(params));
}

void MixedPrecision::refresh_weights(Backend& be, const ParameterSet& params, const RngKey& key) {
  if (offload_) {
    const Tensor run = compute_run(params);
    be.upload(master_, run);
    if (enabled() && !float32_weights_) be.round_to(compute_, run);
  } else if (has_master()) {
    be.round_to(compute_, master_, compute_run(params));
  } else if (enabled() && !float32_weights_) {
    be.stochastic_round(compute_, compute_weights(params), key);
  }
}

}  // namespace brisk
