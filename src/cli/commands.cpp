// brisk subcommands: train, forward-backward, estimate.
#include "cli/commands.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <vector>

#include "adapters/attach.h"
#include "backend/backend.h"
#include "core/clock.h"
#include "core/input_file.h"
#include "core/json_file.h"
#include "core/safetensors.h"
#include "models/batch.h"
#include "models/model.h"
#include "optim/optimizer.h"
#include "parallel/communicator.h"
#include "precision/mixed_precision.h"
#include "tokenizer/encode_lines.h"
#include "tokenizer/tokenizer.h"
#include "train/assembly.h"
#include "train/deepspeed.h"
#include "train/options.h"

namespace brisk::cli {
namespace fs = std::filesystem;

namespace {
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
  const fs::path adapter(a.adapter);
  if (!a.adapter.empty()) {
    const std::string path = (adapter / "adapter_config.json").string();
    attach_lora(
        *model,
        lora_for_task(read_adapter_config(read_json_file(path, "adapter config"), path), *model));
  }
  auto be = make_cpu_backend(a.switches);
  SafetensorsFile batch_file(a.batch);
  MemoryPlan plan;
  const BatchShape shape = batch_shape_of(batch_file);
  PlanOptions options;
  switch_paths(options, device_traits(Device::cpu), a.switches);
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
  if (!a.adapter.empty())
    load_adapter(*be, *model, SafetensorsFile((adapter / "adapter_model.safetensors").string()));
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
    // (An adapter's gradients laid out as PEFT's file lays the tensors.)
    const ParameterSet& ps = model->params();
    std::vector<std::vector<float>> laid;
    laid.reserve(ps.list().size());
    for (size_t i = 0; i < ps.list().size(); ++i) {  // a frozen parameter has none
      if (ps.list()[i].frozen) continue;
      const auto id = static_cast<int>(i);
      std::vector<float>& v = laid.emplace_back(static_cast<size_t>(ps.grad(id).numel()));
      const Shape shape = to_peft_layout(*model, id, ps.grad(id).f32(), v.data());
      out.emplace_back("grad." + ps.list()[i].name, Tensor(v.data(), shape, DType::f32));
    }
    write_safetensors(a.output, out);
  }
  return 0;
}

int run_estimate(const TrainOptions& options, const EstimateArgs& args) {
  const Estimate e = plan_estimate(options, args);
  print_estimate(e);
  write_estimate_files(e, args);
  return 0;
}

namespace {
// Lines are read in chunks and encoded in parallel (encode_lines), printed in order.
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
    ids = encode_lines(*tok, {a.add_special_tokens, a.pair_separator}, lines, total_lines);
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
