// Byte-level BPE (GPT-2, Llama-3): the pre-tokenizer's regex (PCRE2 with Unicode properties and
// the lookahead GPT-2 needs), every byte of a piece mapped to a printable character, then the
// merges applied lowest rank first. Pieces are cached: real text repeats its words.
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <algorithm>
#include <climits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/error.h"
#include "tokenizer/merges.h"
#include "tokenizer/tokenizer.h"

namespace brisk {

namespace {

// GPT-2's pattern: contractions, letters, numbers, other symbols (each optionally after one
// space), then whitespace not followed by a non-space, then any whitespace.
constexpr const char* kGpt2Pattern =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

}  // namespace

// GPT-2's pattern applied between digits, as one regex: a digit alone (no space before it; the
// space before a number is whitespace of the stretch before it), and whitespace may end where a
// digit follows, as it ends at the end of a stretch.
const char* const kGpt2IndividualDigitsPattern =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+|\\s+(?![^\\s\\p{N}])|\\s+";

namespace {

// bytes_to_unicode: printable bytes stand for themselves, the others for code points from 256 up.
std::vector<std::string> byte_symbols() {
  std::vector<int> cp(256, -1);
  for (int b = '!'; b <= '~'; ++b) cp[b] = b;
  for (int b = 0xA1; b <= 0xAC; ++b) cp[b] = b;
  for (int b = 0xAE; b <= 0xFF; ++b) cp[b] = b;
  int next = 256;
  std::vector<std::string> out(256);
  for (int b = 0; b < 256; ++b) {
    const int c = cp[b] >= 0 ? cp[b] : next++;
    std::string s;
    if (c < 0x80) {
      s.push_back(static_cast<char>(c));
    } else {  // two-byte UTF-8: every symbol is below 0x800
      s.push_back(static_cast<char>(0xC0 | (c >> 6)));
      s.push_back(static_cast<char>(0x80 | (c & 0x3F)));
    }
    out[b] = s;
  }
  return out;
}

// Bounds on one pcre2_match call of a pattern from a file, which may backtrack without end on some
// text: its steps (the JIT's too), the interpreter's backtracking depth and its heap in KiB.
constexpr uint32_t kRegexMatchLimit = 10'000'000;
constexpr uint32_t kRegexDepthLimit = 100'000;
constexpr uint32_t kRegexHeapLimitKiB = 64 * 1024;
// One text's budget (PCRE2's limits bound one call, and a text makes a call per match): each
// call first runs under kRegexFirstTry steps (the published patterns take tens), then under
// twice as many until it ends or reaches kRegexMatchLimit; the steps of the tries that ran out
// are charged to the text, which may spend twice kRegexMatchLimit (one match's way to the
// limit) and kRegexStepsPerByte per byte.
constexpr uint32_t kRegexFirstTry = 1024;
constexpr uint64_t kRegexStepsPerByte = 64;

// The limit a failed match ran into, or PCRE2's own words for another failure.
std::string match_failure(int rc) {
  switch (rc) {
    case PCRE2_ERROR_MATCHLIMIT:
      return "ran past PCRE2's match limit of " + std::to_string(kRegexMatchLimit) + " steps";
    case PCRE2_ERROR_DEPTHLIMIT:
      return "ran past PCRE2's depth limit of " + std::to_string(kRegexDepthLimit);
    case PCRE2_ERROR_HEAPLIMIT:
      return "ran past PCRE2's heap limit of " + std::to_string(kRegexHeapLimitKiB) + " KiB";
    case PCRE2_ERROR_JIT_STACKLIMIT:
      return "ran past the PCRE2 JIT's stack";
    default: {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(rc, message, sizeof message);
      return std::string("failed: ") + reinterpret_cast<const char*>(message);
    }
  }
}

class Regex {
 public:
  Regex(const std::string& pattern, const std::string& origin)
      : pattern_(pattern), origin_(origin) {
    int err = 0;
    PCRE2_SIZE offset = 0;
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                          PCRE2_UTF | PCRE2_UCP, &err, &offset, nullptr);
    if (code_ == nullptr) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(err, message, sizeof message);
      BRISK_FAIL("cannot compile the pre-tokenizer pattern \"", excerpt(pattern), "\" at ", offset,
                 ": ", reinterpret_cast<const char*>(message));
    }
    pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE);  // optional: falls back to the interpreter
    context_ = pcre2_match_context_create(nullptr);
    pcre2_set_match_limit(context_, kRegexMatchLimit);
    pcre2_set_depth_limit(context_, kRegexDepthLimit);
    pcre2_set_heap_limit(context_, kRegexHeapLimitKiB);
  }
  ~Regex() {
    pcre2_match_context_free(context_);
    pcre2_code_free(code_);
  }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Calls f(begin, end) for each match and each stretch between matches, in order (the
  // tokenizers library's Split with the Isolated behaviour). A match that runs into a limit ends
  // the encoding with an error naming the pattern (the callers' parallel loops carry it out).
  template <typename F>
  void for_each(std::string_view text, F&& f) const {
    const std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> md(
        pcre2_match_data_create_from_pattern(code_, nullptr), &pcre2_match_data_free);
    BRISK_CHECK(md != nullptr, "out of memory for a pre-tokenizer match");
    // This text's own limits (the context is shared by the threads encoding other texts).
    const std::unique_ptr<pcre2_match_context, decltype(&pcre2_match_context_free)> context(
        pcre2_match_context_copy(context_), &pcre2_match_context_free);
    BRISK_CHECK(context != nullptr, "out of memory for a pre-tokenizer match");
    const uint64_t budget = 2 * uint64_t{kRegexMatchLimit} + kRegexStepsPerByte * text.size();
    uint64_t spent = 0;
    PCRE2_SIZE at = 0, emitted = 0;
    while (at < text.size()) {
      const int rc = match_within(text, at, budget, spent, md.get(), context.get());
      if (rc == PCRE2_ERROR_NOMATCH) break;
      BRISK_CHECK(rc >= 0, "'", origin_, "': the pre-tokenizer pattern \"", excerpt(pattern_),
                  "\" ", match_failure(rc), " on a text of ", text.size(), " bytes");
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
      if (ov[1] == ov[0]) {  // an empty match splits nothing: move on one character
        at = ov[0] + 1;
        while (at < text.size() && (static_cast<unsigned char>(text[at]) & 0xC0) == 0x80) ++at;
        continue;
      }
      if (ov[0] > emitted) f(emitted, ov[0]);
      f(ov[0], ov[1]);
      at = emitted = ov[1];
    }
    if (emitted < text.size()) f(emitted, text.size());
  }

 private:
  // One pcre2_match from `at`, under the first try's steps, then twice as many at a time; the
  // tries that run out are charged to `spent`, refused past `budget`.
  int match_within(std::string_view text, PCRE2_SIZE at, uint64_t budget, uint64_t& spent,
                   pcre2_match_data* md, pcre2_match_context* context) const {
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    // The text is valid UTF-8 (see ByteLevelBpe::encode) and matches start at character bounds.
    for (uint32_t limit = kRegexFirstTry;; limit = std::min(2 * limit, kRegexMatchLimit)) {
      pcre2_set_match_limit(context, limit);
      const int rc = pcre2_match(code_, subject, text.size(), at, PCRE2_NO_UTF_CHECK, md, context);
      if (rc != PCRE2_ERROR_MATCHLIMIT || limit == kRegexMatchLimit) return rc;
      spent += limit;
      BRISK_CHECK(spent <= budget, "'", origin_, "': the pre-tokenizer pattern \"",
                  excerpt(pattern_), "\" ran past its budget of ", budget, " steps for a text of ",
                  text.size(),
                  " bytes (PCRE2's match limit bounds one match, this budget every "
                  "match of one text)");
    }
  }

  std::string pattern_, origin_;
  pcre2_code* code_ = nullptr;
  pcre2_match_context* context_ = nullptr;
};

