// safetensors mapping, validation and atomic writing.
#include "core/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string_view>
#include <unordered_set>

#include "core/checked.h"
#include "core/error.h"
#include "core/input_file.h"
#include "core/json_file.h"

namespace brisk {

namespace {
constexpr uint64_t kMaxHeader = 100u << 20;

// A header entry: its name, dtype, shape and byte range in the data section.
struct HeaderEntry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin, end;
};

// The entry `name` of a header, checked against a data section of data_size bytes; throws an
// Error saying what is wrong with it (the caller names the file and the entry).
HeaderEntry read_entry(const std::string& name, const nlohmann::json& entry, uint64_t data_size) {
  BRISK_CHECK(entry.is_object() && entry.contains("dtype") && entry.contains("shape") &&
                  entry.contains("data_offsets"),
              "lacks dtype, shape or data_offsets");
  const nlohmann::json& dt = entry["dtype"];
  const nlohmann::json& sh = entry["shape"];
  const nlohmann::json& off = entry["data_offsets"];
  BRISK_CHECK(dt.is_string(), "dtype must be a string");
  BRISK_CHECK(sh.is_array() && std::all_of(sh.begin(), sh.end(),
                                           [](const auto& d) { return d.is_number_unsigned(); }),
              "shape must be a list of non-negative whole numbers");
  BRISK_CHECK(off.is_array() && off.size() == 2 && off[0].is_number_unsigned() &&
                  off[1].is_number_unsigned(),
              "data_offsets must be two non-negative whole numbers");
  HeaderEntry e{name, dtype_from_safetensors(dt.get<std::string>()), Shape{},
                off[0].get<uint64_t>(), off[1].get<uint64_t>()};
  for (const auto& d : sh) {
    BRISK_CHECK(d.get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX), "dimension ",
                d.get<uint64_t>(), " is too large");
    e.shape.push_back(d.get<int64_t>());
  }
  BRISK_CHECK(e.begin <= e.end && e.end <= data_size, "data_offsets [", e.begin, ", ", e.end,
              "] outside the data section of ", data_size, " bytes");
  const int64_t need = checked_mul(e.shape.numel(), static_cast<int64_t>(dtype_size(e.dtype)),
                                   "the tensor's byte size");
  BRISK_CHECK(e.end - e.begin == static_cast<uint64_t>(need), "holds ", e.end - e.begin,
              " bytes but shape ", e.shape.str(), " needs ", need);
  return e;
}

// The header's tensor entries, each checked (read_entry), and its __metadata__ checked; errors
// begin with `where`.
std::vector<HeaderEntry> read_entries(const nlohmann::json& header, uint64_t data_size,
                                      const std::string& where) {
  std::vector<HeaderEntry> entries;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      BRISK_CHECK(entry.is_object() && std::all_of(entry.begin(), entry.end(),
                                                   [](const auto& v) { return v.is_string(); }),
                  where, "__metadata__ must map names to strings");
      continue;
    }
    const std::string label = "entry '" + excerpt(name) + "': ";
    try {
      entries.push_back(read_entry(name, entry, data_size));
    } catch (const Error& ex) {
      BRISK_FAIL(where, label, ex.what());
    }
  }
  return entries;
}

// Sorts the entries by offset and checks that they tile the data section of data_size bytes
// exactly: no overlap, no gap, nothing after the last one.
void check_tiling(std::vector<HeaderEntry>& entries, uint64_t data_size, const std::string& where) {
  std::sort(entries.begin(), entries.end(),
            [](const HeaderEntry& a, const HeaderEntry& b) { return a.begin < b.begin; });
  uint64_t covered = 0;
  for (const HeaderEntry& e : entries) {
    BRISK_CHECK(e.begin == covered, where, "entry '", excerpt(e.name), "' starts at byte ", e.begin,
                " where ",
                e.begin < covered ? "the previous tensor's data ends at "
                                  : "a gap begins: the data before it ends at ",
                covered);
    covered = e.end;
  }
  BRISK_CHECK(covered == data_size, where, "the header covers ", covered,
              " bytes of the data section's ", data_size,
              " (wrong header length or trailing data)");
}
}  // namespace

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  const InputFile f(path, "safetensors file");
  size_ = f.size();
  BRISK_CHECK(size_ >= 8, "'", path, "' is not a safetensors file: only ", size_, " bytes");
  map_ = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, f.fd(), 0);
  BRISK_CHECK(map_ != MAP_FAILED, "cannot map '", path, "'");
  try {
    validate_and_index();
  } catch (...) {
    ::munmap(map_, size_);
    map_ = nullptr;
    throw;
  }
}

