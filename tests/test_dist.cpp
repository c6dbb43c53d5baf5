// Launch information from the environment (MPI launchers, torchrun-style variables), and the
// single-process communicator. The collectives across processes are tests/parallel/ (run by
// mpirun).
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/json_file.h"
#include "parallel/communicator.h"
#include "parallel/grad_buckets.h"
#include "parallel/launch.h"
#include "parallel/zero.h"
#include "test_support.h"
#include "train/assembly.h"
#include "train/deepspeed.h"
#include "train/deepspeed_keys.h"
#include "train/trainer.h"
#include "trainer_support.h"

namespace brisk::testing {
namespace {

LaunchInfo launch(const std::map<std::string, std::string>& vars) {
  return launch_info_from_env([&](const std::string& name) -> std::optional<std::string> {
    const auto it = vars.find(name);
    return it == vars.end() ? std::nullopt : std::optional<std::string>(it->second);
  });
}

TEST(Launch, NoLauncherIsOneProcess) {
  const LaunchInfo l = launch({});
  EXPECT_EQ(l.launcher, Launcher::none);
  EXPECT_EQ(l.rank, 0);
  EXPECT_EQ(l.size, 1);
}

TEST(Launch, MpiLaunchersAreRead) {
  LaunchInfo l = launch({{"OMPI_COMM_WORLD_RANK", "2"},
                         {"OMPI_COMM_WORLD_SIZE", "4"},
                         {"OMPI_COMM_WORLD_LOCAL_RANK", "0"}});
  EXPECT_EQ(l.launcher, Launcher::mpi);
  EXPECT_EQ(l.rank, 2);
  EXPECT_EQ(l.size, 4);
  EXPECT_EQ(l.local_rank, 0);
  l = launch({{"PMI_RANK", "1"}, {"PMI_SIZE", "3"}, {"MPI_LOCALRANKID", "1"}});  // MPICH
  EXPECT_EQ(l.launcher, Launcher::mpi);
  EXPECT_EQ(l.rank, 1);
  EXPECT_EQ(l.size, 3);
  EXPECT_EQ(l.local_rank, 1);
  // torchrun-style variables that agree with the MPI launcher are fine.
  l = launch({{"OMPI_COMM_WORLD_RANK", "1"},
              {"OMPI_COMM_WORLD_SIZE", "2"},
              {"RANK", "1"},
              {"WORLD_SIZE", "2"},
              {"MASTER_ADDR", "node7"},
              {"MASTER_PORT", "29500"}});
  EXPECT_EQ(l.launcher, Launcher::mpi);
  EXPECT_EQ(l.master_addr, "node7");
  EXPECT_EQ(l.master_port, 29500);
}

TEST(Launch, TorchrunStyleVariablesAreRead) {
  const LaunchInfo l =
      launch({{"RANK", "3"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "3"}, {"MASTER_PORT", "1"}});
  EXPECT_EQ(l.launcher, Launcher::torchrun);
  EXPECT_EQ(l.rank, 3);
  EXPECT_EQ(l.size, 8);
  EXPECT_EQ(l.local_rank, 3);
}

TEST(Launch, BadOrContradictingVariablesAreRefusedByName) {
  expect_error(
      [] {
        launch({{"RANK", "x"}, {"WORLD_SIZE", "2"}});
      },
      "RANK=\"x\" is not a whole number");
  expect_error([] { launch({{"RANK", "-1"}, {"WORLD_SIZE", "2"}}); }, "RANK=\"-1\"");
  expect_error(
      [] {
        launch({{"RANK", "2"}, {"WORLD_SIZE", "2"}});
      },
      "RANK=2 is not below WORLD_SIZE=2");
  expect_error([] { launch({{"RANK", "0"}, {"WORLD_SIZE", "0"}}); }, "WORLD_SIZE=0 is outside");
  expect_error([] { launch({{"RANK", "1"}}); }, "WORLD_SIZE is missing (RANK is set)");
  expect_error(
      [] {
        launch({{"OMPI_COMM_WORLD_SIZE", "2"}});
      },
      "OMPI_COMM_WORLD_RANK is missing (OMPI_COMM_WORLD_SIZE is set)");
  expect_error(
      [] {
        launch({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "5"}});
      },
      "local rank 5 is not below the number of ranks 2");
  expect_error(
      [] {
        launch({{"RANK", "0"}, {"WORLD_SIZE", "99999999999"}});
      },
      "WORLD_SIZE=\"99999999999\" is not a whole number");
  expect_error([] { launch({{"MASTER_PORT", "70000"}}); }, "MASTER_PORT=70000 is outside");
  // A long value is shown cut short.
  try {
    launch({{"RANK", std::string(5000, '7')}, {"WORLD_SIZE", "2"}});
    ADD_FAILURE() << "a 5000-digit RANK was accepted";
  } catch (const Error& e) {
    EXPECT_LT(std::string(e.what()).size(), 200u) << e.what();
  }
  expect_error(
      [] {
        launch({{"OMPI_COMM_WORLD_RANK", "1"},
                {"OMPI_COMM_WORLD_SIZE", "2"},
                {"RANK", "0"},
                {"WORLD_SIZE", "2"}});
      },
      "rank 0 of 2 (RANK, WORLD_SIZE) but the MPI launcher rank 1 of 2");
}

// brisk's rendezvous never takes torchrun's port: the one after it, or the one asked for.
TEST(Launch, TheRendezvousPortIsDerivedFromMasterPort) {
  EXPECT_EQ(launch({{"MASTER_PORT", "29500"}}).rendezvous_port, 29501);
  EXPECT_EQ(launch({{"MASTER_PORT", "29500"}, {"BRISK_RENDEZVOUS_PORT", "40000"}}).rendezvous_port,
            40000);
  EXPECT_EQ(launch({{"MASTER_PORT", "65535"}}).rendezvous_port, 0);  // none after it
  EXPECT_EQ(launch({}).rendezvous_port, 0);
  expect_error(
      [] {
        launch({{"MASTER_PORT", "29500"}, {"BRISK_RENDEZVOUS_PORT", "29500"}});
      },
      "BRISK_RENDEZVOUS_PORT=29500 is MASTER_PORT, which torchrun's own store holds");
  expect_error(
      [] {
        launch({{"BRISK_RENDEZVOUS_PORT", "0"}});
      },
      "BRISK_RENDEZVOUS_PORT=0 is outside");
}

// torchrun-style launches of several CPU processes go through Gloo: refused, naming mpirun, where
// brisk was built without it (tests/parallel/ runs them through Gloo otherwise).
TEST(Launch, SeveralTorchrunProcessesWithoutGlooBuiltInAreRefused) {
  EXPECT_EQ(make_communicator(launch({{"RANK", "0"}, {"WORLD_SIZE", "1"}}))->size(), 1);
  if (gloo_built_in()) GTEST_SKIP() << "this brisk has Gloo; tests/parallel/ runs it through Gloo";
  expect_error(
      [] {
        make_communicator(launch({{"RANK", "0"}, {"WORLD_SIZE", "2"}}));
      },
      "brisk was built without Gloo (install libgloo-dev and rebuild, or start the ranks with "
      "mpirun -np 2)");
}

TEST(Launch, AnMpiLaunchWithoutMpiBuiltInIsRefused) {
  if (mpi_built_in()) GTEST_SKIP() << "this brisk has MPI; tests/parallel/ runs it under mpirun";
  expect_error(
      [] {
        make_communicator(launch({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}}));
      },
      "built without MPI");
}

