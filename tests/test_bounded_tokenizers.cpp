// Tokenizer files made to crash brisk or keep it busy without end (issue 50), each class refused
// within seconds with one line naming it, in the library and through `brisk tokenize` (exit 1,
// never a signal); SentencePiece models with corrupted charsmaps, loaded in child processes so a
// crash fails the test; long words costing n log n (merges) or n times the longest token
// (WordPiece); the heap-driven merge loop against the rescan it replaced.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "core/json_file.h"
#include "test_support.h"
#include "tokenizer/charsmap.h"
#include "tokenizer/merges.h"
#include "tokenizer/tokenizer.h"

namespace brisk::testing {
namespace {

namespace fs = std::filesystem;

fs::path scratch() {
  const fs::path dir = fs::temp_directory_path() / ("brisk_bounded_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  return dir;
}

// The scratch folder goes when the tests end.
struct RemoveScratch : ::testing::Environment {
  void TearDown() override { fs::remove_all(scratch()); }
};
const auto* const kRemoveScratch = ::testing::AddGlobalTestEnvironment(new RemoveScratch);

std::string write(const std::string& name, const std::string& bytes) {
  const std::string path = (scratch() / name).string();
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

std::string read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct Run {
  bool signaled = false;
  int exit_code = -1;
  std::string err;
};

Run run_brisk(const std::string& args) {
  const std::string err = (scratch() / "stderr.txt").string();
  const std::string cmd = "timeout 20 " + std::string(BRISK_BINARY) + " " + args +
                          " > /dev/null 2> " + err + " < /dev/null";
  const int status = std::system(cmd.c_str());
  Run r;
  r.signaled = WIFSIGNALED(status) || (WIFEXITED(status) && WEXITSTATUS(status) >= 124);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.err = read(err);
  return r;
}

void expect_one_line(const Run& r, const std::string& message) {
  EXPECT_FALSE(r.signaled) << r.err;
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_EQ(r.err.rfind("brisk: error: ", 0), 0u) << r.err;
  EXPECT_NE(r.err.find(message), std::string::npos) << r.err;
  EXPECT_TRUE(!r.err.empty() && r.err.find('\n') == r.err.size() - 1) << r.err;
  EXPECT_LE(r.err.size(), 400u) << r.err;
}

// The byte range of the charsmap in a serialized ModelProto: field 3 (normalizer_spec), its
// field 2 (one-byte keys and lengths below 2^14 in the fixture).
std::pair<size_t, size_t> charsmap_range(const std::string& model) {
  auto varint = [&](size_t& at) {
    uint64_t v = 0;
    for (int shift = 0;; shift += 7) {
      const auto b = static_cast<unsigned char>(model.at(at++));
      v |= uint64_t{b & 0x7Fu} << shift;
      if (b < 0x80) return v;
    }
  };
  auto walk = [&](size_t begin, size_t end, uint64_t want, size_t& from, size_t& to) {
    for (size_t at = begin; at < end;) {
      const uint64_t key = varint(at);
      if ((key & 7) == 0) {
        varint(at);
        continue;
      }
      EXPECT_EQ(key & 7, 2u) << "the fixture holds other wire types";
      const uint64_t length = varint(at);
      if ((key >> 3) == want) {
        from = at;
        to = at + length;
        return true;
      }
      at += length;
    }
    return false;
  };
  size_t spec_from = 0, spec_to = 0, from = 0, to = 0;
  EXPECT_TRUE(walk(0, model.size(), 3, spec_from, spec_to));
  EXPECT_TRUE(walk(spec_from, spec_to, 2, from, to));
  return {from, to};
}

// Loads `model` in a child process and encodes texts over every byte: 0 it worked, 1 refused
// naming the charsmap, 2 refused otherwise; a crash is a signal.
int load_in_child(const std::string& path) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    int code = 0;
    try {
      const auto t = Tokenizer::load(path);
      std::string all;
      for (int b = 1; b < 256; ++b) all.push_back(static_cast<char>(b));
      for (const std::string& text : {all, std::string("Hello, wörld! ｶﾀｶﾅ ① ﬁ")})
        t->tokenize(text);
    } catch (const Error& e) {
      const std::string m = e.what();
      code = m.find("'" + path + "'") != std::string::npos &&
                     m.find("precompiled charsmap is malformed") != std::string::npos
                 ? 1
                 : 2;
    }
    ::_exit(code);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFSIGNALED(status) ? -WTERMSIG(status) : WEXITSTATUS(status);
}

// libsentencepiece 0.1.97 walks the trie unchecked: random trie bytes behind a kept size prefix,
// or one flipped byte, crashed it. Every case now loads and encodes, or is refused naming the
// file; random tries are refused.
TEST(BoundedTokenizers, CorruptCharsmapsAreRefusedNeverCrash) {
  const std::string model = read(fixture("tokenizer/sentencepiece_unigram/tokenizer.model"));
  const auto [from, to] = charsmap_range(model);
  ASSERT_GT(to, from + 4 + 1024) << "the fixture has a charsmap of 256 units";
  const std::string path = (scratch() / "tokenizer.model").string();
  ASSERT_EQ(load_in_child(write("tokenizer.model", model)), 0);
  int refused_random = 0, refused_flip = 0;
  constexpr int kSeeds = 100;
  for (int seed = 0; seed < kSeeds; ++seed) {
    std::mt19937 rng(static_cast<uint32_t>(seed));
    std::string random = model, flipped = model;
    for (size_t i = from + 4; i < from + 4 + 1024; ++i) random[i] = static_cast<char>(rng());
    const size_t at = from + 4 + rng() % (to - from - 4);  // trie or strings
    flipped[at] = static_cast<char>(flipped[at] ^ (1 << (rng() % 8)));
    using Case = std::pair<const std::string*, int*>;
    for (const auto& [bytes, refused] :
         std::vector<Case>{{&random, &refused_random}, {&flipped, &refused_flip}}) {
      write("tokenizer.model", *bytes);
      const int code = load_in_child(path);
      EXPECT_TRUE(code == 0 || code == 1) << "seed " << seed << ": " << code;
      *refused += code == 1;
    }
  }
  EXPECT_EQ(refused_random, kSeeds);
  EXPECT_GT(refused_flip, 0);
  // Through the command: one line naming the file.
  std::string random = model;
  for (size_t i = from + 4; i < from + 4 + 1024; ++i)
    random[i] = static_cast<char>(i * 2654435761u);
  const std::string input = write("input.txt", "hello\n");
  expect_one_line(
      run_brisk("tokenize --tokenizer " + write("tokenizer.model", random) + " --input " + input),
      "'" + path + "': the SentencePiece normalizer's precompiled charsmap is malformed");
}

// The blob's own checks, each refusal named.
TEST(BoundedTokenizers, CharsmapBlobsAreCheckedStrictly) {
  auto units = [](std::vector<uint32_t> u, const std::string& strings) {
    std::string blob(4, '\0');
    const uint32_t size = static_cast<uint32_t>(4 * u.size());
    for (int i = 0; i < 4; ++i) blob[i] = static_cast<char>(size >> (8 * i));
    for (uint32_t v : u)
      for (int i = 0; i < 4; ++i) blob.push_back(static_cast<char>(v >> (8 * i)));
    return blob + strings;
  };
  // One rule, "a" -> "b": the root (unit 0, offset 0) has base 0; its child on 'a' (unit 'a')
  // has a leaf below and offset 256, so the leaf is unit 'a' ^ 256, holding value 0. The other
  // units are leaves, which no walk follows.
  std::vector<uint32_t> ok(512, 1u << 31);
  ok[0] = 0;
  ok['a'] = 'a' | (1u << 8) | (256u << 10);
  ok['a' ^ 256] = (1u << 31) | 0;
  EXPECT_NO_THROW(check_precompiled_charsmap(units(ok, std::string("b\0", 2)), "m"));
  const std::vector<std::pair<std::string, std::string>> cases = {
      {std::string("\x01\x00\x00", 3), "it holds 3 bytes"},
      {std::string("\x08\x00\x00\x00\x00\x00\x00\x00", 8),
       "its trie of 8 bytes is no whole number"},
      {std::string("\x03\x00\x00\x00\x00\x00\x00\x00", 8), "its trie of 3 bytes"},
      {units(std::vector<uint32_t>(255, 0), ""), "its trie leads to unit 255 of its 255"},
      {units(ok, "b"), "a rule maps to byte 0 of its 1 bytes of strings, past their last NUL"},
      {units(ok, ""), "a rule maps to byte 0 of its 0 bytes"},
  };
  for (const auto& [blob, message] : cases)
    expect_error([&] { check_precompiled_charsmap(blob, "m"); }, message);
  std::vector<uint32_t> far = ok;
  far['a'] = 'a' | (1u << 8) | (512u << 10);  // the leaf's base beyond the array
  expect_error([&] { check_precompiled_charsmap(units(far, std::string("b\0", 2)), "m"); },
               "its trie leads to unit 767 of its 512");
  std::vector<uint32_t> late = ok;
  late['a' ^ 256] = (1u << 31) | 2;  // a value past the last NUL
  expect_error([&] { check_precompiled_charsmap(units(late, std::string("b\0c", 3)), "m"); },
               "a rule maps to byte 2 of its 3 bytes of strings");
}

// A byte-level BPE tokenizer.json (a..z, no merges) with a Split on `pattern` before ByteLevel.
std::string split_bpe(const std::string& pattern) {
  nlohmann::json vocab = nlohmann::json::object();
  for (char c = 'a'; c <= 'z'; ++c) vocab[std::string(1, c)] = c - 'a';
  const nlohmann::json j = {
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::json::array()}}},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"},
           {"pattern", {{"Regex", pattern}}},
           {"behavior", "Isolated"},
           {"invert", false}},
          {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}}}};
  return j.dump();
}

