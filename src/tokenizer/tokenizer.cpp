// Loading tokenizers from the files transformers writes, added tokens, special tokens and
// truncation (see tokenizer.h).
#include "tokenizer/tokenizer.h"

#include <utf8proc.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "core/input_file.h"
#include "core/json_file.h"

namespace brisk {

namespace fs = std::filesystem;

namespace {
constexpr size_t kMaxTokenizerFile = size_t{256} << 20;  // tokenizer.json of large vocabularies
constexpr uint64_t kNoWordLimit = uint64_t{1} << 62;     // WordPiece's word length: none

std::unordered_map<std::string, int32_t> vocab_from_json(const nlohmann::json& v,
                                                         const std::string& origin) {
  BRISK_CHECK(v.is_object(), "'", origin, "': the vocabulary must map tokens to ids");
  BRISK_CHECK(v.size() < (size_t{1} << 31), "'", origin, "': the vocabulary is too large");
  std::unordered_map<std::string, int32_t> out;
  for (const auto& [token, id] : v.items()) {
    BRISK_CHECK(id.is_number_unsigned() && id.get<uint64_t>() < (uint64_t{1} << 31), "'", origin,
                "': token \"", excerpt(token), "\" has no valid id");
    out.emplace(token, static_cast<int32_t>(id.get<uint64_t>()));
  }
  BRISK_CHECK(!out.empty(), "'", origin, "': the vocabulary is empty");
  return out;
}

std::string read_text(const std::string& path, const char* what) {
  return InputFile(path, what).read_all(kMaxTokenizerFile);
}

// merges.txt lines ("a b", after an optional "#version" line), or tokenizer.json's merges
// ("a b" strings or [a, b] lists).
std::vector<std::pair<std::string, std::string>> merges_from_lines(const std::string& text,
                                                                   const std::string& origin) {
  std::vector<std::pair<std::string, std::string>> out;
  std::istringstream in(text);
  std::string line;
  int64_t n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || (n == 1 && line.rfind("#version", 0) == 0)) continue;
    const size_t space = line.find(' ');
    BRISK_CHECK(space != std::string::npos && space > 0 && space + 1 < line.size() &&
                    line.find(' ', space + 1) == std::string::npos,
                "'", origin, "':", n, ": a merge is two symbols separated by one space");
    out.emplace_back(line.substr(0, space), line.substr(space + 1));
  }
  return out;
}

std::vector<std::pair<std::string, std::string>> merges_from_json(const nlohmann::json& m,
                                                                  const std::string& origin) {
  BRISK_CHECK(m.is_array(), "'", origin, "': the merges must be a list");
  std::string lines;
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& e : m) {
    if (e.is_string()) {
      const std::string s = e.get<std::string>();
      const size_t space = s.find(' ');
      BRISK_CHECK(space != std::string::npos && space > 0 && space + 1 < s.size(), "'", origin,
                  "': merge \"", excerpt(s), "\" is not two symbols");
      out.emplace_back(s.substr(0, space), s.substr(space + 1));
    } else {
      BRISK_CHECK(e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string(), "'",
                  origin, "': a merge must be \"a b\" or [a, b]");
      out.emplace_back(e[0].get<std::string>(), e[1].get<std::string>());
    }
  }
  return out;
}

std::string string_or(const nlohmann::json& j, const char* key, const std::string& fallback) {
  return j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : fallback;
}
bool flag_or(const nlohmann::json& j, const char* key, bool fallback) {
  return j.contains(key) && j[key].is_boolean() ? j[key].get<bool>() : fallback;
}
std::string type_of(const nlohmann::json& j) {
  return j.is_object() ? string_or(j, "type", "") : std::string();
}
}  // namespace

TokenModel::TokenModel(std::unordered_map<std::string, int32_t> vocab) : vocab_(std::move(vocab)) {
  // Ids index a table: one far beyond the vocabulary's size would make it huge.
  const size_t bound = 4 * vocab_.size() + 1024;
  for (const auto& [token, id] : vocab_) {
    BRISK_CHECK(static_cast<size_t>(id) < bound, "token \"", excerpt(token), "\" has id ", id,
                ", far beyond the vocabulary's ", vocab_.size(), " entries");
    if (id >= static_cast<int32_t>(tokens_.size())) tokens_.resize(static_cast<size_t>(id) + 1);
    tokens_[static_cast<size_t>(id)] = token;
  }
}

