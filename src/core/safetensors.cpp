// safetensors mapping, validation and atomic writing.
#include "core/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace brisk {

namespace {
constexpr uint64_t kMaxHeader = 100u << 20;

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};
}  // namespace

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  Fd f;
  f.fd = ::open(path.c_str(), O_RDONLY);
  BRISK_CHECK(f.fd >= 0, "cannot open '", path, "': ", std::strerror(errno));
  struct stat st {};
  BRISK_CHECK(::fstat(f.fd, &st) == 0, "cannot stat '", path, "'");
  size_ = static_cast<size_t>(st.st_size);
  BRISK_CHECK(size_ >= 8, "'", path, "' is not a safetensors file: only ", size_, " bytes");
  map_ = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, f.fd, 0);
  BRISK_CHECK(map_ != MAP_FAILED, "cannot map '", path, "'");
  try {
    const auto* bytes = static_cast<const unsigned char*>(map_);
    uint64_t header_len = 0;
    for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | bytes[i];
    BRISK_CHECK(header_len <= kMaxHeader && header_len <= size_ - 8, "'", path,
                "' is corrupt: header length ", header_len, " does not fit in the file of ", size_,
                " bytes");
    nlohmann::json header;
    try {
      header = nlohmann::json::parse(bytes + 8, bytes + 8 + header_len);
    } catch (const nlohmann::json::exception& e) {
      BRISK_FAIL("'", path, "' is corrupt: its header is not valid JSON (", e.what(), ")");
    }
    BRISK_CHECK(header.is_object(), "'", path, "' is corrupt: header is not a JSON object");
    const size_t data_begin = 8 + header_len;
    const size_t data_size = size_ - data_begin;
    for (auto& [name, entry] : header.items()) {
      if (name == "__metadata__") continue;
      BRISK_CHECK(entry.is_object() && entry.contains("dtype") && entry.contains("shape") &&
                      entry.contains("data_offsets"),
                  "'", path, "' is corrupt: entry '", name, "' lacks dtype, shape or offsets");
      try {
        DType dt = dtype_from_safetensors(entry["dtype"].get<std::string>());
        Shape shape;
        for (const auto& d : entry["shape"]) shape.push_back(d.get<int64_t>());
        auto off = entry["data_offsets"];
        BRISK_CHECK(off.is_array() && off.size() == 2, "bad data_offsets");
        uint64_t b = off[0].get<uint64_t>(), e = off[1].get<uint64_t>();
        BRISK_CHECK(b <= e && e <= data_size, "data_offsets [", b, ", ", e,
                    "] outside the data section of ", data_size, " bytes");
        BRISK_CHECK(e - b == static_cast<uint64_t>(shape.numel()) * dtype_size(dt), "holds ", e - b,
                    " bytes but shape ", shape.str(), " needs ", shape.numel() * dtype_size(dt));
        tensors_.emplace(name, Tensor(static_cast<char*>(map_) + data_begin + b, shape, dt));
      } catch (const nlohmann::json::exception& ex) {
        BRISK_FAIL("'", path, "' is corrupt: entry '", name, "': ", ex.what());
      } catch (const Error& ex) {
        BRISK_FAIL("'", path, "' is corrupt: entry '", name, "': ", ex.what());
      }
    }
  } catch (...) {
    ::munmap(map_, size_);
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (map_ && map_ != MAP_FAILED) ::munmap(map_, size_);
}

const Tensor& SafetensorsFile::get(const std::string& name) const {
  auto it = tensors_.find(name);
  BRISK_CHECK(it != tensors_.end(), "'", path_, "' has no tensor named '", name, "'");
  return it->second;
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  for (const auto& [n, t] : tensors_) out.push_back(n);
  return out;
}

void copy_to_f32(const Tensor& src, const Tensor& dst, const std::string& what) {
  BRISK_CHECK(src.shape() == dst.shape(), what, ": shape ", src.shape().str(), " where ",
              dst.shape().str(), " is expected");
  float* out = dst.f32();
  const int64_t n = src.numel();
  switch (src.dtype()) {
    case DType::f32:
      std::memcpy(out, src.data(), n * sizeof(float));
      break;
    case DType::bf16:
      for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_float(src.as<uint16_t>()[i]);
      break;
    case DType::f16:
      for (int64_t i = 0; i < n; ++i) out[i] = fp16_to_float(src.as<uint16_t>()[i]);
      break;
    case DType::f64:
      for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(src.as<double>()[i]);
      break;
    default:
      BRISK_FAIL(what, ": dtype ", dtype_name(src.dtype()), " cannot be read as floats");
  }
}

void write_safetensors(const std::string& path,
                       const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata,
                       const DeviceReader& read_device) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t off = 0;
  for (const auto& [name, t] : tensors) {
    BRISK_CHECK(t.device() == Device::cpu || read_device, "write_safetensors: '", name,
                "' is not in host memory and no reader was given");
    nlohmann::ordered_json shape = nlohmann::ordered_json::array();
    for (int i = 0; i < t.rank(); ++i) shape.push_back(t.dim(i));
    header[name] = {{"dtype", dtype_to_safetensors(t.dtype())},
                    {"shape", shape},
                    {"data_offsets", {off, off + t.bytes()}}};
    off += t.bytes();
  }
  std::string h = header.dump();
  while (h.size() % 8) h.push_back(' ');  // keeps the data section 8-byte aligned

  const std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "wb");
  BRISK_CHECK(f != nullptr, "cannot write '", tmp, "': ", std::strerror(errno));
  bool ok = true;
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(h.size() >> (8 * i));
  ok = ok && std::fwrite(len, 1, 8, f) == 8;
  ok = ok && std::fwrite(h.data(), 1, h.size(), f) == h.size();
  std::vector<unsigned char> staging;  // only for tensors off the host; at most the stated bound
  for (const auto& [name, t] : tensors) {
    if (!ok) break;
    if (t.device() == Device::cpu) {
      ok = t.bytes() == 0 || std::fwrite(t.data(), 1, t.bytes(), f) == t.bytes();
      continue;
    }
    staging.resize(std::min(kSafetensorsStagingBytes, std::max(staging.size(), t.bytes())));
    for (size_t done = 0; ok && done < t.bytes(); done += staging.size()) {
      const size_t n = std::min(staging.size(), t.bytes() - done);
      read_device(t, done, n, staging.data());
      ok = std::fwrite(staging.data(), 1, n, f) == n;
    }
  }
  ok = std::fflush(f) == 0 && ok;
  ok = ::fsync(fileno(f)) == 0 && ok;
  ok = std::fclose(f) == 0 && ok;
  if (!ok) {
    std::remove(tmp.c_str());
    BRISK_FAIL("failed while writing '", tmp, "' (disk full or unwritable?)");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    BRISK_FAIL("cannot rename '", tmp, "' to '", path, "': ", std::strerror(errno));
  }
}

}  // namespace brisk
