// Tokenizers against the `tokenizers` library on the same vocabularies and texts
// (tests/fixtures/tokenizer, from scripts/make_tokenizer_fixtures.py): WordPiece with BERT's
// normalizer (uncased and cased), GPT-2's byte-level BPE (tokenizer.json and the legacy files),
// Llama-3's (a Split regex before ByteLevel, ignore_merges, a BOS template) and Llama-2's BPE with
// byte fallback; SentencePiece tokenizer.model files (BPE and unigram, against the sentencepiece
// library); single texts, texts without special tokens, truncated pairs with their token
// types, decoding.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "core/json_file.h"
#include "test_support.h"
#include "tokenizer/tokenizer.h"

namespace brisk::testing {
namespace {

nlohmann::json load(const std::string& rel) {
  return read_json_file(fixture("tokenizer/" + rel), "fixture", size_t{16} << 20);
}

void expect_like_the_library(const std::string& name, const std::string& path) {
  SCOPED_TRACE(name + " from " + path);
  const std::unique_ptr<Tokenizer> t = Tokenizer::load(path);
  const auto texts = load("texts.json").get<std::vector<std::string>>();
  const nlohmann::json want = load(name + "/expected.json");
  ASSERT_EQ(want["single"].size(), texts.size());
  for (size_t i = 0; i < texts.size(); ++i) {
    EXPECT_EQ(t->encode(texts[i], std::nullopt, 0).ids,
              want["single"][i].get<std::vector<int32_t>>())
        << "line " << i << ": " << texts[i];
    EXPECT_EQ(t->tokenize(texts[i]), want["plain"][i].get<std::vector<int32_t>>()) << "line " << i;
  }
  for (size_t i = 0; i + 1 < texts.size(); ++i) {
    const Encoded e = t->encode(texts[i], texts[i + 1], 16);
    EXPECT_EQ(e.ids, want["pairs"][i]["ids"].get<std::vector<int32_t>>()) << "pair " << i;
    EXPECT_EQ(e.type_ids, want["pairs"][i]["type_ids"].get<std::vector<int32_t>>()) << "pair " << i;
  }
  // </s> in the text (special), or texts one fixture is about (extra).
  for (const char* key : {"special", "extra"})
    for (const auto& text : want.value(key, nlohmann::json::array()))
      EXPECT_EQ(t->tokenize(text[0].get<std::string>()), text[1].get<std::vector<int32_t>>())
          << text[0];
  for (size_t i = 0; i < want["decoded"].size(); ++i)
    EXPECT_EQ(t->decode(want["single"][i].get<std::vector<int32_t>>()),
              want["decoded"][i].get<std::string>())
        << "line " << i;
}

// A folder holds a tokenizer where it holds a file load() reads one from; a file path, a missing
// folder or a folder with none of them does not.
TEST(Tokenizer, AFolderHoldsOneWhereLoadFindsAFile) {
  for (const char* name : {"wordpiece", "bpe", "sentencepiece_bpe"})
    EXPECT_TRUE(Tokenizer::in_folder(fixture(std::string("tokenizer/") + name))) << name;
  namespace fs = std::filesystem;
  const fs::path dir =
      fs::temp_directory_path() / ("brisk_tokenizer_folder_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  EXPECT_FALSE(Tokenizer::in_folder(dir.string()));
  EXPECT_FALSE(Tokenizer::in_folder((dir / "missing").string()));
  EXPECT_FALSE(Tokenizer::in_folder(fixture("tokenizer/wordpiece/vocab.txt")));
  std::ofstream(dir / "vocab.txt") << "[PAD]\n";
  EXPECT_TRUE(Tokenizer::in_folder(dir.string()));
  fs::remove_all(dir);
}

TEST(Tokenizer, WordPieceEqualsTheLibrary) {
  expect_like_the_library("wordpiece", fixture("tokenizer/wordpiece"));  // tokenizer.json
  expect_like_the_library("wordpiece", fixture("tokenizer/wordpiece/vocab.txt"));
  expect_like_the_library("wordpiece_cased", fixture("tokenizer/wordpiece_cased/tokenizer.json"));
}

TEST(Tokenizer, ByteLevelBpeEqualsTheLibrary) {
  expect_like_the_library("bpe", fixture("tokenizer/bpe/tokenizer.json"));
  expect_like_the_library("bpe", fixture("tokenizer/bpe/vocab.json"));  // + merges.txt
}

TEST(Tokenizer, Llama3StyleByteLevelBpeEqualsTheLibrary) {
  expect_like_the_library("bpe_llama3", fixture("tokenizer/bpe_llama3"));
  // A Split pattern that leaves text between its matches: those stretches are pieces too.
  expect_like_the_library("bpe_split_gaps", fixture("tokenizer/bpe_split_gaps"));
}

// Every digit its own piece, GPT-2's pattern between them (SmolLM2's tokenizer.json): the space
// before a number is a piece of its own, not the number's.
TEST(Tokenizer, IndividualDigitsBeforeByteLevelEqualsTheLibrary) {
  expect_like_the_library("bpe_digits", fixture("tokenizer/bpe_digits"));
}

// Llama-2's layout: "▁" normalizers, characters missing from the vocabulary as <0xNN> tokens,
// emoji (no <0xF0> token) as one fused <unk>.
TEST(Tokenizer, ByteFallbackBpeEqualsTheLibrary) {
  expect_like_the_library("bpe_byte_fallback", fixture("tokenizer/bpe_byte_fallback"));
}

// tokenizer.model files through libsentencepiece: BPE with byte fallback and identity
// normalization as Llama's, unigram with squeezed whitespace and a normalization table; <s> first.
TEST(Tokenizer, SentencePieceModelsEqualTheLibrary) {
  expect_like_the_library("sentencepiece_bpe", fixture("tokenizer/sentencepiece_bpe"));
  expect_like_the_library("sentencepiece_unigram",
                          fixture("tokenizer/sentencepiece_unigram/tokenizer.model"));
}

// As transformers' LlamaTokenizer: <s>, </s> and <unk> in the text are the special tokens, each
// stretch between them encoded on its own; tokenizer_config.json may add </s> or drop <s>.
TEST(Tokenizer, SentencePieceSpecialTokensFollowLlamaTokenizer) {
  namespace fs = std::filesystem;
  const std::string model = fixture("tokenizer/sentencepiece_bpe/tokenizer.model");
  const auto t = Tokenizer::load(model);
  const int32_t bos = 1, eos = 2;
  ASSERT_EQ(t->vocab_size(), 500);
  std::vector<int32_t> want = t->tokenize("in the");
  want.push_back(eos);
  const std::vector<int32_t> rest = t->tokenize("beginning");
  want.insert(want.end(), rest.begin(), rest.end());
  EXPECT_EQ(t->tokenize("in the</s>beginning"), want);
  EXPECT_EQ(t->decode(want), "in the beginning");         // "beginning" has its own "▁" prefix
  EXPECT_EQ(t->decode(want, false), "in the beginning");  // the library's </s> reads as nothing

  const fs::path dir = fs::temp_directory_path() / ("brisk_spm_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  fs::copy_file(model, dir / "tokenizer.model", fs::copy_options::overwrite_existing);
  std::ofstream((dir / "tokenizer_config.json").string())
      << R"({"add_bos_token": false, "add_eos_token": true})";
  const auto with_eos = Tokenizer::load(dir.string());
  const std::vector<int32_t> a = t->tokenize("light"), b = t->tokenize("dark");
  std::vector<int32_t> pair = a;
  pair.push_back(eos);
  pair.insert(pair.end(), b.begin(), b.end());
  pair.push_back(eos);
  const Encoded e = with_eos->encode("light", std::string_view("dark"), 0);
  EXPECT_EQ(e.ids, pair);
  EXPECT_EQ(e.type_ids.front(), 0);
  EXPECT_EQ(e.type_ids.back(), 1);
  EXPECT_EQ(t->encode("light", std::nullopt, 0).ids.front(), bos);
  fs::remove_all(dir);
}

// Unigram (Viterbi over the piece scores, unknown characters fused) with the Metaspace
// pre-tokenizer and decoder; with byte fallback, prepend_scheme "first" and no split; after a
// WhitespaceSplit.
TEST(Tokenizer, UnigramWithMetaspaceEqualsTheLibrary) {
  expect_like_the_library("unigram", fixture("tokenizer/unigram"));
  expect_like_the_library("unigram_byte_fallback", fixture("tokenizer/unigram_byte_fallback"));
  expect_like_the_library("unigram_whitespace", fixture("tokenizer/unigram_whitespace"));
}

// Bytes that are not UTF-8 read as U+FFFD each (encoding never throws: it runs in parallel loops).
TEST(Tokenizer, TextThatIsNotUtf8IsReadAsReplacementCharacters) {
  for (const char* name : {"bpe", "bpe_llama3", "bpe_byte_fallback", "wordpiece",
                           "sentencepiece_unigram", "unigram"}) {
    const auto t = Tokenizer::load(fixture(std::string("tokenizer/") + name));
    EXPECT_EQ(t->tokenize("ok \xC3\x28 bad \xFF"), t->tokenize("ok \uFFFD( bad \uFFFD")) << name;
  }
}

TEST(Tokenizer, MalformedFilesAreRefusedByName) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("brisk_tok_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream((dir / name).string()) << text;
    return (dir / name).string();
  };
  expect_error([&] { Tokenizer::load(dir.string()); }, "no tokenizer at");
  expect_error([&] { Tokenizer::load(write("a.json", "{\"model\": 3}")); }, "no model");
  expect_error([&] { Tokenizer::load(write("b.json", R"({"model": {"type": "WordLevel"}})")); },
               "tokenizer model \"WordLevel\" is not supported");
  expect_error(
      [&] {
        Tokenizer::load(write("c.json", R"({"model": {"type": "WordPiece", "vocab": {"a": 0}}})"));
      },
      "lacks its unknown token \"[UNK]\"");
  expect_error(
      [&] {
        Tokenizer::load(
            write("d.json", R"({"model": {"type": "WordPiece", "vocab": {"[UNK]": -1}}})"));
      },
      "has no valid id");
  expect_error(
      [&] {
        Tokenizer::load(write("e.json", R"({"pre_tokenizer": {"type": "ByteLevel"},
            "model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a a"]}})"));
      },
      "makes a token the vocabulary lacks");
  const std::string bpe_head =
      R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}, "pre_tokenizer": )";
  expect_error(
      [&] {
        Tokenizer::load(write("f.json", bpe_head + R"({"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": "(a"}, "behavior": "Isolated"},
            {"type": "ByteLevel", "use_regex": false}]}})"));
      },
      "cannot compile the pre-tokenizer pattern \"(a\"");
  expect_error(
      [&] {
        Tokenizer::load(write("g.json", bpe_head + R"({"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": "a"}, "behavior": "Removed"},
            {"type": "ByteLevel", "use_regex": false}]}})"));
      },
      "only a Split on a regex, isolated");
  expect_error([&] { Tokenizer::load(write("h.json", bpe_head + R"({"type": "Metaspace"}})")); },
               "pre_tokenizer \"Metaspace\" is not supported with BPE");
  // A padding id outside the vocabulary (or not a whole number) is no token.
  for (const char* id : {"2e+40", "1", "-1", "\"0\""})
    expect_error(
        [&] {
          Tokenizer::load(
              write("pad.json", R"({"model": {"type": "WordPiece", "vocab": {"[UNK]": 0}},
              "padding": {"pad_id": )" +
                                    std::string(id) + "}}"));
        },
        std::string("padding.pad_id ") + id + " is not a token id (the vocabulary has 1)");
  const std::string wp_head = R"({"model": {"type": "WordPiece", "vocab": {"[UNK]": 0}},
      "post_processor": {"type": "TemplateProcessing", )";
  expect_error(
      [&] {
        Tokenizer::load(write("i.json", wp_head + R"("single": [{"SpecialToken": {"id": "[X]"}},
            {"Sequence": {"id": "A"}}], "pair": [], "special_tokens": {}}})"));
      },
      "special token \"[X]\" has no ids");
  expect_error(
      [&] {
        Tokenizer::load(write("j.json", wp_head + R"("single": [{"Sequence": {"id": "A"}}],
            "pair": [{"Sequence": {"id": "A"}}], "special_tokens": {}}})"));
      },
      "the pair template must hold $A and $B");
  expect_error(
      [&] {
        Tokenizer::load(write("k.json", wp_head + R"("single": [{"Sequence": {"id": "B"}}],
            "pair": [], "special_tokens": {}}})"));
      },
      "the single template names sequence \"B\"");
  expect_error(
      [&] {
        Tokenizer::load(write("l.json", R"({"model": {"type": "BPE", "byte_fallback": true,
            "vocab": {"a": 0}, "merges": [], "unk_token": "<unk>"}})"));
      },
      "lacks its unknown token \"<unk>\"");
  expect_error(
      [&] {
        Tokenizer::load(write("m.json", R"({"model": {"type": "BPE", "byte_fallback": true,
            "vocab": {"a": 0}, "merges": []}, "normalizer": {"type": "NFKC"}})"));
      },
      "normalizer \"NFKC\" is not supported with byte-fallback BPE");
  expect_error([&] { Tokenizer::load(write("n.model", "\x0a\x05not a model")); },
               "n.model' is not a valid SentencePiece model: ");
  expect_error([&] { Tokenizer::load(write("o.model", "")); },
               "is not a valid SentencePiece model");
  write("vocab.json", R"({"a": 0, "b": 1})");
  write("merges.txt", "#version: 0.2\na b c\n");
  expect_error([&] { Tokenizer::load((dir / "vocab.json").string()); },
               "merges.txt':2: a merge is two symbols");
  fs::remove_all(dir);
}

}  // namespace
}  // namespace brisk::testing
