// What `brisk estimate` prints and writes (train/estimate.h), from what plan_estimate computed.
#include <cstdio>
#include <fstream>
#include <string>

#include "backend/device_traits.h"
#include "core/error.h"
#include "core/json_file.h"
#include "precision/mixed_precision.h"
#include "report/memory_html.h"
#include "train/estimate.h"

namespace brisk {

void print_overlaid(size_t overlaid) {
  if (overlaid > 0)
    std::printf("  %-16s %12s   (gradients over consumed activations: counted twice above)\n",
                "overlaid", format_mib(overlaid).c_str());
}

namespace {

std::string mib(double bytes) {
  return format_mib(static_cast<size_t>(bytes));
}

// The run's first line: model, shape, precision, optimizer, device.
void print_header(const Estimate& e) {
  const TrainOptions& o = e.options;
  const RunAssembly& r = *e.run;
  const int64_t n = r.model->params().total_elements(), active = r.model->active_parameters();
  const MixedPrecision& precision = *r.precision;
  const bool experts = e.layout.on(MeshDim::expert);
  const std::string active_note = active == n
                                      ? ""
                                      : " (" + std::to_string(active) + " active per token" +
                                            (experts ? " in the whole model)" : ")");
  std::printf("%s: %lld parameters%s%s, batch %lld x %lld%s%s%s, %s, on %s\n",
              o.model_name_or_path.c_str(), static_cast<long long>(n), active_note.c_str(),
              e.layout.on(MeshDim::tensor) ? " on each tensor rank"
              : experts                    ? " on each expert rank"
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
              e.device == Device::cuda ? "cuda" : "cpu");
}

// Each tensor rank sends 2 (t - 1) / t of a sum's bytes on a ring.
void print_tensor_parallel(const Estimate& e) {
  const nlohmann::json& j = e.tensor_parallel;
  const auto ranks = j["ranks"].get<long long>();
  const auto t = static_cast<double>(ranks);
  std::printf(
      "tensor parallel over %lld ranks: each holds 1/%lld of every block's attention "
      "heads and MLP width and of the vocabulary (the plan is each rank's)\n",
      ranks, ranks);
  const double bytes = j["sums_bytes_per_step"],
               tokens = j["gathered_and_scattered_bytes_per_step"];
  if (tokens == 0)
    std::printf(
        "  sums over the tensor group per step: %s of activations and gradients (4 per "
        "block per micro-batch%s, and the embeddings' and the head's), each rank sending %s on a "
        "ring\n",
        mib(bytes).c_str(), e.options.gradient_checkpointing ? " and the recomputed forwards'" : "",
        mib(bytes * 2 * (t - 1) / t).c_str());
  else
    std::printf(
        "  sequence parallel between the split products: each rank holds 1/%lld of the tokens "
        "there; per step it gathers and reduce-scatters %s (each rank sending %s) and sums %s "
        "(the embeddings', the head's and the norms' gradients, each rank sending %s)\n",
        ranks, mib(tokens).c_str(), mib(tokens * (t - 1) / t).c_str(), mib(bytes).c_str(),
        mib(bytes * 2 * (t - 1) / t).c_str());
}

void print_sequence_parallel(const Estimate& e) {
  const nlohmann::json& j = e.sequence_parallel;
  const int n = j["ranks"];
  const ModelConfig& c = e.run->model->config();
  const auto seq = static_cast<long long>(e.run->options.seq_len);
  std::printf(
      "sequence parallel over %d ranks: each holds %lld of every sequence's %lld tokens, "
      "attention on all of them for %lld of %lld heads (the plan is each rank's)\n",
      n, seq / n, seq, static_cast<long long>(c.num_heads / n),
      static_cast<long long>(c.num_heads));
  const double bytes = j["all_to_all_bytes_per_step"];
  std::printf(
      "  all-to-alls per step: %s through each rank's exchanges (qkv and attention output per "
      "block, forward and backward), each rank sending %s\n",
      mib(bytes).c_str(), mib(bytes * (n - 1) / n).c_str());
}

void print_expert_parallel(const Estimate& e) {
  const nlohmann::json& j = e.expert_parallel;
  const ModelConfig& c = e.run->model->config();
  std::printf(
      "expert parallel over %lld ranks: each holds %lld of every sparse layer's %lld experts "
      "(%lld expert parameters; the plan is rank 0's)\n",
      j["ranks"].get<long long>(), j["experts_per_rank"].get<long long>(),
      static_cast<long long>(c.moe.experts), j["expert_parameters_per_rank"].get<long long>());
  std::printf(
      "  rows its experts may receive per sparse layer and micro-batch: %lld (%s), the bound "
      "their buffers are planned for\n",
      j["receive_rows_bound"].get<long long>(),
      j["receive_rows_bound_reason"].get<std::string>().c_str());
}

// LoRA: what the adapters train and where the frozen base's bytes lie.
void print_adapters(const Estimate& e) {
  const nlohmann::json& j = e.adapters;
  const auto trained = j["trained_parameters"].get<long long>();
  const auto frozen = j["frozen_parameters"].get<long long>();
  std::string targets;
  for (const auto& t : j["target_modules"])
    targets += (targets.empty() ? "" : ",") + t.get<std::string>();
  const bool shares = j.value("tensor_ranks", 1) > 1;
  std::printf("LoRA r %lld on %s: %lld parameters trained (%.2f%%), %lld frozen%s\n",
              j["r"].get<long long>(), targets.empty() ? "PEFT's default targets" : targets.c_str(),
              trained, 100.0 * static_cast<double>(trained) / static_cast<double>(trained + frozen),
              frozen, shares ? " (a tensor rank's share)" : "");
  auto mib = [&](const nlohmann::json& at, const char* key) {
    return format_mib(at[key].get<size_t>());
  };
  std::printf("  trained: weights %s, gradients %s, master %s, optimizer state %s\n",
              mib(j, "trained_weights_bytes").c_str(), mib(j, "gradients_bytes").c_str(),
              mib(j, "master_weights_bytes").c_str(), mib(j, "optimizer_state_bytes").c_str());
  if (!j.contains("store")) {
    std::printf("  weight buffer (the frozen base and the adapters, float32): %s\n",
                mib(j, "weight_buffer_bytes").c_str());
    return;
  }
  const nlohmann::json& s = j["store"];
  std::printf(
      "  frozen block linears, %s%s: %lld parameters in %s (%.3f bytes a parameter); "
      "the blocks' other parameters %s (float32)\n",
      s["type"].get<std::string>().c_str(), s["nested"].get<bool>() ? " nested" : "",
      s["parameters"].get<long long>(), mib(s, "bytes").c_str(),
      s["bytes_per_parameter"].get<double>(), mib(s, "kept_float32_bytes").c_str());
  std::printf(
      "  weight buffer (embeddings, head, adapters, two slots for what the blocks read from "
      "them): %s\n",
      mib(j, "weight_buffer_bytes").c_str());
  if (s.value("dequantized_bytes", 0) > 0)
    std::printf(
        "  4-bit weights multiplied where they are kept, one at a time dequantized into %s\n",
        mib(s, "dequantized_bytes").c_str());
}

// The plan by category, with bytes per parameter beside the Hugging Face guides' rule of thumb.
void print_categories(const Estimate& e) {
  const RunAssembly& r = *e.run;
  const MemoryPlan& plan = r.plan;
  const int64_t n = r.model->params().total_elements();
  const auto planned = plan.bytes_by_category();
  const RuleOfThumb rule = guides_rule(e.options);
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
  if (e.experts.parameters > 0) {
    std::printf("  of which the routed experts' (%lld parameters, %.1f%%):",
                static_cast<long long>(e.experts.parameters),
                100.0 * static_cast<double>(e.experts.parameters) / static_cast<double>(n));
    const char* sep = " ";
    for (int c = 0; c < kNumCategories; ++c) {
      if (e.experts.bytes[c] == 0) continue;
      std::printf("%s%s %s", sep, category_name(static_cast<Category>(c)),
                  format_mib(e.experts.bytes[c]).c_str());
      sep = ", ";
    }
    std::printf("\n");
  }
  if (r.parallel.offload && e.device == Device::cuda) {
    const auto host = plan.bytes_by_category(Placement::host);
    std::printf(
        "  offload_optimizer cpu, in host memory: master_weights %s, optimizer_state %s, "
        "gradients (host copy) %s\n",
        format_mib(host[static_cast<int>(Category::master_weights)]).c_str(),
        format_mib(host[static_cast<int>(Category::optimizer_state)]).c_str(),
        format_mib(host[static_cast<int>(Category::gradients)]).c_str());
  }
}

// The ZeRO paper's bytes per parameter of mixed-precision Adam at this stage, beside brisk's
// (Rajbhandari et al. 2020: 2 + 2 + K bytes per parameter with K = 12, the K part divided by N
// from stage 1 on, the gradients' 2 from stage 2, the weights' 2 from stage 3).
void print_paper_formula(const Estimate& e) {
  const RunAssembly& run = *e.run;
  const RankSharesInput& in = e.rank_input;
  // (The paper trains every parameter: not a LoRA's frozen base.)
  if (run.optimizer->name() != "adamw_torch" || run.adapter) return;
  const int world = in.world;
  const int64_t stage = e.options.zero_stage;
  const double paper = (stage >= 3 ? 2.0 / world : 2.0) + (stage >= 2 ? 2.0 / world : 2.0) +
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
      paper,
      in.sharded_gradients ? slots(run.model->grad_layout().slots(), "gradients").c_str() : "",
      in.sharded_weights ? slots(run.model->weight_layout().slots(), "weights").c_str() : "");
}

// Each replica's model states (parallel/rank_shares.h).
void print_ranks(const Estimate& e) {
  const RankSharesInput& in = e.rank_input;
  const RankShares& shares = e.rank_shares;
  const int world = in.world;
  const double n = static_cast<double>(in.params);
  std::printf("data parallel over %d ranks, zero_stage %lld:\n", world,
              static_cast<long long>(e.options.zero_stage));
  std::printf("  %-6s %14s %14s %14s %14s %16s %22s\n", "rank", "parameters", "weights", "master",
              "gradients", "optimizer_state", "model states/param");
  for (const RankShare& r : shares.ranks) {
    if (r.rank < 8 || r.rank == world - 1)
      std::printf("  %-6d %14.0f %14s %14s %14s %16s %22.2f\n", r.rank, r.params,
                  mib(r.weights).c_str(), mib(r.master).c_str(), mib(r.gradients).c_str(),
                  mib(r.optimizer_state).c_str(), r.total() / n);
    else if (r.rank == 8)
      std::printf("  ...\n");
  }
  const std::string per_world = " / " + std::to_string(world);
  // A partitioned state's bytes per parameter of the model: 4, or a LoRA's (its trained
  // parameters' alone) less.
  const double part = 4.0 * (in.trained < 0 ? n : static_cast<double>(in.trained)) / n;
  char four[32] = " + 4";
  if (part < 4.0) std::snprintf(four, sizeof four, " + %.2f", part);
  std::printf(
      "  model states per rank: weights %.2f%s + master %.2f%s + gradients %.2f%s + optimizer "
      "%.2f%s = %.2f bytes/param (largest rank: %.2f)\n",
      shares.weights_alike, in.sharded_weights ? (" + 4" + per_world).c_str() : "",
      in.sharded_master ? part : shares.master_alike, in.sharded_master ? per_world.c_str() : "",
      shares.gradients_alike,
      (std::string(in.sharded_gradients ? four + per_world : "") +
       (!in.offload         ? ""
        : in.shards.empty() ? four + std::string(" on the host")
                            : four + per_world + " on the host"))
          .c_str(),
      shares.optimizer, in.shards.empty() ? "" : per_world.c_str(), shares.model_states,
      shares.largest);
  if (in.offload)
    std::printf(
        "  offload_optimizer cpu: master, optimizer state and the gradients' host copy "
        "in host memory, %.2f bytes/param per rank; on the device %.2f\n",
        shares.host, shares.device);
  print_paper_formula(e);
}

void print_pipeline_stages(const Estimate& e) {
  const int p = e.layout.degree(MeshDim::pipeline);
  const int64_t m = e.options.gradient_accumulation_steps;
  std::printf(
      "pipeline: %d stages, 1F1B over %lld micro-batches (bubble (p - 1) / (m + p - 1) "
      "= %.1f%% for stages that take as long):\n",
      p, static_cast<long long>(m), 100.0 * (p - 1) / static_cast<double>(m + p - 1));
  for (const nlohmann::json& s : e.stages)
    std::printf("  stage %d: blocks %lld-%lld, %lld parameters, planned %s (activations %s)%s\n",
                s["stage"].get<int>(), s["first_layer"].get<long long>(),
                s["end_layer"].get<long long>() - 1, s["parameters"].get<long long>(),
                format_mib(s["planned_total_bytes"].get<size_t>()).c_str(),
                format_mib(s["activations_bytes"].get<size_t>()).c_str(),
                s["stage"].get<int>() == e.planned_stage ? ", the largest: the plan above" : "");
  std::printf(
      "  each boundary passes %s of activations forward and as many gradients back per "
      "step\n",
      format_mib(e.stages.back()["boundary_bytes"].get<size_t>()).c_str());
}

// What lies outside the plan, and the total to expect.
void print_fixed_overheads(const Estimate& e) {
  const MemoryPlan& plan = e.run->plan;
  std::printf("fixed overheads assumed (not in the plan):\n");
  std::printf("  %-34s %12s\n", "host: program and libraries (now)",
              format_mib(e.host_base).c_str());
  if (e.device == Device::cuda) {
    std::printf("  %-34s %12s\n", "GPU: context, kernels, libraries",
                format_mib(kCudaContextBytes).c_str());
    std::printf("  %-34s %12s\n",
                e.run->parallel.offload ? "host: pinned, staging and optimizer"
                                        : "host: pinned staging (planned)",
                format_mib(plan.total_bytes(Placement::host)).c_str());
    std::printf("expect \"GPU memory occupied\" near %s\n",
                format_mib(plan.total_bytes(Placement::device) + kCudaContextBytes).c_str());
  } else {
    std::printf("expect a process peak near %s\n",
                format_mib(plan.total_bytes() + e.host_base).c_str());
  }
}

// Against --max_memory: whether the planned run fits, and by how much.
void print_budget(const Estimate& e) {
  const size_t have = e.budget.budget, need = e.needed;
  std::printf("%s within %s (%s): needs %s with the fixed part and a margin, %s %s\n",
              need <= have ? "fits" : "does NOT fit", format_mib(have).c_str(),
              e.budget.source.c_str(), format_mib(need).c_str(),
              format_mib(need <= have ? have - need : need - have).c_str(),
              need <= have ? "to spare" : "over");
}

std::string recompute_of(const TrainOptions& t) {
  return t.gradient_checkpointing ? "full" : t.selective_recompute ? "selective" : "none";
}

// --fit: the configurations that fit, fastest predicted first.
void print_fit(const Estimate& e) {
  const int world = e.layout.world();
  std::printf(
      "fit: global batch %lld%s within %s per rank (%s): %zu configurations fit, %d do not\n",
      static_cast<long long>(global_batch(e.options, world)),
      world > 1 ? (" over " + std::to_string(world) + " ranks").c_str() : "",
      format_mib(e.budget.budget).c_str(), e.budget.source.c_str(), e.fits.size(), e.rejected);
  std::printf("  %-4s %-22s %-6s %-13s %-13s %-9s %-18s %12s %14s\n", "rank", "layout", "method",
              "batch x accum", "recompute", "precision", "optim", "needs", "predicted/step");
  for (size_t i = 0; i < e.fits.size() && i < 10; ++i) {
    const FitCandidate& f = e.fits[i];
    const TrainOptions& t = f.options;
    const std::string shape = std::to_string(t.per_device_train_batch_size) + " x " +
                              std::to_string(t.gradient_accumulation_steps);
    std::printf("  %-4zu %-22s %-6s %-13s %-13s %-9s %-18s %12s %11.1f ms\n", i + 1,
                f.layout.str().c_str(), method_of(t).c_str(), shape.c_str(),
                recompute_of(t).c_str(), precision_of(t).c_str(), t.optim.c_str(),
                format_mib(f.needed).c_str(), f.step_seconds * 1e3);
  }
  if (e.fits.size() > 10) std::printf("  ... %zu more in --output_json\n", e.fits.size() - 10);
}

}  // namespace

