// Fitting a run to memory from its plan (see fit.h).
#include "train/fit.h"

#include <algorithm>
#include <cctype>
#include <cstdio>

#include "core/checked.h"
#include "core/json_file.h"
#include "core/process_memory.h"
#include "parallel/sequence_parallel.h"
#include "train/assembly.h"

namespace brisk {

size_t parse_memory_size(const std::string& text) {
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.'))
    ++i;
  std::string unit = text.substr(i);
  unit.erase(std::remove(unit.begin(), unit.end(), ' '), unit.end());
  for (char& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  double number = 0;
  bool ok = i > 0 && std::count(text.begin(), text.begin() + i, '.') <= 1;
  if (ok) {
    try {
      number = std::stod(text.substr(0, i));
    } catch (const std::exception&) {
      ok = false;
    }
  }
  const std::pair<const char*, double> units[] = {{"", 1},
                                                  {"b", 1},
                                                  {"kb", 1e3},
                                                  {"mb", 1e6},
                                                  {"gb", 1e9},
                                                  {"tb", 1e12},
                                                  {"k", 1024.0},
                                                  {"kib", 1024.0},
                                                  {"m", 1048576.0},
                                                  {"mib", 1048576.0},
                                                  {"g", 1073741824.0},
                                                  {"gib", 1073741824.0},
                                                  {"t", 1099511627776.0},
                                                  {"tib", 1099511627776.0}};
  double scale = -1;
  for (const auto& [name, factor] : units)
    if (unit == name) scale = factor;
  BRISK_CHECK(ok && scale > 0, "max_memory \"", text,
              "\" is not a size (examples: 6GB, 6GiB, 512MiB, 1.5G)");
  const double bytes = number * scale;
  BRISK_CHECK(bytes >= 1 && bytes < 1e18, "max_memory \"", text, "\" is out of range");
  return static_cast<size_t>(bytes);
}

MemoryBudget memory_budget(const TrainOptions& o, Device device, const Backend* backend) {
  MemoryBudget b;
  b.device = device;
  const bool host = device_traits(device).host_memory;
  const bool device_here = backend && backend->device() == device && !host;
  if (!o.max_memory.empty()) {
    b.budget = parse_memory_size(o.max_memory);
    b.source = "--max_memory " + o.max_memory;
    if (host) {
      b.fixed = current_rss_bytes();
    } else {
      const int64_t used = device_here ? backend->device_memory_used() : -1;
      b.fixed = used > 0 ? static_cast<size_t>(used) : device_traits(device).context_bytes;
    }
    return b;
  }
  if (host) {
    b.budget = available_host_bytes();
    b.source = "the host's available memory";
  } else {
    const int64_t free_bytes = device_here ? backend->device_memory_free() : -1;
    BRISK_CHECK(free_bytes > 0,
                "fitting a GPU run needs --max_memory where no GPU can be asked for its free "
                "memory");
    b.budget = static_cast<size_t>(free_bytes);
    b.source = "the GPU's free memory";
  }
  BRISK_CHECK(b.budget > 0, "cannot tell how much memory is available; give --max_memory");
  return b;
}

size_t needed_bytes(const MemoryPlan& plan, const MemoryBudget& budget) {
  const size_t planned = device_traits(budget.device).host_memory
                             ? plan.total_bytes()
                             : plan.total_bytes(Placement::device);
  return planned + budget.fixed + std::max(planned / 50, size_t{32} << 20);
}

namespace {
// The first stage's run of `t` (a pipeline's, or the whole run) and into `needed` what the run
// needs of the budget: its largest stage's plan (the first holds the embeddings, the last the
// head, the second the most stashed inputs).
std::unique_ptr<RunAssembly> plan_stages(const TrainOptions& t, Device device, GivenData dataset,
                                         const ParallelLayout& layout, const MemoryBudget& budget,
                                         size_t& needed) {
  std::unique_ptr<RunAssembly> first = assemble_run(t, device, nullptr, dataset, layout, 0);
  needed = needed_bytes(first->plan, budget);
  const int p = layout.degree(MeshDim::pipeline);
  for (int s : {1, p - 1})
    if (s > 0 && s < p)
      needed = std::max(needed, needed_bytes(assemble_run(t, device, nullptr, dataset, layout,
                                                          layout.first_rank_of_stage(s))
                                                 ->plan,
                                             budget));
  return first;
}
}  // namespace

BatchFit fit_batch(const TrainOptions& o, Device device, const MemoryBudget& budget,
                   GivenData dataset) {
  const int64_t global = o.per_device_train_batch_size * o.gradient_accumulation_steps;
  auto need = [&](int64_t batch, bool checkpointing, const std::string& offload = "") {
    TrainOptions t = o;
    if (!offload.empty()) t.offload_optimizer = offload;
    t.per_device_train_batch_size = batch;
    t.gradient_accumulation_steps = global / batch;
    t.gradient_checkpointing = checkpointing;
    t.selective_recompute = t.selective_recompute && !checkpointing;
    size_t needed = 0;
    // With pipeline stages, the largest's.
    plan_stages(t, device, dataset, parallel_layout(t, 0), budget, needed);
    return needed;
  };
  // The data bounds the batch: a loader refuses a batch larger than the dataset.
  TrainOptions one = o;
  one.per_device_train_batch_size = 1;
  one.gradient_accumulation_steps = global;
  const int64_t samples = assemble_run(one, device, nullptr, dataset)->data->size();
  for (int64_t b = std::min(global, samples); b >= 1; --b) {
    if (global % b) continue;
    const size_t needed = need(b, o.gradient_checkpointing);
    if (needed > budget.budget) continue;
    BatchFit f{b, global / b, needed, ""};
    f.reason = "auto_find_batch_size: per_device_train_batch_size " + std::to_string(b) +
               " x gradient_accumulation_steps " + std::to_string(global / b) + " (global batch " +
               std::to_string(global) + ") needs " + format_mib(needed) + " of " +
               format_mib(budget.budget) + " (" + budget.source + ")";
    if (b < std::min(global, samples))
      f.reason += "; the next larger batch dividing " + std::to_string(global) + " does not fit";
    return f;
  }
  // What batch 1 would need with each memory saver not yet on.
  std::string savers;
  if (!o.gradient_checkpointing)
    savers += ", " + format_mib(need(1, true)) + " with --gradient_checkpointing";
  if (!device_traits(device).host_memory && o.offload_optimizer == "none")
    savers += ", " + format_mib(need(1, true, "cpu")) + " with " +
              (o.gradient_checkpointing ? "" : "--gradient_checkpointing and ") +
              "--offload_optimizer cpu";
  BRISK_FAIL("auto_find_batch_size: not even per_device_train_batch_size 1 fits ",
             format_mib(budget.budget), " (", budget.source, "): it needs ",
             format_mib(need(1, o.gradient_checkpointing)), savers);
}

// The device's measured rates (backend/device_traits.cpp); an offloaded optimizer's pass runs at
// the host's.
CostModel cost_model(Device device) {
  CostModel m;
  static_cast<DeviceRates&>(m) = device_traits(device).rates;
  m.host_bandwidth = device_traits(kHostDevice).rates.bandwidth;
  return m;
}

// The sums across ranks, as ring all-reduces at the collective bandwidth, none hidden: tensor
// parallelism's (tensor_step_bytes, and Megatron's sequence parallelism's gathers and
// reduce-scatters: tensor_token_bytes), the data replicas' sum of the stage's float32 gradients
// (once a step; ZeRO stage 2 reduce-scatters each micro-batch's and gathers the updated runs once,
// (m + 1) / 2 x over m micro-batches; stage 3 gathers the weights for each micro-batch's forward
// and backward besides, 1.5 m x; over a LoRA's frozen base, the adapters as stage 2 and the
// frozen blocks gathered 2 m x), a pipeline stage's float32 [B, T,
// C] activations sent on and gradients sent back per micro-batch (T: a sequence rank's tokens), and
// a sequence rank's all-to-alls. `data_ranks`: the replicas that sum the gradients.
double communication_seconds(const RunAssembly& run, const CostModel& m) {
  const TrainOptions& o = run.options;
  const ModelConfig& c = run.config;
  auto ring = [](double ranks) { return 2 * (ranks - 1) / ranks; };
  const double t = run.layout.degree(MeshDim::tensor);
  const double p = run.layout.degree(MeshDim::pipeline);
  const double s = run.layout.degree(MeshDim::sequence);
  // A rank's tokens: its share of each sequence under sequence parallelism.
  const double tokens = static_cast<double>(o.per_device_train_batch_size *
                                            o.gradient_accumulation_steps * o.seq_len) /
                        s;
  // All-reduces send 2 (t - 1) / t of their bytes, gathers and reduce-scatters (t - 1) / t.
  const double tensor = tensor_step_bytes(run) * ring(t) + tensor_token_bytes(run) * (t - 1) / t;
  const double stages = p > 1 ? 2 * tokens * static_cast<double>(c.hidden_size) * 4 : 0;
  const double d = run.layout.replicas();
  const auto micro = static_cast<double>(o.gradient_accumulation_steps);
  // (Stage 3 over a frozen base: the trained parameters as under stage 2.)
  int64_t frozen = 0;
  for (const ParamShard& s : run.parallel.base_shards) frozen += s.elements.count;
  const int64_t stage = frozen > 0 ? 2 : o.zero_stage;
  const double passes = stage >= 3 ? 1.5 * micro : stage == 2 ? (micro + 1) / 2 : 1;
  // The gradients summed: the trained parameters' (a LoRA's adapters, not its frozen base); the
  // frozen blocks gathered for each micro-batch's forward and backward.
  const double data = 4.0 * static_cast<double>(run.model->params().trained_run().elements.count) *
                          ring(d) * passes +
                      4.0 * static_cast<double>(frozen) * 2 * micro * (d - 1) / d;
  // Sequence parallelism's all-to-alls: each rank sends (s - 1) / s of what it exchanges.
  const double sequence = sequence_step_bytes(run) / p * (s - 1) / s;
  return (tensor + data + stages + sequence) / m.collective;
}

namespace {
// A float32 [B, T, C] tensor's bytes on a tensor rank (T: a sequence rank's tokens).
double tensor_rank_activations(const RunAssembly& run) {
  const TrainOptions& o = run.options;
  return static_cast<double>(o.per_device_train_batch_size) *
         static_cast<double>(o.seq_len / run.layout.degree(MeshDim::sequence)) *
         static_cast<double>(run.model->config().hidden_size) * 4;
}
}  // namespace

double tensor_step_bytes(const RunAssembly& run) {
  const TrainOptions& o = run.options;
  const ModelConfig& c = run.model->config();  // the rank's share: its stage's blocks
  if (!run.layout.on(MeshDim::tensor)) return 0;
  const double activations = tensor_rank_activations(run);
  // Gradient checkpointing runs each block's forward but the last's again, a pre-norm block's
  // without its output (1 sum), a post-norm block's whole (2).
  const double L = static_cast<double>(c.end_layer() - c.first_layer());
  const double again = run.model->inference_style().pre_norm ? 1 : 2;
  double blocks = (4 * L + (o.gradient_checkpointing ? again * (L - 1) : 0)) * activations;
  double once = 0;  // per step
  if (run.model->slices_tokens()) {
    blocks = 0;
    for (const ParamInfo& p : run.model->params().list())
      if (p.split.partial) once += 4 * static_cast<double>(p.shape.numel());
  }
  // Vocabulary parallelism: the embeddings' output on the first stage; on the last, the head's
  // input gradient and each row's 3 statistics from every rank.
  const double rows = activations / static_cast<double>(c.hidden_size) / 4;
  const double ends =
      (c.first_stage() ? activations : 0) +
      (c.last_stage() ? activations + rows * 3 * 4 * run.layout.degree(MeshDim::tensor) : 0);
  return (blocks + ends) * static_cast<double>(o.gradient_accumulation_steps) + once;
}

double tensor_token_bytes(const RunAssembly& run) {
  const TrainOptions& o = run.options;
  const ModelConfig& c = run.model->config();
  if (!run.model->slices_tokens()) return 0;
  const double A = tensor_rank_activations(run);
  // The norms' outputs in 16 bits where the products read them so and nothing is recomputed.
  const double a = run.product == DType::bf16 && !o.gradient_checkpointing ? 0.5 : 1.0;
  const bool pre = run.model->inference_style().pre_norm;
  // Per block: a pre-norm block gathers both norms' outputs twice (4 a A), reduce-scatters 2
  // outputs and 2 input gradients and gathers 2 output gradients (6 A); a post-norm block
  // gathers its input twice and its MLP input twice (2 A + 2 a A) and the same 6 A. Recomputed
  // forwards: a pre-norm block's up to its MLP input (3 A), a post-norm block's whole (4 A).
  const double L = static_cast<double>(c.end_layer() - c.first_layer());
  const double block = pre ? 6 * A + 4 * a * A : 8 * A + 2 * a * A;
  const double again = o.gradient_checkpointing ? (pre ? 3 : 4) * A * (L - 1) : 0;
  const double ends = (c.first_stage() ? A : 0) + (c.last_stage() ? A : 0);
  return (L * block + again + ends) * static_cast<double>(o.gradient_accumulation_steps);
}

double sequence_step_bytes(const RunAssembly& run) {
  const TrainOptions& o = run.options;
  if (!run.layout.on(MeshDim::sequence)) return 0;
  // Where the products read bf16 activations, a mixed-precision run without checkpointing keeps
  // the attention output only as its bf16 copy, which backward exchanges.
  const bool low = run.product == DType::bf16 && !o.gradient_checkpointing;
  return sequence_exchange_bytes(run.model->config(), o.per_device_train_batch_size, o.seq_len,
                                 run.layout.degree(MeshDim::sequence),
                                 o.gradient_accumulation_steps, o.gradient_checkpointing,
                                 low ? 2 : 4);
}

double predicted_step_seconds(const RunAssembly& run, const CostModel& m) {
  const TrainOptions& o = run.options;
  const ModelConfig& c = run.config;
  const double L = static_cast<double>(c.num_layers), C = static_cast<double>(c.hidden_size);
  const double inner = static_cast<double>(c.intermediate_size), T = static_cast<double>(o.seq_len);
  const double k = static_cast<double>(o.gradient_accumulation_steps);
  const double tokens = static_cast<double>(o.per_device_train_batch_size) * k * T;
  // Full recomputation repeats the forward (a third of a step's flops); selective, the
  // attention core's forward (a third of its flops).
  const double attn_recompute = o.gradient_checkpointing || o.selective_recompute ? 4.0 / 3.0 : 1.0;
  const double rate = run.product == DType::bf16  ? m.bf16_flops
                      : run.product == DType::f16 ? m.fp16_flops
                      : o.tf32                    ? m.tf32_flops
                                                  : m.fp32_flops;
  // A tensor rank computes its share of every block's products and attention, a sequence rank
  // the products of its tokens and attention for its heads (both 1/s). A pipeline stage
  // computes its blocks, stages before the last running each forward twice (4/3), and the step
  // takes (m + p - 1) stage-times of a micro-batch where one stage would take m (1F1B's bubble).
  const double t = run.layout.degree(MeshDim::tensor) * run.layout.degree(MeshDim::sequence);
  const double p = run.layout.degree(MeshDim::pipeline);
  const double stage = p > 1 ? (k + p - 1) / k * 4.0 / 3.0 / p : 1.0;
  // The products' passes over N: the forward (twice with full recomputation), the input
  // gradients, and the weights' gradients unless the base is frozen (adapters).
  const double passes = (o.gradient_checkpointing ? 2 : 1) + (run.adapter ? 1 : 2);
  const double matmul = tokens * 2 * passes * L * (4 * C * C + 2 * C * inner) / rate / t * stage;
  const double attention = tokens * 12 * L * C * T * attn_recompute / m.attention_flops / t * stage;
  const auto bytes = run.plan.bytes_by_category();
  auto of = [&](Category cat) { return static_cast<double>(bytes[static_cast<int>(cat)]); };
  // The elementwise passes run over every activation a micro-step produces: what a run without
  // recomputation keeps, and with full recomputation the forward's share (a third) once more.
  double produced = of(Category::activations);
  if (o.gradient_checkpointing || o.selective_recompute) {
    TrainOptions kept = o;
    kept.gradient_checkpointing = kept.selective_recompute = false;
    kept.auto_find_batch_size = false;
    produced = static_cast<double>(
        assemble_run(kept, run.device, nullptr)
            ->plan.bytes_by_category()[static_cast<int>(Category::activations)]);
  }
  const double activations =
      k * 3 * produced * (o.gradient_checkpointing ? 4.0 / 3.0 : 1.0) / m.elementwise;
  // The optimizer pass over the model states where they are (offloaded: the master, the state
  // and the gradients' copy in host memory), and that copy's bytes down and as many of the
  // master's up. Without offload no model state is in host memory. With adapters it steps the
  // trained weights alone, not the frozen base beside them.
  const double trained =
      run.adapter ? 4.0 * static_cast<double>(run.model->params().trained_run().elements.count) : 0;
  auto states = [&](Placement where) {
    const auto by = run.plan.bytes_by_category(where);
    double sum = 0;
    for (Category cat : {Category::master_weights, Category::gradients, Category::optimizer_state})
      sum += static_cast<double>(by[static_cast<int>(cat)]);
    const auto weights = static_cast<double>(by[static_cast<int>(Category::weights)]);
    return sum + (!run.adapter ? weights : where == Placement::device ? trained : 0);
  };
  const double moved = static_cast<double>(
      run.plan.bytes_by_category(Placement::host)[static_cast<int>(Category::gradients)]);
  const double optimizer = 2 * states(Placement::device) / m.bandwidth +
                           2 * states(Placement::host) / m.host_bandwidth + 2 * moved / m.host_link;
  // A frozen base's stored linears widened into their float32 slots, forward and backward: a
  // streaming pass (read the stored bytes, write float32) at the device's bandwidth.
  const double widened = run.quantized
                             ? static_cast<double>(run.quantized->quantized_elements()) *
                                   (4 + (o.load_in_4bit ? 0.5 : 2.0)) * 2 * k / m.bandwidth
                             : 0;
  return matmul + attention + k * L * m.layer_overhead * stage +
         activations * (p > 1 ? 4.0 / 3.0 : 1.0) + optimizer + widened +
         communication_seconds(run, m);
}

namespace {
// Whether `config` splits into `tp` tensor shares, `sp` sequence shares of `seq` tokens (with
// `sliced`, Megatron's sequence parallelism, each again into tp slices) and `pp` stages (the
// shares refuse counts the degrees do not divide).
bool splits(const ModelConfig& config, int tp, int pp, int sp, int64_t seq, bool sliced) {
  try {
    const ModelConfig share = tp > 1 ? tensor_parallel_share(config, 0, tp) : config;
    if (sp > 1) sequence_parallel_share(share, 0, sp);
    if (pp > 1) pipeline_share(config, 0, pp);
    return seq % (sp * (sliced ? tp : 1)) == 0;
  } catch (const Error&) {
    return false;
  }
}

// o's own layout for one process's search; for `world` ranks every tensor-parallel degree,
// pipeline depth and sequence-parallel degree the model's counts (and the length) allow,
// with each ZeRO stage where there are several replicas (data and sequence ranks).
std::vector<ParallelLayout> layouts(const TrainOptions& o, int world) {
  if (world <= 1) return {parallel_layout(o, 0)};
  const ModelConfig config = resolve_config(o.model_name_or_path);
  std::vector<ParallelLayout> out;
  for (int tp = 1; tp <= world; ++tp)
    for (int pp = 1; tp * pp <= world; ++pp)
      for (int sp = 1; tp * pp * sp <= world; ++sp) {
        const int model = tp * pp * sp;
        if (world % model || !splits(config, tp, pp, sp, o.seq_len, o.tp_sequence_parallel))
          continue;
        // Expert parallelism (the options' degree) goes with data parallelism alone.
        if (o.ep_size > 1 && (model > 1 || (world / model) % o.ep_size)) continue;
        ParallelDegrees d{tp, pp, sp, o.ep_size, 0, o.tp_sequence_parallel, {}};
        const int replicas = ParallelLayout(world, d).replicas();
        for (d.zero_stage = 0; d.zero_stage <= (replicas == 1 ? 0 : 3); ++d.zero_stage)
          out.emplace_back(world, d);
      }
  return out;
}

}  // namespace

std::string method_of(const TrainOptions& o) {
  return o.load_in_4bit ? "qlora" : o.use_peft || !o.adapter_name_or_path.empty() ? "lora" : "full";
}

namespace {
// o fine-tuned by `method`: the LoRA and 4-bit options it does not use back at their defaults.
TrainOptions with_method(TrainOptions t, const std::string& method) {
  BRISK_CHECK(method == "full" || method == "lora" || method == "qlora", "unknown method \"",
              excerpt(method), "\" in fit_methods (valid: full, lora, qlora)");
  BRISK_CHECK(method != "full" || t.adapter_name_or_path.empty(),
              "fit_methods: full fine-tuning beside --adapter_name_or_path (an adapter trains on a "
              "frozen base): drop one of them");
  const TrainOptions d;
  if (method == "full") {
    t.lora_r = d.lora_r;
    t.lora_alpha = d.lora_alpha;
    t.lora_dropout = d.lora_dropout;
    t.lora_target_modules = d.lora_target_modules;
    t.lora_modules_to_save = d.lora_modules_to_save;
    t.use_rslora = d.use_rslora;
  }
  if (method != "qlora") {
    t.bnb_4bit_quant_type = d.bnb_4bit_quant_type;
    t.use_bnb_nested_quant = d.use_bnb_nested_quant;
  }
  t.use_peft = method != "full" && t.adapter_name_or_path.empty();
  t.load_in_4bit = method == "qlora";
  return t;
}
}  // namespace

int64_t global_batch(const TrainOptions& o, int world) {
  const char* what = "the global batch";
  const int64_t all =
      checked_mul(checked_mul(o.per_device_train_batch_size, o.gradient_accumulation_steps, what),
                  int64_t{std::max(1, world)}, what);
  const ParallelLayout layout = parallel_layout(o, world);
  return all / layout.degree(MeshDim::tensor) / layout.degree(MeshDim::pipeline) /
         layout.degree(MeshDim::sequence);
}

namespace {
// What one search holds fixed: the budget, the global batch and the data's samples.
struct SearchScope {
  Device device;
  const MemoryBudget& budget;
  CostModel model;
  int64_t global = 0, samples = 0;
};

// `tuned` (a method, precision and optimizer chosen) under `layout`: every recomputation and
// per-device batch of the global batch, those that fit into `out`, the others counted.
void search_layout(const TrainOptions& tuned, const ParallelLayout& layout, const SearchScope& s,
                   std::vector<FitCandidate>& out, int& refused) {
  const int data_ranks = layout.degree(MeshDim::data);
  for (int recompute = 0; recompute < 3; ++recompute)  // none, selective, full
    for (int64_t b = 1; b <= std::min(s.global / data_ranks, s.samples); ++b) {
      if (s.global % (b * data_ranks)) continue;
      TrainOptions t = tuned;
      t.tp_size = layout.degree(MeshDim::tensor);
      t.pp_size = layout.degree(MeshDim::pipeline);
      t.sp_size = layout.degree(MeshDim::sequence);
      t.zero_stage = layout.zero_stage();
      t.per_device_train_batch_size = b;
      t.gradient_accumulation_steps = s.global / (b * data_ranks);
      t.gradient_checkpointing = recompute == 2;
      t.selective_recompute = recompute == 1;
      t.auto_find_batch_size = false;
      validate_options(t);  // a precision or optimizer of the lists may not go with the rest
      size_t needed = 0;
      std::unique_ptr<RunAssembly> run;
      try {
        run = plan_stages(t, s.device, nullptr, layout, s.budget, needed);
      } catch (const Error&) {
        // Adapters under tensor parallelism take no dropout on a row-parallel linear (not built):
        // such a layout is no candidate.
        if (!t.use_peft || t.tp_size == 1 || t.lora_dropout == 0) throw;
        ++refused;
        return;
      }
      if (needed > s.budget.budget) {
        ++refused;
        continue;
      }
      out.push_back({t, layout, data_ranks, needed, predicted_step_seconds(*run, s.model),
                     run->plan.bytes_by_category(), run->plan.overlaid_bytes()});
    }
}

// o with `precision` ("fp32", "bf16", "fp16", "tf32"), refusing another name.
TrainOptions with_precision(TrainOptions t, const std::string& precision) {
  BRISK_CHECK(
      precision == "fp32" || precision == "bf16" || precision == "fp16" || precision == "tf32",
      "unknown precision \"", excerpt(precision),
      "\" in fit_precisions (valid: fp32, tf32, bf16, fp16)");
  t.bf16 = precision == "bf16";
  t.fp16 = precision == "fp16";
  t.tf32 = precision == "tf32";
  return t;
}
}  // namespace

std::vector<FitCandidate> fit_search(const TrainOptions& o, Device device,
                                     const MemoryBudget& budget, const FitChoices& choices,
                                     int* rejected, int world) {
  SearchScope scope{device, budget, cost_model(device), global_batch(o, world), 0};
  TrainOptions one = o;
  one.per_device_train_batch_size = 1;
  one.gradient_accumulation_steps = scope.global;
  scope.samples = assemble_run(one, device, nullptr)->data->size();
  std::vector<FitCandidate> out;
  int refused = 0;
  const std::vector<ParallelLayout> all = layouts(o, world);
  for (const std::string& method : choices.methods)
    for (const std::string& precision : choices.precisions)
      for (const std::string& optim : choices.optims) {
        TrainOptions t = with_precision(with_method(o, method), precision);
        t.optim = optim;
        for (const ParallelLayout& layout : all)
          if (method == "full" ||
              !adapters_unbuilt_with(layout, layout.zero_stage(), t.load_in_4bit))
            search_layout(t, layout, scope, out, refused);
      }
  std::stable_sort(out.begin(), out.end(), [](const FitCandidate& a, const FitCandidate& b) {
    return a.step_seconds < b.step_seconds;
  });
  if (rejected) *rejected = refused;
  return out;
}

}  // namespace brisk