// A Unigram tokenizer.json whose normalizer replaces "a" with "aa" `steps` times.
std::string doubling_unigram(int steps) {
  nlohmann::json chain = nlohmann::json::array();
  for (int i = 0; i < steps; ++i)
    chain.push_back({{"type", "Replace"}, {"pattern", {{"String", "a"}}}, {"content", "aa"}});
  return nlohmann::json{{"model",
                         {{"type", "Unigram"},
                          {"vocab", nlohmann::json::array({nlohmann::json::array({"a", -1.0})})},
                          {"unk_id", 0}}},
                        {"normalizer", {{"type", "Sequence"}, {"normalizers", chain}}}}
      .dump();
}

struct Refusal {
  const char* name;
  std::function<std::string()> tokenizer;  // writes the files, returns the path
  std::string text;
  std::string message;  // a part of the one line expected
};

std::vector<Refusal> refusals() {
  return {
      {"catastrophic Split regex", [] { return write("regex.json", split_bpe("(a+)+$")); },
       std::string(40, 'a') + "!",
       "the pre-tokenizer pattern \"(a+)+$\" ran past PCRE2's match limit of 10000000 steps"},
      // Each position backtracks up to 2^20 steps, under PCRE2's per-match limit, before the
      // one-character alternative matches: the text's budget ends it.
      {"Split regex under the match limit at every position of a long line",
       [] { return write("regex_every.json", split_bpe("(a+)+$|.")); },
       [] {
         std::string line;
         while (line.size() < 400000) line += std::string(20, 'a') + "!";
         return line;
       }(),
       "the pre-tokenizer pattern \"(a+)+$|.\" ran past its budget of 45600512 steps for a "
       "text of 400008 bytes"},
      {"Replace chain doubling the text",
       [] { return write("doubling.json", doubling_unigram(40)); }, "aaaaaaaaaa",
       "normalizer 9 (Replace \"a\") would make 5120 bytes of a text of 10, more than the 8 x + "
       "4096 bytes"},
  };
}

