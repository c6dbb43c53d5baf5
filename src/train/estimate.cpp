// What `brisk estimate` computes (train/estimate.h): the planned rank's run, the layout's
// reports and the fit. Printing is estimate_print.cpp's.
#include "train/estimate.h"

#include <algorithm>
#include <string>

#include "core/checked.h"
#include "core/error.h"
#include "core/json_file.h"
#include "core/process_memory.h"
#include "models/moe_layer.h"
#include "optim/optimizer.h"
#include "precision/mixed_precision.h"

namespace brisk {

RuleOfThumb guides_rule(const TrainOptions& o) {
  const std::string& opt = o.optim;
  const double optimizer = opt == "adamw_torch" || opt == "adamw_torch_fused" ? 8
                           : opt == "adamw_8bit" || opt == "adamw_bnb_8bit"   ? 2
                           : opt == "sgd"                                     ? 4
                                                                              : -1;
  return {o.fp16 || o.bf16 ? 6.0 : 4.0, 4.0, optimizer};
}

size_t bytes_under(const MemoryPlan& plan, const std::string& prefix) {
  size_t total = 0;
  for (const auto& b : plan.buffers())
    if (b.name.rfind(prefix, 0) == 0) total += b.bytes;
  return total;
}

std::string precision_of(const TrainOptions& o) {
  return o.bf16 ? "bf16" : o.fp16 ? "fp16" : o.tf32 ? "tf32" : "fp32";
}

namespace {

// The options an estimate plans: DeepSpeed's config applied for `world` ranks, synthetic data
// holding at least one batch per rank (so that planning many ranks needs no --dataset_size; the
// plan holds 8 bytes per sample of it).
ResolvedRun estimate_run(const TrainOptions& given, const EstimateArgs& args) {
  BRISK_CHECK(args.world_size >= 1 && args.world_size <= (1 << 20),
              "--world_size must lie in [1, 1048576], got ", args.world_size);
  ResolvedRun r = resolve_run(given, static_cast<int>(args.world_size));
  TrainOptions& o = r.options;
  o = resolve_checkpoint(o);
  if (o.dataset == "synthetic" && o.train_file.empty())
    o.dataset_size = std::max(
        o.dataset_size, checked_mul(o.per_device_train_batch_size, args.world_size, "a batch"));
  return r;
}

// Each category's bytes in the share of its elements the routed experts hold (the optimizer's by
// its state's elements, state_elements).
ExpertShare expert_share(const RunAssembly& r) {
  ExpertShare s;
  const auto planned = r.plan.bytes_by_category();
  int64_t all = 0;
  double state_all = 0, state_experts = 0;
  const size_t states = r.optimizer->state().size();
  for (const ParamInfo& p : r.model->params().list()) {
    all += p.shape.numel();
    double state = 0;
    for (size_t i = 0; i < states; ++i)
      state += static_cast<double>(r.optimizer->state_elements(i, p));
    state_all += state;
    if (!p.expert) continue;
    s.parameters += p.shape.numel();
    state_experts += state;
  }
  if (s.parameters == 0) return s;
  const double share = static_cast<double>(s.parameters) / static_cast<double>(all);
  for (const Category c : {Category::weights, Category::gradients, Category::master_weights})
    s.bytes[static_cast<int>(c)] =
        static_cast<size_t>(static_cast<double>(planned[static_cast<int>(c)]) * share + 0.5);
  const int state = static_cast<int>(Category::optimizer_state);
  if (state_all > 0)
    s.bytes[state] =
        static_cast<size_t>(static_cast<double>(planned[state]) * state_experts / state_all + 0.5);
  return s;
}

// The inputs of rank_shares (parallel/rank_shares.h) from the planned rank's run, over the
// `world` replicas that share ZeRO's partitions.
RankSharesInput rank_shares_input(const TrainOptions& o, const RunAssembly& run, int world) {
  RankSharesInput in;
  in.world = world;
  in.planned = run.plan.bytes_by_category();
  in.host_gradient_bytes =
      run.parallel.offload
          ? run.plan.bytes_by_category(Placement::host)[static_cast<int>(Category::gradients)]
          : 0;
  in.params = run.model->params().total_elements();
  in.trained = run.model->params().trained_run().elements.count;
  in.shards = run.parallel.shards;
  // (A frozen base's blocks partitioned under stage 3: each rank holds about rank 0's share.)
  in.sharded_weights =
      !run.parallel.shards.empty() && o.zero_stage >= 3 && run.parallel.base_shards.empty();
  in.sharded_gradients = !run.parallel.shards.empty() && o.zero_stage >= 2;
  // (A LoRA's master copy holds the trained parameters alone: partitioned only under ZeRO.)
  in.sharded_master = run.precision->sharded_master() && !run.parallel.shards.empty();
  in.offload = run.parallel.offload;
  if (run.parallel.shards.empty())  // every rank's optimizer as rank 0's
    in.optimizer_state.assign(
        static_cast<size_t>(world),
        static_cast<double>(in.planned[static_cast<int>(Category::optimizer_state)]));
  for (const ParamShard& shard : run.parallel.shards) {  // each rank's optimizer, planned alone
    MemoryPlan scratch;
    BufferBinder binder;
    make_optimizer(optimizer_config(o))
        ->plan(scratch, binder, shard_params(run.model->params(), shard));
    in.optimizer_state.push_back(static_cast<double>(
        scratch.bytes_by_category()[static_cast<int>(Category::optimizer_state)]));
  }
  return in;
}

// A LoRA run: its adapters, the parameters trained (weights float32, and their gradients,
// master and optimizer state: the plan's categories) and the frozen base: its block linears in
// the store (4-bit codes and state, or 16 bits) per parameter, the blocks' other parameters kept
// float32 there, and the weight buffer (staged: two blocks' slots, the embeddings, the head and
// the adapters).
nlohmann::json adapter_report(const RunAssembly& run) {
  const ParameterSet& ps = run.model->params();
  const int64_t trained = ps.trained_run().elements.count, total = ps.total_elements();
  const auto by = run.plan.bytes_by_category();
  auto of = [&](Category c) { return by[static_cast<int>(c)]; };
  nlohmann::json j = {{"r", run.adapter->r},
                      {"target_modules", run.adapter->target_modules},
                      {"modules_to_save", run.adapter->modules_to_save},
                      {"trained_parameters", trained},
                      {"frozen_parameters", total - trained},
                      {"tensor_ranks", run.model->config().tensor_ranks},
                      {"trained_weights_bytes", trained * 4},
                      {"gradients_bytes", of(Category::gradients)},
                      {"master_weights_bytes", of(Category::master_weights)},
                      {"optimizer_state_bytes", of(Category::optimizer_state)},
                      {"weight_buffer_bytes", bytes_under(run.plan, "params.weights")}};
  if (!run.quantized) return j;
  const TrainOptions& o = run.options;
  const bool four = o.load_in_4bit;
  const std::string prefix = four ? "qlora." : "frozen.";
  const size_t kept = bytes_under(run.plan, prefix + "kept");
  const size_t stored = bytes_under(run.plan, prefix) - kept;
  const int64_t n = run.quantized->quantized_elements();
  j["store"] = {{"type", four ? o.bnb_4bit_quant_type : precision_of(o)},
                {"nested", four && o.use_bnb_nested_quant},
                {"parameters", n},
                {"bytes", stored},
                {"bytes_per_parameter", n > 0 ? static_cast<double>(stored) / n : 0.0},
                {"kept_float32_bytes", kept},
                {"dequantized_bytes", bytes_under(run.plan, "backend.dequantized_weight")}};
  return j;
}

// What a tensor rank holds and what it sums per step (tensor_step_bytes).
nlohmann::json tensor_parallel_report(const ParallelLayout& layout, const RunAssembly& run) {
  const double tokens = tensor_token_bytes(run);
  return {{"ranks", layout.degree(MeshDim::tensor)},
          {"vocabulary_rows_per_rank", run.model->vocab_rows()},
          {"sequence_parallel", tokens > 0},
          {"sums_bytes_per_step", tensor_step_bytes(run)},
          {"gathered_and_scattered_bytes_per_step", tokens}};
}

// What a sequence rank holds and what its all-to-alls pass per step (sequence_exchange_bytes).
nlohmann::json sequence_parallel_report(const ParallelLayout& layout, const RunAssembly& run) {
  const int n = layout.degree(MeshDim::sequence);
  return {{"ranks", n},
          {"tokens_per_rank", run.options.seq_len / n},
          {"all_to_all_bytes_per_step", sequence_step_bytes(run)}};
}

// The plan is expert rank 0's (its share of the experts); each rank's experts may receive up to
// ranks x N x min(k, E / ranks) rows per sparse layer and micro-batch (N the planned
// micro-batch's tokens), the bound their buffers are planned for.
nlohmann::json expert_parallel_report(const ParallelLayout& layout, const RunAssembly& run) {
  const ModelConfig& c = run.model->config();
  const int64_t ranks = layout.degree(MeshDim::expert);
  int64_t held = 0;
  for (const ParamInfo& p : run.model->params().list())
    if (p.expert) held += p.shape.numel();
  const BatchShape planned = run.model->planned_shape();
  MoeShape s{planned.batch * planned.seq, c.hidden_size, c.moe.inner, c.moe.experts, c.moe.top_k};
  s.expert_ranks = ranks;
  s.capacity = moe_capacity(c.moe.capacity_factor, s.tokens, c.moe.top_k, c.moe.experts);
  const int64_t rows = moe_expert_rows(s);
  const int64_t per_token = std::min(c.moe.top_k, c.moe.local_experts());
  const std::string why = rows < ranks * s.tokens * per_token
                              ? "each rank sends each of the " + std::to_string(c.moe.experts) +
                                    " experts at most its capacity, " + std::to_string(s.capacity) +
                                    " rows"
                              : std::to_string(ranks) + " ranks x " + std::to_string(s.tokens) +
                                    " tokens x " + std::to_string(per_token);
  return {{"ranks", ranks},
          {"experts_per_rank", c.moe.local_experts()},
          {"expert_parameters_per_rank", held},
          {"receive_rows_bound", rows},
          {"receive_rows_bound_reason", why}};
}

// A pipeline stage's plan (stages differ: the first holds the embeddings, the last the head,
// those between the inputs of their micro-batches in flight), and what each stage boundary
// passes per step: every micro-batch's [B, T, C] float32 activations forward and their
// gradients back. `peak_bytes`: what the stage's process holds of its plan on `device`.
nlohmann::json stage_report(const TrainOptions& o, Device device, int s, const RunAssembly& r) {
  const ModelConfig& c = r.model->config();
  const size_t planned = r.plan.total_bytes();
  return {
      {"stage", s},
      {"first_layer", c.first_layer()},
      {"end_layer", c.end_layer()},
      {"parameters", r.model->params().total_elements()},
      {"planned_total_bytes", planned},
      {"peak_bytes", device == Device::cuda ? r.plan.total_bytes(Placement::device) : planned},
      {"activations_bytes", r.plan.bytes_by_category()[static_cast<int>(Category::activations)]},
      {"boundary_bytes",
       checked_mul(checked_mul(o.gradient_accumulation_steps, o.per_device_train_batch_size,
                               "a step's rows"),
                   checked_mul(r.model->planned_tokens(), c.hidden_size * 4, "a row's bytes"),
                   "a step's activations")}};
}

// The stage whose process holds the most: the one a machine must be sized for.
int largest_stage(const nlohmann::json& stages) {
  int largest = 0;
  for (const nlohmann::json& s : stages)
    if (s["peak_bytes"].get<size_t>() > stages[largest]["peak_bytes"].get<size_t>())
      largest = s["stage"].get<int>();
  return largest;
}

std::vector<std::string> split_list(const std::string& text, const std::string& fallback) {
  std::vector<std::string> out;
  std::string item;
  for (char ch : (text.empty() ? fallback : text) + ",") {
    if (ch != ',') {
      item += ch;
    } else if (!item.empty()) {
      out.push_back(item);
      item.clear();
    }
  }
  return out;
}

// --fit: the configurations that fit the budget, fastest predicted first.
void plan_fit(Estimate& e, const EstimateArgs& args) {
  const TrainOptions& o = e.options;
  const FitChoices choices{split_list(args.precisions, precision_of(o)),
                           split_list(args.optims, o.optim),
                           split_list(args.methods, method_of(o))};
  e.fits = fit_search(o, e.device, e.budget, choices, &e.rejected, e.layout.world());
  const int64_t global = global_batch(o, e.layout.world());
  const bool can_offload = e.device == Device::cuda && o.offload_optimizer == "none";
  const bool frozen_base =
      std::find(choices.methods.begin(), choices.methods.end(), "qlora") != choices.methods.end();
  BRISK_CHECK(!e.fits.empty(), "no configuration of global batch ", global, " fits ",
              format_mib(e.budget.budget), " (", e.budget.source, ", ", e.rejected,
              " tried); allow more precisions or optimizers, ",
              frozen_base ? "" : "LoRA or QLoRA (--fit_methods full,lora,qlora), ",
              can_offload ? "a smaller batch, or the optimizer in host memory "
                            "(--offload_optimizer cpu)"
                          : "or a smaller batch");
}

}  // namespace

Estimate plan_estimate(const TrainOptions& given, const EstimateArgs& args) {
  Estimate e;
  ResolvedRun resolved = estimate_run(given, args);
  e.options = std::move(resolved.options);
  const TrainOptions& o = e.options;
  // An explicit device is planned whether or not it is present; auto picks as train would.
  e.device = resolved.device;
  e.layout = resolved.layout;
  // The plan is a tensor rank's (every tensor rank's is alike), a sequence rank's (each holds as
  // many tokens), expert rank 0's, and with pipeline stages the largest stage's.
  // Each stage planned once, on the same data; the largest stage's run kept.
  for (int stage = 0; stage < e.layout.degree(MeshDim::pipeline); ++stage) {
    std::unique_ptr<RunAssembly> r = assemble_run(o, e.device, nullptr, GivenData(args.tokenized),
                                                  e.layout, e.layout.first_rank_of_stage(stage));
    if (e.layout.on(MeshDim::pipeline)) e.stages.push_back(stage_report(o, e.device, stage, *r));
    if (!e.run || largest_stage(e.stages) == stage) {
      e.run = std::move(r);
      e.planned_stage = stage;
    }
  }
  const RunAssembly& run = *e.run;
  if (e.layout.on(MeshDim::tensor)) e.tensor_parallel = tensor_parallel_report(e.layout, run);
  if (e.layout.on(MeshDim::sequence)) e.sequence_parallel = sequence_parallel_report(e.layout, run);
  if (e.layout.on(MeshDim::expert)) e.expert_parallel = expert_parallel_report(e.layout, run);
  // The ranks that share ZeRO's partitions: under expert parallelism, those holding the same
  // experts.
  if (e.layout.replicas() > 1) {
    e.rank_input = rank_shares_input(o, run, e.layout.replicas());
    e.rank_shares = rank_shares(e.rank_input);
  }
  e.experts = expert_share(run);
  if (run.adapter) e.adapters = adapter_report(run);
  e.host_base = current_rss_bytes();
  if (args.fit || !o.max_memory.empty()) {
    e.budget = memory_budget(o, e.device, nullptr);
    e.needed = needed_bytes(run.plan, e.budget);
  }
  if (args.fit) plan_fit(e, args);
  return e;
}

}  // namespace brisk
