// What a model's plan and passes are asked for (models/model.h): the plan's options (recomputation,
// precision, staged buffers, the head's chunks), a step's options, and who fills staged weights.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "backend/device_traits.h"
#include "core/dtype.h"
#include "core/grad_scale.h"
#include "core/rng.h"

namespace brisk {

struct PlanOptions {
  bool gradient_checkpointing = false;  // keep only block inputs, recompute inside backward
  // Mixed precision: activations that feed matrix products are kept in this type (bf16/f16);
  // the CPU computes in float32 and rounds them to it.
  DType activation_dtype = DType::f32;
  // The device the run computes on: it decides the attention buffers and whether batches need a
  // device copy.
  Device device = kHostDevice;
  // Selective recomputation (Korthikanti et al. 2022): keep every block's tensors but the
  // attention core's statistics (the probabilities on the CPU), one shared buffer rebuilt per
  // block in backward. Exact; not with gradient_checkpointing, which recomputes everything.
  bool selective_recompute = false;
  // Mixed precision without gradient checkpointing: the blocks' recomputable tensors
  // (recomputable_tensors: a pre-norm block's norm outputs, with recompute_norms; the MLP
  // activation's output, SwiGLU's or a GELU's, with recompute_activation) are not kept per block
  // but in one shared buffer each, rebuilt per block in backward by the same element-wise ops
  // from what the block keeps. Exact; train's assembly sets them as the device's traits say: in
  // bf16, batch 4 x 256, both keep SmolLM2-135M 152 MiB less, the norms GPT-2 34 MiB.
  bool recompute_norms = false;
  bool recompute_activation = false;
  bool recomputes_elementwise() const { return recompute_norms || recompute_activation; }
  // Mixed precision: the backend reads the 16-bit stored copies as they lie
  // (Backend::reads_product_input), so backward never reads the blocks' float32 working set and
  // their backward scratch shares its room (set by train's assembly; a forward on a backend that
  // does not read them so is refused).
  bool reads_stored_copies = false;
  // Post-norm blocks (BERT's): a block's input is the norm of what the block before keeps (its
  // res2 and statistics), so the inputs between the stage's first and last take two buffers in
  // turn and backward rebuilds each (post_norm_output) before the block's backward reads it.
  // Exact; not under gradient checkpointing (the inputs are its checkpoints), staged weights (the
  // block before's norm may be away) or sparse MLPs. Set by train's assembly: at bert-large's
  // batch 32 x 512 it keeps 21 x 64 MiB less. (A run without gradients shares them anyway.)
  bool recompute_block_inputs = false;
  // The flat gradients laid over the blocks' saved tensors as far as backward allows: each
  // segment's over the tensors of blocks whose backward is done before it first writes them
  // (block l's over those of blocks l + 1 on, the embeddings' over any block's, the head's over
  // none; a tied head, which writes the embeddings' gradients in the forward pass, then writes
  // them into a buffer of their own, copied in before the embeddings' backward, where the
  // gradients lie over more than that buffer takes), where they exist only from backward to the
  // update, as PyTorch's autograd makes them. The first micro-batch's backward then zeroes each
  // segment's added-to gradients just before writing them. Only for a step of one micro-batch
  // (train's assembly: no gradient accumulation, no pipeline; the ranks' sums end before the
  // update); not with staged gradients (PlanOptions::gradient_slots). Under gradient
  // checkpointing what the blocks keep is their inputs: the gradients lie over those.
  bool gradients_over_activations = false;
  // Inference with a key/value cache (models/decoder.h): the weights alone; the decoder plans
  // its own buffers.
  bool weights_only = false;
  // A run that only evaluates or predicts: no gradient buffer (its forward passes compute none).
  bool gradients = true;
  // Staged gradients: gradient_slots (1 or 2) > 0 stages the gradients: the gradient buffer holds
  // the slots of that many blocks, which the blocks' gradients use in turn (block b in slot b mod
  // slots), and over the same space the head's and the embeddings' gradients (a tied head's
  // embeddings' gradients apart: the head's chunks start them in forward, the embeddings'
  // backward ends them); backward then reports every segment on every micro-batch, and before a
  // report returns, every place the next segment writes must be empty again (moved out and
  // zeroed): with two slots, the slot of the segment reported before this one; with one, this
  // segment's. Models whose blocks are not laid out alike, or have no more blocks than slots,
  // keep whole gradients.
  int gradient_slots = 0;
  // Staged weights: weight_slots (1 or 2) > 0 stages the weights: the weight buffer holds the slots
  // of that many blocks, into which the model's WeightSlots gathers each block's weights before
  // the block runs (block b in slot b mod slots; with two, the next block's gather runs while a
  // block computes), and over the same space the embeddings' and the head's weights, each
  // gathered when a pass reaches it (both at once for a head tied to the embeddings).
  int weight_slots = 0;
  // With weight_slots: ranges of every block's parameters (from the block's first element) that
  // the slots do not hold (QLoRA's 4-bit linears, multiplied where they are kept; SegmentLayout's
  // holes).
  std::vector<ElementRange> slot_holes;
  // With weight_slots: the slots hold the blocks' weights alone; the embeddings' and the head's
  // keep places of their own (SegmentLayout's resident_ends), where nothing brings them back.
  bool resident_ends = false;
  // Language-model heads (causal LM, masked LM): rows of the [B*T, V] logits held at once; 0
  // holds at most the device's DeviceTraits::logits_chunk_bytes of them (GPT-2: 2048 rows on a
  // GPU, 256 on the CPU). The head computes its logits, loss and (when training) its own
  // backward chunk after chunk, so the whole logits never exist unless they fit.
  int64_t logits_rows = 0;
  // A masked LM's decoder, in passes that compute gradients, over the labelled rows alone
  // (sparse prediction: the loss reads no other row); its logits are then not the batch's.
  bool labelled_rows_only = true;
  // The paths a run may turn off to compare (core/switches.h, set by train's assembly): attention
  // without the mask where a batch's mask hides no key; a right-padded mask's key counts; the
  // residual add fused with its norm (BlockStyle::fused_residual_norm); a bf16 LM head padded to
  // the device's row multiple (DeviceTraits::bf16_head_row_multiple) and its dlogits grouped
  // (DeviceTraits::head_grad_chunks).
  bool unmasked_attention = true;
  bool key_lengths = true;
  bool fused_residual_norm = true;
  bool pad_head = true;
  bool bf16_head_grad = true;
  // Pipeline parallelism: slots for this many micro-batches' stage inputs (stashed_input), which
  // the stage keeps from their forward to their backward.
  int stashed_inputs = 0;
  // Recorded steps (models/step_recorder.h): the words its replays read their micro-step and
  // their loss's gradient scale from (held_step()), in host and backend memory.
  bool held_step = false;
  // Padding-free or packed batches (PackedSamples): their samples' starts and each token's
  // position in its sample in backend memory too, uploaded with the batch, where the blocks, the
  // embeddings and the pooling read them.
  bool packed_samples = false;
};

// Staged weights: who fills the model's weight slots (parallel/zero's ShardedWeights). Segments are
// numbered as param_segments(); segments whose places overlap (Model::weight_layout().overlap) hold
// their weights in turn.
// The parameters one of a block's dense products multiplies by, laid end to end: first..last
// (-1: the layer has no such product). A block's four by ProductSite: qkv, proj, fc, out.
struct ProductParams {
  int first = -1, last = -1;
};
using BlockProducts = std::array<ProductParams, 4>;

class WeightSlots {
 public:
  virtual ~WeightSlots() = default;
  // Layer `layer`'s product at `site` (0-3, BlockProducts' order) when its weight is kept 4-bit
  // and multiplied where it is kept, its parameters in no slot: its matrix; null: the product
  // reads its weight from the slot.
  virtual const Backend::Quant4Matrix* matrix(int /*layer*/, int /*site*/) const { return nullptr; }
  // Such a parameter's values were just written at ParameterSet::weight(param) (loaded or
  // initialized; its place outside the slots): they may be kept now, before the next is written.
  virtual void filled_param(int /*param*/) {}
  // Segment i's weights must be in place when this returns.
  virtual void need(int segment) = 0;
  // Segment i comes next and its place overlaps no segment in use: its weights may start on
  // their way.
  virtual void prefetch(int segment) = 0;
  // Segment i's weights were just written in place (initialized or loaded), all of them.
  virtual void filled(int segment) = 0;
};

struct StepOptions {
  bool training = true;      // dropout on
  bool compute_grad = true;  // write logit gradients (the logits are overwritten)
  // d(loss)/d(summed token loss): the loss scale over the targets in the whole batch (a recorded
  // step's held in memory).
  GradScale loss_grad_scale;
  RngKey rng;  // seed and micro-step; sites are filled in per dropout
  // The optimizer step's first micro-batch: each weight's first gradient is written over what
  // the gradient buffer holds instead of added to it (the linear layers' weights and biases).
  bool first_micro_batch = false;
};

}  // namespace brisk