TEST(BoundedTokenizers, UnboundedWorkIsRefusedNamingItsLimit) {
  for (const Refusal& r : refusals()) {
    SCOPED_TRACE(r.name);
    const std::string path = r.tokenizer();
    const auto t = Tokenizer::load(path);
    expect_error([&] { t->tokenize(r.text); }, r.message);
    expect_error([&] { t->tokenize(r.text); }, "'" + path + "'");
  }
}

// The encoding runs in the command's parallel loop: the error is carried out of it, naming the
// line.
TEST(BoundedTokenizers, TheCommandLineEndsWithOneLineNeverASignal) {
  for (const Refusal& r : refusals()) {
    SCOPED_TRACE(r.name);
    const std::string input = write("input.txt", "b\n" + r.text + "\nc\n");
    expect_one_line(run_brisk("tokenize --tokenizer " + r.tokenizer() + " --input " + input),
                    "line 2 of the input: '");
    expect_one_line(run_brisk("tokenize --tokenizer " + r.tokenizer() + " --input " + input),
                    r.message);
  }
}

// The bpe fixture with `n` added tokens prefix + "i>" (ids after its vocabulary).
std::string with_added_tokens(int n, const std::string& prefix = "<added_") {
  nlohmann::json j = read_json_file(fixture("tokenizer/bpe/tokenizer.json"), "fixture");
  const int64_t first = static_cast<int64_t>(j["model"]["vocab"].size());
  for (int i = 0; i < n; ++i)
    j["added_tokens"].push_back(
        {{"id", first + i}, {"content", prefix + std::to_string(i) + ">"}, {"special", false}});
  return write("added_" + std::to_string(n) + ".json", j.dump());
}

