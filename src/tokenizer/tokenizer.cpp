// Loading tokenizers from the files transformers writes, added tokens, special tokens and
// truncation (see tokenizer.h).
#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "core/json_file.h"

namespace brisk {

namespace fs = std::filesystem;

namespace {
constexpr size_t kMaxTokenizerFile = size_t{256} << 20;  // tokenizer.json of large vocabularies

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
  std::error_code ec;
  BRISK_CHECK(fs::is_regular_file(path, ec), "cannot open ", what, " '", path, "'");
  const auto size = fs::file_size(path, ec);
  BRISK_CHECK(!ec && size <= kMaxTokenizerFile, what, " '", path, "' is larger than 256 MiB");
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  BRISK_CHECK(in.good() || in.eof(), "cannot read ", what, " '", path, "'");
  return ss.str();
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
      const int64_t max_chars = model.contains("max_input_chars_per_word") &&
                                        model["max_input_chars_per_word"].is_number_unsigned()
                                    ? model["max_input_chars_per_word"].get<int64_t>()
                                    : 100;
      t.model_ = make_wordpiece(vocab_from_json(model.value("vocab", nlohmann::json()), path),
                                string_or(model, "unk_token", "[UNK]"), max_chars, lowercase, strip,
                                flag_or(norm, "handle_chinese_chars", true),
                                flag_or(norm, "clean_text", true));
    } else if (type == "BPE") {
      BRISK_CHECK(type_of(pre) == "ByteLevel" && !flag_or(pre, "add_prefix_space", false) &&
                      flag_or(pre, "use_regex", true),
                  "'", path, "': only GPT-2's byte-level BPE is supported (pre_tokenizer \"",
                  excerpt(type_of(pre)), "\")");
      BRISK_CHECK(norm.is_null(), "'", path, "': normalizer \"", excerpt(type_of(norm)),
                  "\" is not supported with byte-level BPE");
      t.model_ = make_byte_level_bpe(
          vocab_from_json(model.value("vocab", nlohmann::json()), path),
          merges_from_json(model.value("merges", nlohmann::json()), path), path);
    } else {
      BRISK_FAIL("'", path, "': tokenizer model \"", excerpt(type),
                 "\" is not supported (WordPiece and byte-level BPE are)");
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
    const nlohmann::json post = j.value("post_processor", nlohmann::json());
    const std::string post_type = type_of(post);
    if (post_type == "TemplateProcessing" || post_type == "BertProcessing") {
      t.bert_template_ = true;
      t.cls_id_ = special_id(t, "[CLS]", path);
      t.sep_id_ = special_id(t, "[SEP]", path);
    } else {
      BRISK_CHECK(post.is_null() || post_type == "ByteLevel", "'", path, "': post_processor \"",
                  excerpt(post_type), "\" is not supported");
    }
    const nlohmann::json pad = j.value("padding", nlohmann::json());
    if (pad.is_object() && pad.contains("pad_id") && pad["pad_id"].is_number_unsigned())
      t.pad_id_ = static_cast<int32_t>(pad["pad_id"].get<uint64_t>() & 0x7fffffff);
    else if (t.model_->id_of("[PAD]") >= 0)
      t.pad_id_ = t.model_->id_of("[PAD]");
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
    t.bert_template_ = true;
    t.cls_id_ = special_id(t, "[CLS]", path);
    t.sep_id_ = special_id(t, "[SEP]", path);
    t.pad_id_ = std::max(0, t.model_->id_of("[PAD]"));
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

std::unique_ptr<Tokenizer> Tokenizer::load(const std::string& path) {
  auto t = std::make_unique<Tokenizer>();
  t->origin_ = path;
  std::error_code ec;
  const fs::path p(path);
  auto in_folder = [&](const char* name) { return (p / name).string(); };
  const bool folder = fs::is_directory(p, ec);
  const std::string name = p.filename().string();
  if (folder ? fs::exists(in_folder("tokenizer.json"), ec)
             : name.ends_with(".json") && name != "vocab.json") {
    TokenizerLoader::from_tokenizer_json(*t, folder ? in_folder("tokenizer.json") : path);
  } else if (folder ? fs::exists(in_folder("vocab.txt"), ec) : name.ends_with(".txt")) {
    // tokenizer_config.json's do_lower_case decides, as BertTokenizer's (default true).
    bool lowercase = true;
    const std::string config = folder ? in_folder("tokenizer_config.json") : std::string();
    if (!config.empty() && fs::exists(config, ec)) {
      const nlohmann::json c = read_json_file(config, "tokenizer config");
      lowercase = flag_or(c, "do_lower_case", true);
    }
    TokenizerLoader::from_vocab_txt(*t, folder ? in_folder("vocab.txt") : path, lowercase);
  } else if (folder ? fs::exists(in_folder("vocab.json"), ec) : name == "vocab.json") {
    const fs::path dir = folder ? p : p.parent_path();
    TokenizerLoader::from_gpt2_files(*t, (dir / "vocab.json").string(),
                                     (dir / "merges.txt").string());
  } else {
    BRISK_FAIL("no tokenizer at '", path,
               "' (looked for tokenizer.json, vocab.txt, vocab.json + merges.txt)");
  }
  // Longest first, so "[SEP]" wins over a shorter added token that is its prefix.
  std::stable_sort(t->added_.begin(), t->added_.end(), [](const auto& a, const auto& b) {
    return a.content.size() > b.content.size();
  });
  for (const AddedToken& a : t->added_)
    t->first_bytes_[static_cast<unsigned char>(a.content[0])] = true;
  return t;
}

std::vector<int32_t> Tokenizer::tokenize(std::string_view text) const {
  std::vector<int32_t> out;
  size_t start = 0, at = 0;
  while (at < text.size()) {
    const AddedToken* hit = nullptr;
    if (first_bytes_[static_cast<unsigned char>(text[at])])
      for (const AddedToken& a : added_)
        if (text.compare(at, a.content.size(), a.content) == 0) {
          hit = &a;
          break;
        }
    if (!hit) {
      ++at;
      continue;
    }
    if (at > start) model_->encode(text.substr(start, at - start), out);
    out.push_back(hit->id);
    at += hit->content.size();
    start = at;
  }
  if (start < text.size()) model_->encode(text.substr(start), out);
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
  std::vector<int32_t> a = tokenize(text);
  std::vector<int32_t> b = pair ? tokenize(*pair) : std::vector<int32_t>();
  const int64_t special = bert_template_ ? (pair ? 3 : 2) : 0;
  if (max_length > 0) {
    const int64_t budget = std::max<int64_t>(0, max_length - special);
    const auto n1 = static_cast<int64_t>(a.size()), n2 = static_cast<int64_t>(b.size());
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
      a.resize(static_cast<size_t>(std::min(k1, n1)));
      b.resize(static_cast<size_t>(std::min(k2, n2)));
    }
  }
  Encoded e;
  if (bert_template_) e.ids.push_back(cls_id_);
  e.ids.insert(e.ids.end(), a.begin(), a.end());
  if (bert_template_) e.ids.push_back(sep_id_);
  e.type_ids.assign(e.ids.size(), 0);
  if (pair) {
    e.ids.insert(e.ids.end(), b.begin(), b.end());
    if (bert_template_) e.ids.push_back(sep_id_);
    e.type_ids.resize(e.ids.size(), 1);
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

int64_t Tokenizer::vocab_size() const {
  int64_t n = model_->vocab_size();
  for (const AddedToken& a : added_) n = std::max<int64_t>(n, int64_t{a.id} + 1);
  return n;
}

}  // namespace brisk
