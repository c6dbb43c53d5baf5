// Reading and writing the safetensors format (8-byte little-endian header length, JSON header,
// raw little-endian data), the format transformers uses for model.safetensors.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace brisk {

// A safetensors file mapped read-only into memory; tensors are views into the mapping.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  bool has(const std::string& name) const { return tensors_.count(name) != 0; }
  // Throws naming the file when the tensor is absent.
  const Tensor& get(const std::string& name) const;
  std::vector<std::string> names() const;
  // Lets the kernel drop the mapped pages under `view` (a tensor of this file, or a range of one)
  // once copied out (a later read maps them again from the file), so loading a model never holds
  // the whole file and its copy at once.
  void release(const Tensor& view) const;
  const std::string& path() const { return path_; }

 private:
  void validate_and_index();

  std::string path_;
  void* map_ = nullptr;
  size_t size_ = 0;
  std::map<std::string, Tensor> tensors_;
  std::vector<std::unique_ptr<uint64_t[]>> aligned_copies_;  // data the file holds misaligned
};

// Copies `src` (any float dtype the file holds) into the float32 tensor `dst` of equal shape;
// refuses a NaN or infinite value, naming `what`.
void copy_to_f32(const Tensor& src, const Tensor& dst, const std::string& what);

// Copies `bytes` bytes of a tensor that lives off the host, from byte `offset` on, into `dst`.
using DeviceReader = std::function<void(const Tensor& t, size_t offset, size_t bytes, void* dst)>;

// Bytes of host memory write_safetensors uses at most to stream tensors that live off the host.
inline constexpr size_t kSafetensorsStagingBytes = size_t{8} << 20;

// Writes tensors to `path` atomically: a temporary file in the same folder, fsync, rename.
// Entries are written in the order given, each straight from its memory: host tensors directly,
// others through `read_device` in pieces of at most kSafetensorsStagingBytes (no whole copies).
void write_safetensors(const std::string& path,
                       const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata = {},
                       const DeviceReader& read_device = nullptr);

// An entry whose bytes no tensor of this process holds whole: `read(offset, bytes, dst)` copies
// bytes [offset, offset + bytes) of it into dst (ZeRO's saves gather them from every rank).
struct StreamedTensor {
  std::string name;
  DType dtype = DType::f32;
  Shape shape;
  std::function<void(size_t offset, size_t bytes, void* dst)> read;
};

// The same, every entry read through its `read`: in the order given, each from its first byte to
// its last, in pieces of at most kSafetensorsStagingBytes (the only host memory it uses).
void write_streamed_safetensors(const std::string& path, const std::vector<StreamedTensor>& tensors,
                                const std::map<std::string, std::string>& metadata = {});

}  // namespace brisk