// One process: reductions leave the buffer, scatters and gathers copy.
TEST(SingleProcess, CollectivesAreCopies) {
  auto comm = make_single_process();
  EXPECT_EQ(comm->rank(), 0);
  EXPECT_EQ(comm->size(), 1);
  std::vector<float> a = {1.5f, -2.f, 3.f}, b(3, 0.f);
  comm->all_reduce_sum(Tensor(a.data(), Shape{3}, DType::f32));
  EXPECT_EQ(a, (std::vector<float>{1.5f, -2.f, 3.f}));
  comm->reduce_scatter_sum(Tensor(a.data(), Shape{3}, DType::f32),
                           Tensor(b.data(), Shape{3}, DType::f32));
  EXPECT_EQ(b, a);
  std::fill(b.begin(), b.end(), 0.f);
  comm->all_gather(Tensor(a.data(), Shape{3}, DType::f32), Tensor(b.data(), Shape{3}, DType::f32));
  EXPECT_EQ(b, a);
  comm->broadcast(Tensor(a.data(), Shape{3}, DType::f32), 0);
  comm->barrier();
  expect_error([&] { comm->broadcast(Tensor(a.data(), Shape{3}, DType::f32), 1); }, "root 1");
  expect_error(
      [&] {
        comm->all_gather(Tensor(a.data(), Shape{3}, DType::f32),
                         Tensor(b.data(), Shape{2}, DType::f32));
      },
      "3 elements in and 2 out");
  std::vector<int32_t> ints(3);
  expect_error([&] { comm->all_reduce_sum(Tensor(ints.data(), Shape{3}, DType::i32)); },
               "float32, bf16 or float64 buffers only");
}

// Records the started all-reduces as element ranges of one buffer, and what was waited for.
class Recorder final : public Communicator {
 public:
  explicit Recorder(const std::vector<float>& base) : base_(base.data()) {}
  std::vector<ElementRange> started;
  int waits = 0;
  int rank() const override { return 0; }
  int size() const override { return 2; }
  std::string name() const override { return "recorder"; }
  void all_reduce_sum(const Tensor&) override { ADD_FAILURE() << "blocking all-reduce"; }
  void reduce_scatter_sum(const Tensor&, const Tensor&) override {}
  void reduce_scatter_sum_v(const Tensor&, const std::vector<int64_t>&, const Tensor&) override {}
  void all_gather(const Tensor&, const Tensor&) override {}
  void gather_v(const Tensor&, const std::vector<int64_t>&, const Tensor&, int) override {}
  void all_gather_v(const Tensor&, const std::vector<int64_t>&, const Tensor&) override {}
  void broadcast(const Tensor&, int) override {}
  void barrier() override {}
  [[noreturn]] void abort(int code) override { std::exit(code); }
  void start_all_reduce_sum(const Tensor& buf) override {
    started.push_back({buf.f32() - base_, buf.numel()});
  }
  double wait_started() override {
    ++waits;
    return 0.5;
  }

 private:
  const float* base_;
};

// Segments as a model reports them (head, blocks last to first, embeddings: downwards through the
// buffer): consecutive ones join a bucket until it holds at least the cap; a bucket's sum starts
// when its last segment is final, in order; finish starts the rest, waits, and resets.
TEST(GradBuckets, SegmentsJoinBucketsUpToTheCapAndStartWhenFinal) {
  std::vector<float> flat(1000);
  const Tensor t(flat.data(), Shape{1000}, DType::f32);
  const std::vector<ElementRange> segments{{900, 100}, {700, 200}, {500, 200}, {300, 200},
                                           {100, 200}, {100, 0},   {0, 100}};
  GradBuckets buckets(t, segments, /*cap_bytes=*/4 * 250);  // 250 elements
  const std::vector<ElementRange> want{{700, 300}, {300, 400}, {0, 300}};
  EXPECT_EQ(buckets.ranges(), want);
  Recorder comm(flat);
  for (int round = 0; round < 2; ++round) {
    comm.started.clear();
    buckets.segment_done(comm, 0);
    EXPECT_TRUE(comm.started.empty()) << "the first bucket's last segment is not final yet";
    buckets.segment_done(comm, 1);
    EXPECT_EQ(comm.started, std::vector<ElementRange>{want[0]});
    buckets.segment_done(comm, 2);
    buckets.segment_done(comm, 3);
    EXPECT_EQ(comm.started.size(), 2u);
    buckets.segment_done(comm, 4);
    buckets.segment_done(comm, 5);
    EXPECT_EQ(comm.started.size(), 2u) << "the empty segment 5 and segment 6 make bucket 3";
    EXPECT_EQ(buckets.finish(comm), 0.5);  // segment 6 was never reported: started here
    EXPECT_EQ(comm.started, want);
    EXPECT_EQ(comm.waits, round + 1);
  }
  // Nothing reported (earlier micro-steps, or a model without segments): all at the end.
  comm.started.clear();
  buckets.finish(comm);
  EXPECT_EQ(comm.started, want);
  EXPECT_THROW(buckets.segment_done(comm, 7), Error);
  buckets.segment_done(comm, 0);
  EXPECT_THROW(buckets.segment_done(comm, 0), Error);
}