// Added tokens are found by one walk of a trie from each position: the longest one there, as
// the scan of every token found it (a reference kept here), and in time bounded by the longest
// token whatever their number: 40,000 tokens sharing a prefix over a 200,000-character line.
TEST(BoundedTokenizers, AddedTokensAreMatchedInOnePassLongestFirst) {
  const auto t = Tokenizer::load(with_added_tokens(12));
  const std::string text = "a<added_1><added_11>b<added_<added_2<added_10>><added_1";
  std::vector<int32_t> want;
  size_t start = 0;
  auto plain = [&](size_t end) {
    if (end > start) {
      const std::vector<int32_t> ids = t->tokenize(text.substr(start, end - start));
      want.insert(want.end(), ids.begin(), ids.end());
    }
  };
  for (size_t at = 0; at < text.size();) {  // every token compared at every position
    size_t longest = 0;
    int32_t id = -1;
    for (int i = 0; i < 12; ++i) {
      const std::string token = "<added_" + std::to_string(i) + ">";
      if (text.compare(at, token.size(), token) == 0 && token.size() > longest)
        longest = token.size(), id = t->token_id(token);
    }
    if (longest == 0) {
      ++at;
      continue;
    }
    plain(at);
    want.push_back(id);
    start = at += longest;
  }
  plain(text.size());
  EXPECT_EQ(t->tokenize(text), want);
  // Every position of the line starts every token's 32-byte prefix.
  const std::string input = write("added_line.txt", std::string(200000, 'a') + "\n");
  const struct Run r =
      run_brisk("tokenize --count_only --tokenizer " +
                with_added_tokens(40000, std::string(32, 'a')) + " --input " + input);
  EXPECT_FALSE(r.signaled) << r.err;
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

// The merge loop before the heap: the lowest rank found by a rescan, every occurrence merged.
void merge_by_rescan(std::vector<std::string>& parts,
                     const std::unordered_map<std::string, int>& ranks) {
  std::string key;
  while (parts.size() > 1) {
    int best = INT_MAX;
    size_t at = 0;
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
      key.assign(parts[i]).append(1, '\x01').append(parts[i + 1]);
      const auto it = ranks.find(key);
      if (it != ranks.end() && it->second < best) {
        best = it->second;
        at = i;
      }
    }
    if (best == INT_MAX) break;
    const std::string a = parts[at], b = parts[at + 1];
    std::vector<std::string> merged;
    for (size_t i = 0; i < parts.size(); ++i) {
      if (i + 1 < parts.size() && parts[i] == a && parts[i + 1] == b) {
        merged.push_back(a + b);
        ++i;
      } else {
        merged.push_back(parts[i]);
      }
    }
    parts.swap(merged);
  }
}

