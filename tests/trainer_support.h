// Helpers shared by the trainer tests on the CPU (test_trainer.cpp) and the GPU (test_cuda.cpp):
// tiny model configs and short runs' options (temporary folders: test_support.h's TempDir).
#pragma once

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/safetensors.h"
#include "data/dataset.h"
#include "models/model.h"
#include "test_support.h"
#include "train/options.h"

namespace brisk::testing {

// Tiny models with vocabulary 128 (the synthetic ids are 100..127), dropout as given, of `layers`
// blocks (ZeRO stages five in two slots).
inline std::string write_config(const TempDir& dir, const std::string& type, double dropout,
                                int layers = 2) {
  nlohmann::json j;
  if (type == "bert")
    j = {{"model_type", "bert"},
         {"vocab_size", 128},
         {"hidden_size", 32},
         {"num_hidden_layers", layers},
         {"num_attention_heads", 2},
         {"intermediate_size", 48},
         {"max_position_embeddings", 64},
         {"hidden_dropout_prob", dropout},
         {"attention_probs_dropout_prob", dropout}};
  else
    j = {{"model_type", "gpt2"},   {"vocab_size", 128},     {"n_embd", 32},
         {"n_layer", layers},      {"n_head", 2},           {"n_positions", 64},
         {"resid_pdrop", dropout}, {"embd_pdrop", dropout}, {"attn_pdrop", dropout}};
  const std::string folder = dir / (type + "_model");
  std::filesystem::create_directories(folder);
  std::ofstream(folder + "/config.json") << j.dump();
  return folder;
}

// A model folder `name` under dir holding config.json = `config` (JSON text); returns its path.
inline std::string write_model_folder(const TempDir& dir, const std::string& name,
                                      const std::string& config) {
  const std::string folder = dir / name;
  std::filesystem::create_directories(folder);
  std::ofstream(folder + "/config.json") << config;
  return folder;
}

// A tiny Mixtral under dir/mixtral (vocabulary 128, 2 layers of 16, `experts` experts of 8, top
// 2); `extra`: more config members (JSON text after a comma, e.g. "\"output_router_logits\":
// true").
inline std::string write_tiny_mixtral(const TempDir& dir, const std::string& extra = "",
                                      int experts = 3) {
  return write_model_folder(
      dir, "mixtral",
      R"({"model_type": "mixtral", "vocab_size": 128, "hidden_size": 16, "intermediate_size": 8,
          "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
          "num_experts_per_tok": 2, "max_position_embeddings": 64, "num_local_experts": )" +
          std::to_string(experts) + (extra.empty() ? std::string() : ", " + extra) + "}");
}

// A tiny BERT for the fixture WordPiece tokenizer's 1200 tokens (tokenizer/wordpiece), dropout off.
inline std::string write_wordpiece_bert(const TempDir& dir) {
  return write_model_folder(
      dir, "bert",
      R"({"model_type": "bert", "vocab_size": 1200, "hidden_size": 32, "num_hidden_layers": 2,
          "num_attention_heads": 2, "intermediate_size": 48, "max_position_embeddings": 64,
          "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0})");
}

// dir/name: the fixture tokenizer texts (tokenizer/texts.json), six times over, one per line.
inline std::string write_fixture_text(const TempDir& dir, const std::string& name) {
  std::ifstream texts(std::string(BRISK_FIXTURES_DIR) + "/tokenizer/texts.json");
  const auto lines = nlohmann::json::parse(texts).get<std::vector<std::string>>();
  const std::string path = dir / name;
  std::ofstream f(path);
  for (int r = 0; r < 6; ++r)
    for (const auto& l : lines) f << l << "\n";
  return path;
}

// dir/name: a labelled CSV of `rows` sentences of 2 to 12 words (dynamic padding and
// group_by_length see lengths that differ), the label named by the first word.
inline std::string write_varied_csv(const TempDir& dir, const std::string& name, int rows) {
  const char* words[] = {"the", "plot", "film", "and", "end", "good", "bad", "a", "of", "it"};
  const std::string path = dir / name;
  std::ofstream f(path);
  f << "sentence,label\n";
  for (int i = 0; i < rows; ++i) {
    const bool pos = (i * 7) % 3 != 0;
    f << (pos ? "good" : "bad");
    for (int w = 0; w < 1 + (i * 5) % 11; ++w) f << " " << words[(i + w * 3) % 10];
    f << "," << (pos ? "positive" : "negative") << "\n";
  }
  return path;
}

// Every float32 weight of a checkpoint's model.safetensors (a LoRA run's: its
// adapter_model.safetensors), tensor by tensor. Where runs may sum
// in another order (a GPU's atomics, ranks), without the key biases: their exact gradient is
// zero (softmax ignores a constant added to a row of scores), so they only receive rounding
// noise, which differs with every summation order and which Adam turns into steps near the
// learning rate however small it is; they change no output.
inline std::vector<float> checkpoint_weights(const std::string& checkpoint,
                                             bool without_key_biases = false) {
  const std::string whole = checkpoint + "/model.safetensors";
  SafetensorsFile f(std::filesystem::exists(whole) ? whole
                                                   : checkpoint + "/adapter_model.safetensors");
  std::vector<float> all;
  for (const auto& name : f.names()) {
    const Tensor& t = f.get(name);
    const float* p = t.f32();
    const int64_t n = t.numel();
    if (without_key_biases && name.ends_with("attention.self.key.bias")) continue;  // BERT
    if (without_key_biases && name.ends_with("attn.c_attn.bias")) {  // GPT-2: query | key | value
      all.insert(all.end(), p, p + n / 3);
      all.insert(all.end(), p + 2 * n / 3, p + n);
      continue;
    }
    all.insert(all.end(), p, p + n);
  }
  return all;
}

