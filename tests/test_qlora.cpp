// QLoRA (--load_in_4bit): the frozen base's block linears kept 4-bit (adapters/quantized_base)
// train as LoRA on the base whose linears are bitsandbytes' dequantized 4-bit values: the same
// losses and adapter, with NF4 and FP4, nested or not, with and without gradient checkpointing,
// in float32, bf16 and fp16, on GPT-2, BERT and Llama.
// The blocks' products then read their 4-bit weights where they are kept; the weight buffer
// stages the blocks' other parameters in two slots, and the plan holds the 4-bit store.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <fstream>
#include <map>

#include "core/json_file.h"
#include "core/quant4.h"
#include "core/quantization.h"
#include "core/safetensors.h"
#include "test_support.h"
#include "train/assembly.h"
#include "train/estimate.h"
#include "train/trainer.h"
#include "trainer_support.h"

namespace brisk::testing {
namespace {

namespace fs = std::filesystem;

const LogSink quiet = [](const nlohmann::json&) {};

std::vector<double> losses_of(const TrainOptions& o, const Dataset* data = nullptr) {
  std::vector<double> losses;
  train(
      o,
      [&](const nlohmann::json& j) {
        if (j.contains("loss")) losses.push_back(j["loss"]);
      },
      data);
  return losses;
}

// A config folder of a tiny `type` (gpt2, bert or llama) with `layers` blocks.
std::string tiny_config(const TempDir& dir, const std::string& type, int layers) {
  if (type != "llama") return write_config(dir, type, 0.0, layers);
  return write_model_folder(dir, "llama",
                            R"({"model_type": "llama", "vocab_size": 128, "hidden_size": 32,
                                "intermediate_size": 48, "num_attention_heads": 4,
                                "num_key_value_heads": 2, "num_hidden_layers": )" +
                                std::to_string(layers) + "}");
}

// A base model folder: `type` with `layers` blocks, its initial weights saved.
std::string base_folder(const TempDir& dir, const std::string& type, int layers) {
  TrainOptions o = tiny_options(tiny_config(dir, type, layers), dir / "base");
  o.max_steps = 1;
  o.learning_rate = 0;
  train(o, quiet);
  return o.output_dir;
}

// [rows, cols] values transposed.
std::vector<float> transposed(const std::vector<float>& v, int64_t rows, int64_t cols) {
  std::vector<float> out(v.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) out[c * rows + r] = v[r * cols + c];
  return out;
}

// The blocks' linears by name: whether each is stored [in, out] (a Conv1D).
std::map<std::string, bool> block_linears(const Model& model) {
  std::map<std::string, bool> linear;
  for (const LinearDecl& l : model.linears())
    if (l.layer >= 0 && !l.expert && !l.router)  // (no nn.Linear in transformers 5)
      linear[model.params().list()[static_cast<size_t>(l.param)].name] = l.fan_in_fan_out;
  return linear;
}

// A new folder `name` in dir with base's config.json.
std::string folder_beside(const TempDir& dir, const std::string& name, const std::string& base) {
  const std::string out = dir / name;
  fs::create_directories(out);
  fs::copy_file(base + "/config.json", out + "/config.json");
  return out;
}

// The same folder with every block linear replaced by its 4-bit round trip as bitsandbytes makes
// it: of the weight in nn.Linear's layout [out, in] (a Conv1D's [in, out] transposed first).
std::string dequantized_copy(const TempDir& dir, const std::string& base, const Model& model,
                             const Quant4Layout& kind) {
  const std::string out = folder_beside(dir, "dequantized", base);
  SafetensorsFile f(base + "/model.safetensors");
  const std::map<std::string, bool> linear = block_linears(model);
  std::vector<std::vector<float>> values;
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const std::string& n : f.names()) {
    const Tensor& t = f.get(n);
    values.emplace_back(t.f32(), t.f32() + t.numel());
    const auto it = linear.find(n);
    if (it == linear.end()) continue;
    Quant4Layout l = kind;
    l.numel = t.numel();
    const int64_t in = t.dim(0), out_features = t.dim(1);
    std::vector<float> w = it->second ? transposed(values.back(), in, out_features) : values.back();
    dequantize_4bit(quantize_4bit(w.data(), l, n.c_str()), w.data());
    values.back() = it->second ? transposed(w, out_features, in) : w;
  }
  size_t i = 0;
  for (const std::string& n : f.names())
    tensors.emplace_back(n, Tensor(values[i++].data(), f.get(n).shape(), DType::f32));
  write_safetensors(out + "/model.safetensors", tensors);
  return out;
}