// Checked as strictly as the reference library: a JSON object header of bounded size and depth,
// every entry a known dtype, a shape of non-negative dimensions whose byte size (checked
// arithmetic) equals its range, and the ranges, sorted, tiling the data section exactly: no
// overlap, no gap, nothing after the last one (a header length off by one byte is refused here
// instead of loading every weight shifted). Tensors whose data is not aligned for their dtype
// are copied into aligned memory instead of being read through misaligned pointers.
void SafetensorsFile::validate_and_index() {
  const auto* bytes = static_cast<const unsigned char*>(map_);
  const std::string where = "'" + path_ + "' is corrupt: ";
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | bytes[i];
  BRISK_CHECK(header_len <= kMaxHeader && header_len <= size_ - 8, where, "header length ",
              header_len, " does not fit in the file of ", size_, " bytes");
  BRISK_CHECK(header_len >= 2 && bytes[8] == '{', where, "its header is not a JSON object");
  const char* text = reinterpret_cast<const char*>(bytes + 8);
  const nlohmann::json header =
      parse_json_bounded(text, text + header_len, "'" + path_ + "' header", 8);
  BRISK_CHECK(header.is_object(), where, "its header is not a JSON object");
  const size_t data_begin = 8 + header_len;
  const uint64_t data_size = size_ - data_begin;
  std::vector<HeaderEntry> entries = read_entries(header, data_size, where);
  check_tiling(entries, data_size, where);

  for (HeaderEntry& e : entries) {
    char* at = static_cast<char*>(map_) + data_begin + e.begin;
    if (reinterpret_cast<uintptr_t>(at) % dtype_size(e.dtype) != 0) {
      // Bounded by the file's own size: each byte is copied at most once.
      auto& copy =
          aligned_copies_.emplace_back(std::make_unique<uint64_t[]>((e.end - e.begin + 7) / 8));
      std::memcpy(copy.get(), at, e.end - e.begin);
      at = reinterpret_cast<char*>(copy.get());
    }
    tensors_.emplace(std::move(e.name), Tensor(at, e.shape, e.dtype));
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

void SafetensorsFile::release(const Tensor& t) const {
  const auto* begin = static_cast<const char*>(t.data());
  const auto* base = static_cast<const char*>(map_);
  if (begin < base || begin + t.bytes() > base + size_) return;  // an aligned copy: not mapped
  // Whole pages inside the tensor only: its neighbours' pages stay.
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t first = (reinterpret_cast<uintptr_t>(begin) + page - 1) / page * page;
  const uintptr_t last = (reinterpret_cast<uintptr_t>(begin) + t.bytes()) / page * page;
  if (last > first) ::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
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
  // A NaN or infinity read in would surface steps later as an expert -1 or a NaN loss blamed on
  // the learning rate: refused here, naming the tensor (one pass over what was just written).
  uint32_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, out + i, sizeof bits);
    bad |= static_cast<uint32_t>((bits & 0x7f800000u) == 0x7f800000u);
  }
  BRISK_CHECK(!bad, what, " holds NaN or infinite values");
}

