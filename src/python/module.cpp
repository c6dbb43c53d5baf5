// brisk._brisk: the engine's actions for the Python package (python/brisk). Options, records and
// results cross as JSON text, which the package turns into Python values; the engine's refusals
// become brisk.BriskError (a ValueError) with the engine's one-line message.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "adapters/merge.h"
#include "core/error.h"
#include "core/switches.h"
#include "eval/generate.h"
#include "parallel/launch.h"
#include "tokenizer/encode_lines.h"
#include "tokenizer/tokenizer.h"
#include "train/estimate.h"
#include "train/options.h"
#include "train/trainer.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

// The options a JSON object of TrainingArguments names gives; caller_metrics: a compute_metrics
// adds metrics that metric_for_best_model may name. train and estimate validate them once, as
// they resolve the run.
brisk::TrainOptions options_of(const std::string& text, bool caller_metrics) {
  brisk::TrainOptions o;
  o.switches = brisk::read_switches();  // the measurement switches, read once for the call
  brisk::apply_options_json(o, nlohmann::json::parse(text), "TrainingArguments");
  o.caller_metrics = caller_metrics;
  return o;
}

// Every option's value (brisk's names) and the keys accepted without effect, validated.
std::string resolve_options(const std::string& text) {
  // (TrainingArguments do not know whether a Trainer will compute metrics of its own.)
  const brisk::TrainOptions o = options_of(text, true);
  brisk::validate_options(o);
  return nlohmann::json{{"options", brisk::options_to_json(o)}, {"ignored", o.ignored_keys}}.dump();
}

// A process a launcher started as one of several: the Python API runs one process only.
void refuse_launch() {
  const brisk::LaunchInfo launch = brisk::launch_info_from_env();
  BRISK_CHECK(launch.size <= 1, "this process is rank ", launch.rank, " of ", launch.size,
              ": the Python API runs one process; launch runs of several with the brisk "
              "program under mpirun or torchrun");
}

// Keeps a Python object alive while rows view its arrays; released holding the interpreter.
std::shared_ptr<const void> keep(nb::handle object) {
  return std::shared_ptr<const void>(new nb::object(nb::borrow(object)), [](const void* p) {
    nb::gil_scoped_acquire held;
    delete static_cast<const nb::object*>(p);
  });
}

// The array's elements where they lie: no conversion (a converted copy would not outlive this
// call), so an array of another dtype or layout is refused.
template <typename T>
std::span<const T> span_of(nb::handle array) {
  using Array = nb::ndarray<const T, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
  const auto a = nb::cast<Array>(array, /*convert=*/false);
  return {a.data(), a.shape(0)};
}

// A split's rows viewed in its NumPy arrays (the package makes them: offsets int64, ids int32,
// labels int32 or values float32, types int32), which stay alive as long as the rows.
brisk::TokenizedRows rows_of(nb::dict split) {
  brisk::TokenizedRows r;
  r.offsets = span_of<int64_t>(split["offsets"]);
  r.ids = span_of<int32_t>(split["ids"]);
  if (split.contains("labels")) r.labels = span_of<int32_t>(split["labels"]);
  if (split.contains("values")) r.values = span_of<float>(split["values"]);
  if (split.contains("types")) r.types = span_of<int32_t>(split["types"]);
  r.memory = keep(split);
  return r;
}

// The tokenized splits the package gives ({"train": {...}, "eval": ..., "test": ...}).
std::optional<brisk::TokenizedInput> tokenized_of(const std::optional<nb::dict>& splits) {
  if (!splits) return std::nullopt;
  brisk::TokenizedInput in;
  const std::pair<const char*, std::optional<brisk::TokenizedRows>*> parts[] = {
      {"train", &in.train}, {"eval", &in.eval}, {"test", &in.test}};
  for (const auto& [name, rows] : parts)
    if (splits->contains(name)) *rows = rows_of(nb::cast<nb::dict>((*splits)[name]));
  return in;
}

