// The tokenization cache: the file format round trip and its refusals, and runs that map the
// rows an earlier run tokenized (and tokenize again whenever the file, the options or the cache
// itself changed).
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "data/token_cache.h"
#include "test_support.h"
#include "train/trainer.h"
#include "trainer_support.h"

namespace brisk::testing {
namespace {

namespace fs = std::filesystem;

// Bytes in 8-byte-aligned memory, as a mapping is.
struct Aligned {
  std::vector<uint64_t> words;
  size_t size = 0;
  explicit Aligned(const std::string& bytes) : words((bytes.size() + 7) / 8), size(bytes.size()) {
    if (!bytes.empty()) std::memcpy(words.data(), bytes.data(), bytes.size());
  }
  std::string_view view() const { return {reinterpret_cast<const char*>(words.data()), size}; }
};

// Limits no value of these tests' caches reaches.
const TokenLimits kWide{int64_t{1} << 31, int64_t{1} << 31, int64_t{1} << 31};

TEST(TokenCache, RoundTripsAndRefusesWhatIsNotACompleteCacheForItsKey) {
  auto a = std::make_shared<TokenArrays>();
  a->offsets = {0, 3, 3, 5};
  a->ids = {2, 10, 3, 2, 3};
  a->types = {0, 0, 0, 1, 1};
  a->labels = {1, kIgnoreIndex, 0};
  const TokenizedRows rows = view_of(a);
  const std::string bytes = serialize_token_cache(77, rows);
  const Aligned good(bytes);
  std::string why;
  const auto back = parse_token_cache(good.view(), 77, kWide, &why);
  ASSERT_TRUE(back) << why;
  EXPECT_EQ(std::vector<int64_t>(back->offsets.begin(), back->offsets.end()), a->offsets);
  EXPECT_EQ(std::vector<int32_t>(back->ids.begin(), back->ids.end()), a->ids);
  EXPECT_EQ(std::vector<int32_t>(back->types.begin(), back->types.end()), a->types);
  EXPECT_EQ(std::vector<int32_t>(back->labels.begin(), back->labels.end()), a->labels);
  EXPECT_TRUE(back->values.empty());

  EXPECT_FALSE(parse_token_cache(good.view(), 78, kWide, &why));
  EXPECT_NE(why.find("other data"), std::string::npos) << why;
  for (size_t n = 0; n < bytes.size(); ++n)  // every truncation
    EXPECT_FALSE(parse_token_cache(Aligned(bytes.substr(0, n)).view(), 77, kWide, &why)) << n;
  EXPECT_FALSE(parse_token_cache(Aligned(bytes + "x").view(), 77, kWide, &why));
  for (size_t at = 48; at < bytes.size(); ++at) {  // every flipped byte of the arrays
    std::string bad = bytes;
    bad[at] ^= 0x10;
    EXPECT_FALSE(parse_token_cache(Aligned(bad).view(), 77, kWide, &why)) << at;
    EXPECT_NE(why.find("checksum"), std::string::npos) << why;
  }
  // A cache of format version 1 (hashed with FNV-1a) is not misread.
  std::string version1 = bytes;
  version1[7] = '1';
  EXPECT_FALSE(parse_token_cache(Aligned(version1).view(), 77, kWide, &why));
  EXPECT_NE(why.find("another version of the cache format"), std::string::npos) << why;
  std::string misaligned = " " + bytes;
  EXPECT_FALSE(parse_token_cache(std::string_view(misaligned).substr(1), 77, kWide, &why));

  // The fuzz seeds (written by another program from the documented layout) parse too.
  for (const auto& [name, key] : {std::pair<const char*, uint64_t>{"classification.tok", 7},
                                  {"regression.tok", 9},
                                  {"causal_lm.tok", 11}}) {
    std::ifstream f(std::string(BRISK_FIXTURES_DIR) + "/../../fuzz/corpus/token_cache/" + name,
                    std::ios::binary);
    std::stringstream s;
    s << f.rdbuf();
    EXPECT_TRUE(parse_token_cache(Aligned(s.str()).view(), key, kWide, &why))
        << name << ": " << why;
  }
}

// The fingerprint is XXH3 (64 bits) of each part's length (8 bytes) and bytes: nothing added is
// XXH3's value of no input, and parts keep their boundaries.
TEST(TokenCache, FingerprintsAreXxh3OfEachPartAndItsLength) {
  EXPECT_EQ(Fingerprint().value(), 0x2d06800538d394c2ull);
  EXPECT_EQ(Fingerprint().add("abc").value(), 0x7ef7c2a83cf8364eull);
  EXPECT_NE(Fingerprint().add("ab").add("c").value(), Fingerprint().add("a").add("bc").value());
  EXPECT_EQ(Fingerprint().add("ab").add("c").value(), Fingerprint().add("ab").add("c").value());
}

// A cache path that is not a regular file (a FIFO, which blocks whoever opens it to read) is
// a cache to rebuild, found without blocking; writing the new one replaces it.
TEST(TokenCache, AFifoInThePlaceOfACacheIsNotWaitedOn) {
  TempDir dir("cache_fifo");
  const std::string path = dir / "rows.tok";
  ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0);
  std::string why;
  EXPECT_FALSE(read_token_cache(path, 5, kWide, &why));
  EXPECT_NE(why.find("is not a regular file (a FIFO)"), std::string::npos) << why;
  auto a = std::make_shared<TokenArrays>();
  a->offsets = {0, 2};
  a->ids = {4, 5};
  a->types = {0, 0};
  a->labels = {1};
  write_token_cache(path, 5, view_of(a));
  EXPECT_TRUE(read_token_cache(path, 5, kWide, &why)) << why;
}

// Two runs on the same CSV: the second maps what the first tokenized, and trains the same; a
// changed file, overwrite_cache or a damaged cache tokenize again; "none" writes nothing.
TEST(TokenCache, ALaterRunMapsTheRowsAnEarlierRunTokenized) {
  TempDir dir("token_cache");
  auto write_csv = [&](int rows) {
    std::ofstream f(dir / "train.csv");
    f << "sentence,label\n";
    for (int i = 0; i < rows; ++i)
      f << (i % 3 ? "good" : "bad") << " film number " << i << "," << (i % 3 ? "pos" : "neg")
        << "\n";
  };
  write_csv(40);
  const std::string model = write_wordpiece_bert(dir);
  TrainOptions o = tiny_options(model, dir / "out");
  o.tokenizer_name = fixture("tokenizer/wordpiece");
  o.train_file = dir / "train.csv";
  o.max_seq_length = 16;
  o.per_device_train_batch_size = 8;
  o.max_steps = 4;
  o.save_strategy = "no";
  auto run = [&](const TrainOptions& t, std::string* note) {
    std::string seen;
    const TrainSummary s = train(t, [&](const nlohmann::json& r) {
      if (r.contains("tokenized_cache")) seen += r["tokenized_cache"].get<std::string>() + "\n";
    });
    *note = seen;
    return s.train_loss;
  };
  std::string note;
  const double first = run(o, &note);
  EXPECT_NE(note.find("tokenized, cached in"), std::string::npos) << note;
  const double again = run(o, &note);
  EXPECT_NE(note.find("mapped from"), std::string::npos) << note;
  EXPECT_EQ(again, first);
  TrainOptions over = o;
  over.overwrite_cache = true;
  run(over, &note);
  EXPECT_NE(note.find("tokenized, cached in"), std::string::npos) << note;
  // Byte `at` of every cache file set to `byte`.
  auto overwrite = [&](std::streamoff at, char byte) {
    for (const auto& e : fs::directory_iterator(o.output_dir + "/tokenized_cache")) {
      std::fstream f(e.path(), std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(at);
      f.put(byte);
    }
  };
  // Damaged: tokenized again, with the reason.
  overwrite(60, '\x7f');
  EXPECT_EQ(run(o, &note), first);
  EXPECT_NE(note.find("checksum"), std::string::npos) << note;
  // A header naming a newer format version: tokenized again, never mapped.
  overwrite(7, '3');
  EXPECT_EQ(run(o, &note), first);
  EXPECT_NE(note.find("another version of the cache format"), std::string::npos) << note;
  EXPECT_EQ(note.find("mapped from"), std::string::npos) << note;
  // Another file: another key.
  write_csv(48);
  run(o, &note);
  EXPECT_NE(note.find("tokenized, cached in"), std::string::npos) << note;
  EXPECT_EQ(std::distance(fs::directory_iterator(o.output_dir + "/tokenized_cache"),
                          fs::directory_iterator()),
            2);
  TrainOptions none = o;
  none.output_dir = dir / "none";
  none.tokenized_cache_dir = "none";
  run(none, &note);
  EXPECT_TRUE(note.empty()) << note;
  EXPECT_FALSE(fs::exists(none.output_dir + "/tokenized_cache"));
}

}  // namespace
}  // namespace brisk::testing