namespace {

// An entry to write: from host memory (`host`) or through `read`.
struct Outgoing {
  const std::string* name;
  DType dtype;
  const Shape* shape;
  size_t bytes;
  const void* host;
  std::function<void(size_t offset, size_t bytes, void* dst)> read;
};

void write_entries(const std::string& path, const std::vector<Outgoing>& entries,
                   const std::map<std::string, std::string>& metadata) {
  // The header is written as text, entry by entry in the order given (an ordered JSON object
  // would search its keys at every insertion: n^2 for n entries).
  std::string h = "{";
  if (!metadata.empty()) h += "\"__metadata__\":" + nlohmann::json(metadata).dump();
  std::unordered_set<std::string_view> seen;
  int64_t off = 0;
  for (const Outgoing& e : entries) {
    BRISK_CHECK(seen.insert(*e.name).second && *e.name != "__metadata__",
                "write_safetensors: the name '", excerpt(*e.name), "' is given twice or reserved");
    nlohmann::json shape = nlohmann::json::array();
    for (int i = 0; i < e.shape->rank(); ++i) shape.push_back((*e.shape)[i]);
    const int64_t end = checked_add(off, static_cast<int64_t>(e.bytes), "the file's data");
    const nlohmann::json entry = {
        {"dtype", dtype_to_safetensors(e.dtype)}, {"shape", shape}, {"data_offsets", {off, end}}};
    if (h.size() > 1) h += ',';
    h += nlohmann::json(*e.name).dump();
    h += ':';
    h += entry.dump();
    off = end;
  }
  h += "}";
  while (h.size() % 8) h.push_back(' ');  // keeps the data section 8-byte aligned

  const std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "wb");
  BRISK_CHECK(f != nullptr, "cannot write '", tmp, "': ", std::strerror(errno));
  bool ok = true;
  try {
    unsigned char len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(h.size() >> (8 * i));
    ok = ok && std::fwrite(len, 1, 8, f) == 8;
    ok = ok && std::fwrite(h.data(), 1, h.size(), f) == h.size();
    std::vector<unsigned char> staging;  // only for entries read in pieces; at most the bound
    for (const Outgoing& e : entries) {
      if (!ok) break;
      if (e.host) {
        ok = e.bytes == 0 || std::fwrite(e.host, 1, e.bytes, f) == e.bytes;
        continue;
      }
      staging.resize(std::min(kSafetensorsStagingBytes, std::max(staging.size(), e.bytes)));
      for (size_t done = 0; ok && done < e.bytes; done += staging.size()) {
        const size_t n = std::min(staging.size(), e.bytes - done);
        e.read(done, n, staging.data());
        ok = std::fwrite(staging.data(), 1, n, f) == n;
      }
    }
  } catch (...) {  // a read that failed: no half-written file is left behind
    std::fclose(f);
    std::remove(tmp.c_str());
    throw;
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

}  // namespace

void write_safetensors(const std::string& path,
                       const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata,
                       const DeviceReader& read_device) {
  std::vector<Outgoing> entries;
  for (const auto& named : tensors) {
    // (Plain locals: clang 14 cannot capture structured bindings in the lambda below.)
    const std::string& name = named.first;
    const Tensor& t = named.second;
    BRISK_CHECK(t.device() == Device::cpu || read_device, "write_safetensors: '", name,
                "' is not in host memory and no reader was given");
    Outgoing e{&name, t.dtype(), &t.shape(), t.bytes(), nullptr, nullptr};
    if (t.device() == Device::cpu)
      e.host = t.data();
    else
      e.read = [&read_device, &t](size_t offset, size_t bytes, void* dst) {
        read_device(t, offset, bytes, dst);
      };
    entries.push_back(std::move(e));
  }
  write_entries(path, entries, metadata);
}

void write_streamed_safetensors(const std::string& path, const std::vector<StreamedTensor>& tensors,
                                const std::map<std::string, std::string>& metadata) {
  std::vector<Outgoing> entries;
  for (const StreamedTensor& t : tensors) {
    BRISK_CHECK(t.read, "write_safetensors: '", t.name, "' has no reader");
    const int64_t bytes =
        checked_mul(t.shape.numel(), static_cast<int64_t>(dtype_size(t.dtype)), "a tensor's bytes");
    entries.push_back({&t.name, t.dtype, &t.shape, static_cast<size_t>(bytes), nullptr, t.read});
  }
  write_entries(path, entries, metadata);
}

}  // namespace brisk