// `values` as a NumPy array of `shape` owning them.
template <typename T>
nb::object owned_array(std::vector<T>&& values, std::initializer_list<size_t> shape) {
  auto* held = new std::vector<T>(std::move(values));
  nb::capsule owner(held, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  return nb::cast(nb::ndarray<nb::numpy, T>(held->data(), shape.size(), shape.begin(), owner));
}

// An evaluated set's rows as NumPy arrays: the logits [rows, labels], and the rows' own labels
// as Trainer's label_ids (int64 class ids, -100 where a row has none, or float32 regression
// values; None where no row has one). (None, None) without rows.
nb::tuple rows_arrays(brisk::EvaluatedRows&& r) {
  const size_t rows = r.rows();
  if (rows == 0 || r.logits.empty() || r.logits.size() % rows != 0)
    return nb::make_tuple(nb::none(), nb::none());
  const size_t width = r.logits.size() / rows;
  nb::object logits = owned_array(std::move(r.logits), {rows, width});
  const bool any =
      std::any_of(r.targets.begin(), r.targets.end(), [](float t) { return !std::isnan(t); });
  if (!any) return nb::make_tuple(logits, nb::none());
  if (r.regression) return nb::make_tuple(logits, owned_array(std::move(r.targets), {rows}));
  std::vector<int64_t> ids(rows);
  std::transform(r.targets.begin(), r.targets.end(), ids.begin(),
                 [](float t) { return std::isnan(t) ? int64_t{-100} : static_cast<int64_t>(t); });
  return nb::make_tuple(logits, owned_array(std::move(ids), {rows}));
}

// Calls into Python from the engine's thread, holding the interpreter while they run. An
// interrupt (Ctrl-C) met in a callback or pending at a step's end ends the training after that
// step, as a callback's stop would; it is raised once the run has finished.
class PythonEvents {
 public:
  PythonEvents(nb::callable on_log, nb::callable on_save, nb::callable on_epoch_end,
               nb::callable on_step_end, nb::object evaluation_metrics)
      : on_log_(std::move(on_log)),
        on_save_(std::move(on_save)),
        on_epoch_end_(std::move(on_epoch_end)),
        on_step_end_(std::move(on_step_end)),
        evaluation_metrics_(std::move(evaluation_metrics)) {}

  brisk::LogSink log_sink() {
    return [this](const nlohmann::json& rec) { call([&] { on_log_(rec.dump()); }); };
  }
  brisk::StepEvents step_events() {
    brisk::StepEvents e;
    e.keep_predictions = true;  // predict() returns them
    if (!evaluation_metrics_.is_none())
      e.evaluation_metrics = [this](brisk::EvaluatedRows&& rows) {
        nlohmann::json metrics = nlohmann::json::object();
        call([&] {
          const nb::tuple arrays = rows_arrays(std::move(rows));
          metrics = nlohmann::json::parse(
              nb::cast<std::string>(evaluation_metrics_(arrays[0], arrays[1])));
        });
        return metrics;
      };
    e.on_save = [this](const std::string& checkpoint) { call([&] { on_save_(checkpoint); }); };
    e.on_epoch_end = [this](int64_t step) { call([&] { on_epoch_end_(step); }); };
    e.on_step_end = [this](int64_t step, int64_t max_steps) {
      bool stop = false;
      call([&] {
        if (PyErr_CheckSignals() != 0) throw nb::python_error();
        stop = nb::cast<bool>(on_step_end_(step, max_steps));
      });
      return stop || interrupt_.has_value();
    };
    return e;
  }
  // Raises the interrupt that ended the run, if one did.
  void raise_interrupt() {
    if (interrupt_) throw std::move(*interrupt_);
  }

 private:
  // Runs `f` holding the interpreter; an interrupt it raises is kept for the step's end, any
  // other Python error ends the run.
  template <typename F>
  void call(F&& f) {
    nb::gil_scoped_acquire held;
    try {
      f();
    } catch (nb::python_error& e) {
      if (!e.matches(PyExc_KeyboardInterrupt)) throw;
      if (!interrupt_) interrupt_.emplace(std::move(e));
    }
  }

  nb::callable on_log_, on_save_, on_epoch_end_, on_step_end_;
  nb::object evaluation_metrics_;  // a callable of logits and label_ids returning JSON; or None
  std::optional<nb::python_error> interrupt_;
};

// Runs `brisk train` on the options (JSON); returns the summary (train_results.json's keys, with
// eval_metrics and predict_metrics), the prediction set's logits and its label_ids (or None).
nb::tuple train(const std::string& text, const std::optional<nb::dict>& tokenized,
                nb::callable on_log, nb::callable on_save, nb::callable on_epoch_end,
                nb::callable on_step_end, nb::object evaluation_metrics) {
  const brisk::TrainOptions o = options_of(text, !evaluation_metrics.is_none());
  refuse_launch();
  const std::optional<brisk::TokenizedInput> rows = tokenized_of(tokenized);
  const brisk::GivenData given(rows ? &*rows : nullptr);
  PythonEvents events(std::move(on_log), std::move(on_save), std::move(on_epoch_end),
                      std::move(on_step_end), std::move(evaluation_metrics));
  const brisk::LogSink sink = events.log_sink();
  const brisk::StepEvents steps = events.step_events();
  brisk::TrainSummary s;
  {
    nb::gil_scoped_release released;
    s = brisk::train(o, sink, given, {}, nullptr, steps);
  }
  events.raise_interrupt();
  nlohmann::json j = brisk::summary_json(s);
  j["eval_metrics"] = s.eval_metrics;
  j["predict_metrics"] = s.predict_metrics;
  j["last_checkpoint"] = s.last_checkpoint;
  j["best_model_checkpoint"] = s.best_model_checkpoint;
  const nb::tuple predicted = rows_arrays(std::move(s.predicted));
  return nb::make_tuple(j.dump(), predicted[0], predicted[1]);
}

// `brisk estimate --output_json`'s JSON of the options' run (the plan is printed too).
std::string estimate(const std::string& text, const std::optional<nb::dict>& tokenized,
                     int64_t world_size) {
  const brisk::TrainOptions o = options_of(text, true);
  const std::optional<brisk::TokenizedInput> rows = tokenized_of(tokenized);
  brisk::EstimateArgs args;
  args.world_size = world_size;
  args.tokenized = rows ? &*rows : nullptr;
  nb::gil_scoped_release released;
  const brisk::Estimate e = brisk::plan_estimate(o, args);
  brisk::print_estimate(e);
  return brisk::estimate_json(e).dump();
}

std::vector<std::vector<int32_t>> tokenize(const std::string& tokenizer,
                                           const std::vector<std::string>& texts,
                                           bool add_special_tokens,
                                           const std::string& pair_separator) {
  nb::gil_scoped_release released;
  const std::unique_ptr<brisk::Tokenizer> tok = brisk::Tokenizer::load(tokenizer);
  return brisk::encode_lines(*tok, {add_special_tokens, pair_separator}, texts);
}

// `brisk generate`'s continuation: {"text", "prompt_ids", "new_ids", "seconds", ...}.
std::string generate(const std::string& text) {
  const nlohmann::json j = nlohmann::json::parse(text);
  brisk::GenerateOptions g;
  g.switches = brisk::read_switches();
  g.model_name_or_path = j.at("model").get<std::string>();
  g.prompt = j.at("prompt").get<std::string>();
  g.max_new_tokens = j.value("max_new_tokens", g.max_new_tokens);
  g.do_sample = j.value("do_sample", g.do_sample);
  g.temperature = j.value("temperature", g.temperature);
  g.top_k = j.value("top_k", g.top_k);
  g.top_p = j.value("top_p", g.top_p);
  g.seed = j.value("seed", g.seed);
  g.device = j.value("device", g.device);
  const std::string adapter = j.value("adapter", std::string());
  if (!adapter.empty())
    g.adjust_weights = [adapter](brisk::Backend& be, const brisk::Model& model) {
      brisk::merge_adapter_into(be, model, adapter, "adapter_name_or_path");
    };
  brisk::Generation out;
  {
    nb::gil_scoped_release released;
    out = brisk::generate(g);
  }
  return nlohmann::json{{"text", out.text},
                        {"prompt_ids", out.prompt_ids},
                        {"new_ids", out.new_ids},
                        {"seconds", out.seconds},
                        {"planned_bytes", out.planned_bytes},
                        {"stopped_at_eos", out.stopped_at_eos}}
      .dump();
}

}  // namespace

NB_MODULE(_brisk, m) {
  m.doc() = "brisk's engine (use the brisk package's Trainer and functions)";
  nb::exception<brisk::Error>(m, "BriskError", PyExc_ValueError);
  m.def("resolve_options", &resolve_options, "options_json"_a);
  m.def("train", &train, "options_json"_a, "tokenized"_a.none(), "on_log"_a, "on_save"_a,
        "on_epoch_end"_a, "on_step_end"_a, "evaluation_metrics"_a.none() = nb::none());
  m.def("estimate", &estimate, "options_json"_a, "tokenized"_a.none(), "world_size"_a = 1);
  m.def("tokenize", &tokenize, "tokenizer"_a, "texts"_a, "add_special_tokens"_a = true,
        "pair_separator"_a = "");
  m.def("generate", &generate, "options_json"_a);
}
