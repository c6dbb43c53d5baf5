// Tokenizers loaded from a model folder or file as transformers finds them: tokenizer.json
// (WordPiece with BERT's normalizer and pre-tokenizer, byte-level BPE as GPT-2 and Llama-3 split
// text, or BPE with byte fallback as Llama-2), else a SentencePiece tokenizer.model (through
// libsentencepiece, with LlamaTokenizer's <s> in front), else the legacy vocab.txt (BERT) or
// vocab.json + merges.txt (GPT-2). Special tokens in the text are matched first, as the tokenizers
// library's added vocabulary does; the post-processor's template adds the model's special tokens
// with their token types ([CLS] A [SEP] B [SEP] for BERT, nothing for GPT-2); pairs are truncated
// longest-first.
#pragma once

#include <array>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "data/text_dataset.h"

namespace brisk {

// The model part: pre-tokenized words to ids, over a vocabulary of token -> id.
class TokenModel {
 public:
  explicit TokenModel(std::unordered_map<std::string, int32_t> vocab);
  virtual ~TokenModel() = default;
  // Appends the ids of one added-token-free stretch of text (normalized, pre-tokenized, split).
  virtual void encode(std::string_view text, std::vector<int32_t>& out) const = 0;
  // The same, told whether the stretch begins the text (Metaspace's prepend_scheme "first").
  virtual void encode_stretch(std::string_view text, bool at_start,
                              std::vector<int32_t>& out) const {
    (void)at_start;
    encode(text, out);
  }
  // The text of ids (byte-level BPE decodes exactly; WordPiece joins words).
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
  int64_t vocab_size() const { return static_cast<int64_t>(tokens_.size()); }
  int32_t id_of(const std::string& token) const;  // -1 when absent
  const std::string& token_of(int32_t id) const { return tokens_.at(static_cast<size_t>(id)); }

 protected:
  std::unordered_map<std::string, int32_t> vocab_;
  std::vector<std::string> tokens_;  // id -> token
};

struct AddedToken {
  std::string content;
  int32_t id = 0;
  bool special = false;
};

class Tokenizer final : public TextEncoder {
 public:
  // A folder (tokenizer.json, tokenizer.model, vocab.txt, or vocab.json + merges.txt) or one of
  // those files.
  static std::unique_ptr<Tokenizer> load(const std::string& path);
  // Whether `folder` is a folder holding a file load() reads a tokenizer from.
  static bool in_folder(const std::string& folder);

  // The ids of `text` without special tokens added (added tokens in the text are still matched).
  std::vector<int32_t> tokenize(std::string_view text) const;
  Encoded encode(std::string_view text, std::optional<std::string_view> pair,
                 int64_t max_length) const override;
  // With add_special_tokens false: the ids only (truncated to max_length when > 0).
  Encoded encode_plain(std::string_view text, int64_t max_length) const;
  // The text of ids; special tokens left out by default, as transformers' decode does.
  std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens = true) const;
  int32_t pad_id() const override { return pad_id_; }
  int64_t vocab_size() const;
  // The special tokens the single-sequence template puts before and after the text ([CLS] and
  // [SEP] for BERT: 1 and 1): what run_mlm's special_tokens_mask marks.
  std::pair<int64_t, int64_t> single_specials() const;
  // The id of a token, an added one or the model's; -1 when absent.
  int32_t token_id(const std::string& token) const;
  // tokenizer_config.json's eos_token (a token's text, or an object with its "content"), -1 when
  // it names none the tokenizer has.
  int32_t eos_id() const { return eos_id_; }
  const std::string& origin() const { return origin_; }

 private:
  friend struct TokenizerLoader;
  std::string origin_;
  std::unique_ptr<TokenModel> model_;
  std::vector<AddedToken> added_;        // matched in the raw text, longest first
  std::array<bool, 256> first_bytes_{};  // bytes an added token starts with
  // The added tokens as a trie of their bytes: node n's child by byte b is
  // added_edges_[n << 8 | b]; added_at_[n] the added token ending there (-1: none). One walk
  // from a position finds its longest added token, in at most the longest token's length.
  std::unordered_map<uint64_t, int32_t> added_edges_;
  std::vector<int32_t> added_at_;
  void index_added_tokens();
  const AddedToken* longest_added(std::string_view text, size_t at) const;
  // The post-processor's template: special ids or a sequence (A or B), each with a token type.
  struct TemplatePiece {
    int sequence = -1;  // 0: A, 1: B, -1: the special ids
    std::vector<int32_t> ids;
    int32_t type_id = 0;
  };
  std::vector<TemplatePiece> single_ = {{0, {}, 0}}, pair_ = {{0, {}, 0}, {1, {}, 1}};
  int32_t pad_id_ = 0;
  int32_t eos_id_ = -1;
};