TEST(GradBuckets, AGapOrAShortfallIsNotBucketed) {
  std::vector<float> flat(100);
  const Tensor t(flat.data(), Shape{100}, DType::f32);
  // Not end to end: separate buckets however large the cap.
  GradBuckets gap(t, {{50, 50}, {0, 50}}, 1 << 20);
  EXPECT_EQ(gap.ranges().size(), 1u);
  GradBuckets apart(t, {{0, 50}, {50, 50}}, 1 << 20);
  EXPECT_EQ(apart.ranges().size(), 2u);
  EXPECT_THROW(GradBuckets(t, {{50, 50}}, 1 << 20), Error);           // half uncovered
  EXPECT_THROW(GradBuckets(t, {{50, 60}, {0, 50}}, 1 << 20), Error);  // past the end
  EXPECT_THROW(GradBuckets(t, {{0, 100}}, 0), Error);
}

// ZeRO's shards: contiguous runs of whole parameters covering them all, each ending at the
// parameter boundary nearest to its share; with blocks, at the block boundary nearest to it.
TEST(Zero, ShardsAreRunsOfWholeParametersNearTheirShare) {
  ParameterSet p;
  for (int64_t n : {10, 10, 10, 70})
    p.add("p" + std::to_string(p.list().size()), Shape{n}, kBiasOrNorm);
  const ShardGranule whole = [](const ParamInfo& q) { return q.shape.numel(); };
  const ShardGranule anywhere = [](const ParamInfo&) { return int64_t{1}; };
  auto shards = partition_params(p, 2, whole);
  ASSERT_EQ(shards.size(), 2u);
  EXPECT_EQ(shards[0].first, 0);
  EXPECT_EQ(shards[0].last, 3);  // 30 elements: nearer 50 than 100
  EXPECT_EQ(shards[0].elements, (ElementRange{0, 30}));
  EXPECT_EQ(shards[1].first, 3);
  EXPECT_EQ(shards[1].last, 4);
  EXPECT_EQ(shards[1].elements, (ElementRange{30, 70}));
  shards = partition_params(p, 1, whole);
  EXPECT_EQ(shards[0].elements, (ElementRange{0, 100}));
  // More ranks than parameters: some shares are empty, the rest still cover everything.
  shards = partition_params(p, 6, whole);
  int64_t next = 0;
  for (const ParamShard& s : shards) {
    EXPECT_EQ(s.elements.offset, next);
    next += s.elements.count;
  }
  EXPECT_EQ(next, 100);
  // Split: equal runs of elements, cut inside parameters; a cut parameter's piece is flat.
  shards = partition_params(p, 3, anywhere);
  EXPECT_EQ(shards[0].elements, (ElementRange{0, 34}));
  EXPECT_EQ(shards[1].elements, (ElementRange{34, 34}));
  EXPECT_EQ(shards[2].elements, (ElementRange{68, 32}));
  EXPECT_EQ(shards[0].first, 0);
  EXPECT_EQ(shards[0].last, 4);
  EXPECT_EQ(shards[1].first, 3);
  EXPECT_EQ(shards[1].last, 4);
  const ParameterSet first = shard_params(p, shards[0]);
  ASSERT_EQ(first.list().size(), 4u);
  EXPECT_EQ(first.list()[3].name, "p3");
  EXPECT_EQ(first.list()[3].shape.numel(), 4);
  EXPECT_EQ(first.total_elements(), 34);
  EXPECT_EQ(shard_params(p, shards[2]).total_elements(), 32);
  shards = partition_params(p, 200, anywhere);  // more ranks than elements: the last ones get none
  EXPECT_EQ(shards[99].elements, (ElementRange{99, 1}));
  EXPECT_EQ(shards[100].elements.count, 0);
  EXPECT_EQ(shard_params(p, shards[100]).total_elements(), 0);
  const ParameterSet mine = shard_params(p, partition_params(p, 2, whole)[1]);
  ASSERT_EQ(mine.list().size(), 1u);
  EXPECT_EQ(mine.list()[0].name, "p3");
  EXPECT_EQ(mine.list()[0].offset, 0);
  EXPECT_EQ(mine.total_elements(), 70);
  EXPECT_EQ(mine.list()[0].whole_elements, 0) << "whole, not a piece";
  // Cut in blocks of 8 inside p3 (as 8-bit AdamW's quantized moments): the share's end, 50, lies
  // 20 into p3, as near block 2's end (46) as block 3's (54): the later.
  const ShardGranule blocks = [](const ParamInfo& q) {
    return q.name == "p3" ? int64_t{8} : q.shape.numel();
  };
  shards = partition_params(p, 2, blocks);
  EXPECT_EQ(shards[0].elements, (ElementRange{0, 54}));
  EXPECT_EQ(shards[1].elements, (ElementRange{54, 46}));
  EXPECT_EQ(shards[0].last, 4);
  EXPECT_EQ(shards[1].first, 3);
  const ParameterSet head = shard_params(p, shards[0]), tail = shard_params(p, shards[1]);
  EXPECT_EQ(head.list()[3].shape.numel(), 24);
  EXPECT_EQ(head.list()[3].whole_elements, 70) << "a piece knows its whole parameter";
  EXPECT_EQ(tail.list()[0].whole_numel(), 70);
  // Three shares of 34: 34 lies as near 30 as 38 (the later), 68 nearer 70 than 62.
  shards = partition_params(p, 3, blocks);
  EXPECT_EQ(shards[0].elements, (ElementRange{0, 38}));
  EXPECT_EQ(shards[1].elements, (ElementRange{38, 32}));
  EXPECT_EQ(shards[2].elements, (ElementRange{70, 30}));
}

// The plan of a ZeRO rank holds its share of the optimizer state: the ranks' shares add up to the
// whole (AdamW's decay tables, one small table per rank, aside), each near 1/N of it.
TEST(Zero, EachRanksPlanHoldsItsShareOfTheOptimizerState) {
  TempDir dir("zero_plan");
  TrainOptions o = tiny_options(write_config(dir, "gpt2", 0.0), dir / "out");
  const int state = static_cast<int>(Category::optimizer_state);
  const size_t whole = assemble_run(o, Device::cpu, nullptr)->plan.bytes_by_category()[state];
  o.zero_stage = 1;
  for (int N : {2, 3}) {
    size_t sum = 0;
    for (int r = 0; r < N; ++r) {
      const size_t part =
          assemble_run(o, Device::cpu, nullptr, nullptr, r, N)->plan.bytes_by_category()[state];
      EXPECT_LT(part, whole * 0.75 / (N - 1)) << "rank " << r << " of " << N;
      sum += part;
    }
    EXPECT_NEAR(static_cast<double>(sum), static_cast<double>(whole), 512.0 * N) << N;
  }
  // Plain data parallelism: every rank holds it all.
  o.zero_stage = 0;
  EXPECT_EQ(assemble_run(o, Device::cpu, nullptr, nullptr, 1, 2)->plan.bytes_by_category()[state],
            whole);
}

