// `brisk estimate` end to end on other devices and layouts: a GPU's plan without a GPU, offloaded
// optimizers, pipeline stages, tensor and sequence ranks, the fit search over layouts, adapters and
// the frozen base.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <vector>

#include "cli_support.h"
#include "test_support.h"
#include "trainer_support.h"

namespace brisk::testing {
namespace {

TEST(Cli, EstimatePlansAGpuRunWithoutAGpu) {
  const std::string run = "estimate --model bert-large-uncased --per_device_train_batch_size 4 ";
  const CliRun gpu = run_brisk(run + "--device cuda");
  ASSERT_EQ(gpu.exit_code, 0) << gpu.err;
  EXPECT_NE(gpu.out.find("on cuda"), std::string::npos) << gpu.out;
  EXPECT_NE(gpu.out.find("GPU: context, kernels, libraries"), std::string::npos) << gpu.out;
  EXPECT_NE(gpu.out.find("expect \"GPU memory occupied\" near"), std::string::npos) << gpu.out;
  const CliRun cpu = run_brisk(run + "--device cpu");
  ASSERT_EQ(cpu.exit_code, 0) << cpu.err;
  EXPECT_NE(cpu.out.find("expect a process peak near"), std::string::npos) << cpu.out;
  // Both keep one log-sum-exp per attention row (no [T, T] probabilities): the same activations.
  auto activations_mib = [](const std::string& out) {
    return std::stod(out.substr(out.find("activations") + 11));
  };
  EXPECT_EQ(activations_mib(cpu.out), activations_mib(gpu.out));
  EXPECT_GT(activations_mib(cpu.out), 0.0);
}

// A GPU's bf16 run computes with float32 weights, no master copy (4 bytes a parameter, never more
// than a 16-bit compute copy and a master), and its products read a bf16 copy of them (2 bytes
// more) where that holds no more than the master would: on one rank and under ZeRO 1 on 2 ranks;
// not under ZeRO 1 on 3 ranks (a master of 4/3), offloaded (none on the GPU) or under ZeRO 3
// (staged weights). fp16 keeps a compute copy and a master.
TEST(Cli, EstimateOfAGpuBf16RunPlansAWeightsCopyWhereItHoldsNoMoreThanAMaster) {
  const double n = 335143938.0;
  struct Layout {
    std::string args;
    bool float32_weights, copy;
  };
  const std::vector<Layout> layouts = {{"--bf16", true, true},
                                       {"--bf16 --world_size 2 --zero_stage 1", true, true},
                                       {"--bf16 --world_size 3 --zero_stage 1", true, false},
                                       {"--bf16 --world_size 3 --zero_stage 3", true, false},
                                       {"--bf16 --offload_optimizer cpu", true, false},
                                       {"--fp16", false, false}};
  for (const Layout& l : layouts) {
    CliRun r;
    const nlohmann::json j =
        estimate_json("--model bert-large-uncased --device cuda " + l.args, &r);
    double copy = 0, master_on_gpu = 0;
    for (const nlohmann::json& b : j["memory"]["buffers"]) {
      if (b["name"] == "backend.weights_copy") copy = b["bytes"].get<double>();
      if (b["category"] == "master_weights" && b["placement"] == "device")
        master_on_gpu += b["bytes"].get<double>();
    }
    EXPECT_EQ(r.out.find("with float32 weights") != std::string::npos, l.float32_weights) << l.args;
    EXPECT_EQ(master_on_gpu == 0.0,
              l.float32_weights || l.args.find("offload") != std::string::npos)
        << l.args;
    EXPECT_NEAR(copy, l.copy ? 2.0 * n : 0.0, 1.0) << l.args;
  }
}

// offload_optimizer cpu (in a DeepSpeed config or as the option) plans a GPU run's float32 master
// copy and optimizer state in host memory, with a host copy of the gradients: the GPU's plan
// loses exactly the first two, the host's gains all three; under ZeRO each rank's share. On the
// CPU it changes nothing. (fp16: a bf16 run on one GPU has no master copy to move.)
TEST(Cli, EstimatePlansAnOffloadedOptimizerInHostMemory) {
  const std::string run = "--model bert-large-uncased --fp16 --device cuda";
  const nlohmann::json on_gpu = estimate_json(run);
  CliRun r;
  const nlohmann::json off = estimate_json(run + " --offload_optimizer cpu", &r);
  EXPECT_NE(r.out.find("offload_optimizer cpu, in host memory: master_weights"), std::string::npos)
      << r.out;
  const double n = 335143938.0;
  auto bytes = [](const nlohmann::json& j, const char* key) {
    return j["memory"][key].get<double>();
  };
  auto category = [](const nlohmann::json& j, const char* key) {
    return j["memory"]["planned_bytes"][key].get<double>();
  };
  const double moved = category(on_gpu, "master_weights") + category(on_gpu, "optimizer_state");
  EXPECT_GT(moved, 12.0 * n);
  EXPECT_NEAR(bytes(on_gpu, "planned_device_bytes") - bytes(off, "planned_device_bytes"), moved,
              4096.0);
  EXPECT_NEAR(bytes(off, "planned_host_bytes") - bytes(on_gpu, "planned_host_bytes"),
              moved + 4.0 * n, 4096.0);
  std::set<std::string> host_before;  // staging for batches, the step's statistics
  for (const nlohmann::json& b : on_gpu["memory"]["buffers"])
    if (b["placement"] == "host") host_before.insert(b["name"].get<std::string>());
  for (const nlohmann::json& b : off["memory"]["buffers"]) {
    const std::string name = b["name"], category = b["category"];
    const bool host = host_before.count(name) || name.starts_with("offload.") ||
                      category == "optimizer_state" || category == "master_weights";
    EXPECT_EQ(b["placement"], host ? "host" : "device") << name;
  }
  // ZeRO stage 2 on 3 ranks: each rank's run of the master copy, state and gradients on the host.
  const nlohmann::json zero =
      estimate_json(run + " --offload_optimizer cpu --world_size 3 --zero_stage 2");
  for (const nlohmann::json& rank : zero["data_parallel"]["ranks"]) {
    const double p = rank["parameters"].get<double>();
    EXPECT_NEAR(
        rank["host_bytes"].get<double>(),
        rank["master_bytes"].get<double>() + rank["optimizer_state_bytes"].get<double>() + 4.0 * p,
        1.0);
    EXPECT_NEAR(rank["master_bytes"].get<double>(), 4.0 * p, 1.0);
  }
  EXPECT_NEAR(bytes(zero, "planned_host_bytes") - bytes(on_gpu, "planned_host_bytes"),
              zero["data_parallel"]["ranks"][0]["host_bytes"].get<double>(), 4096.0);
  // The CPU: the state is in host memory already; nothing moves or is added.
  const std::string cpu = "--model bert-large-uncased --bf16 --device cpu";
  EXPECT_EQ(bytes(estimate_json(cpu + " --offload_optimizer cpu"), "planned_total_bytes"),
            bytes(estimate_json(cpu), "planned_total_bytes"));
  // --fit: GPT-2 in bf16 does not fit 3 GiB of GPU memory with its optimizer on the GPU (the
  // message says what would); offloaded it does, predicted slower than on a large GPU by at
  // least the copies (4 bytes per parameter each way at the assumed 25 GB/s).
  const std::string fit =
      "--model gpt2 --device cuda --bf16 --per_device_train_batch_size 4 "
      "--seq_len 256 --fit --fit_optims adamw_torch ";
  expect_refused("estimate " + fit + "--max_memory 3GiB",
                 "or the optimizer in host memory (--offload_optimizer cpu)");
  const nlohmann::json offloaded = estimate_json(fit + "--max_memory 3GiB --offload_optimizer cpu");
  const nlohmann::json ample = estimate_json(fit + "--max_memory 30GiB");
  ASSERT_FALSE(offloaded["fit"].empty());
  ASSERT_FALSE(ample["fit"].empty());
  EXPECT_GT(offloaded["fit"][0]["predicted_step_seconds"].get<double>(),
            ample["fit"][0]["predicted_step_seconds"].get<double>() + 2 * 4 * 124439808.0 / 25e9);
}

// estimate --pp_size: each stage's plan. GPT-2's 12 blocks over 3 stages, 4 each; the first holds
// the embeddings, the last the head and the tied embeddings again; the middle stage keeps the
// inputs of its 2 micro-batches in flight; each boundary passes every micro-batch's activations.
TEST(Cli, EstimatePlansEachPipelineStage) {
  const std::string json = (std::filesystem::temp_directory_path() /
                            ("brisk_pp_stages_" + std::to_string(::getpid()) + ".json"))
                               .string();
  const CliRun r = run_brisk(
      "estimate --device cpu --model gpt2 --seq_len 128 --per_device_train_batch_size 2 "
      "--gradient_accumulation_steps 4 --world_size 3 --pp_size 3 --output_json " +
      json);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("pipeline: 3 stages, 1F1B over 4 micro-batches"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("each boundary passes 3.0 MiB"), std::string::npos) << r.out;
  const nlohmann::json whole = read_json(json), stages = whole["pipeline_stages"];
  std::filesystem::remove(json);
  ASSERT_EQ(stages.size(), 3u);
  // The headline is the largest stage's: the last, with the head and its logits.
  int64_t largest = 0;
  for (const auto& s : stages) largest = std::max(largest, s["peak_bytes"].get<int64_t>());
  EXPECT_EQ(whole["planned_stage"], 2);
  EXPECT_EQ(stages[2]["peak_bytes"], largest);
  EXPECT_EQ(whole["memory"]["planned_total_bytes"], stages[2]["planned_total_bytes"]);
  EXPECT_EQ(whole["parameters"], stages[2]["parameters"]);
  EXPECT_NE(r.out.find("the plan of pipeline stage 2 of 3, the largest rank's"), std::string::npos)
      << r.out;
  const int64_t block = 7087872, wte = 50257 * 768, wpe = 1024 * 768, ln_f = 2 * 768;
  EXPECT_EQ(stages[0]["parameters"], wte + wpe + 4 * block);
  EXPECT_EQ(stages[1]["parameters"], 4 * block);
  EXPECT_EQ(stages[2]["parameters"], wte + 4 * block + ln_f);
  for (int s = 0; s < 3; ++s) {
    EXPECT_EQ(stages[s]["first_layer"], 4 * s);
    EXPECT_EQ(stages[s]["end_layer"], 4 * s + 4);
  }
  // The middle stage's planned inputs: 2 micro-batches of [2, 128, 768] float32.
  EXPECT_GE(stages[1]["activations_bytes"].get<int64_t>(), int64_t{2} * 2 * 128 * 768 * 4);
}

// Adafactor under tensor parallelism plans the whole second moment of every parameter on each
// tensor rank (a split matrix's whole row and column statistics: GPT-2's 321617 values, as one
// process's), and the float64 sums of the split parameters' statistics: per block c_attn
// (768 + 2304 and its 2304-value bias), attn.c_proj (768 + 768), c_fc (768 + 3072 and 3072) and
// mlp.c_proj (3072 + 768), each with its weights' squares; wte (50257 + 768 + 1); then one update
// sum per split parameter.
TEST(Cli, EstimatePlansAdafactorsWholeStatisticsOnEachTensorRank) {
  const std::string common = "--device cpu --model gpt2 --optim adafactor --seq_len 128 ";
  const nlohmann::json one = estimate_json(common);
  const nlohmann::json two = estimate_json(common + "--world_size 2 --tp_size 2");
  EXPECT_EQ(planned_bytes(one, "adafactor.exp_avg_sq"), 321617 * 4);
  EXPECT_EQ(planned_bytes(two, "adafactor.exp_avg_sq"), 321617 * 4);
  EXPECT_EQ(planned_bytes(one, "adafactor.split_sums"), -1);
  const int64_t block = (3072 + 1) + (2304 + 1) + (1536 + 1) + (3840 + 1) + (3072 + 1) + (3840 + 1);
  EXPECT_EQ(planned_bytes(two, "adafactor.split_sums"), (12 * block + 51025 + 1 + 12 * 6 + 1) * 8);
}

// 8-bit AdamW's blocks are the full parameters': each tensor rank plans the codes of its share
// and the maxima of every block of its split parameters (GPT-2's four matrices per block; the
// rest too small for 8 bits, or embeddings), and room for both moments' new maxima.
TEST(Cli, EstimatePlansEightBitBlockMaximaOfTheFullParameters) {
  const std::string common = "--device cpu --model gpt2 --optim adamw_8bit --seq_len 128 ";
  const nlohmann::json one = estimate_json(common);
  const nlohmann::json two = estimate_json(common + "--world_size 2 --tp_size 2");
  const int64_t matrices = 768 * 2304 + 768 * 768 + 2 * 768 * 3072;  // a block's
  const int64_t blocks = 12 * matrices / 256;
  EXPECT_EQ(planned_bytes(one, "adamw_8bit.exp_avg_codes"), 12 * matrices);
  EXPECT_EQ(planned_bytes(two, "adamw_8bit.exp_avg_codes"), 12 * matrices / 2);
  for (const nlohmann::json* j : {&one, &two})
    EXPECT_EQ(planned_bytes(*j, "adamw_8bit.exp_avg_sq_absmax"), blocks * 4);
  EXPECT_EQ(planned_bytes(one, "adamw_8bit.split_maxima"), -1);
  EXPECT_EQ(planned_bytes(two, "adamw_8bit.split_maxima"), 2 * blocks * 4);
}

// estimate --tp_size: each rank's plan holds its share of the blocks and of the vocabulary
// (GPT-2 over 4 ranks: 12565 of the 50257 rows each, the last with 3 of padding), and the sums
// over the tensor group per step are printed (SummedBytesAreTheEstimates checks them against a
// run).
TEST(Cli, EstimatePlansEachTensorRanksShare) {
  const std::string common =
      "--device cpu --model gpt2 --seq_len 1024 --per_device_train_batch_size 2 --world_size 4 "
      "--tp_size 4";
  CliRun four, whole_tokens;
  const nlohmann::json j = estimate_json(common + " --tp_sequence_parallel false", &whole_tokens);
  ASSERT_EQ(whole_tokens.exit_code, 0) << whole_tokens.err;
  EXPECT_NE(whole_tokens.out.find("tensor parallel over 4 ranks: each holds 1/4 of every block's "
                                  "attention heads and MLP width and of the vocabulary"),
            std::string::npos)
      << whole_tokens.out;
  // Per block 1/4 of c_attn, c_fc and both c_proj weights (and the first two's biases), whole
  // norms and row-parallel biases; 12565 rows of wte; wpe and ln_f whole.
  const int64_t split = (768 * 2304 + 2304 + 768 * 768 + 768 * 3072 + 3072 + 3072 * 768) / 4;
  const int64_t whole = 4 * 768 + 2 * 768;
  EXPECT_EQ(j["parameters"], 12 * (split + whole) + 12565 * 768 + 1024 * 768 + 2 * 768);
  EXPECT_EQ(j["tensor_parallel"]["vocabulary_rows_per_rank"], 12565);
  // 12 blocks' 4 sums and 2 more of [2, 1024, 768] float32, and 2048 rows' 3 statistics from
  // each of the 4 ranks.
  const double A = 2.0 * 1024 * 768 * 4, stats = 2048.0 * 3 * 4 * 4;
  EXPECT_EQ(j["tensor_parallel"]["sums_bytes_per_step"].get<double>(), (4.0 * 12 + 2) * A + stats);
  EXPECT_NE(whole_tokens.out.find("sums over the tensor group per step: 300.1 MiB"),
            std::string::npos)
      << whole_tokens.out;
  // Megatron's sequence parallelism (the default): the blocks' sums become 10 whole tensors
  // gathered or reduce-scattered per block (and the ends' 2); the 12 blocks' 4 norm parameters'
  // gradients are summed once. The residual stream's saved tensors fall by 4 too.
  const nlohmann::json sliced = estimate_json(common, &four);
  ASSERT_EQ(four.exit_code, 0) << four.err;
  EXPECT_EQ(sliced["tensor_parallel"]["sums_bytes_per_step"].get<double>(),
            2 * A + stats + 12 * 4 * 768 * 4);
  EXPECT_EQ(sliced["tensor_parallel"]["gathered_and_scattered_bytes_per_step"].get<double>(),
            (10.0 * 12 + 2) * A);
  EXPECT_NE(four.out.find("each rank holds 1/4 of the tokens there; per step it gathers and "
                          "reduce-scatters 732.0 MiB"),
            std::string::npos)
      << four.out;
  const double a_whole = j["memory"]["activations_per_block_bytes"].get<double>();
  const double a_sliced = sliced["memory"]["activations_per_block_bytes"].get<double>();
  // A block's input, residual sum and MLP input [2, 1024, 768] and its 4 norm statistics
  // [2, 1024] float32, each 3/4 smaller.
  EXPECT_EQ(a_whole - a_sliced, 0.75 * (3 * A + 4 * 2048.0 * 4));
}

// estimate --sp_size: each rank's plan holds its share of the tokens (GPT-2's activations per
// block fall by about the degree: all but attention's statistics and the exchange's buffers),
// the ZeRO partitions span the data and sequence ranks together, and the all-to-alls' bytes
// are printed (ExchangedBytesAreTheEstimates checks the formula against a run).
TEST(Cli, EstimatePlansEachSequenceRanksTokens) {
  const std::string common =
      "--device cpu --model gpt2 --seq_len 1024 --per_device_train_batch_size 2 "
      "--zero_stage 1 --world_size 4";
  CliRun one, four;
  const nlohmann::json whole = estimate_json(common, &one);
  const nlohmann::json split = estimate_json(common + " --sp_size 4", &four);
  ASSERT_EQ(four.exit_code, 0) << four.err;
  EXPECT_NE(four.out.find("sequence parallel over 4 ranks: each holds 256 of every sequence's "
                          "1024 tokens, attention on all of them for 3 of 12 heads"),
            std::string::npos)
      << four.out;
  EXPECT_NE(four.out.find("all-to-alls per step: 162.0 MiB"), std::string::npos) << four.out;
  const double a1 = whole["memory"]["activations_per_block_bytes"].get<double>();
  const double a4 = split["memory"]["activations_per_block_bytes"].get<double>();
  EXPECT_LT(a4, 0.3 * a1);
  EXPECT_GT(a4, 0.2 * a1);
  EXPECT_EQ(split["data_parallel"]["ranks"].size(), 4u);  // ZeRO over the 4 sequence ranks
  // 12 blocks x 512 tokens x (qkv 2304 + output 768 forward, + 768 backward) float32 values.
  EXPECT_EQ(split["sequence_parallel"]["all_to_all_bytes_per_step"].get<double>(),
            12.0 * 512 * ((2304 + 768) * 2 + 768) * 4);
  expect_refused("estimate --model gpt2 --world_size 2 --sp_size 2 --tp_size 2",
                 "does not divide the run's 2 ranks");
  expect_refused("estimate --model gpt2 --world_size 2 --sp_size 2 --seq_len 1023",
                 "sequences of 1023 tokens do not split evenly among --sp_size 2");
}

// estimate --fit --world_size searches the layouts of the ranks too: tensor parallelism's
// degrees, pipeline depths and sequence-parallel degrees the model allows, data parallelism over
// the rest under each ZeRO stage (pipelines too), the global batch kept; one process's layout
// does not fit here, others do.
TEST(Cli, EstimateFitSearchesTheLayoutsOfTheRanks) {
  const std::string json = (std::filesystem::temp_directory_path() /
                            ("brisk_fit_layouts_" + std::to_string(::getpid()) + ".json"))
                               .string();
  const CliRun r = run_brisk(
      "estimate --device cpu --model gpt2 --seq_len 128 --per_device_train_batch_size 2 "
      "--world_size 4 --fit --max_memory 1800MiB --output_json " +
      json);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("over 4 ranks"), std::string::npos) << r.out;
  const nlohmann::json fit = read_json(json)["fit"];
  std::filesystem::remove(json);
  ASSERT_FALSE(fit.empty());
  std::set<int64_t> degrees, stages, depths, sequences, pipeline_stages;
  double previous = 0;
  for (const auto& c : fit) {
    const int64_t tp = c["tp_size"], pp = c["pp_size"], sp = c["sp_size"], dp = c["data_ranks"];
    EXPECT_EQ(tp * pp * sp * dp, 4);
    depths.insert(pp);
    sequences.insert(sp);
    if (pp > 1 && dp * sp > 1) pipeline_stages.insert(c["zero_stage"].get<int64_t>());
    EXPECT_EQ(c["per_device_train_batch_size"].get<int64_t>() *
                  c["gradient_accumulation_steps"].get<int64_t>() * dp,
              8);
    EXPECT_LE(c["needed_bytes"].get<size_t>(), size_t{1800} << 20);
    EXPECT_GE(c["predicted_step_seconds"].get<double>(), previous);
    previous = c["predicted_step_seconds"];
    EXPECT_FALSE(tp == 1 && pp == 1 && sp == 1 && c["zero_stage"] == 0)
        << "one process's layout needs more";
    degrees.insert(tp);
    if (dp * sp > 1) stages.insert(c["zero_stage"].get<int64_t>());
  }
  EXPECT_GT(degrees.size(), 1u) << fit.dump();
  EXPECT_GT(depths.size(), 1u) << fit.dump();
  EXPECT_GT(sequences.size(), 1u) << fit.dump();
  EXPECT_TRUE(stages.count(3)) << fit.dump();
  EXPECT_TRUE(pipeline_stages.count(3)) << fit.dump();
}

// estimate --fit lists only configurations of the same global batch that fit, fastest first,
// over the precisions and optimizers allowed; and says so when none fits.
TEST(Cli, EstimateFitRanksWhatFitsTheBudget) {
  const std::string json = (std::filesystem::temp_directory_path() /
                            ("brisk_fit_" + std::to_string(::getpid()) + ".json"))
                               .string();
  const CliRun r = run_brisk(
      "estimate --device cpu --model bert-tiny --seq_len 128 --per_device_train_batch_size 8 "
      "--gradient_accumulation_steps 2 --fit --max_memory 250MiB --fit_precisions fp32,bf16 "
      "--fit_optims adamw_torch,adafactor,sgd --output_json " +
      json);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("predicted/step"), std::string::npos) << r.out;
  const nlohmann::json fit = read_json(json)["fit"];
  std::filesystem::remove(json);
  ASSERT_GT(fit.size(), 4u);
  std::set<std::string> optims, precisions;
  std::set<int> checkpointing;
  double previous = 0;
  for (const auto& c : fit) {
    EXPECT_EQ(c["per_device_train_batch_size"].get<int64_t>() *
                  c["gradient_accumulation_steps"].get<int64_t>(),
              16);
    EXPECT_LE(c["needed_bytes"].get<size_t>(), size_t{250} << 20);
    EXPECT_GE(c["predicted_step_seconds"].get<double>(), previous);
    previous = c["predicted_step_seconds"];
    optims.insert(c["optim"].get<std::string>());
    precisions.insert(c["precision"].get<std::string>());
    checkpointing.insert(c["gradient_checkpointing"].get<bool>() ? 2
                         : c["selective_recompute"].get<bool>()  ? 1
                                                                 : 0);
  }
  EXPECT_EQ(optims.size(), 3u);
  EXPECT_EQ(precisions.size(), 2u);
  EXPECT_EQ(checkpointing.size(), 3u);
  // --html draws the candidates: one bar each, self-contained (inline SVG, no scripts).
  const std::string html = json + ".html";
  const CliRun drawn = run_brisk(
      "estimate --device cpu --model bert-tiny --seq_len 128 --per_device_train_batch_size 8 "
      "--fit --max_memory 250MiB --html " +
      html);
  ASSERT_EQ(drawn.exit_code, 0) << drawn.err;
  std::ifstream in(html);
  const std::string page((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::filesystem::remove(html);
  EXPECT_NE(page.find("<svg"), std::string::npos);
  EXPECT_NE(page.find("#1 "), std::string::npos);
  EXPECT_NE(page.find("optimizer_state"), std::string::npos);
  EXPECT_EQ(page.find("<script"), std::string::npos);
  EXPECT_EQ(page.find("http://"), page.find("http://www.w3.org/2000/svg"));
  expect_refused("estimate --model bert-tiny --fit --max_memory 1MB", "no configuration");
  expect_refused("estimate --model bert-tiny --fit --max_memory 1GB --fit_precisions fp8",
                 "unknown precision \"fp8\"");
}

// --fit_methods: LoRA and QLoRA weighed beside full fine-tuning. Adapters train under data
// parallelism with ZeRO up to stage 2 (LoRA under tensor parallelism too, and some candidate
// takes it); at the same batch, recomputation and layout an adapter run
// needs less memory (QLoRA's less again) and is predicted faster than full fine-tuning (no weight
// gradients). By default the run's own method alone, and a budget nothing fits points at the other
// methods.
TEST(Cli, EstimateFitWeighsLoraAndQloraBesideFullFineTuning) {
  const std::string json = (std::filesystem::temp_directory_path() /
                            ("brisk_fit_lora_" + std::to_string(::getpid()) + ".json"))
                               .string();
  const std::string run =
      "estimate --device cpu --model gpt2 --seq_len 64 --per_device_train_batch_size 2 --fit "
      "--world_size 2 --max_memory 8GB --output_json " +
      json;
  const CliRun r = run_brisk(run + " --fit_methods full,lora,qlora");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find(" lora "), std::string::npos) << r.out;
  const nlohmann::json fit = read_json(json)["fit"];
  // A configuration's key apart from its method.
  auto key = [](const nlohmann::json& c) {
    return c["tp_size"].dump() + c["pp_size"].dump() + c["sp_size"].dump() +
           c["zero_stage"].dump() + c["per_device_train_batch_size"].dump() +
           c["gradient_checkpointing"].dump() + c["selective_recompute"].dump();
  };
  std::map<std::string, std::map<std::string, nlohmann::json>> by_key;
  std::set<int> full_stages, adapter_stages;
  for (const auto& c : fit) {
    const std::string method = c["method"];
    by_key[key(c)][method] = c;
    if (method == "full") {
      full_stages.insert(c["zero_stage"].get<int>());
      continue;
    }
    // LoRA under tensor parallelism too, QLoRA not; ZeRO 3 for LoRA alone, without it.
    EXPECT_EQ(c["pp_size"].get<int>() * c["sp_size"].get<int>(), 1);
    if (method == "qlora") EXPECT_EQ(c["tp_size"].get<int>(), 1);
    if (c["zero_stage"].get<int>() == 3) {
      EXPECT_EQ(method, "lora");
      EXPECT_EQ(c["tp_size"].get<int>(), 1);
    }
    adapter_stages.insert(c["zero_stage"].get<int>());
  }
  EXPECT_EQ(adapter_stages, (std::set<int>{0, 1, 2, 3}));
  EXPECT_TRUE(std::any_of(fit.begin(), fit.end(), [](const nlohmann::json& c) {
    return c["method"] == "lora" && c["tp_size"].get<int>() == 2;
  }));
  EXPECT_EQ(full_stages.size(), 4u);
  int compared = 0;
  for (auto& [k, m] : by_key) {
    if (!m.count("lora") || !m.count("qlora") || !m.count("full")) continue;
    ++compared;
    EXPECT_LT(m["lora"]["needed_bytes"].get<size_t>(), m["full"]["needed_bytes"].get<size_t>());
    EXPECT_LT(m["qlora"]["needed_bytes"].get<size_t>(), m["lora"]["needed_bytes"].get<size_t>());
    EXPECT_LT(m["lora"]["predicted_step_seconds"].get<double>(),
              m["full"]["predicted_step_seconds"].get<double>());
  }
  // ZeRO 0 to 2 x batch 1 and 2 (of 4 over 2 replicas) x 3 recomputations.
  EXPECT_EQ(compared, 18);
  // Stage 3 holds less of a LoRA's frozen base than stage 2 does.
  int staged = 0;
  for (auto& [k, m] : by_key) {
    if (!m.count("lora") || m["lora"]["zero_stage"] != 2) continue;
    nlohmann::json at_three = m["lora"];
    at_three["zero_stage"] = 3;
    const std::string three = key(at_three);
    if (!by_key.count(three) || !by_key[three].count("lora")) continue;
    ++staged;
    EXPECT_LT(by_key[three]["lora"]["needed_bytes"].get<size_t>(),
              m["lora"]["needed_bytes"].get<size_t>());
  }
  EXPECT_GT(staged, 0);
  const CliRun own = run_brisk(run + " --use_peft");
  ASSERT_EQ(own.exit_code, 0) << own.err;
  // Adapters on row-parallel linears with dropout: tensor parallelism is left out, not refused.
  const CliRun all = run_brisk(run + " --use_peft --lora_target_modules all-linear");
  ASSERT_EQ(all.exit_code, 0) << all.err;
  const nlohmann::json all_fit = read_json(json)["fit"];
  for (const auto& c : all_fit) EXPECT_EQ(c["tp_size"], 1);
  const nlohmann::json own_fit = read_json(json)["fit"];
  for (const auto& c : own_fit) EXPECT_EQ(c["method"], "lora");
  std::filesystem::remove(json);
  expect_refused("estimate --device cpu --model gpt2 --fit --max_memory 900MiB",
                 "LoRA or QLoRA (--fit_methods full,lora,qlora)");
  expect_refused("estimate --model gpt2 --fit --max_memory 1GB --fit_methods full,dora",
                 "unknown method \"dora\" in fit_methods (valid: full, lora, qlora)");
  expect_refused(
      "estimate --model gpt2 --fit --max_memory 1GB --fit_methods full "
      "--adapter_name_or_path " +
          fixture("lora/merge_gpt2"),
      "full fine-tuning beside --adapter_name_or_path");
}

// estimate --max_memory says whether the planned run fits and by how much (the headline a QLoRA
// user checks before renting a GPU), in its output and its JSON.
TEST(Cli, EstimateSaysWhetherTheRunFitsMaxMemory) {
  const std::string json = (std::filesystem::temp_directory_path() /
                            ("brisk_budget_" + std::to_string(::getpid()) + ".json"))
                               .string();
  const std::string run =
      "estimate --device cpu --model gpt2 --seq_len 64 --per_device_train_batch_size 2 "
      "--max_memory 1GB --output_json " +
      json;
  const CliRun full = run_brisk(run);
  ASSERT_EQ(full.exit_code, 0) << full.err;
  EXPECT_NE(full.out.find("does NOT fit within 953.7 MiB (--max_memory 1GB)"), std::string::npos)
      << full.out;
  nlohmann::json b = read_json(json)["budget"];
  EXPECT_FALSE(b["fits"].get<bool>());
  EXPECT_GT(b["needed_bytes"].get<size_t>(), size_t{1000000000});
  const CliRun qlora = run_brisk(run + " --use_peft --load_in_4bit");
  ASSERT_EQ(qlora.exit_code, 0) << qlora.err;
  b = read_json(json)["budget"];
  std::filesystem::remove(json);
  EXPECT_TRUE(b["fits"].get<bool>());
  const auto spare =
      static_cast<double>(b["budget_bytes"].get<size_t>() - b["needed_bytes"].get<size_t>()) /
      (1 << 20);
  char line[64];
  std::snprintf(line, sizeof line, "%.1f MiB to spare", spare);
  EXPECT_NE(qlora.out.find(line), std::string::npos) << qlora.out;
}

// estimate of a LoRA run: the parameters its adapters train (r x (in + out) per adapted linear)
// and their states apart from the frozen base; QLoRA's store at its bytes per parameter (4-bit
// codes and a float32 absmax per 64, or nested an 8-bit one and a float32 per 256 of those).
TEST(Cli, EstimateShowsTheAdaptersAndTheFrozenBase) {
  const std::string json = (std::filesystem::temp_directory_path() /
                            ("brisk_adapters_" + std::to_string(::getpid()) + ".json"))
                               .string();
  const std::string run =
      "estimate --device cpu --model gpt2 --seq_len 64 --use_peft --lora_r 8 "
      "--output_json " +
      json;
  const CliRun lora = run_brisk(run);
  ASSERT_EQ(lora.exit_code, 0) << lora.err;
  EXPECT_NE(lora.out.find("LoRA r 8 on c_attn: 294912 parameters trained"), std::string::npos)
      << lora.out;
  nlohmann::json a = read_json(json)["adapters"];
  EXPECT_EQ(a["trained_parameters"], 12 * 8 * (768 + 3 * 768));
  EXPECT_EQ(a["trained_weights_bytes"], 4 * a["trained_parameters"].get<int64_t>());
  EXPECT_EQ(a["gradients_bytes"], a["trained_weights_bytes"]);
  EXPECT_FALSE(a.contains("store"));
  for (const bool nested : {false, true}) {
    const CliRun q = run_brisk(run + " --load_in_4bit" + (nested ? " --use_bnb_nested_quant" : ""));
    ASSERT_EQ(q.exit_code, 0) << q.err;
    a = read_json(json)["adapters"];
    const nlohmann::json& s = a["store"];
    // Every block linear of GPT-2 small: 12 x (3 + 1 + 4 + 4) x 768^2 values, blocks of 64.
    const int64_t n = 12 * 12 * 768 * 768;
    EXPECT_EQ(s["parameters"], n);
    const double want = nested ? 0.5 + 1.0 / 64 + 4.0 / (64 * 256) : 0.5 + 4.0 / 64;
    EXPECT_NEAR(s["bytes_per_parameter"].get<double>(), want, 1e-4) << nested;
    EXPECT_EQ(s["nested"], nested);
  }
  std::filesystem::remove(json);
}

}  // namespace
}  // namespace brisk::testing
