// brisk subcommands: train, forward-backward, estimate.
#include "cli/commands.h"

#include <cstdio>
#include <iostream>

#include "backend/backend.h"
#include "core/safetensors.h"
#include "models/batch.h"
#include "models/model.h"
#include "optim/optimizer.h"
#include "precision/mixed_precision.h"

namespace brisk::cli {

namespace {
std::string mib(size_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  return buf;
}

void print_plan(const std::array<size_t, kNumCategories>& planned, size_t total) {
  for (int c = 0; c < kNumCategories; ++c)
    std::printf("  %-16s %12s\n", category_name(static_cast<Category>(c)), mib(planned[c]).c_str());
  std::printf("  %-16s %12s\n", "total (planned)", mib(total).c_str());
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

int run_train(const TrainOptions& options) {
  TrainSummary s =
      train(options, [](const nlohmann::json& log) { std::cout << log.dump() << std::endl; });
  std::printf("***** train metrics *****\n");
  std::printf("  %-26s = %.1f\n", "epoch", s.epoch);
  std::printf("  %-26s = %.4f\n", "train_loss", s.train_loss);
  std::printf("  %-26s = %.2f\n", "train_runtime", s.train_runtime);
  std::printf("  %-26s = %.3f\n", "train_samples_per_second", s.train_samples_per_second);
  std::printf("  %-26s = %.3f\n", "train_steps_per_second", s.train_steps_per_second);
  std::printf("  %-26s = %.4g\n", "total_flos", s.total_flos);
  std::printf("***** memory anatomy *****\n");
  print_plan(s.memory.planned, s.memory.arena_bytes);
  std::printf("  %-16s %12s\n", "arena high-water", mib(s.memory.arena_high_water).c_str());
  std::printf("  %-16s %12s\n", "process peak", mib(s.memory.peak_rss).c_str());
  std::printf("  %-16s %12s\n", "  before arena", mib(s.memory.rss_before_arena).c_str());
  if (s.memory.device_memory_used >= 0) {
    std::printf("  %-16s %12s\n", "GPU memory occupied",
                mib(static_cast<size_t>(s.memory.device_memory_used)).c_str());
    std::printf("  %-16s %12s\n", "  before arena",
                mib(static_cast<size_t>(s.memory.device_memory_before_arena)).c_str());
  }
  if (!s.last_checkpoint.empty()) std::printf("saved %s\n", s.last_checkpoint.c_str());
  return 0;
}

int run_forward_backward(const ForwardBackwardArgs& a) {
  ModelConfig config = resolve_config(a.config);
  auto model = Model::create(config);
  auto be = make_cpu_backend();
  SafetensorsFile batch_file(a.batch);
  MemoryPlan plan;
  model->plan(plan, batch_shape_of(batch_file), {});
  plan.finalize();
  Arena arena(plan, Device::cpu);
  model->bind(arena);
  if (a.weights.empty())
    model->init_weights(*be, a.seed);
  else
    model->load_weights(*be, SafetensorsFile(a.weights));
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

int run_estimate(const EstimateArgs& a) {
  BRISK_CHECK(!(a.bf16 && a.fp16), "--fp16 and --bf16 contradict each other: choose one");
  OptimizerConfig oc;
  oc.name = a.optim;
  oc.args = a.optim_args;
  const std::unique_ptr<Optimizer> optimizer = make_optimizer(oc);
  ModelConfig config = resolve_config(a.model);
  auto model = Model::create(config);
  MixedPrecision precision(a.bf16   ? DType::bf16
                           : a.fp16 ? DType::f16
                                    : DType::f32,
                           a.bf16_master_weights);
  MemoryPlan plan;
  model->plan(plan, {a.batch_size, a.seq_len},
              {a.gradient_checkpointing, precision.compute_dtype()});
  const int64_t n = model->params().total_elements();
  BufferBinder binder;
  precision.plan(plan, binder, n);
  optimizer->plan(plan, binder, model->params());
  auto be = make_cpu_backend();
  be->set_matmul_dtype(a.bf16 ? DType::bf16 : DType::f32);
  be->plan_workspace(plan, binder, model->max_matmul_operand());
  plan.finalize();
  std::printf("%s: %lld parameters, batch %lld x %lld%s%s%s, %s\n", a.model.c_str(),
              static_cast<long long>(n), static_cast<long long>(a.batch_size),
              static_cast<long long>(a.seq_len),
              a.gradient_checkpointing ? ", gradient checkpointing" : "",
              a.bf16   ? ", bf16"
              : a.fp16 ? ", fp16"
                       : ", fp32",
              precision.enabled() && !precision.has_master() ? " without master weights" : "",
              optimizer->name().c_str());
  print_plan(plan.bytes_by_category(), plan.total_bytes());
  return 0;
}

}  // namespace brisk::cli