// 8-bit AdamW under ZeRO: the ranks' shards may end inside quantized parameters, between whole
// blocks, so the ranks' 8-bit codes and block maxima add up to exactly one process's (a block cut
// in two would count twice), and every rank holds its share within a block of it.
TEST(Zero, EightBitShardsEndBetweenWholeBlocks) {
  TempDir dir("zero_8bit");
  const std::string model = write_config(dir, "gpt2", 0.0, 5);
  TrainOptions o = tiny_options(model, dir / "out");
  o.optim = "adamw_8bit";
  o.optim_args = "min_8bit_size=256";
  auto sizes = [](const RunAssembly& run) {  // the planned state, buffer by buffer
    std::map<std::string, int64_t> n;
    for (const BufferSpec& b : run.plan.buffers())
      if (b.name.rfind("adamw_8bit.", 0) == 0 && b.name != "adamw_8bit.quant_maps")
        n[b.name] = b.shape.numel();
    return n;
  };
  const std::map<std::string, int64_t> whole = sizes(*assemble_run(o, Device::cpu, nullptr));
  o.zero_stage = 1;
  for (int N : {2, 3}) {
    std::map<std::string, int64_t> sum;
    int cut_inside_8bit = 0;
    for (int r = 0; r < N; ++r) {
      const auto run = assemble_run(o, Device::cpu, nullptr, nullptr, r, N);
      for (const auto& [name, n] : sizes(*run)) sum[name] += n;
      const int64_t total = run->model->params().total_elements();
      EXPECT_NEAR(static_cast<double>(run->parallel.shards[static_cast<size_t>(r)].elements.count),
                  static_cast<double>(total) / N, 256.0)
          << "rank " << r << " of " << N;
      for (const ParamInfo& p : run->optimizer_params.list())
        if (p.whole_elements > 0 && run->optimizer->shard_granule(p) > 1) ++cut_inside_8bit;
    }
    EXPECT_EQ(sum, whole) << N << " ranks";
    // On 2 ranks the cut falls in the (float32) embeddings; on 3 (as in tests/dist, where ZeRO
    // then trains bit for bit as plain data parallelism) inside quantized matrices.
    if (N == 3) EXPECT_GT(cut_inside_8bit, 0) << "no shard ends inside a quantized parameter";
  }
}

// ZeRO stage 3 stages the blocks' weights in two slots (the next block's gather running while a
// block computes); stage3_prefetch_bucket_size below one block's weights plans one slot: one
// block's weights less, on every rank.
TEST(Zero, Stage3PrefetchBelowABlockPlansOneSlotLess) {
  TempDir dir("zero3_slots");
  const std::string model = write_config(dir, "gpt2", 0.0, 5);
  TrainOptions o = tiny_options(model, dir / "out");
  o.zero_stage = 3;
  const int weights = static_cast<int>(Category::weights);
  for (int r = 0; r < 2; ++r) {
    auto planned = [&](int64_t prefetch, int* slots) {
      o.stage3_prefetch_bucket_size = prefetch;
      const auto run = assemble_run(o, Device::cpu, nullptr, nullptr, r, 2);
      *slots = run->model->weight_layout().slots();
      return std::make_pair(run->plan.bytes_by_category()[weights],
                            SegmentLayout::block_elements(run->model->param_segments(), 1));
    };
    int slots_default = 0, slots_enough = 0, slots_less = 0;
    const auto [with, block] = planned(-1, &slots_default);
    EXPECT_EQ(slots_default, 2) << "rank " << r;
    EXPECT_EQ(planned(block, &slots_enough).first, with) << "a block's worth prefetches it";
    EXPECT_EQ(slots_enough, 2);
    const size_t without = planned(block - 1, &slots_less).first;
    EXPECT_EQ(slots_less, 1) << "rank " << r;
    EXPECT_EQ(with - without, static_cast<size_t>(block) * 4) << "rank " << r;
  }
}

