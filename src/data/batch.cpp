#include "data/batch.h"

#include <algorithm>
#include <limits>

#include "core/error.h"

namespace brisk {

void reset_label_values(const Batch& batch) {
  const Tensor& t = batch.label_values;
  if (!t.empty()) std::fill(t.f32(), t.f32() + t.numel(), std::numeric_limits<float>::quiet_NaN());
}

Batch token_view(const Batch& b, int64_t at, int64_t len, int64_t label_row) {
  auto view = [](const Tensor& t, int64_t first, Shape shape) {
    if (t.empty()) return t;
    return Tensor(
        static_cast<char*>(t.data()) + first * static_cast<int64_t>(dtype_size(t.dtype())), shape,
        t.dtype(), t.device());
  };
  const bool per_token = b.labels.rank() == 2;
  return {view(b.input_ids, at, {1, len}), view(b.attention_mask, at, {1, len}),
          view(b.token_type_ids, at, {1, len}),
          per_token ? view(b.labels, at, {1, len}) : view(b.labels, label_row, {1}),
          view(b.label_values, label_row, {1})};
}

bool right_padded_lengths(const Tensor& mask, const Tensor& lengths) {
  BRISK_CHECK(mask.rank() == 2 && lengths.numel() == mask.dim(0) && mask.dtype() == DType::i32 &&
                  lengths.dtype() == DType::i32,
              "internal error: key lengths of a mask ", mask.shape().str(), " into ",
              lengths.shape().str());
  const int64_t B = mask.dim(0), T = mask.dim(1);
  for (int64_t b = 0; b < B; ++b) {
    const int32_t* row = mask.i32() + b * T;
    const int32_t* first_hidden = std::find(row, row + T, 0);
    const int64_t n = first_hidden - row;  // every key before it kept: only the rest is read
    if (n == 0 || std::any_of(first_hidden, row + T, [](int32_t v) { return v != 0; }))
      return false;
    lengths.i32()[b] = static_cast<int32_t>(n);
  }
  return true;
}

}  // namespace brisk
