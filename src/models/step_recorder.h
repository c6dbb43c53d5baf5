// A micro-batch's forward and backward recorded once and replayed (Backend::record: a CUDA graph),
// so that the host launches one graph where it launched a kernel per op, and the GPU runs them
// back to back. What the host decides per micro-batch is its signature (Model::step_signature):
// a signature's first micro-batch runs as usual (it finds the products' algorithms, builds the
// attention's graphs), its second is recorded, the later ones replay that recording. The dropout
// keys' micro-step and the loss's gradient scale (the loss scale over the batch's targets), the
// arguments that change under a signature, are read from memory (PlanOptions::held_step,
// RngKey::step_offset, GradScale::held), uploaded with the batch.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "models/model.h"

namespace brisk {

class StepRecorder {
 public:
  // Recordings kept (dynamic padding records one per length seen twice), and signatures
  // remembered; past them micro-batches run as usual.
  static constexpr size_t kMostRecordings = 32, kMostSignatures = 256;

  StepRecorder(Backend& be, Model& model);
  // Whether a run may record: the backend records, the model computes alone (Model::
  // computes_alone) with its held step planned.
  static bool possible(const Backend& be, const Model& model);

  // Model::forward_step then Model::backward (reporting no segments) of the batch the model
  // holds, run, recorded or replayed.
  void run(const StepOptions& options);
  // Model::forward_step alone (an evaluation's batch), the same way.
  void forward(const StepOptions& options);

  struct Counts {
    int64_t ran = 0, recorded = 0, replayed = 0;
  };
  const Counts& counts() const { return counts_; }

 private:
  void through(const StepOptions& options, bool backward);
  struct Entry {
    bool seen = false;
    std::unique_ptr<RecordedWork> work;
  };
  Backend& be_;
  Model& model_;
  std::map<std::vector<int64_t>, Entry> entries_;
  std::vector<int64_t> signature_;  // the current pass's, reused
  size_t recordings_ = 0;
  Counts counts_;
};

}  // namespace brisk
