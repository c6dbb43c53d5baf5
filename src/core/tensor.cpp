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

void expect(const Tensor& t, DType dtype, const Shape& shape, const char* what) {
  BRISK_CHECK(t.dtype() == dtype, what, ": expected dtype ", dtype_name(dtype), ", got ",
              dtype_name(t.dtype()));
  BRISK_CHECK(t.shape() == shape, what, ": expected shape ", shape.str(), ", got ",
              t.shape().str());
}

}  // namespace brisk
