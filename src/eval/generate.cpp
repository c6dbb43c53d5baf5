// brisk generate (see generate.h).
#include "eval/generate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>

#include "backend/backend.h"
#include "backend/device_traits.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/rng.h"
#include "core/safetensors.h"
#include "models/config.h"
#include "models/decoder.h"
#include "models/model.h"
#include "tokenizer/tokenizer.h"

namespace brisk {

namespace fs = std::filesystem;

void validate_generate_options(const GenerateOptions& o) {
  BRISK_CHECK(o.max_new_tokens >= 1, "max_new_tokens must be at least 1, got ", o.max_new_tokens);
  BRISK_CHECK(std::isfinite(o.temperature) && o.temperature > 0,
              "temperature must be a positive number, got ", o.temperature);
  BRISK_CHECK(o.top_k >= 0, "top_k must be 0 (off) or positive, got ", o.top_k);
  BRISK_CHECK(o.top_p > 0 && o.top_p <= 1, "top_p must lie in (0, 1], got ", o.top_p);
  BRISK_CHECK(!o.prompt.empty(), "the prompt is empty");
}

int32_t next_token(const float* logits, int64_t V, const GenerateOptions& o, double uniform,
                   std::vector<std::pair<float, int32_t>>& work) {
  if (!o.do_sample) return static_cast<int32_t>(std::max_element(logits, logits + V) - logits);
  work.resize(static_cast<size_t>(V));
  for (int64_t i = 0; i < V; ++i)
    work[i] = {static_cast<float>(logits[i] / o.temperature), static_cast<int32_t>(i)};
  // Most likely first; equal scores by id, so the order (and the draw) is reproducible.
  auto more_likely = [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  const int64_t k = o.top_k > 0 ? std::min<int64_t>(o.top_k, V) : V;
  std::partial_sort(work.begin(), work.begin() + k, work.end(), more_likely);
  work.resize(static_cast<size_t>(k));
  const float top = work[0].first;
  double sum = 0;
  for (auto& [score, id] : work) sum += std::exp(static_cast<double>(score - top));
  // top_p: keep a token while the probability of the more likely ones is below top_p.
  double before = 0, kept = 0;
  size_t n = 0;
  for (; n < work.size(); ++n) {
    if (n > 0 && before >= o.top_p) break;
    const double p = std::exp(static_cast<double>(work[n].first - top)) / sum;
    before += p;
    kept += p;
  }
  double target = uniform * kept;
  for (size_t i = 0; i < n; ++i) {
    target -= std::exp(static_cast<double>(work[i].first - top)) / sum;
    if (target < 0) return work[i].second;
  }
  return work[n - 1].second;
}

namespace {
// The config's end-of-sequence ids (a number or a list; none when absent or null).
std::vector<int64_t> eos_ids(const ModelConfig& c) {
  std::vector<int64_t> ids;
  const nlohmann::json e = c.source.value("eos_token_id", nlohmann::json());
  if (e.is_number_integer()) ids.push_back(e.get<int64_t>());
  if (e.is_array())
    for (const auto& v : e)
      if (v.is_number_integer()) ids.push_back(v.get<int64_t>());
  return ids;
}
}  // namespace

Generation generate(const GenerateOptions& o) {
  validate_generate_options(o);
  const ModelConfig config = resolve_config(o.model_name_or_path);
  const std::string weights = fs::is_directory(o.model_name_or_path)
                                  ? WeightFiles::find_in_folder(o.model_name_or_path)
                                  : std::string();
  BRISK_CHECK(!weights.empty(), "'", o.model_name_or_path,
              "' is not a model folder with model.safetensors (or its sharded index)");
  const std::unique_ptr<Tokenizer> tok = Tokenizer::load(o.model_name_or_path);
  Generation g;
  g.prompt_ids = tok->encode(o.prompt, std::nullopt, 0).ids;
  BRISK_CHECK(!g.prompt_ids.empty(), "the prompt encodes to no tokens");

  std::unique_ptr<Model> model = Model::create(config);
  const int64_t prompt = static_cast<int64_t>(g.prompt_ids.size());
  BRISK_CHECK(
      prompt < config.max_position_embeddings, "the prompt's ", prompt,
      " tokens leave no room in max_position_embeddings = ", config.max_position_embeddings);
  // The context ends the generation; a larger max_new_tokens (up to 2^63 - 1) is clamped first,
  // so the sum cannot overflow.
  const int64_t max_tokens =
      prompt + std::min<int64_t>(o.max_new_tokens, config.max_position_embeddings - prompt);
  const Device device = device_named(o.device);
  auto be = make_backend(device, o.switches);
  MemoryPlan plan;
  BufferBinder binder;
  PlanOptions weights_only;
  weights_only.device = device;
  weights_only.weights_only = true;
  // Planned for the whole sequence: what depends on the length (rotary tables) covers it.
  model->plan(plan, {1, max_tokens}, weights_only);
  Decoder decoder(*model, max_tokens, prompt);
  decoder.plan(plan, binder);
  plan.finalize();
  g.planned_bytes = plan.total_bytes();
  Arena arena(plan, be->device_memory(), be->staging_memory());
  model->bind(arena);
  binder.bind(arena);
  const std::vector<std::string> fresh = model->load_pretrained(*be, WeightFiles(weights), o.seed);
  BRISK_CHECK(fresh.empty(), "'", weights, "' lacks ", fresh.size(),
              " of the model's weights (the first: ", fresh.empty() ? "" : fresh[0], ")");
  if (o.adjust_weights) o.adjust_weights(*be, *model);

  const std::vector<int64_t> eos = eos_ids(config);
  std::vector<std::pair<float, int32_t>> work;
  const auto start = std::chrono::steady_clock::now();
  const float* logits = decoder.feed(*be, g.prompt_ids);
  // Prompt and continuation together stay within the context (max_tokens).
  for (int64_t step = 0; prompt + step < max_tokens; ++step) {
    // A uniform draw per step from the counter-based generator: reproducible from the seed.
    const uint32_t bits = rng_block(RngKey{o.seed, static_cast<uint64_t>(step), 0x9e11}, 0).v[0];
    const int32_t id =
        next_token(logits, config.vocab_size, o, static_cast<double>(bits) / 4294967296.0, work);
    g.new_ids.push_back(id);
    if (std::find(eos.begin(), eos.end(), id) != eos.end()) {
      g.stopped_at_eos = true;
      break;
    }
    if (prompt + step + 1 < max_tokens) logits = decoder.feed(*be, {id});
  }
  g.seconds = seconds_since(start);
  std::vector<int32_t> all = g.prompt_ids;
  all.insert(all.end(), g.new_ids.begin(), g.new_ids.end());
  g.text = tok->decode(all);
  return g;
}

}  // namespace brisk