// The optimizer state a checkpoint holds, tensor by tensor, as float32 (8-bit codes as their
// values).
inline std::map<std::string, std::vector<float>> optimizer_state(const std::string& checkpoint) {
  SafetensorsFile f(checkpoint + "/optimizer.safetensors");
  std::map<std::string, std::vector<float>> out;
  for (const std::string& name : f.names()) {
    const Tensor& t = f.get(name);
    std::vector<float> v(static_cast<size_t>(t.numel()));
    for (int64_t i = 0; i < t.numel(); ++i)
      v[static_cast<size_t>(i)] = t.dtype() == DType::f32  ? t.f32()[i]
                                  : t.dtype() == DType::u8 ? static_cast<float>(t.as<uint8_t>()[i])
                                                           : static_cast<float>(t.as<int64_t>()[i]);
    out[name] = v;
  }
  return out;
}

inline TrainOptions tiny_options(const std::string& model, const std::string& out,
                                 const std::string& device = "cpu") {
  TrainOptions o;
  o.model_name_or_path = model;
  o.output_dir = out;
  o.seq_len = 12;
  o.dataset_size = 24;
  o.per_device_train_batch_size = 4;
  o.max_steps = 4;
  o.learning_rate = 3e-3;
  o.logging_steps = 1;
  o.save_steps = 0;
  o.disable_tqdm = true;
  o.device = device;
  return o;
}

// The tests' optimizer settings: --optim, --optim_args, a learning rate that moves the tiny
// models in a few steps, and weight decay 0.01 (so the decay tables take part).
inline void use_optimizer(TrainOptions& o, const std::string& optim, const std::string& args,
                          double lr) {
  o.optim = optim;
  o.optim_args = args;
  o.learning_rate = lr;
  o.weight_decay = 0.01;
}

// Causal-LM samples of unequal length (18 unless given): sample i has 4 + (i * 5) % 9 real tokens.
class UnequalLengths final : public Dataset {
 public:
  explicit UnequalLengths(int64_t samples = 18) : samples_(samples) {}
  int64_t size() const override { return samples_; }
  int64_t seq_len() const override { return 12; }
  int64_t length(int64_t i) const { return 4 + (i * 5) % 9; }
  void fill_row(int64_t i, int64_t, const Batch& b, int64_t row) const override {
    const int64_t T = b.input_ids.dim(1);
    for (int64_t t = 0; t < length(i); ++t) {
      b.input_ids.i32()[row * T + t] = static_cast<int32_t>(100 + (i * 7 + t * 3) % 28);
      b.labels.i32()[row * T + t] = b.input_ids.i32()[row * T + t];
      b.attention_mask.i32()[row * T + t] = 1;
    }
  }
  int64_t count_targets(int64_t i, int64_t) const override { return length(i) - 1; }

 private:
  int64_t samples_;
};

// A fixture's batch (batch.safetensors: input_ids, attention_mask [B, T], labels [B, T] or a
// class per row [B], token_type_ids where given) as a dataset of its B rows.
class FixtureRows final : public Dataset {
 public:
  explicit FixtureRows(const std::string& file) : f_(file) {}
  int64_t size() const override { return f_.get("input_ids").dim(0); }
  int64_t seq_len() const override { return f_.get("input_ids").dim(1); }
  void fill_row(int64_t i, int64_t, const Batch& b, int64_t row) const override {
    const int64_t T = seq_len();
    for (const auto& [name, dst] :
         {std::pair{"input_ids", b.input_ids}, std::pair{"attention_mask", b.attention_mask},
          std::pair{"labels", b.labels}, std::pair{"token_type_ids", b.token_type_ids}}) {
      if (dst.empty() || !f_.has(name)) continue;
      const int64_t width = f_.get(name).shape().rank() == 1 ? 1 : T;
      std::copy_n(f_.get(name).i32() + i * width, width, dst.i32() + row * width);
    }
  }
  // Causal LM: the labels at positions 1.. (position t's target is label t + 1).
  int64_t count_targets(int64_t i, int64_t) const override {
    if (f_.get("labels").shape().rank() == 1) return 1;  // a class per row
    const int32_t* y = f_.get("labels").i32() + i * seq_len();
    return std::count_if(y + 1, y + seq_len(), [](int32_t v) { return v != kIgnoreIndex; });
  }

 private:
  SafetensorsFile f_;
};

// `o` set to resume from a copy of `checkpoint` (a folder under o.output_dir) in a fresh
// output_dir `into`: the resumed run writes beside the copy, the original left as it was.
inline TrainOptions resumed_in_copy(const TrainOptions& o, const std::string& checkpoint,
                                    const std::string& into) {
  TrainOptions r = o;
  r.output_dir = into;
  const std::string copy = into + "/" + std::filesystem::path(checkpoint).filename().string();
  std::filesystem::create_directories(into);
  std::filesystem::copy(o.output_dir + "/" + checkpoint, copy,
                        std::filesystem::copy_options::recursive);
  r.resume_from_checkpoint = copy;
  return r;
}

}  // namespace brisk::testing
