// brisk subcommands: train, forward-backward, estimate.
#include "cli/commands.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <optional>
#include <vector>

#include "backend/backend.h"
#include "core/checked.h"
#include "core/clock.h"
#include "core/input_file.h"
#include "core/json_file.h"
#include "core/process_memory.h"
#include "core/safetensors.h"
#include "models/batch.h"
#include "models/model.h"
#include "models/moe_layer.h"
#include "optim/optimizer.h"
#include "parallel/communicator.h"
#include "parallel/mesh.h"
#include "parallel/rank_shares.h"
#include "parallel/sequence_parallel.h"
#include "precision/mixed_precision.h"
#include "report/memory_html.h"
#include "tokenizer/tokenizer.h"
#include "train/assembly.h"
#include "train/deepspeed.h"
#include "train/fit.h"
#include "train/options.h"

namespace brisk::cli {

namespace {
// The plan's bytes laid over others, counted in two categories above it.
void print_overlaid(size_t overlaid) {
  if (overlaid > 0)
    std::printf("  %-16s %12s   (gradients over consumed activations: counted twice above)\n",
                "overlaid", format_mib(overlaid).c_str());
}

void print_plan(const std::array<size_t, kNumCategories>& planned, size_t overlaid, size_t total) {
  for (int c = 0; c < kNumCategories; ++c)
    std::printf("  %-16s %12s\n", category_name(static_cast<Category>(c)),
                format_mib(planned[c]).c_str());
  print_overlaid(overlaid);
  std::printf("  %-16s %12s\n", "total (planned)", format_mib(total).c_str());
}
}  // namespace

std::string find_options_file(int argc, char** argv) {
  const std::string flag = "--options_file";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == flag && i + 1 < argc) return argv[i + 1];
    if (a.rfind(flag + "=", 0) == 0) return a.substr(flag.size() + 1);
  }
  return "";
}

namespace {
// A value as Trainer's log_metrics prints it: numbers rounded to 4 decimals.
std::string metric_text(const nlohmann::json& v) {
  if (!v.is_number_float()) return v.dump();
  char text[64];
  std::snprintf(text, sizeof text, "%.4f", v.get<double>());
  std::string t = text;
  while (t.size() > 1 && t.back() == '0' && t[t.size() - 2] != '.') t.pop_back();
  return t;
}

// "***** eval metrics *****" and its sorted "key = value" lines, as Trainer.log_metrics.
void print_metrics(const char* split, const nlohmann::json& metrics) {
  if (!metrics.is_object() || metrics.empty()) return;
  std::printf("***** %s metrics *****\n", split);
  for (const auto& [key, value] : metrics.items())  // nlohmann's objects iterate sorted
    std::printf("  %-26s = %s\n", key.c_str(), metric_text(value).c_str());
}
}  // namespace

int run_train(const TrainOptions& options) {
  TrainSummary s =
      train(options, [](const nlohmann::json& log) { std::cout << log.dump() << std::endl; });
  if (launch_info_from_env().rank != 0) return 0;  // rank 0 reports for a run of several
  if (options.do_train) print_metrics("train", train_metrics_json(s));
  print_metrics("eval", s.eval_metrics);
  print_metrics("predict", s.predict_metrics);
  std::printf("***** memory anatomy *****\n");
  print_plan(s.memory.planned, s.memory.overlaid, s.memory.arena_bytes);
  std::printf("  %-16s %12s\n", "process peak", format_mib(s.memory.peak_rss).c_str());
  std::printf("  %-16s %12s\n", "  before arena", format_mib(s.memory.rss_before_arena).c_str());
  std::printf("  %-16s %12s\n", "  during steps", format_mib(s.memory.peak_rss_steps).c_str());
  if (s.memory.peak_rss_saves > 0)
    std::printf("  %-16s %12s\n", "  during saves", format_mib(s.memory.peak_rss_saves).c_str());
  if (s.memory.device_memory_used >= 0) {
    std::printf("  %-16s %12s\n", "GPU memory occupied",
                format_mib(static_cast<size_t>(s.memory.device_memory_used)).c_str());
    std::printf("  %-16s %12s\n", "  before arena",
                format_mib(static_cast<size_t>(s.memory.device_memory_before_arena)).c_str());
  }
  if (!s.auto_fit.empty()) std::printf("%s\n", s.auto_fit.c_str());
  if (!s.last_checkpoint.empty()) std::printf("saved %s\n", s.last_checkpoint.c_str());
  return 0;
}

int run_forward_backward(const ForwardBackwardArgs& a) {
  ModelConfig config = resolve_config(a.config);
  auto model = Model::create(config);
  auto be = make_cpu_backend();
  SafetensorsFile batch_file(a.batch);
  MemoryPlan plan;
  const BatchShape shape = batch_shape_of(batch_file);
  PlanOptions options;
  options.logits_rows = shape.batch * shape.seq;  // written out whole, every row's
  options.labelled_rows_only = false;
  model->plan(plan, shape, options);
  plan.finalize();
  Arena arena(plan, Device::cpu);
  model->bind(arena);
  if (a.weights.empty())
    model->init_weights(*be, a.seed);
  else
    model->load_weights(*be, WeightFiles(a.weights));
  load_batch(batch_file, *model, *be);

  StepOptions so;
  so.training = a.dropout;
  so.rng = RngKey{a.seed, a.step, 0};
  const int64_t targets = model->count_targets();
  BRISK_CHECK(targets > 0, "the batch has no labels to compute a loss from");
  // A first pass keeps the logits (the training pass overwrites them with their gradient).
  so.compute_grad = false;
  model->forward(*be, so);
  std::vector<float> logits(model->logits().f32(), model->logits().f32() + model->logits().numel());
  so.compute_grad = true;
  so.first_micro_batch = true;
  so.loss_grad_scale = 1.0f / static_cast<float>(targets);
  model->zero_grads(*be);
  float loss = static_cast<float>(model->forward(*be, so) / targets);
  model->backward(*be, so);
  std::printf("{\"loss\": %.8g, \"targets\": %lld}\n", loss, static_cast<long long>(targets));

  if (!a.output.empty()) {
    std::vector<std::pair<std::string, Tensor>> out;
    out.emplace_back("loss", Tensor(&loss, Shape{}, DType::f32));
    out.emplace_back("logits", Tensor(logits.data(), model->logits().shape(), DType::f32));
    const ParameterSet& ps = model->params();
    for (size_t i = 0; i < ps.list().size(); ++i)
      out.emplace_back("grad." + ps.list()[i].name, ps.grad(static_cast<int>(i)));
    write_safetensors(a.output, out);
  }
  return 0;
}

