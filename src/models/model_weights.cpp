// A model's weights written: initialized as transformers initializes them, loaded from
// safetensors files by transformers' names (a packed tensor's part, an alias, a base model's
// file), and named views of a flat buffer for saving.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "backend/device_traits.h"
#include "core/checked.h"
#include "core/random_init.h"
#include "models/expert_weights.h"
#include "models/model.h"

namespace brisk {

float Model::init_std(const std::string& name) const {
  const auto& src = config_.source;
  return src.contains("initializer_range") && src["initializer_range"].is_number()
             ? src["initializer_range"].get<float>()
             : 0.02f;
}

// Parameter by parameter in declaration order from one generator, written where the weights
// live piece by piece (no whole host copy of a model on a GPU).
// Each parameter's normal values are their own counter-based stream (core/random_init.h), so the
// init runs on every thread and does not depend on how the weights are staged.
void Model::init_weights(Backend& be, uint64_t seed) {
  for (size_t i = 0; i < params_.list().size(); ++i) {
    const ParamInfo& p = params_.list()[i];
    const bool bias = p.name.ends_with(".bias");
    const bool is_norm = !p.decay && !bias;
    const float stddev = init_std(p.name);
    write_in_pieces(be, params_.weight(static_cast<int>(i)), [&](const Tensor& piece, int64_t at) {
      float* x = piece.f32();
      const int64_t n = piece.numel();
      if (bias || is_norm)
        std::fill(x, x + n, bias ? 0.0f : 1.0f);
      else  // a split parameter's share draws its places' values in the full one
        for_each_split_run(p, at, n, [&](int64_t local, int64_t full, int64_t length) {
          fill_normal(seed, static_cast<uint32_t>(p.stream >= 0 ? p.stream : static_cast<int>(i)),
                      full, length, stddev, x + (local - at));
        });
    });
    if (static_cast<int>(i) == padded_embedding_) {  // the padding id's row, where held
      const Tensor table = params_.weight(padded_embedding_);
      const int64_t C = table.dim(1), row = config_.pad_token_id - vocab_shard().first;
      if (row >= 0 && row < table.dim(0)) be.fill(element_range(table, row * C, C), 0.0f);
    }
    init_extra(be, static_cast<int>(i));
    init_adapter(be, i, seed);
    clear_padding(be, static_cast<int>(i));
    written(i);  // staged weights: its segment's place may be overwritten after this
  }
  written_all();
}

void Model::also_packed_in(int param, const std::string& name, Shape shape, int64_t first) {
  if (param >= 0) packed_[param] = {name, std::move(shape), first};
}

void Model::also_named(int param, const std::string& name) {
  if (param >= 0) aliases_[param] = name;
}

void Model::load_weights(Backend& be, const WeightFiles& file) {
  check_expert_tensors(config_, file);  // before a missing expert is named in another layout
  for (size_t i = 0; i < params_.list().size(); ++i)
    BRISK_CHECK(adapter_param(i) || !weight_source(file, i).name.empty(), "weights file '",
                file.path(), "' lacks parameter '", params_.list()[i].name, "' of the ",
                config_.type_name(), " model");
  load_pretrained(be, file, 0);  // every parameter is present: nothing is initialized
}

Model::WeightSource Model::weight_source(const WeightFiles& file, size_t i) const {
  const ParamInfo& p = params_.list()[i];
  const std::string prefix = base_prefix();
  if (file.has(p.name)) return {p.name};
  if (p.name.rfind(prefix, 0) == 0 && file.has(p.name.substr(prefix.size())))
    return {p.name.substr(prefix.size())};
  const auto alias = aliases_.find(static_cast<int>(i));
  if (alias != aliases_.end() && file.has(alias->second)) return {alias->second};
  const auto packed = packed_.find(static_cast<int>(i));
  if (packed == packed_.end() || !file.has(packed->second.name)) return {};
  const PackedSource& s = packed->second;
  BRISK_CHECK(!file.bnb_4bit(s.name), "tensor '", s.name, "' in '", file.file_of(s.name).path(),
              "' is 4-bit; brisk reads 4-bit weights of linears only");
  BRISK_CHECK(file.get(s.name).shape() == s.shape, "tensor '", s.name, "' in '",
              file.file_of(s.name).path(), "': shape ", file.get(s.name).shape().str(), " where ",
              s.shape.str(), " is expected");
  return {s.name, s.first, true};
}

namespace {
// A 4-bit weight's values (core/bnb_weights.h) in the model's layout: a linear the blocks store
// transposed (GPT-2's Conv1D) is quantized as [out, in], and turned back. Its shape in `shape`.
std::vector<float> dequantized(const WeightFiles& file, const std::string& name, bool transposed,
                               Shape& shape) {
  const Bnb4bitWeight& w = *file.bnb_4bit(name);
  std::vector<float> values(static_cast<size_t>(w.layout.numel));
  dequantize_bnb_4bit(name, w, values.data());
  shape = w.shape;
  if (!transposed || w.shape.rank() != 2) return values;
  const int64_t rows = w.shape[0], cols = w.shape[1];
  std::vector<float> turned(values.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) turned[c * rows + r] = values[r * cols + c];
  shape = Shape{cols, rows};
  return turned;
}
}  // namespace

Shape Model::source_shape(const WeightFiles& file, const std::string& name, size_t param) const {
  const Bnb4bitWeight* w = file.bnb_4bit(name);
  if (!w) return file.get(name).shape();
  if (!stored_transposed(param) || w->shape.rank() != 2) return w->shape;
  return Shape{w->shape[1], w->shape[0]};
}

bool Model::stored_transposed(size_t param) const {
  if (!blocks_store_linears_transposed()) return false;
  for (const LinearDecl& l : linears())
    if (l.param == static_cast<int>(param)) return l.fan_in_fan_out;
  return false;
}

std::vector<std::string> Model::load_pretrained(Backend& be, const WeightFiles& file, uint64_t seed,
                                                bool ignore_mismatched_sizes) {
  check_expert_tensors(config_, file);
  const std::string prefix = base_prefix();
  // Each parameter's tensor in the file; no name where the file does not give it.
  std::vector<WeightSource> source(params_.list().size());
  std::vector<std::string> missing;
  for (size_t i = 0; i < params_.list().size(); ++i) {
    const ParamInfo& p = params_.list()[i];
    const bool in_base = p.name.rfind(prefix, 0) == 0 && !adapter_param(i);
    source[i] = weight_source(file, i);
    const std::string& name = source[i].name;
    if (!name.empty() && !source[i].packed && source_shape(file, name, i) != p.full_shape()) {
      BRISK_CHECK(ignore_mismatched_sizes, "parameter '", name, "' in '", file.file_of(name).path(),
                  "': shape ", source_shape(file, name, i).str(), " where ", p.full_shape().str(),
                  " is expected (--ignore_mismatched_sizes initializes it anew)");
      source[i] = {};
    } else if (name.empty()) {
      BRISK_CHECK(!in_base, "weights file '", file.path(), "' lacks parameter '", p.name,
                  "' of the ", config_.type_name(), " model");
    }
    if (source[i].name.empty()) missing.push_back(p.name);
  }
  // What the file does not give keeps its init: the adapters' alone, where only they are missing
  // (as PEFT's own init; they are not reported).
  const auto adapter_count =
      static_cast<size_t>(std::count_if(missing.begin(), missing.end(), [&](const std::string& n) {
        return adapter_param(static_cast<size_t>(params_.index(n)));
      }));
  if (missing.size() > adapter_count)
    init_weights(be, seed);
  else
    for (size_t i = 0; adapter_count > 0 && i < params_.list().size(); ++i)
      init_adapter(be, i, seed);
  // Staged weights: a segment the file gives in part is first gathered, with its
  // initialized values, into its place, which other segments have overwritten since.
  const bool gathered = weight_source_ && staged_weights();
  std::vector<bool> partial(segments_.size(), false);
  if (gathered)
    for (const std::string& name : missing)
      partial[static_cast<size_t>(segment_of(params_.list()[params_.index(name)].offset))] = true;
  for (size_t i = 0; i < params_.list().size(); ++i) {
    const ParamInfo& p = params_.list()[i];
    if (gathered) {  // at a partial segment's first parameter
      const int segment = segment_of(p.offset);
      if (partial[static_cast<size_t>(segment)] &&
          p.offset == segments_[static_cast<size_t>(segment)].offset)
        weight_source_->need(segment);
    }
    const std::string& name = source[i].name;
    if (name.empty()) {
      written(i);
      continue;
    }
    const int64_t from = source[i].first;  // within a packed tensor
    // A 4-bit weight: its values dequantized on the host, one parameter at a time.
    const bool quantized = file.bnb_4bit(name) != nullptr;
    Shape shape;
    const std::vector<float> values =
        quantized ? dequantized(file, name, stored_transposed(i), shape) : std::vector<float>();
    const Tensor host(const_cast<float*>(values.data()), shape, DType::f32, Device::cpu);
    const Tensor& src = quantized ? host : file.get(name);
    const SafetensorsFile& holder = file.file_of(name);
    const std::string what = "parameter '" + name + "' in '" + holder.path() + "'";
    // In 8 MiB ranges, each released once copied: the file's pages and the weights they fill
    // are never both resident in whole.
    write_in_pieces(
        be, params_.weight(static_cast<int>(i)), [&](const Tensor& piece, int64_t first) {
          constexpr int64_t kRange = int64_t{2} << 20;  // elements
          for (int64_t at = 0; at < piece.numel(); at += kRange) {
            const int64_t n = std::min(kRange, piece.numel() - at);
            // A split parameter's share: its runs' places in the full one.
            for_each_split_run(p, first + at, n, [&](int64_t local, int64_t full, int64_t length) {
              const Tensor part = element_range(src, from + full, length);
              copy_to_f32(part, element_range(piece, local - first, length), what);
              if (!quantized) holder.release(part);
            });
          }
        });
    clear_padding(be, static_cast<int>(i));
    written(i);
  }
  written_all();
  std::erase_if(missing, [&](const std::string& n) {
    return adapter_param(static_cast<size_t>(params_.index(n)));
  });
  std::sort(missing.begin(), missing.end());
  return missing;
}

std::vector<std::pair<std::string, Tensor>> Model::named_views(const Tensor& flat) const {
  BRISK_CHECK(flat.numel() == params_.total_elements(), "a flat buffer of ", flat.numel(),
              " values does not hold the model's ", params_.total_elements(), " parameters");
  std::vector<std::pair<std::string, Tensor>> out;
  for (const ParamInfo& p : params_.list())
    out.emplace_back(p.name, Tensor(flat.f32() + p.offset, p.shape, DType::f32, flat.device()));
  return out;
}

}  // namespace brisk