// LoRA of rank 4 without dropout on `targets` of the model in `base`, 3 steps at 1e-2, into out.
TrainOptions lora_run(const std::string& base, const std::string& out, const std::string& targets) {
  TrainOptions o = tiny_options(base, out);
  o.use_peft = true;
  o.lora_r = 4;
  o.lora_dropout = 0;
  o.lora_target_modules = targets;
  o.learning_rate = 1e-2;
  o.max_steps = 3;
  return o;
}

TEST(Qlora, TrainsAsLoraOnTheDequantizedBase) {
  for (const std::string type : {"gpt2", "bert", "llama"})
    for (const auto [quant, nested, checkpointing, precision] :
         {std::tuple{"nf4", false, false, "fp32"}, std::tuple{"nf4", true, true, "fp32"},
          std::tuple{"fp4", true, false, "fp32"}, std::tuple{"nf4", true, false, "bf16"},
          std::tuple{"nf4", false, true, "fp16"}}) {
      SCOPED_TRACE(type + " " + quant + (nested ? " nested" : "") +
                   (checkpointing ? " checkpointing " : " ") + precision);
      TempDir dir("qlora");
      const std::string base = base_folder(dir, type, 4);
      TrainOptions o = lora_run(base, dir / "q",
                                type == "gpt2"   ? "c_attn,c_proj"
                                : type == "bert" ? "query,value"
                                                 : "all-linear");
      o.gradient_checkpointing = checkpointing;
      o.bf16 = std::string(precision) == "bf16";
      o.fp16 = std::string(precision) == "fp16";
      TrainOptions q = o;
      q.load_in_4bit = true;
      q.bnb_4bit_quant_type = quant;
      q.use_bnb_nested_quant = nested;
      const auto run = assemble_run(resolve_run(q, 1).options, Device::cpu, nullptr);
      EXPECT_TRUE(run->model->staged_weights());
      EXPECT_GT(run->quantized->quantized_params(), 0);
      const Quant4Layout kind{
          0, 64, std::string(quant) == "fp4" ? Quant4Type::fp4 : Quant4Type::nf4, nested};
      o.model_name_or_path = dequantized_copy(dir, base, *run->model, kind);
      o.output_dir = dir / "lora";
      const std::vector<double> want = losses_of(o), got = losses_of(q);
      ASSERT_EQ(got.size(), want.size());
      for (size_t s = 0; s < want.size(); ++s)
        EXPECT_NEAR(got[s], want[s], 1e-6 * std::abs(want[s])) << "step " << s + 1;
      const std::vector<float> a = checkpoint_weights(q.output_dir),
                               b = checkpoint_weights(o.output_dir);
      ASSERT_EQ(a.size(), b.size());
      EXPECT_LE(rel_error(a.data(), b.data(), static_cast<int64_t>(a.size())), 1e-5);
    }
}

// The blocks' products whose weights are all kept 4-bit read them where they are kept: no slot
// holds them (the slots hold the blocks' other parameters alone), and one buffer takes each
// weight dequantized in turn, as large as the largest product's weight.
TEST(Qlora, BlockLinearsAreMultipliedWhereTheyAreKept) {
  for (const std::string type : {"gpt2", "bert", "llama"}) {
    SCOPED_TRACE(type);
    TempDir dir("qlora_direct");
    const char* targets = type == "gpt2" ? "c_attn" : type == "bert" ? "query,value" : "q_proj";
    TrainOptions o = lora_run(tiny_config(dir, type, 4), dir / "q", targets);
    o.load_in_4bit = true;
    const auto run = assemble_run(resolve_run(o, 1).options, Device::cpu, nullptr);
    const Model& model = *run->model;
    ASSERT_TRUE(model.staged_weights());
    int64_t holes = 0;
    for (const ElementRange& h : run->quantized->slot_holes()) holes += h.count;
    // Every block linear is a product's weight here: the holes are all of them.
    int64_t linears = 0, largest = 0;
    for (const LinearDecl& l : model.linears())
      if (l.layer == 0)
        linears += model.params().list()[static_cast<size_t>(l.param)].shape.numel();
    EXPECT_EQ(holes, linears);
    const int64_t block = model.param_segments()[1].count;
    EXPECT_EQ(model.weight_layout().place(1).count, block - holes);
    EXPECT_FALSE(model.weight_layout().overlap(1, 2));
    for (int site = 0; site < 4; ++site) {
      const ProductParams p = model.layer_products(0)[static_cast<size_t>(site)];
      int64_t n = 0;
      for (int i = p.first; i >= 0 && i <= p.last; ++i)
        n += model.params().list()[static_cast<size_t>(i)].shape.numel();
      largest = std::max(largest, n);
    }
    EXPECT_EQ(run->quantized->largest_product(), largest);
    EXPECT_EQ(bytes_under(run->plan, "backend.dequantized_weight"),
              static_cast<size_t>(largest) * sizeof(float));
  }
}

