// BPE over characters with byte fallback, as Llama-2 and Mistral's tokenizer.json: the text
// normalized by Prepend("▁") and Replace(" ", "▁"), no pre-tokenizer, characters missing from the
// vocabulary spelled as <0xNN> byte tokens (or the unknown token, consecutive ones fused).
#include <cstdio>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/error.h"
#include "tokenizer/merges.h"
#include "tokenizer/tokenizer.h"

namespace brisk {

namespace {

size_t utf8_length(unsigned char lead) {
  if (lead < 0x80) return 1;
  if ((lead & 0xE0) == 0xC0) return 2;
  if ((lead & 0xF0) == 0xE0) return 3;
  if ((lead & 0xF8) == 0xF0) return 4;
  return 1;  // a stray byte stands alone
}

std::string byte_token(unsigned char b) {
  char name[8];
  std::snprintf(name, sizeof name, "<0x%02X>", b);
  return name;
}

// `s` with every `from` (left to right, not overlapping) replaced by `to`, built anew: replacing
// in place moves the rest of the text at each match.
std::string replace_all(std::string_view s, std::string_view from, std::string_view to) {
  std::string out;
  size_t begin = 0;
  for (size_t at = s.find(from); at != std::string_view::npos; at = s.find(from, begin)) {
    out.append(s, begin, at - begin).append(to);
    begin = at + from.size();
  }
  return out.append(s, begin);
}

// The bytes replace_all(s, from, to) makes.
size_t replaced_size(std::string_view s, std::string_view from, std::string_view to) {
  size_t n = s.size();
  for (size_t at = s.find(from); at != std::string_view::npos; at = s.find(from, at + from.size()))
    n = n - from.size() + to.size();
  return n;
}

class FallbackBpe final : public TokenModel {
 public:
  FallbackBpe(std::unordered_map<std::string, int32_t> vocab,
              const std::vector<std::pair<std::string, std::string>>& merges,
              std::vector<TextEdit> normalizer, const std::string& unk, bool fuse_unk,
              const std::string& origin)
      : TokenModel(std::move(vocab)),
        origin_(origin),
        normalizer_(std::move(normalizer)),
        fuse_unk_(fuse_unk) {
    for (size_t i = 0; i < merges.size(); ++i) {
      const auto& [a, b] = merges[i];
      BRISK_CHECK(!a.empty() && !b.empty(), "'", origin, "': merge ", i + 1, " has an empty side");
      BRISK_CHECK(vocab_.count(a + b), "'", origin, "': merge ", i + 1, " (\"", excerpt(a), "\" \"",
                  excerpt(b), "\") makes a token the vocabulary lacks");
      ranks_.emplace(a + '\x01' + b, static_cast<int>(i));
    }
    for (int b = 0; b < 256; ++b) {
      byte_ids_[b] = id_of(byte_token(static_cast<unsigned char>(b)));
      if (byte_ids_[b] >= 0) byte_of_[byte_ids_[b]] = static_cast<unsigned char>(b);
    }
    unk_id_ = unk.empty() ? -1 : id_of(unk);
    BRISK_CHECK(unk.empty() || unk_id_ >= 0, "'", origin,
                "': the vocabulary lacks its unknown token \"", excerpt(unk), "\"");
  }

  void encode(std::string_view text, std::vector<int32_t>& out) const override {
    std::string repaired;
    const std::string s = apply_edits(valid_utf8(text, repaired), normalizer_, origin_);
    // Characters as symbols; one missing from the vocabulary becomes its bytes' tokens.
    std::vector<std::string> parts;
    std::vector<int32_t> fixed;  // per part: the unknown id, else -1 (only read to fuse them)
    for (size_t i = 0; i < s.size();) {
      const size_t n = std::min(utf8_length(static_cast<unsigned char>(s[i])), s.size() - i);
      std::string ch = s.substr(i, n);
      i += n;
      if (vocab_.count(ch)) {
        parts.push_back(std::move(ch));
        fixed.push_back(-1);
        continue;
      }
      bool all_bytes = true;
      for (char c : ch) all_bytes = all_bytes && byte_ids_[static_cast<unsigned char>(c)] >= 0;
      if (all_bytes) {
        for (char c : ch) {
          parts.push_back(byte_token(static_cast<unsigned char>(c)));
          fixed.push_back(-1);
        }
        continue;
      }
      if (unk_id_ < 0) continue;  // left out, as the library does without an unknown token
      if (fuse_unk_ && !fixed.empty() && fixed.back() == unk_id_ && parts.back().empty()) continue;
      parts.emplace_back();  // an unknown never merges: no rank has an empty side
      fixed.push_back(unk_id_);
    }
    merge_pieces(parts, ranks_);
    // Merged parts are in the vocabulary (checked at load), so are characters and byte tokens.
    for (const std::string& p : parts) {
      const auto it = p.empty() ? vocab_.end() : vocab_.find(p);
      out.push_back(it != vocab_.end() ? it->second : unk_id_);
    }
  }

  // Tokens joined, byte tokens as their bytes, "▁" as a space, one leading space stripped (the
  // library's Replace, ByteFallback, Fuse and Strip decoders; bytes that are not UTF-8 are kept).
  std::string decode(const std::vector<int32_t>& ids) const override {
    std::string out;
    for (int32_t id : ids) {
      if (id < 0 || id >= static_cast<int32_t>(tokens_.size())) continue;
      const auto b = byte_of_.find(id);
      if (b != byte_of_.end()) {
        out.push_back(static_cast<char>(b->second));
      } else {
        out += replace_all(tokens_[id], "\xE2\x96\x81", " ");
      }
    }
    if (!out.empty() && out[0] == ' ') out.erase(0, 1);
    return out;
  }

 private:
  std::string origin_;
  std::vector<TextEdit> normalizer_;
  bool fuse_unk_;
  int32_t unk_id_ = -1;
  std::unordered_map<std::string, int> ranks_;
  int32_t byte_ids_[256];
  std::unordered_map<int32_t, unsigned char> byte_of_;
};

}  // namespace

std::string apply_edits(std::string_view text, const std::vector<TextEdit>& edits,
                        const std::string& origin) {
  const size_t bound = kNormalizerGrowth * text.size() + kNormalizerSlack;
  std::string s(text);
  for (size_t i = 0; i < edits.size(); ++i) {
    const TextEdit& e = edits[i];
    const size_t made =
        e.prepend ? (s.empty() ? 0 : s.size() + e.to.size()) : replaced_size(s, e.from, e.to);
    BRISK_CHECK(made <= bound, "'", origin, "': normalizer ", i + 1, " (",
                e.prepend ? "Prepend" : "Replace", " \"", excerpt(e.prepend ? e.to : e.from, 20),
                "\") would make ", made, " bytes of a text of ", text.size(), ", more than the ",
                kNormalizerGrowth, " x + ", kNormalizerSlack, " bytes normalizers may make");
    if (e.prepend) {
      if (!s.empty()) s.insert(0, e.to);  // Prepend leaves an empty text empty
    } else {
      s = replace_all(s, e.from, e.to);
    }
  }
  return s;
}

std::unique_ptr<TokenModel> make_fallback_bpe(
    std::unordered_map<std::string, int32_t> vocab,
    const std::vector<std::pair<std::string, std::string>>& merges,
    std::vector<TextEdit> normalizer, const std::string& unk, bool fuse_unk,
    const std::string& origin) {
  return std::make_unique<FallbackBpe>(std::move(vocab), merges, std::move(normalizer), unk,
                                       fuse_unk, origin);
}

}  // namespace brisk