// Word-level pieces other loaders build on.
std::unique_ptr<TokenModel> make_wordpiece(std::unordered_map<std::string, int32_t> vocab,
                                           const std::string& unk, int64_t max_chars,
                                           bool lowercase, bool strip_accents, bool chinese_chars,
                                           bool clean_text);
// `pattern`: the pre-tokenizer's regex (empty: GPT-2's), its matches and the text between them
// being the pieces; `ignore_merges`: a piece in the vocabulary is one token (Llama-3).
// The pattern of Digits(individual_digits) followed by GPT-2's ByteLevel (SmolLM2, StarCoder):
// every digit its own piece, GPT-2's pattern within the text between digits.
extern const char* const kGpt2IndividualDigitsPattern;
std::unique_ptr<TokenModel> make_byte_level_bpe(
    std::unordered_map<std::string, int32_t> vocab,
    const std::vector<std::pair<std::string, std::string>>& merges, const std::string& origin,
    const std::string& pattern = {}, bool ignore_merges = false);

// `text` itself when it is valid UTF-8; else a copy in `fixed` with U+FFFD for each byte that is
// not (as WordPiece reads such text): PCRE2 must only see valid UTF-8, and bad bytes never make
// encoding fail.
std::string_view valid_utf8(std::string_view text, std::string& fixed);

// One normalizer step of the byte-fallback BPE and Unigram: Replace(from, to), or Prepend(to)
// when `prepend`.
struct TextEdit {
  bool prepend = false;
  std::string from, to;
};
// The most bytes a normalizer chain may make of a text of n bytes: kNormalizerGrowth * n +
// kNormalizerSlack (Llama-2's makes 3 n + 3).
constexpr size_t kNormalizerGrowth = 8, kNormalizerSlack = 4096;
// `text` through the edits in order (Prepend leaves an empty text empty), in time linear in the
// bytes made; a step that would make more than the bound above is refused naming it and `origin`.
std::string apply_edits(std::string_view text, const std::vector<TextEdit>& edits,
                        const std::string& origin);

// Rust's char::is_whitespace (the White_Space property), as the tokenizers library splits.
bool is_unicode_whitespace(int32_t c);

// The Metaspace pre-tokenizer: spaces become `replacement`, one is put in front (always, only in
// front of the text's first stretch, or never; not when one is there already), and with `split`
// the text is cut before each replacement. `whitespace_split`: a WhitespaceSplit comes first
// (Sequence [WhitespaceSplit, Metaspace]), its words each treated so.
struct Metaspace {
  enum class PrependScheme { kAlways, kFirst, kNever };
  std::string replacement = "\xE2\x96\x81";
  PrependScheme prepend_scheme = PrependScheme::kAlways;
  bool split = true;
  bool whitespace_split = false;
  // Appends the pieces of one stretch; `at_start`: it begins the text.
  void pieces(std::string_view text, bool at_start, std::vector<std::string>& out) const;

 private:
  static void for_each_word(std::string_view text, std::vector<std::pair<size_t, size_t>>& words);
  void piece_of_word(std::string_view text, bool at_start, std::vector<std::string>& out) const;
};
// The decoder of Metaspace-style tokenizers: `replacement` read as a space, none of the first
// token's when `drop_first` (the Metaspace decoder), then up to `strip_left` leading spaces
// removed (a Strip decoder).
struct MetaspaceDecoding {
  std::string replacement = "\xE2\x96\x81";
  bool drop_first = false;
  size_t strip_left = 0;
};
// Unigram over (piece, score) with id = index; `unk_id` -1: none (unknown characters left out).
std::unique_ptr<TokenModel> make_unigram(std::vector<std::pair<std::string, double>> pieces,
                                         int32_t unk_id, bool byte_fallback,
                                         std::vector<TextEdit> normalizer,
                                         std::optional<Metaspace> metaspace,
                                         MetaspaceDecoding decoding, const std::string& origin);
// BPE over characters with <0xNN> byte tokens for characters the vocabulary lacks (Llama-2);
// `unk` empty: none.
std::unique_ptr<TokenModel> make_fallback_bpe(
    std::unordered_map<std::string, int32_t> vocab,
    const std::vector<std::pair<std::string, std::string>>& merges,
    std::vector<TextEdit> normalizer, const std::string& unk, bool fuse_unk,
    const std::string& origin);

// The special pieces of a SentencePiece model: indexes of make_sentencepiece's ids (-1: none).
enum class SentencePieceSpecial { kUnknown, kBegin, kEnd, kPad };
// A tokenizer.model's bytes through libsentencepiece; `special_ids` receives the special pieces.
std::unique_ptr<TokenModel> make_sentencepiece(const std::string& serialized,
                                               const std::string& origin,
                                               std::array<int32_t, 4>& special_ids);

}  // namespace brisk