int32_t TokenModel::id_of(const std::string& token) const {
  const auto it = vocab_.find(token);
  return it == vocab_.end() ? -1 : it->second;
}

struct TokenizerLoader {
  static void from_tokenizer_json(Tokenizer& t, const std::string& path) {
    const std::string text = read_text(path, "tokenizer file");
    const nlohmann::json j = parse_json_bounded(text.data(), text.data() + text.size(),
                                                "tokenizer file '" + path + "'", 64);
    BRISK_CHECK(j.is_object() && j.contains("model") && j["model"].is_object(), "'", path,
                "' is not a tokenizer.json (no model)");
    const nlohmann::json& model = j["model"];
    const std::string type = type_of(model);
    const nlohmann::json norm = j.value("normalizer", nlohmann::json());
    const nlohmann::json pre = j.value("pre_tokenizer", nlohmann::json());
    if (type == "WordPiece") {
      BRISK_CHECK(norm.is_null() || type_of(norm) == "BertNormalizer", "'", path,
                  "': normalizer \"", excerpt(type_of(norm)),
                  "\" is not supported with WordPiece (BertNormalizer is)");
      BRISK_CHECK(pre.is_null() || type_of(pre) == "BertPreTokenizer", "'", path,
                  "': pre_tokenizer \"", excerpt(type_of(pre)),
                  "\" is not supported with WordPiece (BertPreTokenizer is)");
      BRISK_CHECK(string_or(model, "continuing_subword_prefix", "##") == "##", "'", path,
                  "': only the \"##\" continuing-subword prefix is supported");
      const bool lowercase = flag_or(norm, "lowercase", true);
      const bool strip = norm.contains("strip_accents") && norm["strip_accents"].is_boolean()
                             ? norm["strip_accents"].get<bool>()
                             : lowercase;  // null: follows lowercase
      // Any whole number is read as it is (one beyond 2^62 as none): the split's
      // work is bounded by the longest token, not by this.
      const nlohmann::json& limit = model.value("max_input_chars_per_word", nlohmann::json());
      const int64_t max_chars =
          limit.is_number_unsigned()
              ? static_cast<int64_t>(std::min<uint64_t>(limit.get<uint64_t>(), kNoWordLimit))
              : 100;
      t.model_ = make_wordpiece(vocab_from_json(model.value("vocab", nlohmann::json()), path),
                                string_or(model, "unk_token", "[UNK]"), max_chars, lowercase, strip,
                                flag_or(norm, "handle_chinese_chars", true),
                                flag_or(norm, "clean_text", true));
    } else if (type == "BPE" && flag_or(model, "byte_fallback", false)) {
      BRISK_CHECK(pre.is_null(), "'", path, "': pre_tokenizer \"", excerpt(type_of(pre)),
                  "\" is not supported with byte-fallback BPE (none is)");
      const nlohmann::json unk = model.value("unk_token", nlohmann::json());
      t.model_ = make_fallback_bpe(vocab_from_json(model.value("vocab", nlohmann::json()), path),
                                   merges_from_json(model.value("merges", nlohmann::json()), path),
                                   text_edits(norm, path, "byte-fallback BPE"),
                                   unk.is_string() ? unk.get<std::string>() : std::string(),
                                   flag_or(model, "fuse_unk", false), path);
    } else if (type == "BPE") {
      BRISK_CHECK(norm.is_null(), "'", path, "': normalizer \"", excerpt(type_of(norm)),
                  "\" is not supported with byte-level BPE");
      t.model_ = make_byte_level_bpe(
          vocab_from_json(model.value("vocab", nlohmann::json()), path),
          merges_from_json(model.value("merges", nlohmann::json()), path), path,
          byte_level_pattern(pre, path), flag_or(model, "ignore_merges", false));
    } else if (type == "Unigram") {
      t.model_ = unigram(model, norm, pre, j.value("decoder", nlohmann::json()), path);
    } else {
      BRISK_FAIL("'", path, "': tokenizer model \"", excerpt(type),
                 "\" is not supported (WordPiece, BPE and Unigram are)");
    }
    const nlohmann::json added = j.value("added_tokens", nlohmann::json::array());
    BRISK_CHECK(added.is_array(), "'", path, "': added_tokens must be a list");
    for (const auto& a : added) {
      BRISK_CHECK(a.is_object() && a.contains("content") && a["content"].is_string() &&
                      a.contains("id") && a["id"].is_number_unsigned() &&
                      a["id"].get<uint64_t>() < (uint64_t{1} << 31),
                  "'", path, "': an added token needs a content and an id");
      const std::string content = a["content"].get<std::string>();
      BRISK_CHECK(!content.empty(), "'", path, "': an added token is empty");
      t.added_.push_back(
          {content, static_cast<int32_t>(a["id"].get<uint64_t>()), flag_or(a, "special", false)});
    }
    read_post_processor(t, j.value("post_processor", nlohmann::json()), path);
    const nlohmann::json pad = j.value("padding", nlohmann::json());
    if (pad.is_object() && pad.contains("pad_id")) {
      const nlohmann::json& id = pad["pad_id"];
      BRISK_CHECK(
          id.is_number_unsigned() && id.get<uint64_t>() < static_cast<uint64_t>(t.vocab_size()),
          "'", path, "': padding.pad_id ", excerpt(id.dump()),
          " is not a token id (the vocabulary has ", t.vocab_size(), ")");
      t.pad_id_ = static_cast<int32_t>(id.get<uint64_t>());
    } else if (t.model_->id_of("[PAD]") >= 0)
      t.pad_id_ = t.model_->id_of("[PAD]");
  }