// --deepspeed: the keys brisk has a meaning for become options, "auto" keeps them, contradictions
// and what brisk does not do are refused naming the key, the rest is listed.
TEST(DeepSpeed, TheConfigsKeysBecomeOptions) {
  TrainOptions o;
  o.per_device_train_batch_size = 4;
  o.gradient_accumulation_steps = 2;
  o.device = "cpu";
  const nlohmann::json config = nlohmann::json::parse(R"({
    "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": 2,
    "train_batch_size": 16, "gradient_clipping": 1.0, "bf16": {"enabled": false},
    "fp16": {"enabled": "auto", "loss_scale": 0},
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "weight_decay": "auto"}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": "auto"}},
    "zero_optimization": {"stage": 1, "overlap_comm": true, "reduce_bucket_size": 5e8,
                          "allgather_bucket_size": 5e8, "offload_optimizer": {"device": "cpu"}},
    "steps_per_print": 10})");
  std::vector<std::string> ignored;
  TrainOptions got = apply_deepspeed_json(o, config, "ds.json", 2, &ignored);
  EXPECT_EQ(got.zero_stage, 1);
  EXPECT_NEAR(got.ddp_bucket_cap_mb, 5e8 * 4 / (1 << 20), 1e-6);
  EXPECT_EQ(ignored, (std::vector<std::string>{"fp16.loss_scale", "steps_per_print",
                                               "zero_optimization.allgather_bucket_size"}));
  EXPECT_EQ(got.stage3_prefetch_bucket_size, -1);
  EXPECT_EQ(got.offload_optimizer, "cpu");
  got = apply_deepspeed_json(o, {{"zero_optimization", {{"overlap_comm", false}}}}, "ds.json", 1);
  EXPECT_EQ(got.offload_optimizer, "none");
  EXPECT_EQ(got.ddp_bucket_cap_mb, 1e6) << "no overlap: one bucket after backward";
  EXPECT_EQ(got.zero_stage, 0);
  got = apply_deepspeed_json(
      o, {{"zero_optimization", {{"stage", 3}, {"stage3_prefetch_bucket_size", 1000}}}}, "ds.json",
      2);
  EXPECT_EQ(got.stage3_prefetch_bucket_size, 1000);
  got = apply_deepspeed_json(o, {{"zero_optimization", {{"stage3_prefetch_bucket_size", "auto"}}}},
                             "ds.json", 2);
  EXPECT_EQ(got.stage3_prefetch_bucket_size, -1) << "auto keeps the option";

  auto refused = [&](const std::string& text, const std::string& message, int ranks = 1) {
    SCOPED_TRACE(text);
    expect_error(
        [&] {
          validate_options(apply_deepspeed_json(o, nlohmann::json::parse(text), "ds.json", ranks));
        },
        message);
  };
  refused(R"({"train_micro_batch_size_per_gpu": 8})",
          "ds.json: train_micro_batch_size_per_gpu is 8 but --per_device_train_batch_size is 4");
  refused(R"({"train_batch_size": 8})", "train_batch_size is 8 but", 2);
  refused(R"({"bf16": {"enabled": true}})", "bf16.enabled is true but --bf16 is false");
  refused(R"({"optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}})",
          "optimizer.params.lr is 0.0001 but --learning_rate is 5e-05");
  refused(R"({"zero_optimization": {"stage": 5}})", "zero_optimization.stage must be a whole");
  // Trainer fills in no stage: "auto" and other types are refused as numbers, the value shown.
  for (const char* stage : {R"("auto")", R"("2")", "true", "null"})
    refused(std::string(R"({"zero_optimization": {"stage": )") + stage + "}}",
            std::string("zero_optimization.stage must be a whole number in [0, 3], got ") + stage);
  EXPECT_EQ(apply_deepspeed_json(o, nlohmann::json::parse(R"({"zero_optimization": {"stage": 3}})"),
                                 "ds.json", 2)
                .zero_stage,
            3);
  refused(R"({"zero_optimization": {"offload_optimizer": {"device": "nvme"}}})",
          "offload_optimizer.device \"nvme\" is not supported yet");
  refused(R"({"zero_optimization": {"reduce_bucket_size": -1}})", "reduce_bucket_size must be");
  refused(R"({"zero_optimization": []})", "zero_optimization must be an object");
  refused(R"([1, 2])", "a DeepSpeed config must be a JSON object");
  refused(R"({"zero_optimization": {"offload_param": {"device": "cpu"}}})",
          "offload_param.device \"cpu\" is not supported yet");
  refused(R"({"zero_optimization": {"offload_optimizer": {"device": 1}}})",
          "offload_optimizer.device must be");
  o.bf16 = true;
  o.bf16_master_weights = false;
  refused(
      R"({"bf16": {"enabled": true}, "zero_optimization": {"offload_optimizer": {"device": "cpu"}}})",
      "offload_optimizer cpu with --bf16 needs the float32 master copy");
  o.bf16 = false;
  o.bf16_master_weights = true;
  o.device = "cuda";
  EXPECT_EQ(
      apply_deepspeed_json(o, {{"zero_optimization", {{"offload_optimizer", {{"device", "cpu"}}}}}},
                           "ds.json", 1)
          .offload_optimizer,
      "cpu");
  // From a file: none named, nothing read; a malformed one named.
  o.device = "cpu";
  EXPECT_EQ(apply_deepspeed_config(o, 1).zero_stage, 0);
  TempDir dir("deepspeed");
  std::ofstream(dir / "bad.json") << "{\"zero_optimization\": {";
  o.deepspeed = dir / "bad.json";
  expect_error([&] { apply_deepspeed_config(o, 1); }, "bad.json");
}

TrainOptions from_fixture(const TrainOptions& o, const std::string& name, int ranks = 1) {
  TrainOptions given = o;
  given.deepspeed = fixture("deepspeed/" + name);
  TrainOptions got = apply_deepspeed_config(given, ranks);
  validate_options(got);
  return got;
}

// transformers' own ZeRO-2 config: ZeRO stage 2, the optimizer offloaded, DeepSpeed's WarmupLR.
TEST(DeepSpeed, TransformersZero2ConfigRunsZero2WithWarmupLR) {
  TrainOptions o;
  o.device = "cpu";
  const TrainOptions got = from_fixture(o, "transformers_ds_config_zero2.json", 2);
  EXPECT_EQ(got.zero_stage, 2);
  EXPECT_EQ(got.offload_optimizer, "cpu");
  EXPECT_NEAR(got.ddp_bucket_cap_mb, 2e8 * 4 / (1 << 20), 1e-6);
  EXPECT_EQ(got.lr_scheduler_type, "constant_with_warmup");
  EXPECT_EQ(got.deepspeed_scheduler.type, "WarmupLR");
  EXPECT_TRUE(got.deepspeed_scheduler.log_warmup) << "DeepSpeed's default warmup_type";
  EXPECT_EQ(got.deepspeed_scheduler.warmup_num_steps, -1) << "auto";
  EXPECT_EQ(got.optim, "adamw_torch");
}

// transformers' ZeRO-3 config offloads the parameters, which brisk does not do.
TEST(DeepSpeed, TransformersZero3ConfigIsRefusedForOffloadingTheParameters) {
  TrainOptions o;
  o.device = "cpu";
  expect_error([&] { from_fixture(o, "transformers_ds_config_zero3.json", 2); },
               "zero_optimization.offload_param.device \"cpu\" is not supported yet");
}

// accelerate's ZeRO-2 template: fp16, WarmupDecayLR, and torch_adam / adam_w_mode as extras.
TEST(DeepSpeed, AccelerateTemplateRunsWarmupDecayLRWithFp16) {
  TrainOptions o;
  o.device = "cpu";
  expect_error([&] { from_fixture(o, "accelerate_zero_stage2_config.json"); },
               "fp16.enabled is true but --fp16 is false");
  o.fp16 = true;
  const TrainOptions got = from_fixture(o, "accelerate_zero_stage2_config.json");
  EXPECT_EQ(got.zero_stage, 2);
  EXPECT_EQ(got.ddp_bucket_cap_mb, o.ddp_bucket_cap_mb) << "reduce_bucket_size auto";
  EXPECT_EQ(got.lr_scheduler_type, "linear");
  EXPECT_EQ(got.deepspeed_scheduler.type, "WarmupDecayLR");
  EXPECT_EQ(got.deepspeed_scheduler.total_num_steps, -1) << "auto";
  // torch.optim.AdamW decays by 0.01 where the config gives no weight_decay; here it is "auto".
  o.weight_decay = 0.01;
  EXPECT_EQ(from_fixture(o, "accelerate_zero_stage2_config.json").weight_decay, 0.01);
}