namespace {
// The Hugging Face guides' rules of thumb, bytes per parameter: weights 4 (fp32) or 6 (mixed
// precision: an fp32 and a 16-bit copy), gradients 4, optimizer state 8 (AdamW), 2 (8-bit AdamW),
// 4 (SGD); -1 where the guides give none (Adafactor).
struct RuleOfThumb {
  double weights, gradients, optimizer;
};
RuleOfThumb guides_rule(const TrainOptions& o) {
  const std::string& opt = o.optim;
  const double optimizer = opt == "adamw_torch" || opt == "adamw_torch_fused" ? 8
                           : opt == "adamw_8bit" || opt == "adamw_bnb_8bit"   ? 2
                           : opt == "sgd"                                     ? 4
                                                                              : -1;
  return {o.fp16 || o.bf16 ? 6.0 : 4.0, 4.0, optimizer};
}

// Bytes of the buffers whose names start with `prefix`.
size_t bytes_under(const MemoryPlan& plan, const std::string& prefix) {
  size_t total = 0;
  for (const auto& b : plan.buffers())
    if (b.name.rfind(prefix, 0) == 0) total += b.bytes;
  return total;
}
}  // namespace

namespace {
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

std::string precision_of(const TrainOptions& o) {
  return o.bf16 ? "bf16" : o.fp16 ? "fp16" : o.tf32 ? "tf32" : "fp32";
}

// brisk estimate --fit: the configurations that fit, fastest predicted first.
std::vector<FitCandidate> print_fit(const TrainOptions& o, Device device, const EstimateArgs& args,
                                    nlohmann::json& out) {
  const MemoryBudget budget = memory_budget(o, device, nullptr);
  int rejected = 0;
  const int world = static_cast<int>(args.world_size);
  const std::vector<FitCandidate> fits =
      fit_search(o, device, budget, split_list(args.precisions, precision_of(o)),
                 split_list(args.optims, o.optim), &rejected, world);
  const int64_t global = global_batch(o, world);
  std::printf(
      "fit: global batch %lld%s within %s per rank (%s): %zu configurations fit, %d do not\n",
      static_cast<long long>(global),
      world > 1 ? (" over " + std::to_string(world) + " ranks").c_str() : "",
      format_mib(budget.budget).c_str(), budget.source.c_str(), fits.size(), rejected);
  const bool can_offload = device == Device::cuda && o.offload_optimizer == "none";
  BRISK_CHECK(!fits.empty(), "no configuration of global batch ", global, " fits ",
              format_mib(budget.budget), "; allow more precisions or optimizers, ",
              can_offload ? "a smaller batch, or the optimizer in host memory "
                            "(--offload_optimizer cpu)"
                          : "or a smaller batch");
  std::printf("  %-4s %-22s %-13s %-13s %-9s %-18s %12s %14s\n", "rank", "layout", "batch x accum",
              "recompute", "precision", "optim", "needs", "predicted/step");
  for (size_t i = 0; i < fits.size(); ++i) {
    const TrainOptions& t = fits[i].options;
    const std::string shape = std::to_string(t.per_device_train_batch_size) + " x " +
                              std::to_string(t.gradient_accumulation_steps);
    const ParallelLayout parallel = parallel_layout(t, world);
    const std::string layout = parallel.str();
    if (i < 10)
      std::printf("  %-4zu %-22s %-13s %-13s %-9s %-18s %12s %11.1f ms\n", i + 1, layout.c_str(),
                  shape.c_str(),
                  t.gradient_checkpointing ? "full"
                  : t.selective_recompute  ? "selective"
                                           : "none",
                  precision_of(t).c_str(), t.optim.c_str(), format_mib(fits[i].needed).c_str(),
                  fits[i].step_seconds * 1e3);
    out.push_back({{"tp_size", parallel.degree(MeshDim::tensor)},
                   {"pp_size", parallel.degree(MeshDim::pipeline)},
                   {"sp_size", parallel.degree(MeshDim::sequence)},
                   {"data_ranks", fits[i].data_ranks},
                   {"zero_stage", t.zero_stage},
                   {"per_device_train_batch_size", t.per_device_train_batch_size},
                   {"gradient_accumulation_steps", t.gradient_accumulation_steps},
                   {"gradient_checkpointing", t.gradient_checkpointing},
                   {"selective_recompute", t.selective_recompute},
                   {"precision", precision_of(t)},
                   {"optim", t.optim},
                   {"needed_bytes", fits[i].needed},
                   {"predicted_step_seconds", fits[i].step_seconds}});
  }
  if (fits.size() > 10) std::printf("  ... %zu more in --output_json\n", fits.size() - 10);
  return fits;
}
}  // namespace