// The base folder as transformers saves it from a model loaded 4-bit: each block linear's codes
// (quantized in nn.Linear's layout, as bitsandbytes does) under its name, its state beside it.
std::string saved_4bit(const TempDir& dir, const std::string& base, const Model& model,
                       const Quant4Layout& kind) {
  const std::string out = folder_beside(dir, "bnb", base);
  SafetensorsFile f(base + "/model.safetensors");
  const std::map<std::string, bool> linear = block_linears(model);
  std::vector<Quant4Host> states;
  std::vector<std::string> texts;
  states.reserve(linear.size());
  texts.reserve(linear.size());
  std::vector<std::pair<std::string, Tensor>> tensors;
  static const std::array<float, 256> map = dynamic_quant_map(true);
  static std::array<float, 16> codes;
  for (int c = 0; c < 16; ++c) codes[c] = quant4_value(kind.type, c);
  for (const std::string& n : f.names()) {
    const Tensor& t = f.get(n);
    const auto it = linear.find(n);
    if (it == linear.end()) {
      tensors.emplace_back(n, t);
      continue;
    }
    const int64_t rows = it->second ? t.dim(1) : t.dim(0), cols = t.numel() / rows;
    std::vector<float> w(t.f32(), t.f32() + t.numel());
    if (it->second) w = transposed(w, cols, rows);
    Quant4Layout l = kind;
    l.numel = t.numel();
    Quant4Host& q = states.emplace_back(quantize_4bit(w.data(), l, n.c_str()));
    const std::string type = kind.type == Quant4Type::nf4 ? "nf4" : "fp4";
    nlohmann::json j = {
        {"quant_type", type}, {"blocksize", 64}, {"dtype", "float32"}, {"shape", {rows, cols}}};
    if (kind.nested) j.update({{"nested_blocksize", 256}, {"nested_offset", q.offset}});
    std::string& text = texts.emplace_back(j.dump());
    tensors.emplace_back(n, Tensor(q.packed.data(), Shape{l.packed_bytes(), 1}, DType::u8));
    tensors.emplace_back(n + ".quant_map", Tensor(codes.data(), Shape{16}, DType::f32));
    tensors.emplace_back(n + ".quant_state.bitsandbytes__" + type,
                         Tensor(text.data(), Shape{static_cast<int64_t>(text.size())}, DType::u8));
    if (!kind.nested) {
      tensors.emplace_back(n + ".absmax", Tensor(q.absmax.data(), Shape{l.blocks()}, DType::f32));
      continue;
    }
    tensors.emplace_back(n + ".absmax", Tensor(q.qabsmax.data(), Shape{l.blocks()}, DType::u8));
    tensors.emplace_back(n + ".nested_absmax",
                         Tensor(q.absmax2.data(), Shape{l.nested_blocks()}, DType::f32));
    tensors.emplace_back(n + ".nested_quant_map",
                         Tensor(const_cast<float*>(map.data()), Shape{256}, DType::f32));
  }
  write_safetensors(out + "/model.safetensors", tensors);
  return out;
}

// A checkpoint saved 4-bit: LoRA trains on its dequantized values, and QLoRA keeps its codes
// (nested: its offset too, which quantizing the dequantized values again would not reproduce):
// both as LoRA on the 4-bit round trip of the base. QLoRA options other than the checkpoint's
// are refused, naming them.
// A mixture's 4-bit base holds its attention's, shared expert's and dense MLPs' linears 4-bit, as
// BitsAndBytesConfig quantizes each nn.Linear; its router and fused experts (no nn.Linear in
// transformers 5) stay float32. The run trains as LoRA on that base dequantized, the router's
// adapter (gate.weight) included.
TEST(Qlora, AMixturesRouterAndExpertsStayUnquantized) {
  for (const std::string f : {"mixtral", "qwen2_moe"}) {
    SCOPED_TRACE(f);
    TempDir dir("qlora_moe");
    const std::string base = fixture("moe/" + f + "_tiny");
    FixtureRows rows(base + "/batch.safetensors");
    TrainOptions o = lora_run(base, dir / "q", "q_proj,v_proj");
    o.lora_target_parameters = "gate.weight";
    o.per_device_train_batch_size = 1;
    TrainOptions q = o;
    q.load_in_4bit = true;
    const auto run = assemble_run(resolve_run(q, 1).options, Device::cpu, nullptr, &rows);
    // Mixtral: 2 layers' q, k, v, o; Qwen2-MoE: those, its sparse layer's shared expert (gate,
    // up, down) and gate, its dense layer's MLP.
    EXPECT_EQ(run->quantized->quantized_params(), f == "mixtral" ? 8 : 15);
    o.model_name_or_path =
        dequantized_copy(dir, base, *run->model, {0, 64, Quant4Type::nf4, false});
    o.output_dir = dir / "lora";
    const std::vector<double> want = losses_of(o, &rows), got = losses_of(q, &rows);
    ASSERT_EQ(got.size(), want.size());
    for (size_t s = 0; s < want.size(); ++s)
      EXPECT_NEAR(got[s], want[s], 1e-6 * std::abs(want[s])) << "step " << s + 1;
  }
}