// DeepSpeedExamples' tensor-parallel config: autotp_size 4 is --tp_size 4 (never data parallel),
// sequence_parallel_size --sp_size; a flag giving another degree is refused naming both.
TEST(DeepSpeed, TensorAndSequenceParallelDegreesSetTheOptions) {
  TrainOptions o;
  o.device = "cpu";
  EXPECT_EQ(from_fixture(o, "deepspeedexamples_tensor_parallel_ds_config.json", 4).tp_size, 4);
  TrainOptions given = o;
  given.tp_size = 2;
  expect_error([&] { from_fixture(given, "deepspeedexamples_tensor_parallel_ds_config.json", 4); },
               "tensor_parallel.autotp_size is 4 but --tp_size is 2");
  EXPECT_EQ(apply_deepspeed_json(o, {{"sequence_parallel_size", 2}}, "ds.json", 2).sp_size, 2);
  std::vector<std::string> ignored;
  apply_deepspeed_json(o, {{"tensor_parallel", {{"autotp_size", 1}, {"tp_overlap_comm", true}}}},
                       "ds.json", 1, &ignored);
  EXPECT_EQ(ignored, std::vector<std::string>{"tensor_parallel.tp_overlap_comm"});
  auto refused = [&](const nlohmann::json& config, const std::string& message) {
    SCOPED_TRACE(config.dump());
    expect_error([&] { apply_deepspeed_json(o, config, "ds.json", 2); }, message);
  };
  refused({{"sequence_parallel_size", 0}}, "sequence_parallel_size");
  refused({{"amp", {{"enabled", true}}}}, "amp.enabled is true: apex's amp is not in brisk");
  refused({{"zero_optimization", {{"zero_quantized_weights", true}}}},
          "zero_optimization.zero_quantized_weights is true: ZeRO++'s quantized communication");
  apply_deepspeed_json(o, {{"sequence_parallel_size", 1}, {"amp", {{"enabled", false}}}}, "ds.json",
                       2);
}

// DeepSpeedExamples' ZenFlow config: explicit optimizer values equal to the options pass, a
// different one is refused naming both, and ZenFlow's partial updates are refused.
TEST(DeepSpeed, ZenFlowConfigChecksItsExplicitValuesAndIsRefused) {
  TrainOptions o;
  o.device = "cpu";
  o.per_device_train_batch_size = 32;
  o.bf16 = true;
  o.weight_decay = 0.01;
  expect_error([&] { from_fixture(o, "deepspeedexamples_zenflow_zf_config.json"); },
               "optimizer.params.lr is 2e-05 but --learning_rate is 5e-05: set it to \"auto\"");
  o.learning_rate = 2e-5;
  expect_error([&] { from_fixture(o, "deepspeedexamples_zenflow_zf_config.json"); },
               "zero_optimization.zenflow is not in brisk");
}

// optimizer.type: DeepSpeed's Adam and AdamW are adamw_torch; values "auto", equal, or refused.
TEST(DeepSpeed, OptimizerTypesMapToAdamWOrAreRefusedByName) {
  TrainOptions o;
  o.device = "cpu";
  auto optimizer = [](const std::string& type, const nlohmann::json& params) {
    return nlohmann::json{{"optimizer", {{"type", type}, {"params", params}}}};
  };
  const nlohmann::json same = {{"lr", 5e-5},        {"betas", {0.9, 0.999}}, {"eps", 1e-8},
                               {"weight_decay", 0}, {"torch_adam", false},   {"adam_w_mode", true}};
  for (const char* type : {"AdamW", "Adam", "adamw"})
    EXPECT_EQ(apply_deepspeed_json(o, optimizer(type, same), "ds.json", 1).optim, "adamw_torch");
  auto refused = [&](const nlohmann::json& config, const std::string& message) {
    SCOPED_TRACE(config.dump());
    expect_error([&] { apply_deepspeed_json(o, config, "ds.json", 1); }, message);
  };
  refused(optimizer("AdamW", {{"lr", "auto"}, {"betas", {0.8, 0.999}}}),
          "optimizer.params.betas is [0.8,0.999] but --adam_beta1/--adam_beta2 is [0.9,0.999]");
  refused(optimizer("AdamW", {{"lr", "auto"}, {"eps", 1e-6}}),
          "optimizer.params.eps is 1e-06 but --adam_epsilon");
  refused(optimizer("AdamW", {{"lr", "auto"}, {"weight_decay", 0.1}}),
          "optimizer.params.weight_decay is 0.1 but --weight_decay is 0.0");
  refused(optimizer("AdamW", nlohmann::json::object()),
          "optimizer.params.lr is absent, so DeepSpeed takes its default 0.001, but "
          "--learning_rate is 5e-05");
  refused(optimizer("AdamW", {{"lr", "auto"}, {"torch_adam", true}}),
          "optimizer.params.weight_decay is absent, so DeepSpeed takes its default 0.01");
  refused(optimizer("Adam", {{"lr", "auto"}, {"adam_w_mode", false}}),
          "optimizer.params.adam_w_mode false makes Adam add the weight decay to the gradient");
  refused(optimizer("Lamb", same), "optimizer.type \"Lamb\" is not in brisk");
  refused(optimizer("OneBitAdam", same), "optimizer.type \"OneBitAdam\" is not in brisk");
  refused(optimizer("AdamW", {{"lr", "auto"}, {"amsgrad", true}}),
          "optimizer.params.amsgrad is true: brisk's AdamW has it false");
  refused(optimizer("AdamW", {{"lr", "auto"}, {"freeze_step", 4}}),
          "optimizer.params.freeze_step is not a parameter of brisk's AdamW");
  refused({{"optimizer", {{"params", same}}}}, "optimizer.type must name the optimizer");
  refused({{"optimizer", {{"type", "AdamW"}, {"legacy_fusion", false}}}},
          "optimizer.legacy_fusion is not a key brisk knows");
  o.optim = "sgd";
  refused(optimizer("AdamW", same), "optimizer.type is AdamW but --optim is sgd");
}