class ByteLevelBpe final : public TokenModel {
 public:
  ByteLevelBpe(std::unordered_map<std::string, int32_t> vocab,
               const std::vector<std::pair<std::string, std::string>>& merges,
               const std::string& origin, const std::string& pattern, bool ignore_merges)
      : TokenModel(std::move(vocab)),
        regex_(pattern.empty() ? std::string(kGpt2Pattern) : pattern, origin),
        ignore_merges_(ignore_merges),
        symbols_(byte_symbols()) {
    for (size_t i = 0; i < merges.size(); ++i) {
      const auto& [a, b] = merges[i];
      BRISK_CHECK(!a.empty() && !b.empty(), "'", origin, "': merge ", i + 1, " has an empty side");
      BRISK_CHECK(vocab_.count(a + b), "'", origin, "': merge ", i + 1, " (\"", excerpt(a), "\" \"",
                  excerpt(b), "\") makes a token the vocabulary lacks");
      ranks_.emplace(a + '\x01' + b, static_cast<int>(i));
    }
    for (int b = 0; b < 256; ++b) byte_of_.emplace(symbols_[b], static_cast<unsigned char>(b));
  }

  void encode(std::string_view raw, std::vector<int32_t>& out) const override {
    std::string fixed;
    const std::string_view text = valid_utf8(raw, fixed);
    regex_.for_each(text, [&](size_t begin, size_t end) {
      std::string mapped;
      for (size_t i = begin; i < end; ++i) mapped += symbols_[static_cast<unsigned char>(text[i])];
      piece(mapped, out);
    });
  }

