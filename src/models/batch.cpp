// Batch files: integer tensors of any integer dtype, converted to int32; regression labels as
// float32.
#include "models/batch.h"

#include <algorithm>
#include <limits>

namespace brisk {

namespace {
void copy_ints(const SafetensorsFile& file, const std::string& name, const Tensor& dst) {
  const Tensor& src = file.get(name);
  BRISK_CHECK(src.shape() == dst.shape(), "'", file.path(), "': ", name, " has shape ",
              src.shape().str(), " where ", dst.shape().str(), " is expected");
  int32_t* out = dst.i32();
  for (int64_t i = 0; i < src.numel(); ++i) {
    int64_t v = 0;
    switch (src.dtype()) {
      case DType::i32:
        v = src.as<int32_t>()[i];
        break;
      case DType::i64:
        v = src.as<int64_t>()[i];
        break;
      case DType::u16:
        v = src.as<uint16_t>()[i];
        break;
      case DType::u8:
        v = src.as<uint8_t>()[i];
        break;
      default:
        BRISK_FAIL("'", file.path(), "': ", name, " must hold integers, not ",
                   dtype_name(src.dtype()));
    }
    BRISK_CHECK(
        v >= std::numeric_limits<int32_t>::min() && v <= std::numeric_limits<int32_t>::max(), "'",
        file.path(), "': ", name, " value ", v, " does not fit in int32");
    out[i] = static_cast<int32_t>(v);
  }
}
void copy_label_values(const SafetensorsFile& file, const Tensor& dst) {
  const Tensor& src = file.get("labels");
  BRISK_CHECK(src.shape() == dst.shape() && src.dtype() == DType::f32, "'", file.path(),
              "': a regression model's labels must be float32 ", dst.shape().str(), ", not ",
              dtype_name(src.dtype()), " ", src.shape().str());
  std::copy(src.f32(), src.f32() + src.numel(), dst.f32());
}
}  // namespace

BatchShape batch_shape_of(const SafetensorsFile& file) {
  const Tensor& ids = file.get("input_ids");
  BRISK_CHECK(ids.rank() == 2, "'", file.path(), "': input_ids must be [batch, seq], got ",
              ids.shape().str());
  return {ids.dim(0), ids.dim(1)};
}

void load_batch(const SafetensorsFile& file, Model& model, Backend& be) {
  model.reset_batch();
  const Batch& b = model.batch();
  copy_ints(file, "input_ids", b.input_ids);
  if (file.has("attention_mask")) copy_ints(file, "attention_mask", b.attention_mask);
  if (file.has("token_type_ids")) {
    // transformers' GPT-2 would add their embeddings (through wte); dropping them silently would
    // compute another model.
    BRISK_CHECK(!b.token_type_ids.empty(), "'", file.path(), "': token_type_ids given, but the ",
                model.config().type_name(),
                " model as brisk runs it takes none; remove them from the batch");
    copy_ints(file, "token_type_ids", b.token_type_ids);
  }
  if (!file.has("labels")) return;
  if (b.label_values.empty())
    copy_ints(file, "labels", b.labels);
  else
    copy_label_values(file, b.label_values);
}

}  // namespace brisk