// scheduler.type: DeepSpeed's warm-up schedulers with their parameters, or refused by name.
TEST(DeepSpeed, SchedulerTypesMapToDeepSpeedsCurvesOrAreRefusedByName) {
  TrainOptions o;
  o.device = "cpu";
  auto scheduler = [](const std::string& type, const nlohmann::json& params) {
    return nlohmann::json{{"scheduler", {{"type", type}, {"params", params}}}};
  };
  TrainOptions got = apply_deepspeed_json(o,
                                          scheduler("WarmupCosineLR", {{"total_num_steps", 100},
                                                                       {"warmup_num_steps", "auto"},
                                                                       {"warmup_min_ratio", 0.1},
                                                                       {"warmup_type", "linear"}}),
                                          "ds.json", 1);
  EXPECT_EQ(got.lr_scheduler_type, "cosine");
  EXPECT_FALSE(got.deepspeed_scheduler.log_warmup);
  EXPECT_DOUBLE_EQ(got.deepspeed_scheduler.cos_min_ratio, 1e-4) << "DeepSpeed's default";
  EXPECT_DOUBLE_EQ(got.deepspeed_scheduler.warmup_min_ratio, 0.1);
  EXPECT_EQ(got.deepspeed_scheduler.total_num_steps, 100);
  got = apply_deepspeed_json(
      o,
      scheduler("WarmupLR",
                {{"warmup_min_lr", 1e-5}, {"warmup_max_lr", 5e-5}, {"warmup_num_steps", "auto"}}),
      "ds.json", 1);
  EXPECT_DOUBLE_EQ(got.deepspeed_scheduler.warmup_min_ratio, 0.2);
  // Without --max_steps the run's steps are known later: checked when the schedule is made.
  got = apply_deepspeed_json(
      o,
      scheduler("WarmupDecayLR",
                {{"total_num_steps", 100}, {"warmup_num_steps", 10}, {"warmup_max_lr", "auto"}}),
      "ds.json", 1);
  got.warmup_steps = 10;
  EXPECT_EQ(learning_rate_schedule(got, 100).deepspeed.type, "WarmupDecayLR");
  expect_error([&] { learning_rate_schedule(got, 90); },
               "scheduler.params.total_num_steps is 100 but the run has 90 steps");

  auto refused = [&](const nlohmann::json& config, const std::string& message) {
    SCOPED_TRACE(config.dump());
    expect_error([&] { apply_deepspeed_json(o, config, "ds.json", 1); }, message);
  };
  refused(scheduler("OneCycle", {}), "scheduler.type \"OneCycle\" is not in brisk");
  refused(scheduler("WarmupLR", {{"warmup_num_steps", "auto"}, {"warmup_type", "exp"}}),
          "scheduler.params.warmup_type must be \"log\" or \"linear\", got \"exp\"");
  refused(scheduler("WarmupLR", {{"warmup_num_steps", "auto"}, {"warmup_max_lr", 1e-3}}),
          "scheduler.params.warmup_max_lr is 0.001 but --learning_rate is 5e-05");
  refused(scheduler("WarmupDecayLR", {{"warmup_num_steps", "auto"}}),
          "scheduler.params.total_num_steps is required by WarmupDecayLR");
  refused(scheduler("WarmupDecayLR", {{"warmup_num_steps", "auto"}, {"total_num_steps", "auto"}}),
          "scheduler.params.warmup_max_lr is absent, so DeepSpeed takes its default 0.001");
  refused(scheduler("WarmupCosineLR", {{"total_num_steps", "auto"},
                                       {"warmup_num_steps", "auto"},
                                       {"cos_min_ratio", "auto"}}),
          "scheduler.params.cos_min_ratio must be a number in [0.0, 1.0]");
  refused(scheduler("WarmupLR", {{"warmup_num_steps", "auto"}, {"cos_min_ratio", 0}}),
          "scheduler.params.cos_min_ratio is not a parameter of WarmupLR");
  refused({{"scheduler", {{"params", nlohmann::json::object()}}}},
          "scheduler.type must name the scheduler");
  o.max_steps = 50;
  refused(scheduler("WarmupLR", {{"warmup_num_steps", 500}}),
          "scheduler.params.warmup_num_steps is 500 but the run warms up 0 steps");
  refused(scheduler("WarmupLR", nlohmann::json::object()),
          "scheduler.params.warmup_num_steps is absent (DeepSpeed's default 1000) but the run");
  refused(
      scheduler("WarmupDecayLR",
                {{"total_num_steps", 40}, {"warmup_max_lr", "auto"}, {"warmup_num_steps", "auto"}}),
      "scheduler.params.total_num_steps is 40 but the run has 50 steps");
  o.lr_scheduler_type = "cosine";
  refused(scheduler("WarmupLR", {{"warmup_num_steps", "auto"}}),
          "scheduler.type is WarmupLR but --lr_scheduler_type is cosine");
}

// The curves as DeepSpeed's engine runs them: its scheduler steps after each update, from
// iteration -1, over a warm-up of at least 2 steps.
TEST(DeepSpeed, CurvesFollowDeepSpeedsSchedulers) {
  Schedule s{"constant_with_warmup", 4, 10, {}};
  s.deepspeed.type = "WarmupLR";
  EXPECT_EQ(s.factor(0), 0.0);
  EXPECT_EQ(s.factor(1), 0.0);           // iteration 0: log(1)
  EXPECT_NEAR(s.factor(2), 0.5, 1e-12);  // log 2 / log 4
  EXPECT_NEAR(s.factor(3), std::log(3.0) / std::log(4.0), 1e-12);
  EXPECT_EQ(s.factor(5), 1.0);
  EXPECT_EQ(s.factor(9), 1.0);
  s.deepspeed.type = "WarmupDecayLR";
  s.deepspeed.log_warmup = false;
  s.deepspeed.warmup_min_ratio = 0.1;
  EXPECT_NEAR(s.factor(0), 0.1, 1e-12);
  EXPECT_NEAR(s.factor(3), 0.1 + 0.9 * 0.5, 1e-12);
  EXPECT_NEAR(s.factor(5), 1.0, 1e-12);
  EXPECT_NEAR(s.factor(9), 0.1 + 0.9 * 2 / 6.0, 1e-12);  // iteration 8 of 10
  s.deepspeed.type = "WarmupCosineLR";
  s.deepspeed.cos_min_ratio = 0.01;
  EXPECT_EQ(s.factor(0), 0.0);
  EXPECT_NEAR(s.factor(5), 0.01 + 0.99 * 0.5 * (1 + std::cos(M_PI / 6)), 1e-12);
  EXPECT_NEAR(s.factor(11), 0.01, 1e-12);
  s.warmup_steps = 0;  // DeepSpeed warms up over 2 steps at least
  EXPECT_NEAR(s.factor(2), 0.1 + 0.9 * 0.5, 1e-12);
}