  // A Prepend, a Replace of a string, or a Sequence of them (Llama-2's normalizer).
  static std::vector<TextEdit> text_edits(const nlohmann::json& norm, const std::string& path,
                                          const char* model) {
    std::vector<TextEdit> out;
    const bool sequence = type_of(norm) == "Sequence";
    const nlohmann::json steps = sequence         ? norm.value("normalizers", nlohmann::json())
                                 : norm.is_null() ? nlohmann::json::array()
                                                  : nlohmann::json::array({norm});
    BRISK_CHECK(steps.is_array(), "'", path, "': the normalizer Sequence needs a list");
    for (const auto& n : steps) {
      const std::string type = type_of(n);
      if (type == "Prepend" && n.contains("prepend") && n["prepend"].is_string()) {
        out.push_back({true, "", n["prepend"].get<std::string>()});
      } else if (type == "Replace" && n.contains("pattern") && n["pattern"].is_object() &&
                 n["pattern"].contains("String") && n["pattern"]["String"].is_string() &&
                 !n["pattern"]["String"].get<std::string>().empty() && n.contains("content") &&
                 n["content"].is_string()) {
        out.push_back(
            {false, n["pattern"]["String"].get<std::string>(), n["content"].get<std::string>()});
      } else {
        BRISK_FAIL("'", path, "': normalizer \"", excerpt(type), "\" is not supported with ", model,
                   " (Prepend and Replace of a string are)");
      }
    }
    return out;
  }

  // Unigram: [piece, score] pairs (ids are their indexes), an optional unk_id, byte_fallback;
  // Prepend/Replace normalizers; a Metaspace pre-tokenizer (after a WhitespaceSplit or not).
  static std::unique_ptr<TokenModel> unigram(const nlohmann::json& model,
                                             const nlohmann::json& norm, const nlohmann::json& pre,
                                             const nlohmann::json& decoder,
                                             const std::string& path) {
    const nlohmann::json vocab = model.value("vocab", nlohmann::json());
    BRISK_CHECK(vocab.is_array() && !vocab.empty() && vocab.size() < (size_t{1} << 31), "'", path,
                "': the Unigram vocabulary must be a non-empty list of [piece, score]");
    std::vector<std::pair<std::string, double>> pieces;
    pieces.reserve(vocab.size());
    for (const auto& v : vocab) {
      BRISK_CHECK(v.is_array() && v.size() == 2 && v[0].is_string() && v[1].is_number() &&
                      std::isfinite(v[1].get<double>()),
                  "'", path, "': a Unigram vocabulary entry must be [piece, finite score]");
      pieces.emplace_back(v[0].get<std::string>(), v[1].get<double>());
    }
    int32_t unk = -1;
    const nlohmann::json u = model.value("unk_id", nlohmann::json());
    if (!u.is_null()) {
      BRISK_CHECK(u.is_number_unsigned() && u.get<uint64_t>() < pieces.size(), "'", path,
                  "': the Unigram unk_id is not an index of the vocabulary");
      unk = static_cast<int32_t>(u.get<uint64_t>());
    }
    return make_unigram(std::move(pieces), unk, flag_or(model, "byte_fallback", false),
                        text_edits(norm, path, "Unigram"), metaspace(pre, path),
                        metaspace_decoding(decoder, path), path);
  }

