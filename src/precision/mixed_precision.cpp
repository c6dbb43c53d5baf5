// Master weights and their compute copies.
#include "precision/mixed_precision.h"

namespace brisk {

void MixedPrecision::plan(MemoryPlan& plan, BufferBinder& binder, int64_t num_params) {
  if (has_master())
    binder.declare(plan, &master_, "master.weights", Category::master_weights, DType::f32,
                   Shape{num_params});
}

void MixedPrecision::adopt_model_weights(Backend& be, const ParameterSet& params) {
  if (!enabled()) return;
  if (has_master()) be.copy(params.flat_weights(), master_);
  be.round_to(compute_, params.flat_weights());
}

void MixedPrecision::refresh_weights(Backend& be, const ParameterSet& params, const RngKey& key) {
  if (has_master())
    be.round_to(compute_, master_, params.flat_weights());
  else if (enabled())
    be.stochastic_round(compute_, params.flat_weights(), key);
}

}  // namespace brisk
