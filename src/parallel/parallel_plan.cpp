// The planning half of the parallel policy (policy.h): ZeRO's partition, the model's staging
// slots, and the buffers the layout needs in the run's plan.
#include <algorithm>
#include <string>

#include "core/error.h"
#include "core/segment_layout.h"
#include "core/step_control.h"
#include "optim/optimizer.h"
#include "parallel/policy.h"
#include "precision/mixed_precision.h"

namespace brisk {

namespace {

bool zero(const ParallelPlanOptions& o) {
  return o.zero_stage >= 1 && o.ranks > 1;
}

// A rank that gets no parameters: what the optimizer keeps on one rank outweighs its share.
[[noreturn]] void refuse_empty_rank(const Model& model, const Optimizer& optimizer,
                                    const ParallelPlanOptions& o) {
  std::string name;
  int64_t kept = 0;
  for (const ParamInfo& p : model.params().list()) {
    const int64_t together = std::min(p.shape.numel(), optimizer.shard_granule(p));
    if (together > kept) {
      kept = together;
      name = p.name;
    }
  }
  BRISK_FAIL("--zero_stage ", o.zero_stage, ": rank ", o.rank, " of ", o.ranks,
             " gets no parameters to hold: ", optimizer.name(), " keeps up to ", kept,
             " elements together on one rank ('", name, "'), more than a rank's share of ",
             model.params().trained_run().elements.count, "; use fewer ranks or another --optim");
}

// Stage 2 stages the gradients in two blocks' slots (a block's sums overlap the next block's
// backward) unless that and the shard would hold more than whole gradients; then in one.
// Stage 3 gathers the blocks' weights into two slots (the next block's gather overlaps a
// block's computation) unless that and the weight shard would hold more than whole weights,
// or stage3_prefetch_bucket_size is below one block's weights; then one slot, or (not even
// then) whole weights gathered after each update.
// A model with frozen parameters keeps the trained ones' gradients whole (they are few: a
// LoRA's adapters).
void choose_slots(const Model& model, const ParallelPlanOptions& o, int64_t mine,
                  PlanOptions& model_options) {
  if (model.params().frozen()) return;
  const int64_t total = model.params().total_elements();
  const std::vector<ElementRange>& segments = model.param_segments();
  auto length = [&](int slots, bool embeddings_apart) {
    return SegmentLayout::staged(segments, slots, embeddings_apart).length();
  };
  if (o.zero_stage >= 2)
    model_options.gradient_slots = length(2, model.head_reads_embeddings()) + mine < total ? 2 : 1;
  if (o.zero_stage >= 3) {
    const int64_t one = length(1, false), two = length(2, false);
    const int64_t block = SegmentLayout::block_elements(segments, 1);
    const bool prefetch =
        o.stage3_prefetch_bucket_size < 0 || o.stage3_prefetch_bucket_size >= block;
    model_options.weight_slots = prefetch && two + mine < total ? 2 : one + mine < total ? 1 : 0;
  }
}

// Stage 3 with frozen parameters (a LoRA's base): the blocks' segments (all frozen) staged in
// two slots with the ends resident (the head's holds the trained parameters), each rank holding
// an equal run of the blocks' elements. None where the blocks cannot be staged.
std::vector<ParamShard> partition_frozen_blocks(const Model& model, const ParallelPlanOptions& o,
                                                PlanOptions& model_options) {
  const std::vector<ElementRange>& segments = model.param_segments();
  if (o.zero_stage < 3 || segments.size() < 4 || SegmentLayout::block_elements(segments, 2) == 0)
    return {};
  // The blocks from last (segment 1) to first (the one before the embeddings').
  const int64_t begin = segments[segments.size() - 2].offset;
  const int64_t end = segments[1].offset + segments[1].count;
  for (const ParamInfo& p : model.params().list())  // (the trained ones lie after the blocks)
    BRISK_CHECK(p.offset + p.shape.numel() <= begin || p.offset >= end || p.frozen,
                "internal error: '", p.name, "' of a block is trained beside a frozen base");
  model_options.weight_slots = 2;
  model_options.resident_ends = true;
  const int64_t chunk = (end - begin + o.ranks - 1) / o.ranks;
  std::vector<ParamShard> shards;
  for (int r = 0; r < o.ranks; ++r) {
    const int64_t first = std::min(end, begin + chunk * r);
    shards.push_back({0, 0, {first, std::min(end, first + chunk) - first}});
  }
  return shards;
}

}  // namespace

void partition_parameters(const Model& model, const Optimizer& optimizer,
                          const ParallelPlanOptions& o, ParallelBuffers& buffers,
                          PlanOptions& model_options) {
  if (!zero(o)) return;
  buffers.shards = partition_params(model.params(), o.ranks,
                                    [&](const ParamInfo& p) { return optimizer.shard_granule(p); });
  const int64_t mine = buffers.shards[static_cast<size_t>(o.rank)].elements.count;
  if (mine == 0) refuse_empty_rank(model, optimizer, o);
  choose_slots(model, o, mine, model_options);
  if (model.params().frozen())
    buffers.base_shards = partition_frozen_blocks(model, o, model_options);
}

void plan_zero_buffers(const Model& model, const ParallelPlanOptions& o, ParallelBuffers& b,
                       ParameterSet& stepped, MemoryPlan& plan, BufferBinder& binder) {
  if (b.shards.empty()) return;
  const ParamShard& mine = b.shards[static_cast<size_t>(o.rank)];
  stepped = shard_params(model.params(), mine);
  if (o.zero_stage >= 3 && !model.params().frozen())
    binder.declare(plan, &b.weight_shard, "zero.weight_shard", Category::weights, DType::f32,
                   Shape{mine.elements.count});
  if (!b.base_shards.empty())
    binder.declare(
        plan, &b.base_shard, "zero.frozen_base_shard", Category::weights, DType::f32,
        Shape{std::max<int64_t>(b.base_shards[static_cast<size_t>(o.rank)].elements.count, 1)});
  if (o.zero_stage >= 2) {
    binder.declare(plan, &b.grad_shard, "zero.gradient_shard", Category::gradients, DType::f32,
                   Shape{mine.elements.count});
    // The gradients' segments: the model's, or (some frozen) the trained run as one.
    const ParameterSet& params = model.params();
    const std::vector<ElementRange> segments =
        params.frozen() ? std::vector<ElementRange>{params.trained_run().elements}
                        : model.param_segments();
    const int64_t receive = ShardedGradients::receive_elements(
        b.shards, o.rank, segments, gradient_piece_elements(o.bucket_cap_mb));
    binder.declare(plan, &b.grad_receive, "zero.gradient_sums", Category::temporaries, DType::f32,
                   Shape{std::max<int64_t>(receive, 1)});
  }
}

void plan_offload_buffers(const Model& model, const MixedPrecision& precision, ParallelBuffers& b,
                          MemoryPlan& plan, BufferBinder& binder) {
  if (!b.offload) return;
  const ElementRange stepped = precision.master_elements(model.params());
  binder.declare(plan, &b.offload_grads, "offload.gradients", Category::gradients, DType::f32,
                 Shape{stepped.count}, Placement::host);
  binder.declare(plan, &b.offload_control, "offload.step_control", Category::temporaries,
                 DType::f32, Shape{kControlSize}, Placement::host);
}

}  // namespace brisk
