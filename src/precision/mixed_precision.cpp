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
                   Shape{shard.count >= 0 ? shard.count : num_params});
}

void MixedPrecision::adopt_model_weights(Backend& be, const ParameterSet& params) {
  if (!enabled()) return;
  if (has_master()) {
    const ElementRange e = master_elements(params);
    be.copy(element_range(params.flat_weights(), e.offset, e.count), master_);
  }
  be.round_to(compute_, params.flat_weights());
}

void MixedPrecision::refresh_weights(Backend& be, const ParameterSet& params, const RngKey& key) {
  if (has_master()) {
    const ElementRange e = master_elements(params);
    be.round_to(compute_, master_, element_range(params.flat_weights(), e.offset, e.count));
  } else if (enabled()) {
    be.stochastic_round(compute_, params.flat_weights(), key);
  }
}

}  // namespace brisk