TEST(Qlora, ASaved4BitCheckpointTrainsOnItsOwnCodes) {
  for (const std::string type : {"gpt2", "bert"}) {
    SCOPED_TRACE(type);
    TempDir dir("qlora_saved");
    const std::string base = base_folder(dir, type, 4);
    TrainOptions o = lora_run(base, dir / "lora", type == "gpt2" ? "c_attn" : "query,value");
    const auto run = assemble_run(resolve_run(o, 1).options, Device::cpu, nullptr);
    const Quant4Layout kind{0, 64, Quant4Type::nf4, true};
    o.model_name_or_path = dequantized_copy(dir, base, *run->model, kind);
    const std::vector<double> want = losses_of(o);
    TrainOptions lora = o;
    lora.model_name_or_path = saved_4bit(dir, base, *run->model, kind);
    lora.output_dir = dir / "saved_lora";
    TrainOptions q = lora;
    q.output_dir = dir / "saved_qlora";
    q.load_in_4bit = true;
    q.use_bnb_nested_quant = true;
    for (const TrainOptions& t : {lora, q}) {
      const std::vector<double> got = losses_of(t);
      ASSERT_EQ(got.size(), want.size());
      for (size_t s = 0; s < want.size(); ++s)
        EXPECT_NEAR(got[s], want[s], 1e-6 * std::abs(want[s])) << t.output_dir << " " << s;
    }
    TrainOptions other = q;
    other.use_bnb_nested_quant = false;
    other.output_dir = dir / "other";
    expect_error([&] { losses_of(other); },
                 "is saved 4-bit as nf4 with nested absmaxes: train it as saved with "
                 "--bnb_4bit_quant_type nf4 --use_bnb_nested_quant");
  }
}

// A checkpoint bitsandbytes saved 4-bit from bf16 weights (gpt2_fp4: its quant_state's dtype)
// dequantizes to bf16-rounded values, as bitsandbytes' matmul_4bit does, in a float32 QLoRA run
// too: the first step (fresh adapters add nothing; dropout off) computes transformers' loss of
// the 4-bit model.
TEST(Qlora, ASaved4BitCheckpointDequantizesToItsDtype) {
  TempDir dir("qlora_dtype");
  const std::string folder = folder_beside(dir, "fp4", fixture("qlora/gpt2_fp4"));
  fs::copy_file(fixture("qlora/gpt2_fp4/model.safetensors"), folder + "/model.safetensors");
  nlohmann::json config = read_json_file(folder + "/config.json", "config");
  for (const char* p : {"attn_pdrop", "embd_pdrop", "resid_pdrop"}) config[p] = 0.0;
  std::ofstream(folder + "/config.json") << config.dump();
  FixtureRows rows(fixture("gpt2_tiny/batch.safetensors"));
  TrainOptions q = lora_run(folder, dir / "q", "c_attn");
  q.load_in_4bit = true;
  q.bnb_4bit_quant_type = "fp4";
  q.per_device_train_batch_size = 2;
  q.seq_len = 13;
  q.max_steps = 1;
  const std::vector<double> got = losses_of(q, &rows);
  ASSERT_EQ(got.size(), 1u);
  const double want =
      SafetensorsFile(fixture("qlora/gpt2_fp4/expected.safetensors")).get("loss").f32()[0];
  EXPECT_NEAR(got[0], want, 1e-6 * want);
}

