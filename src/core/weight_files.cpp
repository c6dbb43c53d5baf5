// Single-file and sharded weights (see weight_files.h).
#include "core/weight_files.h"

#include <filesystem>

#include "core/error.h"
#include "core/json_file.h"

namespace brisk {

namespace fs = std::filesystem;

namespace {
constexpr const char* kSingle = "model.safetensors";
constexpr const char* kIndex = "model.safetensors.index.json";
// Far above any published checkpoint (a 400B model has ~200 shards and ~10^5 tensors): the
// bounds keep a hostile index from opening unbounded numbers of files.
constexpr size_t kMaxShards = 100000;
constexpr size_t kMaxIndexBytes = size_t{64} << 20;
}  // namespace

std::vector<std::string> WeightFiles::names() const {
  std::vector<std::string> out;
  for (const auto& [name, file] : where_) out.push_back(name);
  return out;
}

std::string WeightFiles::find_in_folder(const std::string& folder) {
  for (const char* name : {kSingle, kIndex})
    if (fs::exists(fs::path(folder) / name)) return (fs::path(folder) / name).string();
  return "";
}

WeightFiles::WeightFiles(const std::string& path) : path_(path) {
  if (!path.ends_with(".index.json")) {
    files_.push_back(std::make_unique<SafetensorsFile>(path));
    for (const std::string& n : files_[0]->names()) where_[n] = files_[0].get();
    bnb_ = find_bnb_4bit(*files_[0]);
    return;
  }
  const nlohmann::json index = read_json_file(path, "weights index", kMaxIndexBytes);
  const std::string what = "weights index '" + path + "'";
  BRISK_CHECK(index.is_object() && index.contains("weight_map") && index["weight_map"].is_object(),
              what, ": no \"weight_map\" object");
  std::map<std::string, const SafetensorsFile*> shard_of_file;
  for (const auto& [name, shard] : index["weight_map"].items()) {
    BRISK_CHECK(shard.is_string(), what, ": the shard of '", excerpt(name), "' is not a file name");
    const std::string file = shard.get<std::string>();
    // Shards lie beside the index: a path elsewhere would read files the user did not name.
    BRISK_CHECK(!file.empty() && file.find('/') == std::string::npos && file != "." && file != "..",
                what, ": shard '", excerpt(file), "' of '", excerpt(name),
                "' is not a file name in the index's folder");
    auto it = shard_of_file.find(file);
    if (it == shard_of_file.end()) {
      BRISK_CHECK(files_.size() < kMaxShards, what, ": more than ", kMaxShards, " shards");
      const fs::path shard_path = fs::path(path).parent_path() / file;
      BRISK_CHECK(fs::exists(shard_path), what, ": shard '", file, "' does not exist");
      files_.push_back(std::make_unique<SafetensorsFile>(shard_path.string()));
      it = shard_of_file.emplace(file, files_.back().get()).first;
    }
    BRISK_CHECK(it->second->has(name), what, " places '", excerpt(name), "' in '", file,
                "', which lacks it");
    where_[name] = it->second;
  }
  for (const auto& file : files_) bnb_.merge(find_bnb_4bit(*file));
}

const Bnb4bitWeight* WeightFiles::bnb_4bit(const std::string& name) const {
  const auto it = bnb_.find(name);
  return it == bnb_.end() ? nullptr : &it->second;
}

const Tensor& WeightFiles::get(const std::string& name) const {
  return file_of(name).get(name);
}

const SafetensorsFile& WeightFiles::file_of(const std::string& name) const {
  auto it = where_.find(name);
  BRISK_CHECK(it != where_.end(), "weights '", path_, "' lack tensor '", name, "'");
  return *it->second;
}

}  // namespace brisk
