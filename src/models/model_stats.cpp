// A model's step statistics (the summed loss and the gradients' sum of squares on the device),
// its constants' upload, and the decoding hooks an architecture may override.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "backend/device_traits.h"
#include "core/checked.h"
#include "models/model.h"

namespace brisk {

void Model::upload_constants(Backend& be) const {
  if (constants_uploaded_) return;
  for (const auto& [host, device] : planned_constants_) be.upload(host, device);
  constants_uploaded_ = true;
}

void Model::reset_step_stats(Backend& be) {
  std::fill(stats_host_.as<double>(), stats_host_.as<double>() + kStatsSize, 0.0);
  be.upload(stats_host_, stats_);
}

void Model::add_to_loss(Backend& be, double value) {
  be.download(stats_, stats_host_);
  stats_host_.as<double>()[kStatLoss] += value;
  be.upload(stats_host_, stats_);
}

std::array<double, 2> Model::read_step_stats(Backend& be) {
  be.download(stats_, stats_host_);
  const double* p = stats_host_.as<double>();
  return {p[kStatLoss], p[kStatGradSumSq]};
}

void Model::embed_at(Backend&, const Tensor&, int64_t, const Tensor&) const {
  BRISK_FAIL("a ", class_name(), " does not generate text: it is not a causal language model");
}

void Model::next_token_logits(Backend&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                              const Tensor&) const {
  BRISK_FAIL("a ", class_name(), " does not generate text: it is not a causal language model");
}

}  // namespace brisk