// Random merge lists over a small alphabet, in training order or shuffled (a merge may then use
// a symbol a later one makes, or rank below the merge that made its side), on random words.
TEST(BoundedTokenizers, HeapMergesEqualTheRescanTheyReplace) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 400; ++trial) {
    std::vector<std::string> symbols = {"a", "b", "c"};
    std::vector<std::pair<std::string, std::string>> merges;
    for (int m = 0; m < 12; ++m) {
      const std::string& x = symbols[rng() % symbols.size()];
      const std::string& y = symbols[rng() % symbols.size()];
      merges.emplace_back(x, y);
      symbols.push_back(x + y);
    }
    if (trial % 2) std::shuffle(merges.begin(), merges.end(), rng);
    std::unordered_map<std::string, int> ranks;
    for (size_t i = 0; i < merges.size(); ++i)
      ranks.emplace(merges[i].first + '\x01' + merges[i].second, static_cast<int>(i));
    for (int w = 0; w < 10; ++w) {
      std::vector<std::string> word;
      for (size_t n = rng() % 24; n > 0; --n) word.push_back(std::string(1, "abc"[rng() % 3]));
      std::vector<std::string> want = word, got = word;
      merge_by_rescan(want, ranks);
      merge_pieces(got, ranks);
      ASSERT_EQ(got, want) << "trial " << trial << " word " << w;
    }
  }
}

// Long words: 256 KiB of letters merged through the GPT-2 fixture (one piece: decoded back
// whole), 100 KB split by WordPiece with no word limit (the rescan and the unbounded candidate
// took minutes on these; bench/bounded_tokenizers.py measures the growth).
TEST(BoundedTokenizers, LongWordsAreTokenizedWhole) {
  const auto gpt2 = Tokenizer::load(fixture("tokenizer/bpe/tokenizer.json"));
  std::string word;
  std::mt19937 rng(3);
  for (int i = 0; i < (1 << 18); ++i) word.push_back("etaoinshrdlu"[rng() % 12]);
  const std::vector<int32_t> ids = gpt2->tokenize(word);
  EXPECT_LT(ids.size(), word.size() * 3 / 4);  // merged
  EXPECT_EQ(gpt2->decode(ids), word);

  nlohmann::json vocab = {{"[UNK]", 0}, {"a", 1}, {"##a", 2}, {"##aa", 3}};
  const std::string path =
      write("wordpiece.json", nlohmann::json{{"model",
                                              {{"type", "WordPiece"},
                                               {"vocab", vocab},
                                               {"unk_token", "[UNK]"},
                                               {"max_input_chars_per_word", 1000000000000}}}}
                                  .dump());
  const auto wp = Tokenizer::load(path);
  const std::vector<int32_t> pieces = wp->tokenize(std::string(100001, 'a'));
  ASSERT_EQ(pieces.size(), 50001u);
  EXPECT_EQ(pieces.front(), 1);
  EXPECT_EQ(pieces.back(), 3);
  // A value beyond int64 is no limit, not a negative one that makes every word [UNK].
  nlohmann::json huge = nlohmann::json::parse(read(path));
  huge["model"]["max_input_chars_per_word"] = 18446744073709551615ull;
  const auto wp2 = Tokenizer::load(write("wordpiece2.json", huge.dump()));
  EXPECT_EQ(wp2->tokenize("aaa"), (std::vector<int32_t>{1, 3}));
}

}  // namespace
}  // namespace brisk::testing
