#include "models/step_recorder.h"

#include <cstring>

#include "core/error.h"

namespace brisk {

StepRecorder::StepRecorder(Backend& be, Model& model) : be_(be), model_(model) {
  BRISK_CHECK(possible(be, model), "internal error: a step recorder where none can record");
}

bool StepRecorder::possible(const Backend& be, const Model& model) {
  return be.records_work() && model.computes_alone() && !model.held_step().second.empty();
}

void StepRecorder::run(const StepOptions& options) {
  through(options, true);
}

void StepRecorder::forward(const StepOptions& options) {
  through(options, false);
}

void StepRecorder::through(const StepOptions& given, bool backward) {
  model_.load_step(be_);
  // The key's step and the loss's gradient scale from memory, the same for every micro-batch of
  // a signature.
  const auto [host, device] = model_.held_step();
  const float scale = applied(given.loss_grad_scale);
  BRISK_CHECK(given.loss_grad_scale.held == nullptr, "internal error: a held scale held again");
  std::memcpy(host.data(), &given.rng.step, sizeof given.rng.step);
  std::memcpy(host.as<uint64_t>() + 1, &scale, sizeof scale);
  be_.upload(host, device);
  StepOptions o = given;
  o.rng.step = 0;
  o.rng.step_offset = static_cast<const uint64_t*>(device.data());
  o.loss_grad_scale.value = 1;
  o.loss_grad_scale.held = reinterpret_cast<const float*>(device.as<uint64_t>() + 1);
  auto compute = [this, o, backward] {
    model_.forward_compute(be_, o);
    if (backward) model_.backward(be_, o);
  };
  model_.step_signature(be_, o, signature_);
  signature_.push_back(backward);
  auto it = entries_.find(signature_);
  if (it == entries_.end() && entries_.size() < kMostSignatures)
    it = entries_.emplace(signature_, Entry()).first;
  Entry* e = it == entries_.end() ? nullptr : &it->second;
  const bool records = e && !e->work && e->seen && recordings_ < kMostRecordings;
  if (!e || (!e->work && !records)) {  // first seen, or past the limits: as usual
    if (e) e->seen = true;
    ++counts_.ran;
    compute();
    return;
  }
  if (records) {
    e->work = be_.record(compute);
    BRISK_CHECK(e->work != nullptr, "internal error: the backend recorded nothing");
    ++recordings_;
    ++counts_.recorded;
  } else {
    ++counts_.replayed;
  }
  e->work->run();
}

}  // namespace brisk