namespace {
// estimate --world_size N: what each rank holds of the model states, next to the ZeRO paper's
// formula for the stage (Rajbhandari et al. 2020, mixed-precision Adam: 2 + 2 + K bytes per
// parameter with K = 12, the K part divided by N from stage 1 on, the gradients' 2 from stage 2,
// the weights' 2 from stage 3).
// The inputs of rank_shares from rank 0's assembled run.
RankSharesInput rank_shares_input(const TrainOptions& o, const RunAssembly& run, int world) {
  RankSharesInput in;
  in.world = world;
  in.planned = run.plan.bytes_by_category();
  in.host_gradient_bytes =
      run.parallel.offload
          ? run.plan.bytes_by_category(Placement::host)[static_cast<int>(Category::gradients)]
          : 0;
  in.params = run.model->params().total_elements();
  in.shards = run.parallel.shards;
  in.sharded_weights = !run.parallel.shards.empty() && o.zero_stage >= 3;
  in.sharded_gradients = !run.parallel.shards.empty() && o.zero_stage >= 2;
  in.sharded_master = run.precision->sharded_master();
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

// The ZeRO paper's bytes per parameter of mixed-precision Adam at this stage, beside brisk's.
void print_paper_formula(const TrainOptions& o, const RunAssembly& run, const RankSharesInput& in) {
  if (run.optimizer->name() != "adamw_torch") return;
  const int world = in.world;
  const double paper = (o.zero_stage >= 3 ? 2.0 / world : 2.0) +
                       (o.zero_stage >= 2 ? 2.0 / world : 2.0) +
                       (run.parallel.shards.empty() ? 12.0 : 12.0 / world);
  auto slots = [](int n, const char* what) {
    return n == 0 ? std::string(", ") + what + " staged whole"
                  : std::string(", ") + what + " staged in " +
                        (n == 2 ? "two blocks' slots" : "one block's slot") +
                        " or the embeddings' and head's, whichever holds more";
  };
  std::printf(
      "  ZeRO paper, mixed-precision Adam (2 + 2 + K, K = 12): %.2f bytes/param at this "
      "stage (brisk: float32 gradients%s, the 16-bit copy in float32 on the CPU%s)\n",
      paper, in.sharded_gradients ? slots(run.model->staged_slots(), "gradients").c_str() : "",
      in.sharded_weights ? slots(run.model->weight_slots(), "weights").c_str() : "");
}

// Each rank's model states (parallel/rank_shares.h), printed and as JSON.
nlohmann::json print_ranks(const TrainOptions& o, const RunAssembly& run, int world) {
  if (world == 1) return nlohmann::json::object();
  const RankSharesInput in = rank_shares_input(o, run, world);
  const RankShares shares = rank_shares(in);
  const double n = static_cast<double>(in.params);
  std::printf("data parallel over %d ranks, zero_stage %lld:\n", world,
              static_cast<long long>(o.zero_stage));
  std::printf("  %-6s %14s %14s %14s %14s %16s %22s\n", "rank", "parameters", "weights", "master",
              "gradients", "optimizer_state", "model states/param");
  nlohmann::json per_rank = nlohmann::json::array();
  for (const RankShare& r : shares.ranks) {
    per_rank.push_back({{"rank", r.rank},
                        {"parameters", r.params},
                        {"weight_bytes", r.weights},
                        {"master_bytes", r.master},
                        {"gradient_bytes", r.gradients},
                        {"optimizer_state_bytes", r.optimizer_state},
                        {"host_bytes", r.host}});
    if (r.rank < 8 || r.rank == world - 1)
      std::printf("  %-6d %14.0f %14s %14s %14s %16s %22.2f\n", r.rank, r.params,
                  format_mib(static_cast<size_t>(r.weights)).c_str(),
                  format_mib(static_cast<size_t>(r.master)).c_str(),
                  format_mib(static_cast<size_t>(r.gradients)).c_str(),
                  format_mib(static_cast<size_t>(r.optimizer_state)).c_str(), r.total() / n);
    else if (r.rank == 8)
      std::printf("  ...\n");
  }
  const std::string per_world = " / " + std::to_string(world);
  std::printf(
      "  model states per rank: weights %.2f%s + master %.2f%s + gradients %.2f%s + optimizer "
      "%.2f%s = %.2f bytes/param (largest rank: %.2f)\n",
      shares.weights_alike, in.sharded_weights ? (" + 4" + per_world).c_str() : "",
      in.sharded_master ? 4.0 : shares.master_alike, in.sharded_master ? per_world.c_str() : "",
      shares.gradients_alike,
      (std::string(in.sharded_gradients ? " + 4" + per_world : "") +
       (!in.offload         ? ""
        : in.shards.empty() ? " + 4 on the host"
                            : " + 4" + per_world + " on the host"))
          .c_str(),
      shares.optimizer, in.shards.empty() ? "" : per_world.c_str(), shares.model_states,
      shares.largest);
  if (in.offload)
    std::printf(
        "  offload_optimizer cpu: master, optimizer state and the gradients' host copy "
        "in host memory, %.2f bytes/param per rank; on the device %.2f\n",
        shares.host, shares.device);
  print_paper_formula(o, run, in);
  return {{"world_size", world},
          {"zero_stage", o.zero_stage},
          {"weight_bytes_per_param", shares.weights},
          {"master_bytes_per_param", shares.master},
          {"gradient_bytes_per_param", shares.gradients},
          {"optimizer_bytes_per_param", shares.optimizer},
          {"model_state_bytes_per_param", shares.model_states},
          {"host_model_state_bytes_per_param", shares.host},
          {"ranks", per_rank}};
}
}  // namespace

namespace {

// The options an estimate plans: DeepSpeed's config applied for `world` ranks, synthetic data
// holding at least one batch per rank (so that planning many ranks needs no --dataset_size; the
// plan holds 8 bytes per sample of it).
TrainOptions estimate_options(const TrainOptions& given, const EstimateArgs& args) {
  BRISK_CHECK(args.world_size >= 1 && args.world_size <= (1 << 20),
              "--world_size must lie in [1, 1048576], got ", args.world_size);
  TrainOptions o = resolve_checkpoint(resolve_options(given, static_cast<int>(args.world_size)));
  if (o.dataset == "synthetic" && o.train_file.empty())
    o.dataset_size = std::max(
        o.dataset_size, checked_mul(o.per_device_train_batch_size, args.world_size, "a batch"));
  return o;
}

// The run's first line: model, shape, precision, optimizer, device.
void print_estimate_header(const TrainOptions& o, const RunAssembly& r, Device device) {
  const int64_t n = r.model->params().total_elements(), active = r.model->active_parameters();
  const MixedPrecision& precision = *r.precision;
  const std::string active_note = active == n
                                      ? ""
                                      : " (" + std::to_string(active) + " active per token" +
                                            (o.ep_size > 1 ? " in the whole model)" : ")");
  std::printf("%s: %lld parameters%s%s, batch %lld x %lld%s%s%s, %s, on %s\n",
              o.model_name_or_path.c_str(), static_cast<long long>(n), active_note.c_str(),
              o.tp_size > 1   ? " on each tensor rank"
              : o.ep_size > 1 ? " on each expert rank"
                              : "",
              static_cast<long long>(r.model->planned_shape().batch),  // the eval batch's, ...
              static_cast<long long>(r.options.seq_len),  // a text file's max_seq_length, ...
              o.gradient_checkpointing ? ", gradient checkpointing"
              : o.selective_recompute  ? ", selective recomputation"
                                       : "",
              o.bf16   ? ", bf16"
              : o.fp16 ? ", fp16"
                       : ", fp32",
              precision.float32_weights()                      ? " with float32 weights"
              : precision.enabled() && !precision.has_master() ? " without master weights"
                                                               : "",
              o.do_train ? r.optimizer->name().c_str() : "evaluation only",
              device == Device::cuda ? "cuda" : "cpu");
}

// A mixture of experts: the routed experts' parameters and their part of the planned weights,
// gradients, master weights and optimizer state: each category's bytes in the share of its
// elements the experts hold (the optimizer's by its state's elements, state_elements).
struct ExpertShare {
  int64_t parameters = 0;
  std::array<size_t, kNumCategories> bytes{};
};
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

// The plan by category, with bytes per parameter beside the Hugging Face guides' rule of thumb.
void print_categories(const TrainOptions& o, const RunAssembly& r, Device device) {
  const MemoryPlan& plan = r.plan;
  const int64_t n = r.model->params().total_elements();
  const auto planned = plan.bytes_by_category();
  const RuleOfThumb rule = guides_rule(o);
  auto per_param = [&](size_t bytes) {
    return static_cast<double>(bytes) / static_cast<double>(n);
  };
  std::printf("  %-16s %12s   %s\n", "category", "planned", "bytes/param (rule of thumb)");
  for (int c = 0; c < kNumCategories; ++c) {
    const Category cat = static_cast<Category>(c);
    std::printf("  %-16s %12s", category_name(cat), format_mib(planned[c]).c_str());
    const double thumb = cat == Category::gradients         ? rule.gradients
                         : cat == Category::optimizer_state ? rule.optimizer
                                                            : -1;
    if (cat == Category::weights || cat == Category::gradients || cat == Category::optimizer_state)
      std::printf("   %.2f", per_param(planned[c]));
    if (thumb >= 0) std::printf(" (%.0f)", thumb);
    if (cat == Category::master_weights)
      std::printf("   weights + master: %.2f (%.0f)",
                  per_param(planned[c] + planned[static_cast<int>(Category::weights)]),
                  rule.weights);
    std::printf("\n");
  }
  print_overlaid(plan.overlaid_bytes());
  std::printf("  %-16s %12s\n", "total (planned)", format_mib(plan.total_bytes()).c_str());
  const ExpertShare experts = expert_share(r);
  if (experts.parameters > 0) {
    std::printf("  of which the routed experts' (%lld parameters, %.1f%%):",
                static_cast<long long>(experts.parameters),
                100.0 * static_cast<double>(experts.parameters) / static_cast<double>(n));
    const char* sep = " ";
    for (int c = 0; c < kNumCategories; ++c) {
      if (experts.bytes[c] == 0) continue;
      std::printf("%s%s %s", sep, category_name(static_cast<Category>(c)),
                  format_mib(experts.bytes[c]).c_str());
      sep = ", ";
    }
    std::printf("\n");
  }
  if (r.parallel.offload && device == Device::cuda) {
    const auto host = plan.bytes_by_category(Placement::host);
    std::printf(
        "  offload_optimizer cpu, in host memory: master_weights %s, optimizer_state %s, "
        "gradients (host copy) %s\n",
        format_mib(host[static_cast<int>(Category::master_weights)]).c_str(),
        format_mib(host[static_cast<int>(Category::optimizer_state)]).c_str(),
        format_mib(host[static_cast<int>(Category::gradients)]).c_str());
  }
}

// What lies outside the plan, and the total to expect; returns the host's baseline (now).
size_t print_fixed_overheads(const RunAssembly& r, Device device) {
  const MemoryPlan& plan = r.plan;
  std::printf("fixed overheads assumed (not in the plan):\n");
  const size_t host_base = current_rss_bytes();
  std::printf("  %-34s %12s\n", "host: program and libraries (now)", format_mib(host_base).c_str());
  if (device == Device::cuda) {
    std::printf("  %-34s %12s\n", "GPU: context, kernels, libraries",
                format_mib(kCudaContextBytes).c_str());
    std::printf("  %-34s %12s\n",
                r.parallel.offload ? "host: pinned, staging and optimizer"
                                   : "host: pinned staging (planned)",
                format_mib(plan.total_bytes(Placement::host)).c_str());
    std::printf("expect \"GPU memory occupied\" near %s\n",
                format_mib(plan.total_bytes(Placement::device) + kCudaContextBytes).c_str());
  } else {
    std::printf("expect a process peak near %s\n",
                format_mib(plan.total_bytes() + host_base).c_str());
  }
  return host_base;
}

// --html: the plan's bars (or the --fit candidates'), with the fixed overheads.
void write_estimate_html(const TrainOptions& o, const EstimateArgs& args, const MemoryPlan& plan,
                         Device device, size_t host_base, const std::vector<FitCandidate>& fits) {
  const auto planned = plan.bytes_by_category();
  const size_t fixed = device == Device::cuda ? kCudaContextBytes : static_cast<size_t>(host_base);
  const char* fixed_label =
      device == Device::cuda ? "GPU context, kernels, libraries" : "host: program and libraries";
  std::vector<MemoryBar> bars;
  if (fits.empty()) {
    bars.push_back({"as asked", planned, plan.overlaid_bytes(), fixed, fixed_label, {}});
  } else {
    for (size_t i = 0; i < fits.size() && i < 10; ++i) {
      const TrainOptions& t = fits[i].options;
      char shape[96];
      std::snprintf(shape, sizeof shape, "#%zu %lldx%lld %s\n", i + 1,
                    static_cast<long long>(t.per_device_train_batch_size),
                    static_cast<long long>(t.gradient_accumulation_steps), precision_of(t).c_str());
      std::string label = shape;
      label.append(t.optim);
      if (t.gradient_checkpointing) label.append(" ckpt");
      if (t.selective_recompute) label.append(" sel");
      bars.push_back({label, fits[i].planned, fits[i].overlaid, fixed, fixed_label, {}});
    }
  }
  write_memory_html(args.html_path, "brisk estimate: " + o.model_name_or_path,
                    std::string("planned bytes by category on ") +
                        (device == Device::cuda ? "cuda" : "cpu") +
                        (fits.empty() ? "" : "; --fit candidates, fastest predicted first"),
                    bars);
}

// The routed experts' bytes by category, those they have.
nlohmann::json expert_bytes_json(const ExpertShare& s) {
  nlohmann::json j = nlohmann::json::object();
  for (int c = 0; c < kNumCategories; ++c)
    if (s.bytes[c] > 0) j[category_name(static_cast<Category>(c))] = s.bytes[c];
  return j;
}

// --json: the plan, every buffer, the fit and the parallel layout's reports (`layout`: the
// data-parallel ranks, pipeline stages, tensor and sequence ranks, each under its key).
nlohmann::json estimate_json(const RunAssembly& run, Device device, size_t host_base,
                             const nlohmann::json& fit_json, const nlohmann::json& layout) {
  const MemoryPlan& plan = run.plan;
  const auto planned = plan.bytes_by_category();
  const int64_t n = run.model->params().total_elements();
  const ExpertShare experts = expert_share(run);
  const int64_t layers = run.config.num_layers;
  const size_t block = bytes_under(plan, "block.0.");
  nlohmann::json planned_json = nlohmann::json::object();
  for (int c = 0; c < kNumCategories; ++c)
    planned_json[category_name(static_cast<Category>(c))] = planned[c];
  // Every buffer of the plan, as declared: where each category's bytes go.
  nlohmann::json buffers_json = nlohmann::json::array();
  for (const BufferSpec& b : plan.buffers())
    buffers_json.push_back({{"name", b.name},
                            {"category", category_name(b.category)},
                            {"dtype", dtype_name(b.dtype)},
                            {"shape", b.shape.str()},
                            {"bytes", b.bytes},
                            {"placement", b.placement == Placement::host ? "host" : "device"}});
  nlohmann::json j = {{"device", device == Device::cuda ? "cuda" : "cpu"},
                      {"parameters", n},
                      {"active_parameters", run.model->active_parameters()},
                      {"expert_parameters", experts.parameters},
                      {"expert_bytes", expert_bytes_json(experts)},
                      {"memory",
                       {{"planned_bytes", planned_json},
                        {"planned_total_bytes", plan.total_bytes()},
                        {"overlaid_bytes", plan.overlaid_bytes()},
                        {"planned_device_bytes", plan.total_bytes(Placement::device)},
                        {"planned_host_bytes", plan.total_bytes(Placement::host)},
                        {"activations_per_block_bytes", block},
                        {"layers", layers},
                        {"host_baseline_bytes", host_base},
                        {"device_context_bytes", device == Device::cuda ? kCudaContextBytes : 0},
                        {"buffers", buffers_json}}},
                      {"fit", fit_json}};
  j.update(layout);
  return j;
}

void write_estimate_json(const std::string& json_path, const nlohmann::json& j) {
  std::ofstream out(json_path);
  BRISK_CHECK(out.good(), "cannot write '", json_path, "'");
  out << j.dump(2) << "\n";
  BRISK_CHECK(out.good(), "cannot write '", json_path, "'");
}

}  // namespace

namespace {
// What a tensor rank holds and what it sums per step (tensor_step_bytes), each rank sending
// 2 (t - 1) / t of a sum's bytes on a ring.
nlohmann::json print_tensor_parallel(const TrainOptions& o, const RunAssembly& run) {
  const auto t = static_cast<double>(o.tp_size);
  std::printf(
      "tensor parallel over %lld ranks: each holds 1/%lld of every block's attention "
      "heads and MLP width and of the vocabulary (the plan is each rank's)\n",
      static_cast<long long>(o.tp_size), static_cast<long long>(o.tp_size));
  const double bytes = tensor_step_bytes(run), tokens = tensor_token_bytes(run);
  if (tokens == 0)
    std::printf(
        "  sums over the tensor group per step: %s of activations and gradients (4 per "
        "block per micro-batch%s, and the embeddings' and the head's), each rank sending %s on a "
        "ring\n",
        format_mib(static_cast<size_t>(bytes)).c_str(),
        o.gradient_checkpointing ? " and the recomputed forwards'" : "",
        format_mib(static_cast<size_t>(bytes * 2 * (t - 1) / t)).c_str());
  else
    std::printf(
        "  sequence parallel between the split products: each rank holds 1/%lld of the tokens "
        "there; per step it gathers and reduce-scatters %s (each rank sending %s) and sums %s "
        "(the embeddings', the head's and the norms' gradients, each rank sending %s)\n",
        static_cast<long long>(o.tp_size), format_mib(static_cast<size_t>(tokens)).c_str(),
        format_mib(static_cast<size_t>(tokens * (t - 1) / t)).c_str(),
        format_mib(static_cast<size_t>(bytes)).c_str(),
        format_mib(static_cast<size_t>(bytes * 2 * (t - 1) / t)).c_str());
  return {{"ranks", o.tp_size},
          {"vocabulary_rows_per_rank", run.model->vocab_rows()},
          {"sequence_parallel", tokens > 0},
          {"sums_bytes_per_step", bytes},
          {"gathered_and_scattered_bytes_per_step", tokens}};
}
}  // namespace

namespace {
// What a sequence rank holds and what its all-to-alls pass per step (sequence_exchange_bytes).
nlohmann::json print_sequence_parallel(const TrainOptions& o, const RunAssembly& run) {
  const int n = static_cast<int>(o.sp_size);
  const ModelConfig& c = run.model->config();
  std::printf(
      "sequence parallel over %d ranks: each holds %lld of every sequence's %lld tokens, "
      "attention on all of them for %lld of %lld heads (the plan is each rank's)\n",
      n, static_cast<long long>(o.seq_len / n), static_cast<long long>(o.seq_len),
      static_cast<long long>(c.num_heads / n), static_cast<long long>(c.num_heads));
  const double bytes = sequence_step_bytes(run);
  std::printf(
      "  all-to-alls per step: %s through each rank's exchanges (qkv and attention output per "
      "block, forward and backward), each rank sending %s\n",
      format_mib(static_cast<size_t>(bytes)).c_str(),
      format_mib(static_cast<size_t>(bytes * (n - 1) / n)).c_str());
  return {{"ranks", n}, {"tokens_per_rank", o.seq_len / n}, {"all_to_all_bytes_per_step", bytes}};
}

// --ep_size: the plan is expert rank 0's (its share of the experts); each rank's experts may
// receive up to ranks x N x min(k, E / ranks) rows per sparse layer and micro-batch (N the
// planned micro-batch's tokens), the bound their buffers are planned for.
nlohmann::json print_expert_parallel(const TrainOptions& o, const RunAssembly& run) {
  const ModelConfig& c = run.model->config();
  int64_t held = 0;
  for (const ParamInfo& p : run.model->params().list())
    if (p.expert) held += p.shape.numel();
  const BatchShape planned = run.model->planned_shape();
  MoeShape s{planned.batch * planned.seq, c.hidden_size, c.moe.inner, c.moe.experts, c.moe.top_k};
  s.expert_ranks = o.ep_size;
  s.capacity = moe_capacity(c.moe.capacity_factor, s.tokens, c.moe.top_k, c.moe.experts);
  const int64_t rows = moe_expert_rows(s);
  const int64_t per_token = std::min(c.moe.top_k, c.moe.local_experts());
  const std::string why = rows < o.ep_size * s.tokens * per_token
                              ? "each rank sends each of the " + std::to_string(c.moe.experts) +
                                    " experts at most its capacity, " + std::to_string(s.capacity) +
                                    " rows"
                              : std::to_string(o.ep_size) + " ranks x " + std::to_string(s.tokens) +
                                    " tokens x " + std::to_string(per_token);
  std::printf(
      "expert parallel over %lld ranks: each holds %lld of every sparse layer's %lld experts "
      "(%lld expert parameters; the plan is rank 0's)\n",
      static_cast<long long>(o.ep_size), static_cast<long long>(c.moe.local_experts()),
      static_cast<long long>(c.moe.experts), static_cast<long long>(held));
  std::printf(
      "  rows its experts may receive per sparse layer and micro-batch: %lld (%s), the bound "
      "their buffers are planned for\n",
      static_cast<long long>(rows), why.c_str());
  return {{"ranks", o.ep_size},
          {"experts_per_rank", c.moe.local_experts()},
          {"expert_parameters_per_rank", held},
          {"receive_rows_bound", rows}};
}
}  // namespace

// --pp_size: each stage's plan, which differ (the first holds the embeddings, the last the head,
// those between the inputs of their micro-batches in flight), and what each stage boundary
// passes per step: every micro-batch's [B, T, C] float32 activations forward and their
// gradients back. `peak_bytes`: what the stage's process holds of its plan on `device`.
nlohmann::json pipeline_stages(const TrainOptions& o, Device device, const ParallelLayout& layout) {
  nlohmann::json stages = nlohmann::json::array();
  for (int s = 0; s < layout.degree(MeshDim::pipeline); ++s) {
    const std::unique_ptr<RunAssembly> r =
        assemble_run(o, device, nullptr, nullptr, layout, layout.first_rank_of_stage(s));
    const ModelConfig& c = r->model->config();
    const size_t planned = r->plan.total_bytes();
    stages.push_back(
        {{"stage", s},
         {"first_layer", c.first_layer()},
         {"end_layer", c.end_layer()},
         {"parameters", r->model->params().total_elements()},
         {"planned_total_bytes", planned},
         {"peak_bytes", device == Device::cuda ? r->plan.total_bytes(Placement::device) : planned},
         {"activations_bytes",
          r->plan.bytes_by_category()[static_cast<int>(Category::activations)]},
         {"boundary_bytes",
          checked_mul(checked_mul(o.gradient_accumulation_steps, o.per_device_train_batch_size,
                                  "a step's rows"),
                      checked_mul(r->model->planned_tokens(), c.hidden_size * 4, "a row's bytes"),
                      "a step's activations")}});
  }
  return stages;
}

// The stage whose process holds the most: the one a machine must be sized for.
int largest_stage(const nlohmann::json& stages) {
  int largest = 0;
  for (const nlohmann::json& s : stages)
    if (s["peak_bytes"].get<size_t>() > stages[largest]["peak_bytes"].get<size_t>())
      largest = s["stage"].get<int>();
  return largest;
}

void print_pipeline_stages(const TrainOptions& o, const nlohmann::json& stages) {
  const auto p = static_cast<int>(o.pp_size);
  const int64_t m = o.gradient_accumulation_steps;
  std::printf(
      "pipeline: %d stages, 1F1B over %lld micro-batches (bubble (p - 1) / (m + p - 1) "
      "= %.1f%% for stages that take as long):\n",
      p, static_cast<long long>(m), 100.0 * (p - 1) / static_cast<double>(m + p - 1));
  const int largest = largest_stage(stages);
  for (const nlohmann::json& s : stages)
    std::printf("  stage %d: blocks %lld-%lld, %lld parameters, planned %s (activations %s)%s\n",
                s["stage"].get<int>(), s["first_layer"].get<long long>(),
                s["end_layer"].get<long long>() - 1, s["parameters"].get<long long>(),
                format_mib(s["planned_total_bytes"].get<size_t>()).c_str(),
                format_mib(s["activations_bytes"].get<size_t>()).c_str(),
                s["stage"].get<int>() == largest ? ", the largest: the plan above" : "");
  std::printf(
      "  each boundary passes %s of activations forward and as many gradients back per "
      "step\n",
      format_mib(stages.back()["boundary_bytes"].get<size_t>()).c_str());
}

nlohmann::json estimate(const TrainOptions& given, const EstimateArgs& args) {
  const TrainOptions o = estimate_options(given, args);
  // An explicit device is planned whether or not it is present; auto picks as train would.
  const Device device = resolve_device(o);
  // With --tp_size the plan is a tensor rank's (every tensor rank's is alike), with --pp_size the
  // largest stage's (each stage's follows); the data parallelism runs over the world's replicas.
  // With --sp_size the plan is sequence rank 0's (each holds as many tokens); the data and sequence
  // ranks together share ZeRO's partitions.
  const ParallelLayout parallel = parallel_layout(o, static_cast<int>(args.world_size));
  const bool pipeline = parallel.on(MeshDim::pipeline);
  const nlohmann::json stages =
      pipeline ? pipeline_stages(o, device, parallel) : nlohmann::json::array();
  const int stage = pipeline ? largest_stage(stages) : 0;
  const std::unique_ptr<RunAssembly> run = assemble_run(
      o, device, nullptr, GivenData(args.tokenized), parallel, parallel.first_rank_of_stage(stage));
  print_estimate_header(o, *run, device);
  if (o.pp_size > 1)
    std::printf("the plan of pipeline stage %d of %lld, the largest rank's:\n", stage,
                static_cast<long long>(o.pp_size));
  nlohmann::json layout = nlohmann::json::object();
  layout["tensor_parallel"] =
      o.tp_size > 1 ? print_tensor_parallel(o, *run) : nlohmann::json::object();
  layout["sequence_parallel"] =
      o.sp_size > 1 ? print_sequence_parallel(o, *run) : nlohmann::json::object();
  layout["expert_parallel"] =
      o.ep_size > 1 ? print_expert_parallel(o, *run) : nlohmann::json::object();
  print_categories(o, *run, device);
  // The ranks that share ZeRO's partitions: under expert parallelism, those holding the same
  // experts.
  layout["data_parallel"] = print_ranks(o, *run, parallel.replicas());
  if (o.pp_size > 1) print_pipeline_stages(o, stages);
  layout["pipeline_stages"] = stages;
  layout["planned_stage"] = stage;
  const size_t block = bytes_under(run->plan, "block.0.");
  const int64_t layers = run->config.num_layers;
  std::printf("  activations saved per block: %s x %lld layers = %s\n", format_mib(block).c_str(),
              static_cast<long long>(layers), format_mib(block * layers).c_str());
  const size_t host_base = print_fixed_overheads(*run, device);
  nlohmann::json fit_json = nlohmann::json::array();
  std::vector<FitCandidate> fits;
  if (args.fit) fits = print_fit(o, device, args, fit_json);
  if (!args.html_path.empty()) write_estimate_html(o, args, run->plan, device, host_base, fits);
  return estimate_json(*run, device, host_base, fit_json, layout);
}

int run_estimate(const TrainOptions& options, const EstimateArgs& args) {
  const nlohmann::json j = estimate(options, args);
  if (!args.json_path.empty()) write_estimate_json(args.json_path, j);
  return 0;
}

namespace {
// A line's ids: split at the pair separator (when given) into a sentence pair, encoded with the
// special tokens or tokenized plainly.
std::vector<int32_t> encode_line(const Tokenizer& tok, const TokenizeArgs& a,
                                 std::string_view line) {
  std::optional<std::string_view> pair;
  std::string_view first = line;
  const size_t sep = a.pair_separator.empty() ? std::string::npos : line.find(a.pair_separator);
  if (sep != std::string::npos) {
    first = line.substr(0, sep);
    pair = line.substr(sep + a.pair_separator.size());
  }
  if (a.add_special_tokens) return tok.encode(first, pair, 0).ids;
  std::vector<int32_t> ids = tok.tokenize(first);
  if (pair) {
    const std::vector<int32_t> b = tok.tokenize(*pair);
    ids.insert(ids.end(), b.begin(), b.end());
  }
  return ids;
}

// Lines are read in chunks and encoded in parallel (OpenMP), printed in order.
constexpr size_t kChunk = 8192;

// Reads up to kChunk lines (a trailing '\r' dropped) into lines; false once the input ended.
bool read_chunk(std::istream& in, std::vector<std::string>& lines) {
  bool more = true;
  lines.clear();
  std::string line;
  while (lines.size() < kChunk && (more = static_cast<bool>(std::getline(in, line)))) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    lines.push_back(std::move(line));
  }
  return more;
}

// Encodes a chunk's lines into ids in parallel; the first failing line's error is raised, naming
// it (lines_before: the lines of the chunks before).
void encode_chunk(const Tokenizer& tok, const TokenizeArgs& a,
                  const std::vector<std::string>& lines, std::vector<std::vector<int32_t>>& ids,
                  int64_t lines_before) {
  ids.assign(lines.size(), {});
  const auto n = static_cast<int64_t>(lines.size());
  // An error may not leave the parallel loop: the first line's is raised after it.
  int64_t failed = n;
  std::string error;
#pragma omp parallel for schedule(dynamic, 64)
  for (int64_t i = 0; i < n; ++i) {
    try {
      ids[i] = encode_line(tok, a, lines[i]);
    } catch (const std::exception& e) {
#pragma omp critical(brisk_tokenize_error)
      if (i < failed) {
        failed = i;
        error = e.what();
      }
    }
  }
  BRISK_CHECK(failed == n, "line ", lines_before + failed + 1, " of the input: ", error);
}

// The chunk's ids as lines "[id, id, ...]" (nothing when count_only); adds their count to
// *total_tokens.
std::string format_ids(const std::vector<std::vector<int32_t>>& ids, bool count_only,
                       int64_t* total_tokens) {
  std::string out;
  for (const auto& v : ids) {
    *total_tokens += static_cast<int64_t>(v.size());
    if (count_only) continue;
    out += '[';
    for (size_t i = 0; i < v.size(); ++i) {
      if (i) out += ", ";
      out += std::to_string(v[i]);
    }
    out += "]\n";
  }
  return out;
}
}  // namespace