void print_estimate(const Estimate& e) {
  print_header(e);
  if (e.layout.on(MeshDim::pipeline))
    std::printf("the plan of pipeline stage %d of %d, the largest rank's:\n", e.planned_stage,
                e.layout.degree(MeshDim::pipeline));
  if (e.layout.on(MeshDim::tensor)) print_tensor_parallel(e);
  if (e.layout.on(MeshDim::sequence)) print_sequence_parallel(e);
  if (e.layout.on(MeshDim::expert)) print_expert_parallel(e);
  print_categories(e);
  if (e.layout.replicas() > 1) print_ranks(e);
  if (e.layout.on(MeshDim::pipeline)) print_pipeline_stages(e);
  const size_t block = bytes_under(e.run->plan, "block.0.");
  const int64_t layers = e.run->config.num_layers;
  std::printf("  activations saved per block: %s x %lld layers = %s\n", format_mib(block).c_str(),
              static_cast<long long>(layers), format_mib(block * layers).c_str());
  if (!e.adapters.empty()) print_adapters(e);
  print_fixed_overheads(e);
  if (!e.options.max_memory.empty()) print_budget(e);
  if (!e.fits.empty()) print_fit(e);
}

namespace {

// The replicas' model states by rank; none with one replica.
nlohmann::json ranks_json(const Estimate& e) {
  if (e.layout.replicas() == 1) return nlohmann::json::object();
  const RankShares& shares = e.rank_shares;
  nlohmann::json per_rank = nlohmann::json::array();
  for (const RankShare& r : shares.ranks)
    per_rank.push_back({{"rank", r.rank},
                        {"parameters", r.params},
                        {"weight_bytes", r.weights},
                        {"master_bytes", r.master},
                        {"gradient_bytes", r.gradients},
                        {"optimizer_state_bytes", r.optimizer_state},
                        {"host_bytes", r.host}});
  return {{"world_size", e.rank_input.world},
          {"zero_stage", e.options.zero_stage},
          {"weight_bytes_per_param", shares.weights},
          {"master_bytes_per_param", shares.master},
          {"gradient_bytes_per_param", shares.gradients},
          {"optimizer_bytes_per_param", shares.optimizer},
          {"model_state_bytes_per_param", shares.model_states},
          {"host_model_state_bytes_per_param", shares.host},
          {"ranks", per_rank}};
}

nlohmann::json fit_json(const Estimate& e) {
  nlohmann::json out = nlohmann::json::array();
  for (const FitCandidate& f : e.fits) {
    const TrainOptions& t = f.options;
    out.push_back({{"tp_size", f.layout.degree(MeshDim::tensor)},
                   {"pp_size", f.layout.degree(MeshDim::pipeline)},
                   {"sp_size", f.layout.degree(MeshDim::sequence)},
                   {"data_ranks", f.data_ranks},
                   {"zero_stage", t.zero_stage},
                   {"method", method_of(t)},
                   {"per_device_train_batch_size", t.per_device_train_batch_size},
                   {"gradient_accumulation_steps", t.gradient_accumulation_steps},
                   {"gradient_checkpointing", t.gradient_checkpointing},
                   {"selective_recompute", t.selective_recompute},
                   {"precision", precision_of(t)},
                   {"optim", t.optim},
                   {"needed_bytes", f.needed},
                   {"predicted_step_seconds", f.step_seconds}});
  }
  return out;
}

// The routed experts' bytes by category, those they have.
nlohmann::json expert_bytes_json(const ExpertShare& s) {
  nlohmann::json j = nlohmann::json::object();
  for (int c = 0; c < kNumCategories; ++c)
    if (s.bytes[c] > 0) j[category_name(static_cast<Category>(c))] = s.bytes[c];
  return j;
}

// Every buffer of the plan, as declared: where each category's bytes go.
nlohmann::json buffers_json(const MemoryPlan& plan) {
  nlohmann::json out = nlohmann::json::array();
  for (const BufferSpec& b : plan.buffers())
    out.push_back({{"name", b.name},
                   {"category", category_name(b.category)},
                   {"dtype", dtype_name(b.dtype)},
                   {"shape", b.shape.str()},
                   {"bytes", b.bytes},
                   {"placement", b.placement == Placement::host ? "host" : "device"}});
  return out;
}

// --html: the plan's bars (or the --fit candidates'), with the fixed overheads.
void write_estimate_html(const Estimate& e, const std::string& path) {
  const MemoryPlan& plan = e.run->plan;
  const bool cuda = e.device == Device::cuda;
  const size_t fixed = cuda ? kCudaContextBytes : e.host_base;
  const char* fixed_label =
      cuda ? "GPU context, kernels, libraries" : "host: program and libraries";
  std::vector<MemoryBar> bars;
  if (e.fits.empty())
    bars.push_back(
        {"as asked", plan.bytes_by_category(), plan.overlaid_bytes(), fixed, fixed_label, {}});
  for (size_t i = 0; i < e.fits.size() && i < 10; ++i) {
    const TrainOptions& t = e.fits[i].options;
    char shape[96];
    std::snprintf(shape, sizeof shape, "#%zu %lldx%lld %s\n", i + 1,
                  static_cast<long long>(t.per_device_train_batch_size),
                  static_cast<long long>(t.gradient_accumulation_steps), precision_of(t).c_str());
    std::string label = shape + t.optim;
    if (t.gradient_checkpointing) label.append(" ckpt");
    if (t.selective_recompute) label.append(" sel");
    if (const std::string method = method_of(t); method != "full") label.append(" ").append(method);
    bars.push_back({label, e.fits[i].planned, e.fits[i].overlaid, fixed, fixed_label, {}});
  }
  write_memory_html(path, "brisk estimate: " + e.options.model_name_or_path,
                    std::string("planned bytes by category on ") + (cuda ? "cuda" : "cpu") +
                        (e.fits.empty() ? "" : "; --fit candidates, fastest predicted first"),
                    bars);
}

// Against --max_memory (or --fit's budget): the bytes allowed, needed, and whether they fit; null
// without a budget.
nlohmann::json budget_json(const Estimate& e) {
  if (e.budget.budget == 0) return nullptr;
  return {{"budget_bytes", e.budget.budget},
          {"source", e.budget.source},
          {"needed_bytes", e.needed},
          {"fits", e.needed <= e.budget.budget}};
}

}  // namespace