// A run on a checkpoint saved 4-bit without --load_in_4bit says once that it dequantizes it.
TEST(Qlora, ARunOnA4BitCheckpointWithoutLoadIn4bitSaysSo) {
  TempDir dir("qlora_hint");
  TrainOptions o = tiny_options(fixture("qlora/llama_nf4"), dir / "out");
  o.use_peft = true;
  o.max_steps = 1;
  int said = 0;
  train(o, [&](const nlohmann::json& j) {
    if (j.contains("warning") &&
        j["warning"].get<std::string>().find("is saved 4-bit: its weights are dequantized") !=
            std::string::npos)
      ++said;
  });
  EXPECT_EQ(said, 1);
}

// A QLoRA run resumed from its checkpoint (the base quantized again as it loads, the adapter and
// its optimizer state from the checkpoint) ends on the uninterrupted run's adapter, bit for bit:
// with AdamW, and with 8-bit AdamW under gradient checkpointing (the low-memory optimizer and
// recomputation composed with the 4-bit base; its state 8-bit from 256 elements on).
TEST(Qlora, ResumeContinuesExactly) {
  for (const std::string optim : {"adamw_torch", "adamw_8bit"}) {
    SCOPED_TRACE(optim);
    TempDir dir("qlora_resume");
    TrainOptions o = tiny_options(base_folder(dir, "gpt2", 4), dir / "out");
    o.use_peft = true;
    o.lora_r = 4;
    o.lora_target_modules = "c_attn";
    o.load_in_4bit = true;
    o.use_bnb_nested_quant = true;
    use_optimizer(o, optim, optim == "adamw_8bit" ? "min_8bit_size=256" : "", 1e-2);
    o.gradient_checkpointing = optim == "adamw_8bit";
    o.max_steps = 4;
    o.save_steps = 2;
    losses_of(o);
    if (optim == "adamw_8bit") {  // the adapters' state is 8-bit
      const auto state = optimizer_state(o.output_dir + "/checkpoint-4");
      EXPECT_TRUE(std::any_of(state.begin(), state.end(),
                              [](const auto& t) { return t.first.ends_with("_codes"); }));
    }
    const TrainOptions resumed = resumed_in_copy(o, "checkpoint-2", dir / "resumed");
    EXPECT_EQ(losses_of(resumed).size(), 2u);
    EXPECT_EQ(checkpoint_weights(resumed.output_dir + "/checkpoint-4"),
              checkpoint_weights(o.output_dir + "/checkpoint-4"));
  }
}

TEST(Qlora, OptionsAreCheckedByName) {
  TrainOptions o;
  o.load_in_4bit = true;
  expect_error([&] { validate_options(o); }, "--load_in_4bit keeps the base frozen in 4 bits");
  o.use_peft = true;
  o.bnb_4bit_quant_type = "int4";
  expect_error([&] { validate_options(o); }, "bnb_4bit_quant_type must be nf4 or fp4");
  TrainOptions forgotten;
  forgotten.use_bnb_nested_quant = true;
  expect_error([&] { validate_options(forgotten); },
               "--use_bnb_nested_quant is set but --load_in_4bit is not");
}

// A bf16 or fp16 LoRA run keeps the frozen block linears in its 16-bit type (its products round
// them to it anyway): the same losses and adapter, bit for bit, as with the float32 base
// (BRISK_HALF_FROZEN_BASE=0), its weights staged and planned at fewer bytes (8 blocks: the two
// float32 slots and the 16-bit store hold less than eight float32 blocks).
TEST(Qlora, A16BitLoraRunsFrozenBaseIs16BitWithTheSameResults) {
  for (const std::string type : {"gpt2", "bert"})
    for (const bool bf16 : {true, false}) {
      SCOPED_TRACE(type + (bf16 ? " bf16" : " fp16"));
      TempDir dir("half_base");
      TrainOptions o = lora_run(base_folder(dir, type, 8), dir / "store",
                                type == "gpt2" ? "c_attn" : "query,value");
      o.bf16 = bf16;
      o.fp16 = !bf16;
      TrainOptions f32 = o;
      f32.output_dir = dir / "float32";
      f32.switches.half_frozen_base = false;
      const auto with = assemble_run(o, Device::cpu, nullptr);
      const auto without = assemble_run(f32, Device::cpu, nullptr);
      ASSERT_TRUE(with->quantized);
      EXPECT_TRUE(with->model->staged_weights());
      EXPECT_FALSE(without->quantized);
      EXPECT_LT(with->plan.total_bytes(), without->plan.total_bytes());
      EXPECT_EQ(losses_of(o), losses_of(f32));
      EXPECT_EQ(checkpoint_weights(o.output_dir), checkpoint_weights(f32.output_dir));
    }
}

}  // namespace
}  // namespace brisk::testing