int run_tokenize(const TokenizeArgs& a) {
  const std::unique_ptr<Tokenizer> tok = Tokenizer::load(a.tokenizer);
  std::ifstream file;
  if (!a.input.empty()) {
    InputFile(a.input, "input");  // a regular file (a FIFO would block the open below)
    file.open(a.input, std::ios::binary);
    BRISK_CHECK(file.good(), "cannot open input '", a.input, "'");
  }
  std::istream& in = a.input.empty() ? std::cin : file;
  std::vector<std::string> lines;
  std::vector<std::vector<int32_t>> ids;
  int64_t total_lines = 0, total_tokens = 0;
  const auto start = std::chrono::steady_clock::now();
  for (bool more = true; more;) {
    more = read_chunk(in, lines);
    encode_chunk(*tok, a, lines, ids, total_lines);
    const std::string out = format_ids(ids, a.count_only, &total_tokens);
    total_lines += static_cast<int64_t>(lines.size());
    std::cout << out;
  }
  if (a.count_only) {
    const double secs = seconds_since(start);
    std::cout << nlohmann::json{{"lines", total_lines},
                                {"tokens", total_tokens},
                                {"seconds", secs},
                                {"tokens_per_second", secs > 0 ? total_tokens / secs : 0.0}}
                     .dump()
              << "\n";
  }
  std::cout.flush();
  return 0;
}

std::vector<std::vector<int32_t>> tokenize_texts(const TokenizeArgs& a,
                                                 const std::vector<std::string>& texts) {
  const std::unique_ptr<Tokenizer> tok = Tokenizer::load(a.tokenizer);
  std::vector<std::vector<int32_t>> ids;
  encode_chunk(*tok, a, texts, ids, 0);
  return ids;
}

int run_generate(const GenerateOptions& options) {
  const Generation g = generate(options);
  std::cout << g.text << "\n";
  const double per_second =
      g.seconds > 0 ? static_cast<double>(g.prompt_ids.size() + g.new_ids.size()) / g.seconds : 0;
  std::fprintf(stderr,
               "generated %zu tokens after a prompt of %zu%s in %.3f s (%.1f tokens/s), "
               "planned memory %.1f MiB\n",
               g.new_ids.size(), g.prompt_ids.size(), g.stopped_at_eos ? " (stopped at EOS)" : "",
               g.seconds, per_second, static_cast<double>(g.planned_bytes) / (1 << 20));
  return 0;
}

}  // namespace brisk::cli
