// Shape and Tensor view helpers.
#include "core/tensor.h"

#include "core/checked.h"

namespace brisk {

Shape::Shape(std::initializer_list<int64_t> dims) {
  for (int64_t d : dims) push_back(d);
}

void Shape::push_back(int64_t d) {
  BRISK_CHECK(rank_ < kMaxDims, "tensor rank above ", kMaxDims);
  BRISK_CHECK(d >= 0, "negative dimension ", d);
  dims_[rank_++] = d;
}

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int i = 0; i < rank_; ++i) n = checked_mul(n, dims_[i], "a tensor's element count");
  return n;
}

bool Shape::operator==(const Shape& o) const {
  if (rank_ != o.rank_) return false;
  for (int i = 0; i < rank_; ++i)
    if (dims_[i] != o.dims_[i]) return false;
  return true;
}

std::string Shape::str() const {
  std::string s = "[";
  for (int i = 0; i < rank_; ++i) s += (i ? ", " : "") + std::to_string(dims_[i]);
  return s + "]";
}

float* Tensor::f32() const {
  BRISK_CHECK(dtype_ == DType::f32, "expected a float32 tensor, got ", dtype_name(dtype_));
  return static_cast<float*>(data_);
}

int32_t* Tensor::i32() const {
  BRISK_CHECK(dtype_ == DType::i32, "expected an int32 tensor, got ", dtype_name(dtype_));
  return static_cast<int32_t*>(data_);
}

Tensor row_range(const Tensor& t, int64_t first, int64_t count, bool as_vector) {
  const bool vector = as_vector || t.rank() <= 1;
  const int64_t width = vector ? 1 : t.dim(-1);
  const int64_t rows = width ? t.numel() / width : 0;
  BRISK_CHECK(first >= 0 && count >= 0 && first <= rows && count <= rows - first,
              "internal error: rows ", first, "..", first + count, " of a tensor of ", rows);
  void* data =
      static_cast<char*>(t.data()) + static_cast<size_t>(first * width) * dtype_size(t.dtype());
  return Tensor(data, vector ? Shape{count} : Shape{count, width}, t.dtype(), t.device());
}

void expect(const Tensor& t, DType dtype, const Shape& shape, const char* what) {
  BRISK_CHECK(t.dtype() == dtype, what, ": expected dtype ", dtype_name(dtype), ", got ",
              dtype_name(t.dtype()));
  BRISK_CHECK(t.shape() == shape, what, ": expected shape ", shape.str(), ", got ",
              t.shape().str());
}

}  // namespace brisk
