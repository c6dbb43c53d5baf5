// BERT's tokenization: the BertNormalizer (clean text, spaces around CJK characters, accents
// stripped through NFD, lowercase), the BertPreTokenizer (whitespace and punctuation) and the
// WordPiece model (greedy longest match, "##" continuations, [UNK] for what does not split).
// Unicode properties and decomposition come from utf8proc.
#include <utf8proc.h>

#include <algorithm>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace brisk {

bool is_unicode_whitespace(int32_t c) {
  if (c == ' ' || c == '\t' || c == '\n' || c == '\r') return true;
  const auto cat = utf8proc_category(c);
  // Rust's char::is_whitespace: the White_Space property (Zs, Zl, Zp and a few controls).
  return cat == UTF8PROC_CATEGORY_ZS || cat == UTF8PROC_CATEGORY_ZL ||
         cat == UTF8PROC_CATEGORY_ZP || c == 0x0b || c == 0x0c || c == 0x85;
}

namespace {

bool is_whitespace(int32_t c) {
  return is_unicode_whitespace(c);
}

bool is_control(int32_t c) {
  if (c == '\t' || c == '\n' || c == '\r') return false;
  const auto cat = utf8proc_category(c);
  return cat == UTF8PROC_CATEGORY_CC || cat == UTF8PROC_CATEGORY_CF ||
         cat == UTF8PROC_CATEGORY_CS || cat == UTF8PROC_CATEGORY_CO || cat == UTF8PROC_CATEGORY_CN;
}

bool is_punctuation(int32_t c) {
  if ((c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) ||
      (c >= 123 && c <= 126))
    return true;  // every ASCII symbol counts, as in BERT
  const auto cat = utf8proc_category(c);
  return cat >= UTF8PROC_CATEGORY_PC && cat <= UTF8PROC_CATEGORY_PO;
}

bool is_cjk(int32_t c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) ||
         (c >= 0x20000 && c <= 0x2A6DF) || (c >= 0x2A700 && c <= 0x2B73F) ||
         (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B820 && c <= 0x2CEAF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

std::vector<int32_t> code_points(std::string_view s) {
  std::vector<int32_t> out;
  out.reserve(s.size());
  const auto* p = reinterpret_cast<const utf8proc_uint8_t*>(s.data());
  utf8proc_ssize_t left = static_cast<utf8proc_ssize_t>(s.size());
  while (left > 0) {
    utf8proc_int32_t c = 0;
    utf8proc_ssize_t n = utf8proc_iterate(p, left, &c);
    if (n <= 0) {  // invalid UTF-8: one replacement character per byte, as a lossy decode
      c = 0xFFFD;
      n = 1;
    }
    out.push_back(c);
    p += n;
    left -= n;
  }
  return out;
}

void append_utf8(std::string& out, int32_t c) {
  utf8proc_uint8_t buf[4];
  const auto n = utf8proc_encode_char(c, buf);
  out.append(reinterpret_cast<const char*>(buf), static_cast<size_t>(n));
}

class WordPiece final : public TokenModel {
 public:
  WordPiece(std::unordered_map<std::string, int32_t> vocab, const std::string& unk,
            int64_t max_chars, bool lowercase, bool strip_accents, bool chinese_chars,
            bool clean_text)
      : TokenModel(std::move(vocab)),
        max_chars_(max_chars),
        lowercase_(lowercase),
        strip_accents_(strip_accents),
        chinese_chars_(chinese_chars),
        clean_text_(clean_text) {
    for (const auto& [token, id] : vocab_) longest_ = std::max(longest_, token.size());
    const auto it = vocab_.find(unk);
    BRISK_CHECK(it != vocab_.end(), "the WordPiece vocabulary lacks its unknown token \"",
                excerpt(unk), "\"");
    unk_ = it->second;
  }

  void encode(std::string_view text, std::vector<int32_t>& out) const override {
    // Normalize into code points.
    std::vector<int32_t> cps;
    for (int32_t c : code_points(text)) {
      if (clean_text_) {
        if (c == 0 || c == 0xFFFD || is_control(c)) continue;
        if (is_whitespace(c)) c = ' ';
      }
      if (chinese_chars_ && is_cjk(c)) {
        cps.push_back(' ');
        cps.push_back(c);
        cps.push_back(' ');
        continue;
      }
      cps.push_back(c);
    }
    if (strip_accents_) {
      std::vector<int32_t> kept;
      for (int32_t c : cps) {
        utf8proc_int32_t parts[8];
        int last = 0;
        const auto n = utf8proc_decompose_char(c, parts, 8, UTF8PROC_DECOMPOSE, &last);
        if (n <= 0 || n > 8) {
          kept.push_back(c);
          continue;
        }
        for (utf8proc_ssize_t i = 0; i < n; ++i)
          if (utf8proc_category(parts[i]) != UTF8PROC_CATEGORY_MN) kept.push_back(parts[i]);
      }
      cps.swap(kept);
    }
    if (lowercase_)
      for (int32_t& c : cps) c = utf8proc_tolower(c);
    // Pre-tokenize: whitespace separates, each punctuation character is a word of its own.
    std::string word;
    int64_t chars = 0;
    auto flush = [&] {
      if (!word.empty()) split_word(word, chars, out);
      word.clear();
      chars = 0;
    };
    for (int32_t c : cps) {
      if (is_whitespace(c)) {
        flush();
      } else if (is_punctuation(c)) {
        flush();
        append_utf8(word, c);
        chars = 1;
        flush();
      } else {
        append_utf8(word, c);
        ++chars;
      }
    }
    flush();
  }

  std::string decode(const std::vector<int32_t>& ids) const override {
    std::string out;
    for (int32_t id : ids) {
      if (id < 0 || id >= static_cast<int32_t>(tokens_.size())) continue;
      const std::string& t = tokens_[id];
      if (t.rfind("##", 0) == 0) {
        out += t.substr(2);
      } else {
        if (!out.empty()) out += ' ';
        out += t;
      }
    }
    return out;
  }

 private:
  // Greedy longest-match-first; a word that does not split entirely becomes [UNK].
  void split_word(const std::string& word, int64_t chars, std::vector<int32_t>& out) const {
    if (chars > max_chars_) {
      out.push_back(unk_);
      return;
    }
    const size_t mark = out.size();
    size_t start = 0;
    std::string piece;
    while (start < word.size()) {
      // No candidate longer than the longest token can match: a long word costs its length
      // times the longest token's, not its length squared.
      size_t end = start + std::min(word.size() - start, longest_);
      while (end < word.size() && (static_cast<unsigned char>(word[end]) & 0xC0) == 0x80) --end;
      int32_t found = -1;
      while (end > start) {
        piece.assign(start > 0 ? "##" : "");
        piece.append(word, start, end - start);
        const auto it = vocab_.find(piece);
        if (it != vocab_.end()) {
          found = it->second;
          break;
        }
        // Back off one whole UTF-8 character.
        do --end;
        while (end > start && (static_cast<unsigned char>(word[end]) & 0xC0) == 0x80);
      }
      if (found < 0) {
        out.resize(mark);
        out.push_back(unk_);
        return;
      }
      out.push_back(found);
      start = end;
    }
  }

  int32_t unk_ = 0;
  size_t longest_ = 0;  // bytes of the longest token
  int64_t max_chars_;
  bool lowercase_, strip_accents_, chinese_chars_, clean_text_;
};

}  // namespace

std::unique_ptr<TokenModel> make_wordpiece(std::unordered_map<std::string, int32_t> vocab,
                                           const std::string& unk, int64_t max_chars,
                                           bool lowercase, bool strip_accents, bool chinese_chars,
                                           bool clean_text) {
  return std::make_unique<WordPiece>(std::move(vocab), unk, max_chars, lowercase, strip_accents,
                                     chinese_chars, clean_text);
}

}  // namespace brisk