  // None, Metaspace, or Sequence [WhitespaceSplit, Metaspace].
  static std::optional<Metaspace> metaspace(const nlohmann::json& pre, const std::string& path) {
    if (pre.is_null()) return std::nullopt;
    const bool after_split = type_of(pre) == "Sequence" && pre.contains("pretokenizers") &&
                             pre["pretokenizers"].is_array() && pre["pretokenizers"].size() == 2 &&
                             type_of(pre["pretokenizers"][0]) == "WhitespaceSplit";
    const nlohmann::json& m = after_split ? pre["pretokenizers"][1] : pre;
    BRISK_CHECK(type_of(m) == "Metaspace", "'", path, "': pre_tokenizer \"", excerpt(type_of(pre)),
                "\" is not supported with Unigram (Metaspace, after a WhitespaceSplit or not, is)");
    Metaspace out;
    out.whitespace_split = after_split;
    out.replacement = one_character(m, path);
    out.split = flag_or(m, "split", true);
    const std::string scheme = string_or(m, "prepend_scheme", "always");
    BRISK_CHECK(scheme == "always" || scheme == "first" || scheme == "never", "'", path,
                "': Metaspace's prepend_scheme \"", excerpt(scheme),
                "\" is not always, first or never");
    out.prepend_scheme = !flag_or(m, "add_prefix_space", true) || scheme == "never"
                             ? Metaspace::PrependScheme::kNever
                         : scheme == "first" ? Metaspace::PrependScheme::kFirst
                                             : Metaspace::PrependScheme::kAlways;
    return out;
  }

