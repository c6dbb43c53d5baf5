// TensorBoard event files (see tensorboard.h).
#include "report/tensorboard.h"

#include <fcntl.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <utility>

#include "core/error.h"

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace brisk {

namespace {
// Protocol-buffer encoding of the few fields an Event needs.
void varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
template <typename T>
void fixed(std::string& out, T v) {
  char bytes[sizeof(T)];
  std::memcpy(bytes, &v, sizeof(T));  // little-endian hosts only (x86-64, aarch64)
  out.append(bytes, sizeof(T));
}
void bytes_field(std::string& out, int field, const std::string& data) {
  varint(out, static_cast<uint64_t>(field) << 3 | 2);
  varint(out, data.size());
  out += data;
}
void double_field(std::string& out, int field, double v) {
  varint(out, static_cast<uint64_t>(field) << 3 | 1);
  fixed(out, v);
}

// An Event holding `summary`; step 0 is left out, as protocol buffers leave out zeros.
std::string summary_event(const std::string& summary, int64_t step, double wall_time) {
  std::string event;
  double_field(event, 1, wall_time);
  if (step != 0) {
    varint(event, 2 << 3 | 0);
    varint(event, static_cast<uint64_t>(step));
  }
  bytes_field(event, 5, summary);
  return event;
}

// transformers' rewrite_logs: eval_/test_ metrics under eval/ and test/, the rest under train/.
std::string tag_of(const std::string& key) {
  if (key == "perplexity") return "eval/perplexity";  // run_clm's name for an eval metric
  for (const char* p : {"eval_", "test_"})
    if (key.rfind(p, 0) == 0) return std::string(p, 4) + "/" + key.substr(5);
  return "train/" + key;
}
}  // namespace

namespace {
// CRC-32C's reflected polynomial; entry b is the CRC of byte b alone.
constexpr std::array<uint32_t, 256> crc32c_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t b = 0; b < 256; ++b) {
    uint32_t c = b;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (c & 1u ? 0x82f63b78u : 0u);
    t[b] = c;
  }
  return t;
}
constexpr std::array<uint32_t, 256> kCrc32cTable = crc32c_table();

#if defined(__x86_64__)
// The SSE4.2 CRC32 instruction computes CRC-32C; compiled for SSE4.2 whatever the build targets,
// and called only where the CPU reports it.
__attribute__((target("sse4.2"))) uint32_t crc32c_sse42(const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t crc = 0xffffffffu;
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);
    crc = _mm_crc32_u64(crc, word);
  }
  auto c = static_cast<uint32_t>(crc);
  for (; n > 0; --n, ++p) c = _mm_crc32_u8(c, *p);
  return ~c;
}
#endif
}  // namespace

bool crc32c_in_hardware() {
#if defined(__x86_64__)
  static const bool sse42 = __builtin_cpu_supports("sse4.2");
  return sse42;
#else
  return false;
#endif
}

uint32_t crc32c_software(const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = 0xffffffffu;
  for (; n > 0; --n, ++p) c = kCrc32cTable[(c ^ *p) & 0xffu] ^ (c >> 8);
  return ~c;
}

uint32_t crc32c(const void* data, size_t n) {
#if defined(__x86_64__)
  if (crc32c_in_hardware()) return crc32c_sse42(data, n);
#endif
  return crc32c_software(data, n);
}

uint32_t masked_crc32c(const void* data, size_t n) {
  const uint32_t c = crc32c(data, n);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

std::string event_file_path(const std::string& dir, double wall_time) {
  char host[256] = "localhost";
  ::gethostname(host, sizeof host - 1);
  return (std::filesystem::path(dir) /
          ("events.out.tfevents." + std::to_string(static_cast<int64_t>(wall_time)) + "." + host +
           "." + std::to_string(::getpid()) + ".0"))
      .string();
}

EventWriter::EventWriter(const std::string& path, double wall_time) : path_(path) {
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  BRISK_CHECK(fd_ >= 0, "cannot write TensorBoard events to '", path, "': ", std::strerror(errno));
  std::string event;
  double_field(event, 1, wall_time);
  bytes_field(event, 3, "brain.Event:2");
  record(event);
}

EventWriter::~EventWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void EventWriter::record(const std::string& data) {
  if (stopped_) return;
  std::string framed;
  fixed(framed, static_cast<uint64_t>(data.size()));
  fixed(framed, masked_crc32c(framed.data(), 8));
  framed += data;
  fixed(framed, masked_crc32c(data.data(), data.size()));
  for (size_t done = 0; done < framed.size();) {  // one write, unless a signal cuts it short
    const ssize_t n = ::write(fd_, framed.data() + done, framed.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return stop(n < 0 ? errno : ENOSPC);
    done += static_cast<size_t>(n);
  }
  whole_bytes_ += framed.size();
  ++records_;
}

// Cuts the file back to its whole records (removes it when it has none) and takes no more.
void EventWriter::stop(int err) {
  stopped_ = true;
  const bool cut = ::ftruncate(fd_, static_cast<off_t>(whole_bytes_)) == 0;
  if (records_ == 0 && cut) ::unlink(path_.c_str());
  warning_ = "TensorBoard events stopped: writing '" + path_ + "' failed (" + std::strerror(err) +
             "), " +
             (cut ? "the file keeps its " + std::to_string(records_) + " whole records"
                  : "and cutting it back to its whole records failed too") +
             "; the run goes on without them";
}

std::string EventWriter::take_warning() {
  return std::exchange(warning_, std::string());
}

void EventWriter::scalar(const std::string& tag, float value, int64_t step, double wall_time) {
  std::string v;
  bytes_field(v, 1, tag);
  varint(v, 2 << 3 | 5);
  fixed(v, value);
  std::string summary;
  bytes_field(summary, 1, v);
  record(summary_event(summary, step, wall_time));
}

void EventWriter::text(const std::string& tag, const std::string& text, int64_t step,
                       double wall_time) {
  // As SummaryWriter.add_text: the text plugin's metadata and a string tensor of shape [1].
  std::string plugin;
  bytes_field(plugin, 1, "text");
  std::string metadata;
  bytes_field(metadata, 1, plugin);
  std::string dim;
  varint(dim, 1 << 3 | 0);
  varint(dim, 1);
  std::string shape;
  bytes_field(shape, 2, dim);
  std::string tensor;
  varint(tensor, 1 << 3 | 0);
  varint(tensor, 7);  // DT_STRING
  bytes_field(tensor, 2, shape);
  bytes_field(tensor, 8, text);
  std::string v;
  bytes_field(v, 1, tag);
  bytes_field(v, 8, tensor);
  bytes_field(v, 9, metadata);
  std::string summary;
  bytes_field(summary, 1, v);
  record(summary_event(summary, step, wall_time));
}

void EventWriter::log(const nlohmann::json& rec, int64_t step, double wall_time) {
  for (const auto& [key, v] : rec.items()) {
    if (key == "step" || !v.is_number() || !std::isfinite(v.get<double>())) continue;
    scalar(tag_of(key), v.get<float>(), step, wall_time);
  }
}

}  // namespace brisk
