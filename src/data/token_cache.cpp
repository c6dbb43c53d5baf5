// Tokenized-dataset caches (see token_cache.h).
#include "data/token_cache.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "core/checked.h"
#include "core/error.h"
#include "core/input_file.h"
#include "core/json_file.h"
#include "core/tensor.h"

namespace brisk {

namespace {
// The last byte is the format's version: version 1 hashed with FNV-1a, version 2 with XXH3.
constexpr char kMagic[8] = {'B', 'R', 'I', 'S', 'K', 'T', 'K', '2'};
enum Flags : uint64_t { kOffsets = 1, kTypes = 2, kLabels = 4, kValues = 8 };

struct Header {
  char magic[8];
  uint64_t key, rows, ids, flags, checksum;
};
static_assert(sizeof(Header) == 48);

// A read-only mapping of a whole file.
struct MappedFile {
  const char* data = nullptr;
  size_t size = 0;
  ~MappedFile() {
    if (data) ::munmap(const_cast<char*>(data), size);
  }
};

std::shared_ptr<MappedFile> map_file(const std::string& path, std::string* why) {
  try {
    const InputFile file(path, "tokenization cache");
    auto m = std::make_shared<MappedFile>();
    m->size = file.size();
    if (m->size > 0) {
      void* p = ::mmap(nullptr, m->size, PROT_READ, MAP_PRIVATE, file.fd(), 0);
      if (p == MAP_FAILED) {
        *why = "cannot map it";
        return nullptr;
      }
      m->data = static_cast<const char*>(p);
    }
    return m;
  } catch (const Error& e) {
    *why = e.what();
    return nullptr;
  }
}

template <typename T>
void append(std::string& out, std::span<const T> a) {
  out.append(reinterpret_cast<const char*>(a.data()), a.size_bytes());
}
}  // namespace

TokenizedRows view_of(std::shared_ptr<const TokenArrays> a) {
  TokenizedRows r;
  r.offsets = a->offsets;
  r.ids = a->ids;
  r.types = a->types;
  r.labels = a->labels;
  r.values = a->values;
  r.memory = std::move(a);
  return r;
}

void Fingerprint::FreeState::operator()(XXH3_state_s* s) const {
  XXH3_freeState(s);
}

Fingerprint::Fingerprint() : state_(XXH3_createState()) {
  BRISK_CHECK(state_ && XXH3_64bits_reset(state_.get()) == XXH_OK,
              "cannot start an XXH3 fingerprint (out of memory)");
}

Fingerprint::~Fingerprint() = default;

Fingerprint& Fingerprint::add(std::string_view bytes) {
  const uint64_t n = bytes.size();
  XXH3_64bits_update(state_.get(), &n, sizeof n);
  XXH3_64bits_update(state_.get(), bytes.data(), bytes.size());
  return *this;
}

uint64_t Fingerprint::value() const {
  return XXH3_64bits_digest(state_.get());
}

Fingerprint& Fingerprint::add_file(const std::string& path) {
  std::string why;
  const std::shared_ptr<MappedFile> m = map_file(path, &why);
  BRISK_CHECK(m, "cannot read '", path, "': ", why);
  return add(std::string_view(m->data ? m->data : "", m->size));
}

std::string serialize_token_cache(uint64_t key, const TokenizedRows& rows) {
  Header h{};
  std::memcpy(h.magic, kMagic, sizeof kMagic);
  h.key = key;
  h.rows = rows.offsets.empty() ? 0 : rows.offsets.size() - 1;
  h.ids = rows.ids.size();
  const auto flag = [](bool present, Flags f) { return present ? uint64_t{f} : uint64_t{0}; };
  h.flags = flag(!rows.offsets.empty(), kOffsets) | flag(!rows.types.empty(), kTypes) |
            flag(!rows.labels.empty(), kLabels) | flag(!rows.values.empty(), kValues);
  std::string payload;
  append(payload, rows.offsets);
  append(payload, rows.ids);
  append(payload, rows.types);
  append(payload, rows.labels);
  append(payload, rows.values);
  h.checksum = Fingerprint().add(payload).value();
  std::string out(reinterpret_cast<const char*>(&h), sizeof h);
  return out + payload;
}

const char* out_of_limits(const TokenizedRows& r, const TokenLimits& limits) {
  const auto below = [](int64_t bound) {
    return [bound](int32_t v) { return v >= 0 && v < bound; };
  };
  if (!std::all_of(r.ids.begin(), r.ids.end(), below(limits.vocab)))
    return "a token id outside the vocabulary";
  if (!std::all_of(r.types.begin(), r.types.end(), below(limits.type_vocab)))
    return "a token type outside the model's";
  const auto class_or_none = [&](int32_t v) {
    return v == kIgnoreIndex || below(limits.classes)(v);
  };
  if (!std::all_of(r.labels.begin(), r.labels.end(), class_or_none))
    return "a label outside the classes";
  if (!std::all_of(r.values.begin(), r.values.end(), [](float v) { return !std::isinf(v); }))
    return "an infinite label value";
  return nullptr;
}

std::optional<TokenizedRows> parse_token_cache(std::string_view bytes, uint64_t key,
                                               const TokenLimits& limits, std::string* why) {
  auto fail = [&](const char* reason) {
    *why = reason;
    return std::nullopt;
  };
  Header h{};
  if (reinterpret_cast<uintptr_t>(bytes.data()) % alignof(int64_t) != 0) return fail("misaligned");
  if (bytes.size() < sizeof h) return fail("shorter than its header");
  std::memcpy(&h, bytes.data(), sizeof h);
  if (std::memcmp(h.magic, kMagic, sizeof kMagic - 1) != 0) return fail("not a token cache");
  if (h.magic[7] != kMagic[7]) return fail("written in another version of the cache format");
  if (h.key != key) return fail("made from other data, tokenizer or options");
  const bool offsets = h.flags & kOffsets;
  if (h.flags > 15 || h.rows > (uint64_t{1} << 40) || h.ids > (uint64_t{1} << 40) ||
      (!offsets && (h.rows != 0 || (h.flags & (kLabels | kValues)) != 0)))
    return fail("a header out of range");
  const int64_t rows = static_cast<int64_t>(h.rows), ids = static_cast<int64_t>(h.ids);
  int64_t size = sizeof h;
  const int64_t offsets_bytes = offsets ? checked_mul(rows + 1, 8, "token cache") : 0;
  size = checked_add(size, offsets_bytes, "token cache");
  size =
      checked_add(size, checked_mul(ids, (h.flags & kTypes) ? 8 : 4, "token cache"), "token cache");
  if (h.flags & kLabels)
    size = checked_add(size, checked_mul(rows, 4, "token cache"), "token cache");
  if (h.flags & kValues)
    size = checked_add(size, checked_mul(rows, 4, "token cache"), "token cache");
  if (static_cast<uint64_t>(size) != bytes.size()) return fail("truncated or padded");
  const std::string_view payload = bytes.substr(sizeof h);
  if (Fingerprint().add(payload).value() != h.checksum) return fail("its checksum does not match");
  TokenizedRows r;
  const char* p = payload.data();
  auto take = [&p](auto& span, int64_t n) {
    using T = typename std::remove_reference_t<decltype(span)>::element_type;
    span = {reinterpret_cast<const T*>(p), static_cast<size_t>(n)};
    p += n * static_cast<int64_t>(sizeof(T));
  };
  if (offsets) take(r.offsets, rows + 1);
  take(r.ids, ids);
  if (h.flags & kTypes) take(r.types, ids);
  if (h.flags & kLabels) take(r.labels, rows);
  if (h.flags & kValues) take(r.values, rows);
  if (offsets) {
    if (r.offsets[0] != 0 || r.offsets[rows] != ids) return fail("offsets out of range");
    for (int64_t i = 0; i < rows; ++i)
      if (r.offsets[i] > r.offsets[i + 1]) return fail("offsets out of order");
  }
  if (const char* bad = out_of_limits(r, limits)) return fail(bad);
  return r;
}

std::optional<TokenizedRows> read_token_cache(const std::string& path, uint64_t key,
                                              const TokenLimits& limits, std::string* why) {
  const std::shared_ptr<MappedFile> m = map_file(path, why);
  if (!m) return std::nullopt;
  // The arrays are read in place: the header's 48 bytes keep them aligned.
  std::optional<TokenizedRows> r =
      parse_token_cache(std::string_view(m->data ? m->data : "", m->size), key, limits, why);
  if (r) r->memory = m;
  return r;
}

void write_token_cache(const std::string& path, uint64_t key, const TokenizedRows& rows) {
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  BRISK_CHECK(!ec, "cannot create the folder of '", path, "': ", ec.message());
  write_file_atomically(path, serialize_token_cache(key, rows));
}

}  // namespace brisk
