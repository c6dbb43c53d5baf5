// 8-bit AdamW (--optim adamw_8bit or adamw_bnb_8bit), as bitsandbytes' block-wise 8-bit AdamW
// under transformers' Trainer: both moments of a parameter with at least min_8bit_size (4096)
// elements are 8-bit codes into the dynamic quantization map (signed for the first moment,
// unsigned for the second) with one float32 absolute maximum per block of 256 values; smaller
// parameters and embedding tables (Trainer registers nn.Embedding weights for 32-bit state) keep
// float32 moments. The arithmetic is the backend's adamw_8bit_update.
#include <functional>

#include "core/quantization.h"
#include "optim/optimizer.h"

namespace brisk {

namespace {
class AdamW8bit final : public Optimizer {
 public:
  AdamW8bit(const OptimizerConfig& c, int64_t min_8bit_size)
      : beta1_(static_cast<float>(c.beta1)),
        beta2_(static_cast<float>(c.beta2)),
        eps_(static_cast<float>(c.epsilon)),
        wd_(static_cast<float>(c.weight_decay)),
        min_8bit_size_(min_8bit_size) {}
  std::string name() const override { return "adamw_8bit"; }
  // 8-bit moments split between whole blocks (a piece's blocks are the whole parameter's), a
  // tensor rank's share of a split parameter not at all (its blocks are the full parameter's);
  // float32 ones anywhere.
  int64_t shard_granule(const ParamInfo& p) const override {
    if (!eight_bit(p)) return 1;
    return p.split.split() ? p.whole_numel() : kQuantBlock;
  }
  // A split parameter's blocks are the full one's: their maxima taken over the group.
  bool steps_split_parameters(const Backend& be) const override {
    return be.sums_split_statistics();
  }
  void join_split_group(const SplitGroup& group) override { group_max_ = group.max; }
  void plan(MemoryPlan& plan, BufferBinder& binder, const ParameterSet& params) override {
    slots_ = param_slots(params);
    std::vector<bool> eight_bit_slots;
    std::vector<int64_t> block_counts;
    for (const ParamInfo& p : params.list()) {
      eight_bit_slots.push_back(eight_bit(p));
      block_counts.push_back(state_elements(2, p));
    }
    const int64_t split_blocks = take_split_slots(params);
    BRISK_CHECK(eight_bit_slots.size() == slots_.size(), "internal error: ", slots_.size(),
                " optimizer slots for ", eight_bit_slots.size(), " parameters");
    const QuantizedStateSizes sizes = place_8bit_state(slots_, eight_bit_slots, &block_counts);
    const int64_t n8 = sizes.values8, blocks = sizes.blocks, n32 = sizes.values32;
    const Category c = Category::optimizer_state;
    binder.declare(plan, &codes1_, "adamw_8bit.exp_avg_codes", c, DType::u8, Shape{n8}, placement_);
    binder.declare(plan, &codes2_, "adamw_8bit.exp_avg_sq_codes", c, DType::u8, Shape{n8},
                   placement_);
    binder.declare(plan, &absmax1_, "adamw_8bit.exp_avg_absmax", c, DType::f32, Shape{blocks},
                   placement_);
    binder.declare(plan, &absmax2_, "adamw_8bit.exp_avg_sq_absmax", c, DType::f32, Shape{blocks},
                   placement_);
    binder.declare(plan, &m32_, "adamw_8bit.exp_avg_32bit", c, DType::f32, Shape{n32}, placement_);
    binder.declare(plan, &v32_, "adamw_8bit.exp_avg_sq_32bit", c, DType::f32, Shape{n32},
                   placement_);
    binder.declare(plan, &qmaps_, "adamw_8bit.quant_maps", c, DType::f32, Shape{2, 256},
                   placement_);
    if (!split_.empty())  // both moments' new block maxima
      binder.declare(plan, &maxima_, "adamw_8bit.split_maxima", Category::temporaries, DType::f32,
                     Shape{2 * split_blocks}, placement_);
  }
  void reset(Backend& be) override {
    // Zero absolute maxima make every code dequantize to zero.
    for (const Tensor* t : {&absmax1_, &absmax2_, &m32_, &v32_}) be.fill(*t, 0.0f);
    for (const Tensor* t : {&codes1_, &codes2_})
      with_host_view(be, *t, false, true,
                     [](const Tensor& h) { std::fill_n(h.as<uint8_t>(), h.numel(), 0); });
    with_host_view(be, qmaps_, false, true, [](const Tensor& h) {
      const auto s = dynamic_quant_map(true), u = dynamic_quant_map(false);
      std::copy(s.begin(), s.end(), h.f32());
      std::copy(u.begin(), u.end(), h.f32() + 256);
    });
    step_ = 0;
  }
  std::vector<std::pair<std::string, Tensor>> state() const override {
    return {{"exp_avg_codes", codes1_},   {"exp_avg_sq_codes", codes2_},
            {"exp_avg_absmax", absmax1_}, {"exp_avg_sq_absmax", absmax2_},
            {"exp_avg_32bit", m32_},      {"exp_avg_sq_32bit", v32_}};
  }
  // In state()'s order: an 8-bit parameter's codes and block maxima (a split parameter's: the
  // full one's blocks, alike on every tensor rank), another's float32 moments.
  int64_t state_elements(size_t i, const ParamInfo& p) const override {
    const int64_t n = p.shape.numel();
    if (i >= 4) return eight_bit(p) ? 0 : n;
    if (!eight_bit(p)) return 0;
    const int64_t blocked = p.split.split() ? p.full_shape().numel() : n;
    return i < 2 ? n : (blocked + kQuantBlock - 1) / kQuantBlock;
  }
  bool state_per_element(size_t i, const ParamInfo&) const override { return i < 2 || i >= 4; }
  // Partitions cut 8-bit parameters between whole blocks (shard_granule).
  int64_t state_offset(size_t i, const ParamInfo& p, int64_t element) const override {
    return i >= 2 && i < 4 && eight_bit(p) ? element / kQuantBlock : element;
  }

