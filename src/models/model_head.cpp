// Language-model heads: the logits chunk by chunk, their loss and backward, the padded and
// tied weights' gradients.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "backend/device_traits.h"
#include "core/checked.h"
#include "models/model.h"

namespace brisk {

int Model::tied_table() const {
  const std::vector<ParamInfo>& list = params_.list();
  for (size_t i = 0; i < list.size(); ++i)
    if (list[i].embedding && list[i].product) return static_cast<int>(i);
  return -1;
}

Tensor Model::head_weight_grad(int weight) const {
  return weight == tied_apart_ ? tied_head_grad_ : g(weight);
}

const Tensor& Model::logits() const {
  if (lm_chunk_rows_ > 0) {
    const int64_t rows = shape_.batch * tokens(), kept = logits_.numel() / lm_width_;
    BRISK_CHECK(lm_rows_ < 0 || lm_rows_ == rows, "the logits were computed for ", lm_rows_,
                " of the ", rows,
                " rows (a masked LM's labelled rows: plan with "
                "labelled_rows_only false)");
    BRISK_CHECK(kept == rows, "the logits of ", rows, " rows were computed ", kept,
                " rows at a time and are not kept whole; plan with logits_rows >= ", rows);
  }
  return logits_;
}

void Model::declare_lm_logits(MemoryPlan& plan, const BatchShape& s, int weight, bool biased) {
  lm_head_weight_ = weight;
  lm_chunk_rows_ = lm_width_ = 0;
  if (!config_.last_stage()) return;  // a pipeline stage without the head
  const int64_t rows = s.batch * s.seq;
  lm_width_ = vocab_rows();
  const int64_t multiple =
      options_.pad_head ? device_traits(options_.device).bf16_head_row_multiple : 1;
  if (config_.tensor_ranks == 1 && options_.activation_dtype == DType::bf16)
    lm_width_ = checked_add(lm_width_, multiple - 1, "the logits' width") / multiple * multiple;
  const int64_t V = lm_width_;
  if (biased && V > vocab_rows())
    declare(plan, &head_bias_, "lm_head.padded_bias", Category::activations, DType::f32, {V});
  // 64 rows times a power of two (chunks that divide the usual batch x length, and keep a GPU
  // product's operands 256-byte aligned) within the device's chunk bytes; the same at every
  // length.
  const int64_t chunk_bytes = device_traits(options_.device).logits_chunk_bytes;
  lm_chunk_rows_ = options_.logits_rows;
  if (lm_chunk_rows_ <= 0)
    for (lm_chunk_rows_ = 64; lm_chunk_rows_ * 2 * V * 4 <= chunk_bytes;) lm_chunk_rows_ *= 2;
  if (rows <= lm_chunk_rows_)
    declare(plan, &logits_, "logits", Category::activations, DType::f32, {s.batch, s.seq, V});
  else
    declare(plan, &logits_, "logits", Category::activations, DType::f32, {lm_chunk_rows_, V});
  // bf16 products read the logits' gradient rounded once, as the loss writes it, a group of
  // DeviceTraits::head_grad_chunks chunks at a time (in runs that compute gradients). Decided for
  // the planned length: a shorter one (use_seq) declares the same buffers, this one however few
  // its rows.
  const int64_t group =
      options_.bf16_head_grad ? device_traits(options_.device).head_grad_chunks : 0;
  if (!replanning_)
    lm_grouped_ = options_.gradients && options_.activation_dtype == DType::bf16 &&
                  (group > 1 ? rows > lm_chunk_rows_ : group == 1 && !biased);
  if (lm_grouped_)
    declare(plan, &head_dlogits_, "lm_head.dlogits", Category::activations, DType::bf16,
            {std::min(rows, group * lm_chunk_rows_), V});
  declare(plan, &head_dx_, "lm_head.dx", Category::activations, DType::f32,
          {s.batch, s.seq, config_.hidden_size});
  // Vocabulary parallelism: each tensor rank's statistics of a chunk's rows, summed across them
  // (a padded head's, of its one rank).
  if (config_.tensor_ranks > 1 || V > vocab_rows())
    declare(plan, &head_stats_, "lm_head.vocab_stats", Category::activations, DType::f32,
            {config_.tensor_ranks, std::min(rows, lm_chunk_rows_), 3});
}

void Model::lm_loss(Backend& be, const StepOptions& o, const Tensor& logits, const Tensor& labels,
                    const Tensor& grad) {
  if (config_.tensor_ranks == 1 && lm_width_ == vocab_rows()) {
    be.softmax_cross_entropy(logits, labels, o.compute_grad, o.loss_grad_scale, loss_sum(), grad);
    return;
  }
  // Vocabulary parallelism's two steps (a padded head's too, on its one rank: its padding
  // columns take no probability and no gradient).
  // Every rank's maximum, sum of exponentials and label logit of each row, each at its place.
  const int64_t n = labels.numel(), R = config_.tensor_ranks;
  const Tensor stats(head_stats_.data(), Shape{R, n, 3}, DType::f32, head_stats_.device());
  be.fill(stats, 0.0f);
  const VocabShard shard =
      config_.tensor_ranks > 1 ? vocab_shard() : VocabShard{0, config_.vocab_size};
  const Tensor mine(stats.f32() + config_.tensor_rank * n * 3, Shape{n, 3}, DType::f32,
                    stats.device());
  be.cross_entropy_stats(logits, labels, shard, mine);
  if (config_.tensor_ranks > 1) parallelism_.tensor->all_reduce_sum(be, stats);
  be.cross_entropy_from_stats(logits, labels, shard, stats, o.compute_grad, o.loss_grad_scale,
                              loss_sum(), grad);
}

Tensor Model::head_bias(Backend& be, const Tensor& bias) const {
  if (head_bias_.empty()) return bias;
  be.fill(element_range(head_bias_, bias.numel(), head_bias_.numel() - bias.numel()), 0.0f);
  be.copy(bias, element_range(head_bias_, 0, bias.numel()));
  return head_bias_;
}

void Model::lm_head_forward(Backend& be, const StepOptions& o, const Tensor& x, int weight,
                            int bias, const Tensor& labels) {
  const int64_t rows = labels.numel(), chunk = logits_.numel() / lm_width_;
  lm_rows_ = rows;
  const Tensor b = bias >= 0 ? head_bias(be, w(bias)) : Tensor();
  // A padded head's bias gradient: of the vocabulary's columns, the first (Backend::
  // linear_backward).
  const Tensor db = bias >= 0 && o.compute_grad ? g(bias) : Tensor();
  // The weight is read by two products per chunk and does not change meanwhile; a padded head's
  // products read it padded.
  struct Held {
    Backend& be;
    Tensor weight;
    Held(Backend& backend, const Tensor& w, int64_t rows) : be(backend), weight(w) {
      if (rows > w.dim(0))
        weight = be.hold_padded_weight(w, rows);
      else
        be.hold_weight(w);
    }
    ~Held() { be.release_weight(); }
  } held(be, w(weight), lm_width_);
  const Tensor& wt = held.weight;
  // The input gradient and dW of rows [group, r0) still to add (grouped: their dlogits in
  // head_dlogits_).
  const bool grouped = !head_dlogits_.empty() && be.reads_product_input(DType::bf16);
  const int64_t group_rows = grouped ? head_dlogits_.dim(0) : 0;
  int64_t group = 0;
  for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
    const int64_t n = std::min(chunk, rows - r0);
    // One chunk of the logits' planned rows: the tensors as they are.
    const bool whole = n == rows && rows * lm_width_ == logits_.numel();
    const Tensor xs = whole ? x : row_range(x, r0, n);
    const Tensor ls = whole ? logits_ : row_range(logits_, 0, n);
    const Tensor dx = whole ? head_dx_ : row_range(head_dx_, r0, n);
    be.linear_forward(xs, wt, b, WeightLayout::out_in, ls);
    // Grouped without a bias: the gradient written in bf16 straight into its rows of dlogits
    // (the bias's gradient needs the unrounded one in ls).
    const Tensor dl =
        grouped && o.compute_grad ? row_range(head_dlogits_, r0 - group, n) : Tensor();
    lm_loss(be, o, ls, whole ? labels : row_range(labels, r0, n, true), db.empty() ? dl : Tensor());
    if (!o.compute_grad) continue;
    if (!grouped) {
      be.linear_backward(xs, wt, ls, WeightLayout::out_in, dx, false, head_weight_grad(weight), db,
                         !o.first_micro_batch || r0 > 0);
      continue;
    }
    if (!db.empty()) {
      be.cast(ls, dl);  // from the unrounded gradient, as unchunked
      be.linear_backward(xs, wt, ls, WeightLayout::out_in, Tensor(), false, Tensor(), db,
                         !o.first_micro_batch || r0 > 0);
    }
    // The group's input gradient and its share of dW, from its rounded dlogits.
    if (r0 + n - group == group_rows || r0 + n == rows) {
      const int64_t span = r0 + n - group;
      be.linear_backward(row_range(x, group, span), wt, row_range(head_dlogits_, 0, span),
                         WeightLayout::out_in, row_range(head_dx_, group, span), false,
                         head_weight_grad(weight), Tensor(), !o.first_micro_batch || group > 0);
      group = r0 + n;
    }
  }
  // Vocabulary parallelism: each rank's columns gave a part of the input gradient.
  if (o.compute_grad && config_.tensor_ranks > 1)
    parallelism_.tensor->all_reduce_sum(be, row_range(head_dx_, 0, rows));
}

}  // namespace brisk