// transformers' ZeRO-2 config with its WarmupLR: after the warm-up the run holds the peak rate,
// where brisk's own default schedule would decay it.
// A key DeepSpeed does not have is refused naming it and the key meant, at the top level and in
// the sections DeepSpeed reads strictly; every fixture config (real files) passes the check.
TEST(DeepSpeed, UnknownKeysAreRefusedWithTheKeyMeant) {
  TrainOptions o;
  o.device = "cpu";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"zero_optimisation": {"stage": 2}})",
       "ds.json: zero_optimisation is not a DeepSpeed key (did you mean zero_optimization?)"},
      {R"({"zero_optimization": {"stgae": 2}})",
       "ds.json: zero_optimization.stgae is not a DeepSpeed key (did you mean "
       "zero_optimization.stage?)"},
      {R"({"zero_optimization": {"reduce_bucket_sise": 5e8}})",
       "(did you mean zero_optimization.reduce_bucket_size?)"},
      {R"({"zero_optimization": {"offload_optimizer": {"devise": "cpu"}}})",
       "zero_optimization.offload_optimizer.devise is not a DeepSpeed key (did you mean "
       "zero_optimization.offload_optimizer.device?)"},
      {R"({"fp16": {"enabled": "auto", "loss_scael": 0}})",
       "fp16.loss_scael is not a DeepSpeed key (did you mean fp16.loss_scale?)"},
      {R"({"bf16": {"enable": true}})", "bf16.enable is not a DeepSpeed key (did you mean"},
      {R"({"completely_unrelated_setting": 1})",
       "ds.json: completely_unrelated_setting is not a DeepSpeed key"},
      {R"({"tensor_parallel": {"autotp_sise": 2}})",
       "ds.json: tensor_parallel.autotp_sise is not a DeepSpeed key (did you mean "
       "tensor_parallel.autotp_size?)"},
      {R"({"tensor_parallel": {"tp": {"tp_sise": 2}}})",
       "tensor_parallel.tp.tp_sise is not a DeepSpeed key (did you mean "
       "tensor_parallel.tp.tp_size?)"},
  };
  for (const auto& [text, message] : cases) {
    SCOPED_TRACE(text);
    expect_error([&] { apply_deepspeed_json(o, nlohmann::json::parse(text), "ds.json", 1); },
                 message);
  }
  // DeepSpeed's aliases and sections brisk passes over are keys too.
  std::vector<std::string> ignored;
  const TrainOptions got = apply_deepspeed_json(
      o, nlohmann::json::parse(R"({"zero_optimization": {"stage": 3, "prefetch_bucket_size": 7,
        "stage3_max_live_parameters": 1e9, "max_live_parameters": 1e9},
        "flops_profiler": {"anything": 1}, "bfloat16": {"enabled": false}})"),
      "ds.json", 2, &ignored);
  EXPECT_EQ(got.stage3_prefetch_bucket_size, 7);
  EXPECT_EQ(ignored.size(), 4u);
  for (const char* name :
       {"accelerate_zero_stage2_config.json", "deepspeedexamples_tensor_parallel_ds_config.json",
        "deepspeedexamples_zenflow_zf_config.json", "transformers_ds_config_zero2.json",
        "transformers_ds_config_zero3.json"})
    EXPECT_NO_THROW(check_deepspeed_keys(read_json_file(fixture("deepspeed/") + name, name), name))
        << name;
}

// A setting given both as a flag and in the config: the flag at its default yields, the same
// value passes, another value is refused naming both.
TEST(DeepSpeed, FlagsThatContradictTheConfigAreRefusedNamingBoth) {
  TrainOptions o;
  o.device = "cpu";
  struct Case {
    std::function<void(TrainOptions&)> flag;
    std::string config, message;
  };
  const std::vector<Case> cases = {
      {[](TrainOptions& t) { t.zero_stage = 1; }, R"({"zero_optimization": {"stage": 2}})",
       "ds.json: zero_optimization.stage is 2 but --zero_stage is 1: give one of the two"},
      {[](TrainOptions& t) { t.ddp_bucket_cap_mb = 50; },
       R"({"zero_optimization": {"reduce_bucket_size": 1048576}})",
       "zero_optimization.reduce_bucket_size is 1048576 float32 elements (4.0 MiB) but "
       "--ddp_bucket_cap_mb is 50.0"},
      {[](TrainOptions& t) { t.ddp_bucket_cap_mb = 50; },
       R"({"zero_optimization": {"overlap_comm": false}})",
       "zero_optimization.overlap_comm is false (one bucket after backward) but "
       "--ddp_bucket_cap_mb is 50.0"},
      {[](TrainOptions& t) { t.stage3_prefetch_bucket_size = 100; },
       R"({"zero_optimization": {"stage": 3, "stage3_prefetch_bucket_size": 5e7}})",
       "zero_optimization.stage3_prefetch_bucket_size is 50000000 but "
       "--stage3_prefetch_bucket_size is 100"},
      {[](TrainOptions& t) { t.offload_optimizer = "cpu"; },
       R"({"zero_optimization": {"offload_optimizer": {"device": "none"}}})",
       "zero_optimization.offload_optimizer.device is \"none\" but --offload_optimizer is "
       "\"cpu\""},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.config);
    TrainOptions given = o;
    c.flag(given);
    expect_error(
        [&] { apply_deepspeed_json(given, nlohmann::json::parse(c.config), "ds.json", 2); },
        c.message);
  }
  // The same value in both, or the flag at its default, passes.
  TrainOptions given = o;
  given.zero_stage = 2;
  EXPECT_EQ(
      apply_deepspeed_json(given, {{"zero_optimization", {{"stage", 2}}}}, "ds.json", 2).zero_stage,
      2);
  EXPECT_EQ(
      apply_deepspeed_json(o, {{"zero_optimization", {{"stage", 2}}}}, "ds.json", 2).zero_stage, 2);
}

TEST(DeepSpeed, WarmupLRHoldsThePeakAfterTheWarmUp) {
  TempDir dir("ds_warmup_lr");
  TrainOptions o = tiny_options(write_config(dir, "bert", 0.0), dir / "out");
  o.max_steps = 6;
  o.warmup_steps = 3;
  o.deepspeed = fixture("deepspeed/transformers_ds_config_zero2.json");
  std::map<int64_t, double> lr;
  train(o, [&](const nlohmann::json& j) {
    if (j.contains("learning_rate")) lr[j["step"].get<int64_t>()] = j["learning_rate"];
  });
  ASSERT_EQ(lr.size(), 6u);
  EXPECT_EQ(lr[1], 0.0);
  EXPECT_EQ(lr[2], 0.0);
  EXPECT_NEAR(lr[3], o.learning_rate * std::log(2.0) / std::log(3.0), 1e-12);
  for (int64_t step = 4; step <= 6; ++step) EXPECT_EQ(lr[step], o.learning_rate) << step;
}

}  // namespace
}  // namespace brisk::testing
