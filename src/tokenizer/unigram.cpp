// The Unigram model of tokenizer.json (T5, ALBERT and SentencePiece models converted by
// transformers): the best-scoring split of each piece by Viterbi over the pieces' log
// probabilities, consecutive unknown characters fused into one <unk>, or spelled as <0xNN> byte
// tokens with byte_fallback. With the Metaspace pre-tokenizer (spaces as "▁", one in front,
// pieces split before each "▁") and decoder, as the tokenizers library does.
#include <utf8proc.h>

#include <cstdio>
#include <limits>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace brisk {

namespace {

// The library's penalty below the lowest piece score for an unknown character.
constexpr double kUnknownPenalty = 10.0;

size_t utf8_length(unsigned char lead) {
  if (lead < 0x80) return 1;
  if ((lead & 0xE0) == 0xC0) return 2;
  if ((lead & 0xF0) == 0xE0) return 3;
  if ((lead & 0xF8) == 0xF0) return 4;
  return 1;
}

// A byte trie over the pieces: from a position, every piece the text starts with, shortest first.
class PieceTrie {
 public:
  void insert(std::string_view piece, int32_t id) {
    int32_t node = 0;
    for (unsigned char b : piece) {
      const uint64_t key = (static_cast<uint64_t>(node) << 8) | b;
      const auto it = children_.find(key);
      if (it != children_.end()) {
        node = it->second;
      } else {
        ids_.push_back(-1);
        node = static_cast<int32_t>(ids_.size() - 1);
        children_.emplace(key, node);
      }
    }
    ids_[static_cast<size_t>(node)] = id;
  }

  // Calls f(length, id) for each piece that `text` starts with, shortest first.
  template <typename F>
  void prefixes(std::string_view text, F&& f) const {
    int32_t node = 0;
    for (size_t i = 0; i < text.size(); ++i) {
      const auto it =
          children_.find((static_cast<uint64_t>(node) << 8) | static_cast<unsigned char>(text[i]));
      if (it == children_.end()) return;
      node = it->second;
      if (ids_[static_cast<size_t>(node)] >= 0) f(i + 1, ids_[static_cast<size_t>(node)]);
    }
  }

 private:
  std::vector<int32_t> ids_ = {-1};  // per node: the piece ending there, else -1; node 0 the root
  std::unordered_map<uint64_t, int32_t> children_;  // (node << 8 | byte) -> child
};

std::unordered_map<std::string, int32_t> ids_of(
    const std::vector<std::pair<std::string, double>>& pieces) {
  std::unordered_map<std::string, int32_t> vocab;
  for (size_t i = 0; i < pieces.size(); ++i)
    vocab[pieces[i].first] =
        static_cast<int32_t>(i);  // a repeated piece: the last id, as the library
  return vocab;
}

class Unigram final : public TokenModel {
 public:
  Unigram(std::vector<std::pair<std::string, double>> pieces, int32_t unk_id, bool byte_fallback,
          std::vector<TextEdit> normalizer, std::optional<Metaspace> metaspace,
          MetaspaceDecoding decoding, const std::string& origin)
      : TokenModel(ids_of(pieces)),
        origin_(origin),
        unk_id_(unk_id),
        byte_fallback_(byte_fallback),
        normalizer_(std::move(normalizer)),
        metaspace_(std::move(metaspace)),
        decoding_(std::move(decoding)) {
    for (size_t i = 0; i < pieces.size(); ++i) {
      min_score_ = std::min(min_score_, pieces[i].second);
      if (!pieces[i].first.empty()) trie_.insert(pieces[i].first, static_cast<int32_t>(i));
    }
    scores_.reserve(pieces.size());
    for (const auto& p : pieces) scores_.push_back(p.second);
    for (int b = 0; b < 256; ++b) {
      char name[8];
      std::snprintf(name, sizeof name, "<0x%02X>", b);
      byte_ids_[b] = id_of(name);
      if (byte_ids_[b] >= 0) byte_of_[byte_ids_[b]] = static_cast<unsigned char>(b);
    }
  }