  // Metaspace's replacement: one character.
  static std::string one_character(const nlohmann::json& m, const std::string& path) {
    const std::string r = string_or(m, "replacement", "\xE2\x96\x81");
    utf8proc_int32_t c = 0;
    const auto n = r.empty() ? -1
                             : utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(r.data()),
                                                static_cast<utf8proc_ssize_t>(r.size()), &c);
    BRISK_CHECK(n > 0 && static_cast<size_t>(n) == r.size(), "'", path,
                "': Metaspace's replacement must be one character");
    return r;
  }

  // The Metaspace decoder, or a Sequence of Replace(x, " "), ByteFallback, Fuse and Strip (as
  // converted SentencePiece models have); none joins the tokens as they are.
  static MetaspaceDecoding metaspace_decoding(const nlohmann::json& decoder,
                                              const std::string& path) {
    MetaspaceDecoding d;
    if (type_of(decoder) == "Metaspace") {
      d.replacement = one_character(decoder, path);
      d.drop_first = flag_or(decoder, "add_prefix_space", true) &&
                     string_or(decoder, "prepend_scheme", "always") != "never";
      return d;
    }
    d.replacement.clear();
    if (type_of(decoder) != "Sequence" || !decoder.contains("decoders") ||
        !decoder["decoders"].is_array())
      return d;
    for (const auto& step : decoder["decoders"]) {
      const std::string type = type_of(step);
      if (type == "Replace" && string_or(step, "content", "") == " " && step.contains("pattern") &&
          step["pattern"].is_object())
        d.replacement = string_or(step["pattern"], "String", "");
      else if (type == "Strip" && string_or(step, "content", "") == " " && step.contains("start") &&
               step["start"].is_number_unsigned())
        d.strip_left = step["start"].get<size_t>();
    }
    return d;
  }

  // The regex of a byte-level pre-tokenizer: GPT-2's (empty) for ByteLevel with its regex, or a
  // Split's pattern before a ByteLevel without one (Llama-3).
  static std::string byte_level_pattern(const nlohmann::json& pre, const std::string& path) {
    auto byte_level = [&](const nlohmann::json& p, bool own_regex) {
      return type_of(p) == "ByteLevel" && !flag_or(p, "add_prefix_space", false) &&
             flag_or(p, "use_regex", true) == own_regex;
    };
    if (byte_level(pre, true)) return {};
    const bool pair = type_of(pre) == "Sequence" && pre.contains("pretokenizers") &&
                      pre["pretokenizers"].is_array() && pre["pretokenizers"].size() == 2;
    if (pair && type_of(pre["pretokenizers"][0]) == "Digits" &&
        flag_or(pre["pretokenizers"][0], "individual_digits", false) &&
        byte_level(pre["pretokenizers"][1], true))
      return kGpt2IndividualDigitsPattern;
    if (pair && byte_level(pre["pretokenizers"][1], false)) {
      const nlohmann::json& split = pre["pretokenizers"][0];
      BRISK_CHECK(type_of(split) == "Split" && string_or(split, "behavior", "") == "Isolated" &&
                      !flag_or(split, "invert", false) && split.contains("pattern") &&
                      split["pattern"].is_object() && split["pattern"].contains("Regex") &&
                      split["pattern"]["Regex"].is_string(),
                  "'", path,
                  "': before ByteLevel only a Split on a regex, isolated, not inverted, is "
                  "supported");
      const std::string pattern = split["pattern"]["Regex"].get<std::string>();
      BRISK_CHECK(!pattern.empty(), "'", path, "': the Split pattern is empty");
      return pattern;
    }
    BRISK_FAIL("'", path, "': pre_tokenizer \"", excerpt(type_of(pre)),
               "\" is not supported with BPE (ByteLevel, Split + ByteLevel without a regex, or "
               "individual Digits + ByteLevel are; without a prefix space)");
  }

  // TemplateProcessing, BertProcessing and RobertaProcessing as single and pair templates;
  // ByteLevel or none leaves A (type 0) and B (type 1) as they are.
  static void read_post_processor(Tokenizer& t, const nlohmann::json& post,
                                  const std::string& path) {
    const std::string type = type_of(post);
    if (type == "TemplateProcessing") {
      const nlohmann::json specials = post.value("special_tokens", nlohmann::json::object());
      BRISK_CHECK(specials.is_object(), "'", path, "': the template's special_tokens must map");
      t.single_ = read_template(post.value("single", nlohmann::json()), specials, path, false);
      t.pair_ = read_template(post.value("pair", nlohmann::json()), specials, path, true);
    } else if (type == "BertProcessing" || type == "RobertaProcessing") {
      const int32_t cls = processing_id(post, "cls", path), sep = processing_id(post, "sep", path);
      const int32_t b_type = type == "BertProcessing" ? 1 : 0;  // RoBERTa has one token type
      t.single_ = {{-1, {cls}, 0}, {0, {}, 0}, {-1, {sep}, 0}};
      t.pair_ = {{-1, {cls}, 0}, {0, {}, 0}, {-1, {sep}, 0}};
      if (type == "RobertaProcessing") t.pair_.push_back({-1, {sep}, 0});  // <s> A </s></s> B </s>
      t.pair_.push_back({1, {}, b_type});
      t.pair_.push_back({-1, {sep}, b_type});
    } else {
      BRISK_CHECK(post.is_null() || type == "ByteLevel", "'", path, "': post_processor \"",
                  excerpt(type), "\" is not supported");
    }
  }

  static int32_t processing_id(const nlohmann::json& post, const char* key,
                               const std::string& path) {
    const nlohmann::json v = post.value(key, nlohmann::json());
    BRISK_CHECK(v.is_array() && v.size() == 2 && v[1].is_number_unsigned() &&
                    v[1].get<uint64_t>() < (uint64_t{1} << 31),
                "'", path, "': the post-processor's ", key, " must be [token, id]");
    return static_cast<int32_t>(v[1].get<uint64_t>());
  }

  static std::vector<Tokenizer::TemplatePiece> read_template(const nlohmann::json& pieces,
                                                             const nlohmann::json& specials,
                                                             const std::string& path, bool pair) {
    BRISK_CHECK(pieces.is_array(), "'", path, "': the template must be a list");
    std::vector<Tokenizer::TemplatePiece> out;
    int seen = 0;  // bit 0: A, bit 1: B
    for (const auto& p : pieces) {
      const bool is_special = p.is_object() && p.contains("SpecialToken");
      const nlohmann::json body =
          p.is_object() ? p.value(is_special ? "SpecialToken" : "Sequence", nlohmann::json())
                        : nlohmann::json();
      BRISK_CHECK(body.is_object() && body.contains("id") && body["id"].is_string(), "'", path,
                  "': a template piece is a SpecialToken or a Sequence with an id");
      const std::string id = body["id"].get<std::string>();
      Tokenizer::TemplatePiece piece;
      if (body.contains("type_id")) {
        BRISK_CHECK(body["type_id"].is_number_unsigned() && body["type_id"].get<uint64_t>() < 256,
                    "'", path, "': a template's type_id must be a small number");
        piece.type_id = static_cast<int32_t>(body["type_id"].get<uint64_t>());
      }
      if (is_special) {
        BRISK_CHECK(specials.contains(id) && specials[id].is_object() &&
                        specials[id].contains("ids") && specials[id]["ids"].is_array(),
                    "'", path, "': the template's special token \"", excerpt(id), "\" has no ids");
        for (const auto& v : specials[id]["ids"]) {
          BRISK_CHECK(v.is_number_unsigned() && v.get<uint64_t>() < (uint64_t{1} << 31), "'", path,
                      "': special token \"", excerpt(id), "\" has an invalid id");
          piece.ids.push_back(static_cast<int32_t>(v.get<uint64_t>()));
        }
      } else {
        BRISK_CHECK(id == "A" || (pair && id == "B"), "'", path, "': the ",
                    pair ? "pair" : "single", " template names sequence \"", excerpt(id), "\"");
        piece.sequence = id == "A" ? 0 : 1;
        BRISK_CHECK(!(seen & (1 << piece.sequence)), "'", path, "': the template repeats $", id);
        seen |= 1 << piece.sequence;
      }
      out.push_back(std::move(piece));
    }
    BRISK_CHECK(seen == (pair ? 3 : 1), "'", path, "': the ", pair ? "pair" : "single",
                " template must hold ", pair ? "$A and $B" : "$A");
    return out;
  }

  static int32_t special_id(const Tokenizer& t, const std::string& token, const std::string& path) {
    for (const AddedToken& a : t.added_)
      if (a.content == token) return a.id;
    const int32_t id = t.model_->id_of(token);
    BRISK_CHECK(id >= 0, "'", path, "': the post-processor needs ", token,
                ", which the vocabulary lacks");
    return id;
  }

  // vocab.txt: one WordPiece token per line, its line number its id (BertTokenizer's defaults:
  // lowercase and accents stripped, as bert-base-uncased).
  static void from_vocab_txt(Tokenizer& t, const std::string& path, bool lowercase) {
    std::istringstream in(read_text(path, "vocabulary"));
    std::unordered_map<std::string, int32_t> vocab;
    std::string line;
    int32_t id = 0;
    while (std::getline(in, line)) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      vocab.emplace(line, id++);
    }
    t.model_ = make_wordpiece(std::move(vocab), "[UNK]", 100, lowercase, lowercase, true, true);
    for (const char* s : {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"})
      if (t.model_->id_of(s) >= 0) t.added_.push_back({s, t.model_->id_of(s), true});
    const int32_t cls = special_id(t, "[CLS]", path), sep = special_id(t, "[SEP]", path);
    t.single_ = {{-1, {cls}, 0}, {0, {}, 0}, {-1, {sep}, 0}};
    t.pair_ = {{-1, {cls}, 0}, {0, {}, 0}, {-1, {sep}, 0}, {1, {}, 1}, {-1, {sep}, 1}};
    t.pad_id_ = std::max(0, t.model_->id_of("[PAD]"));
  }

  // tokenizer.model: SentencePiece's file, with LlamaTokenizer's template (<s> in front, no </s>,
  // unless tokenizer_config.json's add_bos_token / add_eos_token say otherwise). Its unknown,
  // begin, end and pad pieces are special tokens, matched in the text as transformers does.
  static void from_sentencepiece(Tokenizer& t, const std::string& path,
                                 const nlohmann::json& config) {
    std::array<int32_t, 4> ids{};
    t.model_ = make_sentencepiece(read_text(path, "SentencePiece model"), path, ids);
    for (int32_t id : ids)
      if (id >= 0) t.added_.push_back({t.model_->token_of(id), id, true});
    const int32_t bos = ids[static_cast<size_t>(SentencePieceSpecial::kBegin)];
    const int32_t eos = ids[static_cast<size_t>(SentencePieceSpecial::kEnd)];
    const int32_t pad = ids[static_cast<size_t>(SentencePieceSpecial::kPad)];
    const bool add_bos = flag_or(config, "add_bos_token", true) && bos >= 0;
    const bool add_eos = flag_or(config, "add_eos_token", false) && eos >= 0;
    t.single_.clear();
    t.pair_.clear();
    for (int sequence : {0, 1}) {
      if (add_bos) t.pair_.push_back({-1, {bos}, sequence});
      t.pair_.push_back({sequence, {}, sequence});
      if (add_eos) t.pair_.push_back({-1, {eos}, sequence});
      if (sequence == 0) t.single_ = t.pair_;
    }
    t.pad_id_ = std::max(0, pad);
  }

  // vocab.json + merges.txt: GPT-2's files.
  static void from_gpt2_files(Tokenizer& t, const std::string& vocab, const std::string& merges) {
    const nlohmann::json v = read_json_file(vocab, "vocabulary", kMaxTokenizerFile, 4);
    t.model_ =
        make_byte_level_bpe(vocab_from_json(v, vocab),
                            merges_from_lines(read_text(merges, "merges file"), merges), merges);
    const int32_t eos = t.model_->id_of("<|endoftext|>");
    if (eos >= 0) t.added_.push_back({"<|endoftext|>", eos, true});
    t.pad_id_ = std::max(0, eos);
  }
};

