// Data files and weights as an attacker writes them: many distinct keys, many header entries,
// whole-number labels beyond 64 bits, tokenization caches with a matching checksum but values
// (or arrays) this run cannot use. Each is read in time linear in its size, kept exact, rebuilt
// or refused with one line; never a signal, a hang or silent garbage.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "core/json_file.h"
#include "core/safetensors.h"
#include "data/text_dataset.h"
#include "data/text_table.h"
#include "data/token_cache.h"
#include "test_support.h"
#include "train/trainer.h"
#include "trainer_support.h"

namespace brisk::testing {
namespace {

namespace fs = std::filesystem;

// A safetensors file of `n` one-element float32 entries ("t0", "t1", ...), written as text.
std::string many_entries(const TempDir& dir, int n) {
  std::string header = "{";
  for (int i = 0; i < n; ++i)
    header += (i ? ",\"t" : "\"t") + std::to_string(i) + R"(":{"dtype":"F32","shape":[1],)" +
              R"("data_offsets":[)" + std::to_string(4 * i) + "," + std::to_string(4 * i + 4) +
              "]}";
  header += "}";
  while ((header.size() + 8) % 8) header += ' ';
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>(header.size() >> (8 * i));
  const std::string path = dir / "many.safetensors";
  std::ofstream(path, std::ios::binary) << bytes << header << std::string(4 * size_t(n), '\0');
  return path;
}

// A header of 100000 entries is read and written back whole (the JSON parser's callback, used for
// the depth bound, once made this take minutes; the growth is measured by
// bench/bounded_files.py, not here).
TEST(BoundedFiles, ManyHeaderEntriesAreReadAndWrittenWhole) {
  TempDir dir("bounded_entries");
  const SafetensorsFile f(many_entries(dir, 100000));
  EXPECT_EQ(f.names().size(), 100000u);
  EXPECT_EQ(f.get("t99999").numel(), 1);
  // Written back in the order given.
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (int i = 0; i < 100000; i += 2) {
    const std::string name = "t" + std::to_string(i);
    tensors.emplace_back(name, f.get(name));
  }
  write_safetensors(dir / "half.safetensors", tensors);
  EXPECT_EQ(SafetensorsFile(dir / "half.safetensors").names().size(), 50000u);
  // A name given twice would leave a header whose ranges do not tile: refused when writing.
  expect_error(
      [&] {
        write_safetensors(dir / "twice.safetensors", {tensors[0], tensors[0]});
      },
      "write_safetensors: the name 't0' is given twice or reserved");
}

// A JSON Lines file of 4096 distinct keys, each first met on a later row, and one record naming
// 4096 keys, read into the right cells (sizes that took minutes when each new key re-laid the
// rows read so far; the growth is measured by bench/bounded_files.py, not here).
TEST(BoundedFiles, ManyDistinctKeysAreReadIntoTheirCells) {
  // 4096 distinct keys (the most a table has), each first met on its own row, then more rows.
  std::string jsonl;
  for (int i = 0; i < 4095; ++i)
    jsonl += "{\"text\": \"row\", \"k" + std::to_string(i) + "\": " + std::to_string(i) + "}\n";
  for (int i = 0; i < 20000; ++i) jsonl += "{\"k4094\": 1}\n";
  // One record naming every key: an ordered document searched its keys at each insertion.
  std::string wide = "{";
  for (int i = 0; i < 4096; ++i) wide += (i ? ",\"w" : "\"w") + std::to_string(i) + "\": 0";
  wide += "}\n";
  const TextTable t = parse_text_table(jsonl, TableFormat::json_lines, "many.jsonl");
  const TextTable w = parse_text_table(wide, TableFormat::json_lines, "wide.jsonl");
  ASSERT_EQ(t.columns().size(), 4096u);
  ASSERT_EQ(t.rows(), 4095 + 20000);
  EXPECT_EQ(t.text(7, 8), "7");  // row 7 holds k7 (column 8, after "text")
  EXPECT_EQ(t.kind(7, 9), CellKind::null);
  EXPECT_EQ(t.kind(6, 8), CellKind::null);
  EXPECT_EQ(t.text(5000, 4095), "1");
  EXPECT_EQ(t.text(5000, 0), "");
  EXPECT_EQ(w.columns().size(), 4096u);
  EXPECT_EQ(w.columns()[4095], "w4095");
}

// The nesting bound is checked before parsing in one pass that skips strings; the limit still
// holds and brackets inside strings (escaped quotes included) do not count.
TEST(BoundedFiles, JsonNestingIsBoundedOutsideStringsOnly) {
  auto parse = [](const std::string& s, int depth) {
    return parse_json_bounded(s.data(), s.data() + s.size(), "x.json", depth);
  };
  EXPECT_EQ(parse(R"({"a": "[[[[{{{{", "b": "\"[[[["})", 1)["b"], "\"[[[[");
  EXPECT_EQ(parse("[[[1]]]", 3)[0][0][0], 1);
  expect_error([&] { parse("[[[[1]]]]", 3); }, "x.json is not valid JSON: nested deeper than 3");
  expect_error([&] { parse(R"({"a": [)", 3); }, "x.json is not valid JSON: ");
}

// Whole-number labels are compared by their exact digits, however many: 2^63 and 2^63 + 1 are
// two classes (they were one, each read as the largest int64), sorted numerically, in JSON Lines
// and CSV alike; "007" and "7" remain one class.
TEST(BoundedFiles, WholeNumberLabelsBeyondSixtyFourBitsStayDistinct) {
  struct Case {
    const char* name;
    TableFormat format;
    std::string text;
    std::vector<std::string> classes;
  };
  const std::vector<Case> cases = {
      {"jsonl_unsigned",
       TableFormat::json_lines,
       "{\"s\": \"a\", \"label\": 9223372036854775808}\n"
       "{\"s\": \"b\", \"label\": 9223372036854775809}\n"
       "{\"s\": \"c\", \"label\": 1}\n",
       {"1", "9223372036854775808", "9223372036854775809"}},
      {"jsonl_beyond_64_bits",
       TableFormat::json_lines,
       "{\"s\": \"a\", \"label\": 100000000000000000000000000001}\n"
       "{\"s\": \"b\", \"label\": 100000000000000000000000000000}\n"
       "{\"s\": \"c\", \"label\": -100000000000000000000000000000}\n",
       {"-100000000000000000000000000000", "100000000000000000000000000000",
        "100000000000000000000000000001"}},
      {"csv",
       TableFormat::csv,
       "s,label\na,9223372036854775808\nb,9223372036854775809\nc,-9223372036854775809\n"
       "d,007\ne,7\n",
       {"-9223372036854775809", "7", "9223372036854775808", "9223372036854775809"}},
      {"csv_signs",
       TableFormat::csv,
       "s,label\na,-0\nb,+0\nc,-12\nd,-3\ne,+5\n",
       {"-12", "-3", "0", "5"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const TextTable t = parse_text_table(c.text, c.format, c.name);
    const LabelSet labels = label_set(t, t.column("label"));
    EXPECT_FALSE(labels.regression);
    EXPECT_TRUE(labels.whole);
    EXPECT_EQ(labels.names, c.classes);
    for (int64_t r = 0; r < t.rows(); ++r)
      EXPECT_GE(labels.id_of(t.text(r, t.column("label"))), 0) << r;
  }
  // In an evaluation file a real of whole value names that class; any other real names none
  // (it was cut to its whole part: 2.5 was class 2).
  const LabelSet labels =
      label_set(parse_text_table("s,label\na,1\nb,2\n", TableFormat::csv, "t"), 1);
  EXPECT_EQ(labels.id_of("2.0"), 1);
  EXPECT_EQ(labels.id_of("1e0"), 0);
  EXPECT_EQ(labels.id_of("2.5"), -1);
  EXPECT_EQ(labels.id_of("0x2"), -1);
}

// What the JSON Lines reader refuses, each with the file and line.
TEST(BoundedFiles, MalformedRecordsAreNamedByFileAndLine) {
  std::string keys;
  for (int i = 0; i <= 4096; ++i) keys += "{\"k" + std::to_string(i) + "\": 1}\n";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {keys, "d.jsonl:4097: more than 4096 distinct keys"},
      {"{\"a\": 1}\n{\"a\": {\"b\": 1}}\n", "d.jsonl:2: \"a\" holds a list or object"},
      {"{\"a\": 1}\n5\n", "d.jsonl:2: a record must be a JSON object"},
      {"{\"a\": 1}\n[{\"a\": 1}]\n", "d.jsonl:2: a record must be a JSON object"},
      {"{\"a\": 1} {\"a\": 2}\n", "d.jsonl:1 is not valid JSON"},
      {"[{\"a\": 1}, 2]", "d.jsonl:1: a record must be a JSON object"},
      {"[{\"a\": 1}, [2]]", "d.jsonl:1: a record must be a JSON object"},
      {"[{\"a\": [2]}]", "d.jsonl:1: \"a\" holds a list or object"},
      {"[{\"a\": 1}", "d.jsonl:1 is not valid JSON"},
  };
  for (const auto& [text, needle] : cases)
    expect_error([&] { parse_text_table(text, TableFormat::json_lines, "d.jsonl"); }, needle);
  // A key given twice keeps its last value, as JSON readers do.
  const TextTable t =
      parse_text_table("{\"a\": 1, \"b\": 2, \"a\": null}\n", TableFormat::json_lines, "d.jsonl");
  EXPECT_EQ(t.kind(0, 0), CellKind::null);
  EXPECT_EQ(t.text(0, 1), "2");
}

// Bytes in 8-byte-aligned memory, as a mapping is.
struct Aligned {
  std::vector<uint64_t> words;
  size_t size = 0;
  explicit Aligned(const std::string& bytes)
      : words((bytes.size() + 7) / 8 + 1), size(bytes.size()) {
    if (!bytes.empty()) std::memcpy(words.data(), bytes.data(), bytes.size());
  }
  std::string_view view() const { return {reinterpret_cast<const char*>(words.data()), size}; }
};

// A cache with a matching checksum is used only when its values fit the run: ids inside the
// vocabulary, types inside the model's, labels among the classes (or none), values not infinite.
// Caches made by another program from the documented layout are accepted when they are valid:
// without token types (all 0), of zero rows, or a token stream with types.
TEST(BoundedFiles, TokenCacheValuesAreCheckedAgainstTheRun) {
  const TokenLimits limits{100, 2, 3};
  struct Case {
    const char* name;
    TokenArrays arrays;
    const char* refused;  // nullptr: accepted
  };
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<Case> cases = {
      {"fits", {{0, 2, 3}, {1, 99, 5}, {0, 1, 0}, {2, kIgnoreIndex}, {}}, nullptr},
      {"id_beyond", {{0, 2, 3}, {1, 100, 5}, {0, 0, 0}, {0, 1}, {}}, "outside the vocabulary"},
      {"id_negative", {{0, 1}, {-1}, {0}, {0}, {}}, "outside the vocabulary"},
      {"type_beyond", {{0, 1}, {1}, {2}, {0}, {}}, "a token type outside"},
      {"label_beyond", {{0, 1}, {1}, {0}, {3}, {}}, "a label outside the classes"},
      {"label_negative", {{0, 1}, {1}, {0}, {-1}, {}}, "a label outside the classes"},
      {"value_infinite", {{0, 1}, {1}, {0}, {}, {inf}}, "an infinite label value"},
      {"value_none", {{0, 1}, {1}, {0}, {}, {nan}}, nullptr},
      {"no_types", {{0, 2}, {4, 5}, {}, {1}, {}}, nullptr},
      {"zero_rows", {{0}, {}, {}, {}, {}}, nullptr},
      {"stream", {{}, {7, 8, 9, 10}, {}, {}, {}}, nullptr},
      {"stream_with_types", {{}, {7, 8}, {0, 1}, {}, {}}, nullptr},
      {"stream_id_beyond", {{}, {7, 800}, {}, {}, {}}, "outside the vocabulary"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    auto a = std::make_shared<TokenArrays>(c.arrays);
    const Aligned bytes(serialize_token_cache(5, view_of(a)));
    std::string why;
    const auto rows = parse_token_cache(bytes.view(), 5, limits, &why);
    if (!c.refused) {
      ASSERT_TRUE(rows) << why;
      EXPECT_EQ(rows->ids.size(), a->ids.size());
      EXPECT_EQ(rows->types.size(), a->types.size());
    } else {
      EXPECT_FALSE(rows);
      EXPECT_NE(why.find(c.refused), std::string::npos) << why;
    }
  }
  // Rows without types fill type 0.
  auto a = std::make_shared<TokenArrays>();
  a->offsets = {0, 2};
  a->ids = {4, 5};
  a->labels = {1};
  const TextClassificationDataset d(view_of(a), false, 0, 4);
  EXPECT_EQ(d.size(), 1);
}

// A run given a cache whose checksum matches but whose ids lie beyond the vocabulary, or whose
// rows are longer than this run's max_seq_length, tokenizes again (saying why) and trains as the
// run that made the cache did.
TEST(BoundedFiles, ACacheTheRunCannotUseIsRebuilt) {
  TempDir dir("bounded_cache");
  {
    std::ofstream f(dir / "train.csv");
    f << "sentence,label\n";
    for (int i = 0; i < 24; ++i)
      f << (i % 2 ? "good" : "bad") << " film " << i << "," << i % 2 << "\n";
  }
  TrainOptions o = tiny_options(write_wordpiece_bert(dir), dir / "out");
  o.tokenizer_name = fixture("tokenizer/wordpiece");
  o.train_file = dir / "train.csv";
  o.max_seq_length = 16;
  o.per_device_train_batch_size = 8;
  o.max_steps = 2;
  o.save_strategy = "no";
  auto run = [&](std::string* note) {
    std::string seen;
    const TrainSummary s = train(o, [&](const nlohmann::json& r) {
      if (r.contains("tokenized_cache")) seen += r["tokenized_cache"].get<std::string>() + "\n";
    });
    *note = seen;
    return s.train_loss;
  };
  std::string note;
  const double first = run(&note);
  ASSERT_NE(note.find("tokenized, cached in"), std::string::npos) << note;
  const fs::path cache = fs::directory_iterator(o.output_dir + "/tokenized_cache")->path();
  // Rewrites the cache under its own key (a valid checksum) with `change` applied to its arrays.
  auto tamper = [&](const std::function<void(TokenArrays&)>& change) {
    std::ifstream in(cache, std::ios::binary);
    std::stringstream s;
    s << in.rdbuf();
    const Aligned bytes(s.str());
    uint64_t key = 0;
    std::memcpy(&key, bytes.view().data() + 8, sizeof key);
    std::string why;
    const TokenLimits wide{int64_t{1} << 31, int64_t{1} << 31, int64_t{1} << 31};
    const auto rows = parse_token_cache(bytes.view(), key, wide, &why);
    ASSERT_TRUE(rows) << why;
    TokenArrays a{{rows->offsets.begin(), rows->offsets.end()},
                  {rows->ids.begin(), rows->ids.end()},
                  {rows->types.begin(), rows->types.end()},
                  {rows->labels.begin(), rows->labels.end()},
                  {rows->values.begin(), rows->values.end()}};
    change(a);
    std::ofstream(cache, std::ios::binary)
        << serialize_token_cache(key, view_of(std::make_shared<TokenArrays>(a)));
  };
  struct Case {
    const char* name;
    std::function<void(TokenArrays&)> change;
    const char* why;
  };
  const std::vector<Case> cases = {
      {"id_beyond_vocabulary", [](TokenArrays& a) { a.ids[1] = 5000; }, "outside the vocabulary"},
      {"label_beyond_classes", [](TokenArrays& a) { a.labels[0] = 2; }, "outside the classes"},
      {"row_too_long",
       [](TokenArrays& a) {
         a.ids.insert(a.ids.begin(), 20, 5);
         a.types.insert(a.types.begin(), 20, 0);
         for (size_t r = 1; r < a.offsets.size(); ++r) a.offsets[r] += 20;
       },
       "more than 16"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    tamper(c.change);
    EXPECT_EQ(run(&note), first);
    EXPECT_NE(note.find(c.why), std::string::npos) << note;
    EXPECT_NE(note.find("tokenized again"), std::string::npos) << note;
    run(&note);  // the rebuilt cache is mapped
    EXPECT_NE(note.find("mapped from"), std::string::npos) << note;
  }
}

// The brisk binary on such files: exit 1 and one line naming the file, never a signal.
TEST(BoundedFiles, TheCliRefusesBadDataFilesWithOneLine) {
  TempDir dir("bounded_cli");
  auto file = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir / name, std::ios::binary) << text;
    return dir / name;
  };
  std::string keys;
  for (int i = 0; i <= 4096; ++i)
    keys += "{\"sentence\": \"a\", \"label\": 1, \"k" + std::to_string(i) + "\": 1}\n";
  std::string deep_header = "{\"a\":" + std::string(100, '[') + std::string(100, ']') + "}";
  std::string header_bytes(8, '\0');
  for (int i = 0; i < 8; ++i) header_bytes[i] = static_cast<char>(deep_header.size() >> (8 * i));
  const std::string train = "train --model bert-tiny --tokenizer_name " +
                            fixture("tokenizer/wordpiece") + " --max_steps 1 --output_dir " +
                            (dir / "out") + " --train_file ";
  const std::string bert = fixture("bert_tiny/");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {train + file("keys.jsonl", keys), "keys.jsonl:4095: more than 4096 distinct keys"},
      {train + file("nested.jsonl", "{\"sentence\": \"a\", \"label\": [1]}\n"),
       "nested.jsonl:1: \"label\" holds a list or object"},
      {train + file("one_class.jsonl",
                    "{\"sentence\": \"a\", \"label\": 9223372036854775808}\n"
                    "{\"sentence\": \"b\", \"label\": 9223372036854775808}\n"),
       "the labels take 1 value"},
      {"forward-backward --config " + bert + " --batch " + bert + "batch.safetensors --weights " +
           file("deep.safetensors", header_bytes + deep_header),
       "nested deeper than 8 levels"},
  };
  for (const auto& [args, needle] : cases) {
    const std::string out = dir / "stdout", err = dir / "stderr";
    const int status = std::system(("timeout 60 " + std::string(BRISK_BINARY) + " " + args + " > " +
                                    out + " 2> " + err + " < /dev/null")
                                       .c_str());
    std::ifstream in(err);
    std::stringstream s;
    s << in.rdbuf();
    const std::string e = s.str();
    SCOPED_TRACE(args.substr(0, 160));
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 1) << e;
    EXPECT_EQ(e.rfind("brisk: error: ", 0), 0u) << e;
    EXPECT_NE(e.find(needle), std::string::npos) << e;
    EXPECT_EQ(e.find('\n'), e.size() - 1) << e;
    EXPECT_LE(e.size(), 400u) << e;
  }
}

}  // namespace
}  // namespace brisk::testing
