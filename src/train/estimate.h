// `brisk estimate` and the Python API's estimate_memory: the run the options describe, planned on
// its device (cuda needs no GPU) for the largest rank of its layout, with what each layer of the
// layout adds (the data-parallel ranks' model states beside the ZeRO paper's formula, the tensor,
// sequence and expert ranks' exchanges, each pipeline stage's plan) and, with --fit, the
// configurations that fit the memory budget. plan_estimate computes it all; print_estimate
// prints it and estimate_json gives what --output_json writes.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "parallel/rank_shares.h"
#include "train/assembly.h"
#include "train/fit.h"

namespace brisk {

struct EstimateArgs {
  std::string json_path;   // also write the plan (and the fit) as JSON here
  bool fit = false;        // rank the configurations that fit max_memory
  std::string precisions;  // comma-separated, for --fit; empty: the run's own
  std::string optims;      // comma-separated, for --fit; empty: the run's own
  std::string methods;     // comma-separated full, lora, qlora, for --fit; empty: the run's own
  std::string html_path;   // draw the plan (or the fit's candidates) into this HTML file
  int64_t world_size = 1;  // plan the largest rank of a run of this many processes
  const TokenizedInput* tokenized = nullptr;  // rows tokenized before the run (the Python API)
};

// A mixture of experts: the routed experts' parameters and their part of the planned weights,
// gradients, master weights and optimizer state.
struct ExpertShare {
  int64_t parameters = 0;
  std::array<size_t, kNumCategories> bytes{};
};

struct Estimate {
  TrainOptions options;  // resolved for the world's ranks
  Device device = kHostDevice;
  ParallelLayout layout;
  std::unique_ptr<RunAssembly> run;  // the planned rank's: the first of the largest stage
  // Pipeline stages: each stage's plan (stage, first_layer, end_layer, parameters,
  // planned_total_bytes, peak_bytes, activations_bytes, boundary_bytes); empty without.
  nlohmann::json stages = nlohmann::json::array();
  int planned_stage = 0;
  // What the tensor, sequence and expert ranks hold and exchange (empty objects without them).
  nlohmann::json tensor_parallel = nlohmann::json::object();
  nlohmann::json sequence_parallel = nlohmann::json::object();
  nlohmann::json expert_parallel = nlohmann::json::object();
  // LoRA: the adapters and what they train, and the frozen base's bytes (empty without).
  nlohmann::json adapters = nlohmann::json::object();
  // The data-parallel replicas' model states, rank by rank, where there are several
  // (layout.replicas() > 1).
  RankSharesInput rank_input;
  RankShares rank_shares;
  ExpertShare experts;
  size_t host_base = 0;  // the host's baseline: the program and its libraries, measured
  // --fit (or --max_memory): the budget, and what the planned run needs of it.
  MemoryBudget budget;
  size_t needed = 0;
  // --fit: the configurations that fit (fastest predicted first), those that do not.
  std::vector<FitCandidate> fits;
  int rejected = 0;
};

Estimate plan_estimate(const TrainOptions& given, const EstimateArgs& args);
void print_estimate(const Estimate& e);
nlohmann::json estimate_json(const Estimate& e);
// --output_json and --html, where asked for.
void write_estimate_files(const Estimate& e, const EstimateArgs& args);

// The Hugging Face guides' rules of thumb, bytes per parameter: weights 4 (fp32) or 6 (mixed
// precision: an fp32 and a 16-bit copy), gradients 4, optimizer state 8 (AdamW), 2 (8-bit AdamW),
// 4 (SGD); -1 where the guides give none (Adafactor).
struct RuleOfThumb {
  double weights, gradients, optimizer;
};
RuleOfThumb guides_rule(const TrainOptions& o);
// Bytes of the plan's buffers whose names start with `prefix`.
size_t bytes_under(const MemoryPlan& plan, const std::string& prefix);
// The plan's bytes laid over others, counted in two categories above it (a line of the plan's
// table; nothing when none).
void print_overlaid(size_t overlaid);
// "bf16", "fp16", "tf32" or "fp32".
std::string precision_of(const TrainOptions& o);

}  // namespace brisk