bool Tokenizer::in_folder(const std::string& folder) {
  std::error_code ec;
  if (!fs::is_directory(folder, ec)) return false;
  for (const char* name : {"tokenizer.json", "tokenizer.model", "vocab.txt", "vocab.json"})
    if (fs::exists(fs::path(folder) / name, ec)) return true;
  return false;
}

std::unique_ptr<Tokenizer> Tokenizer::load(const std::string& path) {
  auto t = std::make_unique<Tokenizer>();
  t->origin_ = path;
  std::error_code ec;
  const fs::path p(path);
  auto in_folder = [&](const char* name) { return (p / name).string(); };
  const bool folder = fs::is_directory(p, ec);
  const std::string name = p.filename().string();
  // The folder's tokenizer_config.json (none for a file path): options the slow tokenizers read,
  // and the eos token.
  const std::string config_file = folder ? in_folder("tokenizer_config.json") : std::string();
  const nlohmann::json config = !config_file.empty() && fs::exists(config_file, ec)
                                    ? read_json_file(config_file, "tokenizer config")
                                    : nlohmann::json::object();
  if (folder ? fs::exists(in_folder("tokenizer.json"), ec)
             : name.ends_with(".json") && name != "vocab.json") {
    TokenizerLoader::from_tokenizer_json(*t, folder ? in_folder("tokenizer.json") : path);
  } else if (folder ? fs::exists(in_folder("tokenizer.model"), ec) : name.ends_with(".model")) {
    TokenizerLoader::from_sentencepiece(*t, folder ? in_folder("tokenizer.model") : path, config);
  } else if (folder ? fs::exists(in_folder("vocab.txt"), ec) : name.ends_with(".txt")) {
    // do_lower_case decides, as BertTokenizer's (default true).
    TokenizerLoader::from_vocab_txt(*t, folder ? in_folder("vocab.txt") : path,
                                    flag_or(config, "do_lower_case", true));
  } else if (folder ? fs::exists(in_folder("vocab.json"), ec) : name == "vocab.json") {
    const fs::path dir = folder ? p : p.parent_path();
    TokenizerLoader::from_gpt2_files(*t, (dir / "vocab.json").string(),
                                     (dir / "merges.txt").string());
  } else {
    BRISK_FAIL(
        "no tokenizer at '", path,
        "' (looked for tokenizer.json, tokenizer.model, vocab.txt, vocab.json + merges.txt)");
  }
  // Longest first, so "[SEP]" wins over a shorter added token that is its prefix.
  std::stable_sort(t->added_.begin(), t->added_.end(), [](const auto& a, const auto& b) {
    return a.content.size() > b.content.size();
  });
  t->index_added_tokens();
  const nlohmann::json eos = config.value("eos_token", nlohmann::json());
  const nlohmann::json content = eos.is_object() ? eos.value("content", nlohmann::json()) : eos;
  if (content.is_string()) t->eos_id_ = t->token_id(content.get<std::string>());
  return t;
}

