// A model's weights as transformers saves them: one model.safetensors, or shards named by
// model.safetensors.index.json's weight_map (save_pretrained's max_shard_size). Tensors are
// looked up by name across the files; each file is mapped as SafetensorsFile maps it.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/bnb_weights.h"
#include "core/safetensors.h"

namespace brisk {

class WeightFiles {
 public:
  // One safetensors file, or a model.safetensors.index.json with its shards beside it.
  explicit WeightFiles(const std::string& path);
  // What transformers loads from a model folder: model.safetensors, else the sharded index;
  // "" when the folder has neither.
  static std::string find_in_folder(const std::string& folder);

  bool has(const std::string& name) const { return where_.count(name) != 0; }
  // Every tensor's name, in order.
  std::vector<std::string> names() const;
  // Throws naming the files when the tensor is absent.
  const Tensor& get(const std::string& name) const;
  // The file holding `name` (for messages and SafetensorsFile::release).
  const SafetensorsFile& file_of(const std::string& name) const;
  // The path given: the safetensors file or the index.
  const std::string& path() const { return path_; }
  // `name` as bitsandbytes saved it 4-bit (core/bnb_weights.h), or nullptr: its packed codes are
  // then get(name), its values dequantize_bnb_4bit's.
  const Bnb4bitWeight* bnb_4bit(const std::string& name) const;
  // Whether any weight is saved 4-bit.
  bool has_bnb_4bit() const { return !bnb_.empty(); }

 private:
  std::string path_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const SafetensorsFile*> where_;
  std::map<std::string, Bnb4bitWeight> bnb_;
};

}  // namespace brisk