  void encode(std::string_view text, std::vector<int32_t>& out) const override {
    encode_stretch(text, true, out);
  }

  void encode_stretch(std::string_view text, bool at_start,
                      std::vector<int32_t>& out) const override {
    std::string repaired;
    const std::string s = apply_edits(valid_utf8(text, repaired), normalizer_, origin_);
    if (!metaspace_) {
      encode_piece(s, out);
      return;
    }
    std::vector<std::string> pieces;
    metaspace_->pieces(s, at_start, pieces);
    for (const std::string& p : pieces) encode_piece(p, out);
  }

  // Tokens joined, "▁" as spaces (none from the first token under the Metaspace decoder), byte
  // tokens as their bytes, then up to `strip_left` leading spaces removed.
  std::string decode(const std::vector<int32_t>& ids) const override {
    std::string out;
    bool first = true;
    for (int32_t id : ids) {
      if (id < 0 || id >= static_cast<int32_t>(tokens_.size())) continue;
      const auto b = byte_fallback_ ? byte_of_.find(id) : byte_of_.end();
      if (b != byte_of_.end()) {
        out.push_back(static_cast<char>(b->second));
      } else {
        const std::string& t = tokens_[static_cast<size_t>(id)];
        const std::string& r = decoding_.replacement;
        for (size_t i = 0; i < t.size();) {
          if (!r.empty() && t.compare(i, r.size(), r) == 0) {
            if (!(first && decoding_.drop_first)) out.push_back(' ');
            i += r.size();
          } else {
            out.push_back(t[i++]);
          }
        }
      }
      first = false;
    }
    size_t strip = 0;
    while (strip < out.size() && strip < decoding_.strip_left && out[strip] == ' ') ++strip;
    return out.substr(strip);
  }

 private:
  struct Node {
    double score = 0;  // of the best path ending here
    size_t from = 0;   // where its last piece starts
    int32_t id = -1;   // its last piece; -1: an unknown character with no <unk> (left out)
    bool reached = false;
  };

  // The best path over `piece` (valid UTF-8), its pieces' strings turned into ids.
  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
    if (piece.empty()) return;
    std::vector<Node> best(piece.size() + 1);
    best[0].reached = true;
    const double unk_score = min_score_ - kUnknownPenalty;
    auto offer = [&](size_t from, size_t to, int32_t id, double score) {
      Node& n = best[to];
      const double candidate = score + best[from].score;
      if (!n.reached || candidate > n.score) n = {candidate, from, id, true};
    };
    for (size_t at = 0; at < piece.size();) {
      const size_t char_len =
          std::min(utf8_length(static_cast<unsigned char>(piece[at])), piece.size() - at);
      bool single = false;
      trie_.prefixes(piece.substr(at), [&](size_t len, int32_t id) {
        offer(at, at + len, id, scores_[static_cast<size_t>(id)]);
        single = single || len == char_len;
      });
      if (!single) offer(at, at + char_len, unk_id_, unk_score);
      at += char_len;
    }
    // Back from the end: the strings of the path, unknown characters fused (reversed order).
    std::vector<std::pair<std::string_view, bool>> path;  // (text, unknown)
    for (size_t end = piece.size(); end > 0;) {
      const Node& n = best[end];
      const bool unknown = n.id < 0 || n.id == unk_id_;
      const std::string_view text = piece.substr(n.from, end - n.from);
      if (unknown && !path.empty() && path.back().second)
        path.back().first = piece.substr(n.from, path.back().first.size() + text.size());
      else
        path.emplace_back(text, unknown);
      end = n.from;
    }
    for (auto it = path.rbegin(); it != path.rend(); ++it) emit(it->first, out);
  }