 protected:
  void update(Backend& be, const Tensor& weights, const Tensor& grads, const Tensor& control,
              float lr) override {
    AdamW8bitUpdate u;
    u.weights = weights;
    u.grads = grads;
    u.control = control;
    u.exp_avg32 = m32_;
    u.exp_avg_sq32 = v32_;
    u.exp_avg8 = codes1_;
    u.exp_avg_sq8 = codes2_;
    u.absmax1 = absmax1_;
    u.absmax2 = absmax2_;
    u.qmap_signed = Tensor(qmaps_.f32(), Shape{256}, DType::f32, qmaps_.device());
    u.qmap_unsigned = Tensor(qmaps_.f32() + 256, Shape{256}, DType::f32, qmaps_.device());
    u.slots = &slots_;
    u.lr = lr;
    u.beta1 = beta1_;
    u.beta2 = beta2_;
    u.eps = eps_;
    u.weight_decay = wd_;
    u.step = step_;
    BRISK_CHECK(split_.empty() || group_max_,
                "internal error: adamw_8bit steps split parameters without their group");
    u.split = &split_;
    u.maxima = maxima_;
    u.group_max = group_max_;
    be.adamw_8bit_update(u);
  }

 private:
  // Tensor parallelism's 8-bit shares among params, each with the place of its blocks among the
  // split parameters' new maxima (sums_at); returns how many blocks they have.
  int64_t take_split_slots(const ParameterSet& params) {
    split_.clear();
    int64_t blocks = 0;
    for (size_t i = 0; i < params.list().size(); ++i) {
      const ParamInfo& p = params.list()[i];
      if (!eight_bit(p) || !p.split.split()) continue;
      SplitSlot x = split_slot(p, slots_[i], i);
      x.sums_at = blocks;
      blocks += state_elements(2, p);
      split_.push_back(std::move(x));
    }
    return blocks;
  }
  // Both moments in 8 bits: a parameter (a piece's whole one, a share's full one) of at least
  // min_8bit_size elements that is not an embedding table.
  bool eight_bit(const ParamInfo& p) const {
    const int64_t n = p.split.split() ? p.full_shape().numel() : p.whole_numel();
    return n >= min_8bit_size_ && !p.embedding;
  }
  float beta1_, beta2_, eps_, wd_;
  int64_t min_8bit_size_;
  std::vector<ParamSlot> slots_;
  std::vector<SplitSlot> split_;  // tensor parallelism's 8-bit shares (sums_at: their blocks)
  std::function<void(const Tensor&)> group_max_;
  Tensor codes1_, codes2_, absmax1_, absmax2_, m32_, v32_, qmaps_, maxima_;
};
}  // namespace

QuantizedStateSizes place_8bit_state(std::vector<ParamSlot>& slots,
                                     const std::vector<bool>& eight_bit,
                                     const std::vector<int64_t>* block_counts) {
  BRISK_CHECK(
      eight_bit.size() == slots.size() && (!block_counts || block_counts->size() == slots.size()),
      "place_8bit_state: one flag and block count per slot expected");
  QuantizedStateSizes n;
  for (size_t i = 0; i < slots.size(); ++i) {
    ParamSlot& s = slots[i];
    if (eight_bit[i]) {
      s.state = n.values8;
      s.blocks = n.blocks;
      n.values8 += s.numel;
      n.blocks += block_counts ? (*block_counts)[i] : (s.numel + kQuantBlock - 1) / kQuantBlock;
    } else {
      s.state = n.values32;
      s.blocks = -1;
      n.values32 += s.numel;
    }
  }
  return n;
}

std::unique_ptr<Optimizer> make_adamw_8bit(const OptimizerConfig& config, OptimArgs& args) {
  const double min_size = args.number("min_8bit_size", 4096);
  BRISK_CHECK(min_size >= 1 && min_size == static_cast<int64_t>(min_size),
              "optim_args: min_8bit_size must be a positive whole number, got ", min_size);
  return std::make_unique<AdamW8bit>(config, static_cast<int64_t>(min_size));
}

}  // namespace brisk