  std::string decode(const std::vector<int32_t>& ids) const override {
    std::string out;
    for (int32_t id : ids) {
      if (id < 0 || id >= static_cast<int32_t>(tokens_.size())) continue;
      const std::string& t = tokens_[id];
      for (size_t i = 0; i < t.size();) {
        const size_t n = (static_cast<unsigned char>(t[i]) & 0x80) ? 2 : 1;
        const auto it = byte_of_.find(t.substr(i, n));
        if (it != byte_of_.end()) out.push_back(static_cast<char>(it->second));
        i += n;
      }
    }
    return out;
  }

 private:
  // One pre-tokenized piece (in byte symbols): merged lowest rank first, then looked up.
  void piece(const std::string& word, std::vector<int32_t>& out) const {
    {
      std::lock_guard<std::mutex> lock(cache_mu_);
      const auto it = cache_.find(word);
      if (it != cache_.end()) {
        out.insert(out.end(), it->second.begin(), it->second.end());
        return;
      }
    }
    if (ignore_merges_) {
      const auto whole = vocab_.find(word);
      if (whole != vocab_.end()) {
        out.push_back(whole->second);
        return;
      }
    }
    std::vector<std::string> parts;
    for (size_t i = 0; i < word.size();) {
      const size_t n = (static_cast<unsigned char>(word[i]) & 0x80) ? 2 : 1;
      parts.push_back(word.substr(i, n));
      i += n;
    }
    merge_pieces(parts, ranks_);
    std::vector<int32_t> ids;
    ids.reserve(parts.size());
    for (const std::string& p : parts) {
      // A symbol the vocabulary lacks is left out, as the library does without an unknown token.
      const auto it = vocab_.find(p);
      if (it != vocab_.end()) ids.push_back(it->second);
    }
    out.insert(out.end(), ids.begin(), ids.end());
    if (word.size() > kMaxCachedPiece) return;
    std::lock_guard<std::mutex> lock(cache_mu_);
    if (cache_.size() < kMaxCache) cache_.emplace(word, std::move(ids));
  }

  // Bounded, as memory outside the plan: pieces, and the bytes of one (long ones do not repeat).
  static constexpr size_t kMaxCache = 1 << 18;
  static constexpr size_t kMaxCachedPiece = 256;
  std::unordered_map<std::string, int> ranks_;
  Regex regex_;
  bool ignore_merges_;
  std::vector<std::string> symbols_;
  std::unordered_map<std::string, unsigned char> byte_of_;
  mutable std::mutex cache_mu_;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;
};

}  // namespace

std::string_view valid_utf8(std::string_view text, std::string& fixed) {
  const auto* p = reinterpret_cast<const utf8proc_uint8_t*>(text.data());
  size_t at = 0;
  bool copying = false;
  while (at < text.size()) {
    utf8proc_int32_t c = 0;
    const utf8proc_ssize_t n =
        utf8proc_iterate(p + at, static_cast<utf8proc_ssize_t>(text.size() - at), &c);
    if (n > 0) {
      if (copying) fixed.append(text.substr(at, static_cast<size_t>(n)));
      at += static_cast<size_t>(n);
      continue;
    }
    if (!copying) fixed.assign(text.substr(0, at));
    copying = true;
    fixed += "\xEF\xBF\xBD";
    ++at;
  }
  return copying ? std::string_view(fixed) : text;
}

std::unique_ptr<TokenModel> make_byte_level_bpe(
    std::unordered_map<std::string, int32_t> vocab,
    const std::vector<std::pair<std::string, std::string>>& merges, const std::string& origin,
    const std::string& pattern, bool ignore_merges) {
  return std::make_unique<ByteLevelBpe>(std::move(vocab), merges, origin, pattern, ignore_merges);
}

}  // namespace brisk
