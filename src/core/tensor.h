// Tensor: a non-owning view of contiguous, row-major memory (pointer, shape, dtype, device).
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "core/dtype.h"
#include "core/error.h"

namespace brisk {

// The label a loss skips (PyTorch's ignore_index): padding and unmasked tokens in the datasets,
// skipped rows in the backends' losses.
inline constexpr int kIgnoreIndex = -100;

// A shape of up to kMaxDims dimensions, stored inline so views never allocate.
class Shape {
 public:
  static constexpr int kMaxDims = 5;
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims);
  template <typename It>
  static Shape from(It begin, It end) {
    Shape s;
    for (It it = begin; it != end; ++it) s.push_back(static_cast<int64_t>(*it));
    return s;
  }

  int rank() const { return rank_; }
  int64_t operator[](int i) const { return dims_[i]; }
  int64_t numel() const;
  void push_back(int64_t d);
  bool operator==(const Shape& o) const;
  bool operator!=(const Shape& o) const { return !(*this == o); }
  std::string str() const;

 private:
  std::array<int64_t, kMaxDims> dims_{};
  int rank_ = 0;
};

// A range of elements of a flat buffer.
struct ElementRange {
  int64_t offset = 0;
  int64_t count = 0;
  bool operator==(const ElementRange& o) const { return offset == o.offset && count == o.count; }
};

class Tensor {
 public:
  Tensor() = default;
  Tensor(void* data, Shape shape, DType dtype, Device device = Device::cpu)
      : data_(data), shape_(shape), dtype_(dtype), device_(device) {}

  void* data() const { return data_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  float* f32() const;
  int32_t* i32() const;

  const Shape& shape() const { return shape_; }
  int rank() const { return shape_.rank(); }
  int64_t dim(int i) const { return shape_[i < 0 ? shape_.rank() + i : i]; }
  int64_t numel() const { return shape_.numel(); }
  size_t bytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  bool empty() const { return data_ == nullptr; }

 private:
  void* data_ = nullptr;
  Shape shape_;
  DType dtype_ = DType::f32;
  Device device_ = Device::cpu;
};

// Rows [first, first + count) of t seen as a matrix of its last dimension ([count, last]), or,
// for a vector or with as_vector, the elements [first, first + count) as a vector: a view.
Tensor row_range(const Tensor& t, int64_t first, int64_t count, bool as_vector = false);

// Throws unless t has the given dtype and shape; `what` names the tensor in the message.
void expect(const Tensor& t, DType dtype, const Shape& shape, const char* what);

}  // namespace brisk