void Tokenizer::index_added_tokens() {
  added_edges_.clear();
  added_at_.assign(1, -1);
  for (size_t i = 0; i < added_.size(); ++i) {
    const std::string& content = added_[i].content;
    first_bytes_[static_cast<unsigned char>(content[0])] = true;
    int32_t node = 0;
    for (const char c : content) {
      const uint64_t edge = uint64_t{static_cast<uint32_t>(node)} << 8 | static_cast<uint8_t>(c);
      const auto [it, made] =
          added_edges_.try_emplace(edge, static_cast<int32_t>(added_at_.size()));
      if (made) added_at_.push_back(-1);
      node = it->second;
    }
    // Of two alike, the first (of equal length, as the longest-first order kept them).
    if (added_at_[static_cast<size_t>(node)] < 0)
      added_at_[static_cast<size_t>(node)] = static_cast<int32_t>(i);
  }
}

const AddedToken* Tokenizer::longest_added(std::string_view text, size_t at) const {
  if (!first_bytes_[static_cast<unsigned char>(text[at])]) return nullptr;
  const AddedToken* hit = nullptr;
  int32_t node = 0;
  for (size_t i = at; i < text.size(); ++i) {
    const auto it = added_edges_.find(uint64_t{static_cast<uint32_t>(node)} << 8 |
                                      static_cast<uint8_t>(text[i]));
    if (it == added_edges_.end()) break;
    node = it->second;
    const int32_t token = added_at_[static_cast<size_t>(node)];
    if (token >= 0) hit = &added_[static_cast<size_t>(token)];
  }
  return hit;
}

