// Checks of SentencePiece's precompiled charsmap (see charsmap.h): a bounded walk over the
// ModelProto's protobuf fields to find it, then a proof over the double-array trie that any
// lookup libsentencepiece makes stays inside the blob.
#include "tokenizer/charsmap.h"

#include <cstdint>
#include <vector>

#include "core/error.h"

namespace brisk {

namespace {

// Far above the few hundred KiB of the charsmaps SentencePiece compiles (nmt_nfkc and its kin).
constexpr size_t kMaxCharsmap = size_t{16} << 20;

uint32_t le32(const char* p) {
  const auto* b = reinterpret_cast<const unsigned char*>(p);
  return uint32_t{b[0]} | uint32_t{b[1]} << 8 | uint32_t{b[2]} << 16 | uint32_t{b[3]} << 24;
}

// A darts-clone unit: bit 31 marks a leaf (whose low 31 bits are its value), bit 8 says a leaf
// hangs below, the low byte is the label, the rest the offset to the children.
bool is_leaf(uint32_t u) {
  return (u >> 31) != 0;
}
bool has_leaf(uint32_t u) {
  return ((u >> 8) & 1) != 0;
}
uint32_t value_of(uint32_t u) {
  return u & 0x7FFFFFFFu;
}
uint32_t offset_of(uint32_t u) {
  return (u >> 10) << ((u & (1u << 9)) >> 6);
}

// The units whose label leads to them from each base (a walk at base p on byte b reads unit
// p ^ b and follows it when its label is b), grouped by base: CSR arrays.
struct Children {
  std::vector<uint32_t> start, units;
  explicit Children(const std::vector<uint32_t>& array) : start(array.size() + 257, 0) {
    for (size_t c = 0; c < array.size(); ++c)
      if (!is_leaf(array[c])) ++start[(c ^ (array[c] & 0xFF)) + 1];
    for (size_t p = 1; p < start.size(); ++p) start[p] += start[p - 1];
    units.resize(start.back());
    std::vector<uint32_t> fill(start.begin(), start.end() - 1);
    for (size_t c = 0; c < array.size(); ++c)
      if (!is_leaf(array[c])) units[fill[c ^ (array[c] & 0xFF)]++] = static_cast<uint32_t>(c);
  }
};

// From the root, every base a walk can reach must keep all 256 children inside the array (each
// is read before its label is compared), and every leaf's value must start a NUL-terminated
// string (the last NUL of the strings ends it).
void check_trie(const std::vector<uint32_t>& array, std::string_view strings,
                const std::string& origin) {
  const size_t n = array.size();
  const size_t last_nul = strings.rfind('\0');
  const Children children(array);
  std::vector<bool> seen(n, false);
  std::vector<uint32_t> todo = {offset_of(array[0])};  // the root is unit 0
  while (!todo.empty()) {
    const uint32_t base = todo.back();
    todo.pop_back();
    BRISK_CHECK((size_t{base} | 0xFF) < n, "'", origin,
                "': the SentencePiece normalizer's precompiled charsmap is malformed: its trie "
                "leads to unit ",
                base | 0xFF, " of its ", n);
    if (seen[base]) continue;
    seen[base] = true;
    for (uint32_t i = children.start[base]; i < children.start[base + 1]; ++i) {
      const uint32_t unit = array[children.units[i]];
      const uint32_t next = children.units[i] ^ offset_of(unit);
      if (has_leaf(unit) && next < n)
        BRISK_CHECK(last_nul != std::string_view::npos && value_of(array[next]) <= last_nul, "'",
                    origin,
                    "': the SentencePiece normalizer's precompiled charsmap is malformed: a rule "
                    "maps to byte ",
                    value_of(array[next]), " of its ", strings.size(),
                    " bytes of strings, past their last NUL");
      todo.push_back(next);
    }
  }
}

// Protobuf fields of a message, each read inside the bytes: varints of at most 10 bytes,
// lengths that fit, wire types 0, 1, 2 and 5 (SentencePiece writes no groups).
class FieldReader {
 public:
  FieldReader(std::string_view in, const std::string& origin) : in_(in), origin_(origin) {}
  // The next field's number, wire type and, for length-delimited ones, bytes; false at the end.
  bool next(uint64_t& number, uint64_t& wire, std::string_view& bytes) {
    if (at_ == in_.size()) return false;
    const uint64_t key = varint();
    number = key >> 3;
    wire = key & 7;
    check(number != 0, "a field numbered 0");
    bytes = {};
    if (wire == 0) {
      varint();
    } else if (wire == 1 || wire == 5) {
      skip(wire == 1 ? 8 : 4);
    } else if (wire == 2) {
      const uint64_t length = varint();
      check(length <= in_.size() - at_, "a field longer than its message");
      bytes = in_.substr(at_, static_cast<size_t>(length));
      at_ += static_cast<size_t>(length);
    } else {
      check(false, "a field of wire type ", wire);
    }
    return true;
  }

 private:
  template <typename... Parts>
  void check(bool ok, const Parts&... parts) const {
    BRISK_CHECK(ok, "'", origin_, "' is not a valid SentencePiece model: the file does not parse (",
                parts..., ")");
  }
  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 70; shift += 7) {
      check(at_ < in_.size(), "a truncated number");
      const auto b = static_cast<unsigned char>(in_[at_++]);
      v |= uint64_t{b & 0x7Fu} << shift;
      if (b < 0x80) return v;
    }
    check(false, "a number longer than 10 bytes");
    return 0;
  }
  void skip(size_t n) {
    check(n <= in_.size() - at_, "a truncated field");
    at_ += n;
  }

  std::string_view in_;
  const std::string& origin_;
  size_t at_ = 0;
};

}  // namespace

void check_precompiled_charsmap(std::string_view blob, const std::string& origin) {
  const char* what = "': the SentencePiece normalizer's precompiled charsmap is malformed: ";
  BRISK_CHECK(blob.size() > 4 && blob.size() <= kMaxCharsmap, "'", origin, what, "it holds ",
              blob.size(), " bytes (more than 4 and at most ", kMaxCharsmap, " expected)");
  const uint32_t trie_bytes = le32(blob.data());
  BRISK_CHECK(trie_bytes >= 4 && trie_bytes % 4 == 0 && trie_bytes <= blob.size() - 4, "'", origin,
              what, "its trie of ", trie_bytes, " bytes is no whole number of units inside its ",
              blob.size() - 4, " bytes");
  std::vector<uint32_t> array(trie_bytes / 4);
  for (size_t i = 0; i < array.size(); ++i) array[i] = le32(blob.data() + 4 + 4 * i);
  check_trie(array, blob.substr(4 + size_t{trie_bytes}), origin);
}

void check_sentencepiece_charsmaps(std::string_view model, const std::string& origin) {
  constexpr uint64_t kNormalizerSpec = 3, kDenormalizerSpec = 5, kPrecompiledCharsmap = 2;
  FieldReader fields(model, origin);
  uint64_t number = 0, wire = 0;
  std::string_view bytes;
  while (fields.next(number, wire, bytes)) {
    if (wire != 2 || (number != kNormalizerSpec && number != kDenormalizerSpec)) continue;
    FieldReader spec(bytes, origin);
    std::string_view charsmap;
    while (spec.next(number, wire, charsmap))
      if (number == kPrecompiledCharsmap && wire == 2 && !charsmap.empty())
        check_precompiled_charsmap(charsmap, origin);
  }
}

}  // namespace brisk
