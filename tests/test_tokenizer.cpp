// Tokenizers against the `tokenizers` library on the same vocabularies and texts
// (tests/fixtures/tokenizer, from scripts/make_tokenizer_fixtures.py): WordPiece with BERT's
// normalizer (uncased and cased) and GPT-2's byte-level BPE, each loaded from tokenizer.json and
// from its legacy files; single texts, texts without special tokens, truncated pairs, decoding.
#include <gtest/gtest.h>

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
  for (size_t i = 0; i < want["decoded"].size(); ++i)
    EXPECT_EQ(t->decode(want["single"][i].get<std::vector<int32_t>>()),
              want["decoded"][i].get<std::string>())
        << "line " << i;
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
  expect_error([&] { Tokenizer::load(write("b.json", R"({"model": {"type": "Unigram"}})")); },
               "tokenizer model \"Unigram\" is not supported");
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
  write("vocab.json", R"({"a": 0, "b": 1})");
  write("merges.txt", "#version: 0.2\na b c\n");
  expect_error([&] { Tokenizer::load((dir / "vocab.json").string()); },
               "merges.txt':2: a merge is two symbols");
  fs::remove_all(dir);
}

}  // namespace
}  // namespace brisk::testing