std::vector<int32_t> Tokenizer::tokenize(std::string_view text) const {
  std::vector<int32_t> out;
  size_t start = 0, at = 0;
  while (at < text.size()) {
    const AddedToken* hit = longest_added(text, at);
    if (!hit) {
      ++at;
      continue;
    }
    if (at > start) model_->encode_stretch(text.substr(start, at - start), start == 0, out);
    out.push_back(hit->id);
    at += hit->content.size();
    start = at;
  }
  if (start < text.size()) model_->encode_stretch(text.substr(start), start == 0, out);
  return out;
}

Encoded Tokenizer::encode_plain(std::string_view text, int64_t max_length) const {
  Encoded e;
  e.ids = tokenize(text);
  if (max_length > 0 && static_cast<int64_t>(e.ids.size()) > max_length)
    e.ids.resize(static_cast<size_t>(max_length));
  return e;
}

Encoded Tokenizer::encode(std::string_view text, std::optional<std::string_view> pair,
                          int64_t max_length) const {
  std::vector<int32_t> seq[2] = {tokenize(text), pair ? tokenize(*pair) : std::vector<int32_t>()};
  const std::vector<TemplatePiece>& shape = pair ? pair_ : single_;
  int64_t special = 0;
  for (const TemplatePiece& p : shape) special += static_cast<int64_t>(p.ids.size());
  if (max_length > 0) {
    const int64_t budget = std::max<int64_t>(0, max_length - special);
    const auto n1 = static_cast<int64_t>(seq[0].size()), n2 = static_cast<int64_t>(seq[1].size());
    if (n1 + n2 > budget) {
      // longest_first as the tokenizers library truncates: the shorter sequence keeps at most
      // half the budget (the first one on a tie), the longer one the rest.
      int64_t k1, k2;
      if (n1 > n2) {
        k2 = std::min(n2, budget / 2);
        k1 = budget - k2;
      } else {
        k1 = std::min(n1, budget / 2);
        k2 = budget - k1;
      }
      seq[0].resize(static_cast<size_t>(std::min(k1, n1)));
      seq[1].resize(static_cast<size_t>(std::min(k2, n2)));
    }
  }
  Encoded e;
  for (const TemplatePiece& p : shape) {
    const std::vector<int32_t>& ids = p.sequence < 0 ? p.ids : seq[p.sequence];
    e.ids.insert(e.ids.end(), ids.begin(), ids.end());
    e.type_ids.resize(e.ids.size(), p.type_id);
  }
  return e;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  if (!skip_special_tokens) return model_->decode(ids);
  std::vector<int32_t> kept;
  for (int32_t id : ids)
    if (std::none_of(added_.begin(), added_.end(),
                     [&](const AddedToken& a) { return a.special && a.id == id; }))
      kept.push_back(id);
  return model_->decode(kept);
}

std::pair<int64_t, int64_t> Tokenizer::single_specials() const {
  int64_t before = 0, after = 0;
  bool seen_text = false;
  for (const TemplatePiece& p : single_) {
    if (p.sequence >= 0) {
      seen_text = true;
      continue;
    }
    (seen_text ? after : before) += static_cast<int64_t>(p.ids.size());
  }
  return {before, after};
}

int32_t Tokenizer::token_id(const std::string& token) const {
  for (const AddedToken& a : added_)
    if (a.content == token) return a.id;
  return model_->id_of(token);
}

int64_t Tokenizer::vocab_size() const {
  int64_t n = model_->vocab_size();
  for (const AddedToken& a : added_) n = std::max<int64_t>(n, int64_t{a.id} + 1);
  return n;
}

}  // namespace brisk