nlohmann::json estimate_json(const Estimate& e) {
  const RunAssembly& run = *e.run;
  const MemoryPlan& plan = run.plan;
  const auto planned = plan.bytes_by_category();
  nlohmann::json planned_json = nlohmann::json::object();
  for (int c = 0; c < kNumCategories; ++c)
    planned_json[category_name(static_cast<Category>(c))] = planned[c];
  return {{"device", e.device == Device::cuda ? "cuda" : "cpu"},
          {"parameters", run.model->params().total_elements()},
          {"active_parameters", run.model->active_parameters()},
          {"expert_parameters", e.experts.parameters},
          {"expert_bytes", expert_bytes_json(e.experts)},
          {"memory",
           {{"planned_bytes", planned_json},
            {"planned_total_bytes", plan.total_bytes()},
            {"overlaid_bytes", plan.overlaid_bytes()},
            {"planned_device_bytes", plan.total_bytes(Placement::device)},
            {"planned_host_bytes", plan.total_bytes(Placement::host)},
            {"activations_per_block_bytes", bytes_under(plan, "block.0.")},
            {"layers", run.config.num_layers},
            {"host_baseline_bytes", e.host_base},
            {"device_context_bytes", e.device == Device::cuda ? kCudaContextBytes : 0},
            {"buffers", buffers_json(plan)}}},
          {"budget", budget_json(e)},
          {"fit", fit_json(e)},
          {"tensor_parallel", e.tensor_parallel},
          {"sequence_parallel", e.sequence_parallel},
          {"expert_parallel", e.expert_parallel},
          {"adapters", e.adapters},
          {"data_parallel", ranks_json(e)},
          {"pipeline_stages", e.stages},
          {"planned_stage", e.planned_stage}};
}

void write_estimate_files(const Estimate& e, const EstimateArgs& args) {
  if (!args.html_path.empty()) write_estimate_html(e, args.html_path);
  if (args.json_path.empty()) return;
  std::ofstream out(args.json_path);
  BRISK_CHECK(out.good(), "cannot write '", args.json_path, "'");
  out << estimate_json(e).dump(2) << "\n";
  BRISK_CHECK(out.good(), "cannot write '", args.json_path, "'");
}

}  // namespace brisk