  // A piece's id; a string missing from the vocabulary (fused unknowns) as its byte tokens with
  // byte_fallback, else <unk>, else nothing.
  void emit(std::string_view text, std::vector<int32_t>& out) const {
    const auto it = vocab_.find(std::string(text));
    if (it != vocab_.end()) {
      out.push_back(it->second);
      return;
    }
    bool all_bytes = byte_fallback_;
    for (char c : text) all_bytes = all_bytes && byte_ids_[static_cast<unsigned char>(c)] >= 0;
    if (all_bytes) {
      for (char c : text) out.push_back(byte_ids_[static_cast<unsigned char>(c)]);
    } else if (unk_id_ >= 0) {
      out.push_back(unk_id_);
    }
  }

  std::string origin_;
  int32_t unk_id_;
  bool byte_fallback_;
  std::vector<TextEdit> normalizer_;
  std::optional<Metaspace> metaspace_;
  MetaspaceDecoding decoding_;
  double min_score_ = std::numeric_limits<double>::infinity();
  std::vector<double> scores_;
  PieceTrie trie_;
  int32_t byte_ids_[256];
  std::unordered_map<int32_t, unsigned char> byte_of_;
};

}  // namespace

void Metaspace::pieces(std::string_view text, bool at_start, std::vector<std::string>& out) const {
  if (whitespace_split) {  // words between whitespace first, each then as below
    std::vector<std::pair<size_t, size_t>> words;
    for_each_word(text, words);
    for (const auto& [begin, end] : words)
      piece_of_word(text.substr(begin, end - begin), at_start && begin == 0, out);
    return;
  }
  piece_of_word(text, at_start, out);
}

void Metaspace::for_each_word(std::string_view text,
                              std::vector<std::pair<size_t, size_t>>& words) {
  size_t begin = std::string_view::npos;
  for (size_t at = 0; at < text.size();) {
    utf8proc_int32_t c = 0;
    utf8proc_ssize_t n =
        utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(text.data() + at),
                         static_cast<utf8proc_ssize_t>(text.size() - at), &c);
    if (n <= 0) n = 1;  // not reached: the text was made valid UTF-8
    if (is_unicode_whitespace(c)) {
      if (begin != std::string_view::npos) words.emplace_back(begin, at);
      begin = std::string_view::npos;
    } else if (begin == std::string_view::npos) {
      begin = at;
    }
    at += static_cast<size_t>(n);
  }
  if (begin != std::string_view::npos) words.emplace_back(begin, text.size());
}

void Metaspace::piece_of_word(std::string_view text, bool at_start,
                              std::vector<std::string>& out) const {
  std::string s;
  s.reserve(text.size() + replacement.size());
  for (char c : text) {
    if (c == ' ')
      s += replacement;
    else
      s.push_back(c);
  }
  const bool prepend = prepend_scheme == PrependScheme::kAlways ||
                       (prepend_scheme == PrependScheme::kFirst && at_start);
  if (prepend && !s.empty() && s.compare(0, replacement.size(), replacement) != 0)
    s.insert(0, replacement);
  if (!split || replacement.empty()) {
    if (!s.empty()) out.push_back(std::move(s));
    return;
  }
  // Cut before every replacement: each begins the piece that follows it.
  size_t begin = 0;
  for (size_t at = s.find(replacement, 1); at != std::string::npos;
       at = s.find(replacement, at + replacement.size())) {
    out.push_back(s.substr(begin, at - begin));
    begin = at;
  }
  if (begin < s.size()) out.push_back(s.substr(begin));
}

std::unique_ptr<TokenModel> make_unigram(std::vector<std::pair<std::string, double>> pieces,
                                         int32_t unk_id, bool byte_fallback,
                                         std::vector<TextEdit> normalizer,
                                         std::optional<Metaspace> metaspace,
                                         MetaspaceDecoding decoding, const std::string& origin) {
  return std::make_unique<Unigram>(std::move(pieces), unk_id, byte_fallback, std::move(normalizer),
                                   std::move(metaspace), std::move(decoding), origin);
}

}  // namespace brisk
