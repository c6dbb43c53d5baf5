// Data files as the example scripts take them: CSV/TSV quoting, embedded newlines, byte-order
// marks, CRLF, blank and malformed rows; JSON Lines; plain text; each problem named file:line.
#include <gtest/gtest.h>

#include <string>

#include "data/text_table.h"
#include "test_support.h"

namespace brisk::testing {
namespace {

TextTable csv(const std::string& text) {
  return parse_text_table(text, TableFormat::csv, "d.csv");
}

TEST(TextTable, CsvQuotingNewlinesBomAndCrlf) {
  const TextTable t =
      csv("\xEF\xBB\xBFsentence,label\r\n"
          "\"a, quoted \"\"field\"\"\",1\r\n"
          "\r\n"
          "\"two\nlines\",0\n"
          "plain,-3\n"
          ",2.5\n"
          "caf\xC3\xA9 \xF0\x9F\x98\x80,x");  // no final newline
  ASSERT_EQ(t.columns(), (std::vector<std::string>{"sentence", "label"}));
  ASSERT_EQ(t.rows(), 5);
  EXPECT_EQ(t.text(0, 0), "a, quoted \"field\"");
  EXPECT_EQ(t.text(1, 0), "two\nlines");
  EXPECT_EQ(t.line(1), 4);  // after a blank line
  EXPECT_EQ(t.line(2), 6);  // after the embedded newline
  EXPECT_EQ(t.where(2), "d.csv:6");
  EXPECT_EQ(t.kind(0, 1), CellKind::integer);
  EXPECT_EQ(t.kind(2, 1), CellKind::integer);
  EXPECT_EQ(t.kind(3, 0), CellKind::null);
  EXPECT_EQ(t.kind(3, 1), CellKind::real);
  EXPECT_EQ(t.kind(4, 1), CellKind::text);
  EXPECT_EQ(t.text(4, 0), "caf\xC3\xA9 \xF0\x9F\x98\x80");
  EXPECT_EQ(t.column("label"), 1);
  EXPECT_EQ(t.column("nope"), -1);
  // TSV: tabs separate, commas are text; an unnamed column gets pandas' name.
  const TextTable tsv = parse_text_table("\ta,b\n1\tx,y\n", TableFormat::tsv, "d.tsv");
  EXPECT_EQ(tsv.columns(), (std::vector<std::string>{"Unnamed: 0", "a,b"}));
  EXPECT_EQ(tsv.text(0, 1), "x,y");
}

TEST(TextTable, MalformedRowsAreNamedByFileAndLine) {
  expect_error([] { csv("a,b\n1,2\n3\n"); }, "d.csv:3: a row of 1 fields where the header has 2");
  expect_error([] { csv("a,b\n1,2,3\n"); }, "d.csv:2: a row of 3 fields");
  expect_error([] { csv("a,b\n\"open,2\n3,4\n"); }, "d.csv:2: a quoted field is never closed");
  expect_error([] { csv("a,b\n\"x\"y,2\n"); }, "d.csv:2: text after the closing quote");
  expect_error([] { csv("a,a\n1,2\n"); }, "d.csv:1: column \"a\" appears twice");
  expect_error([] { csv(""); }, "the file is empty");
  expect_error([] { csv("\n\n"); }, "the file is empty");
  expect_error([] { csv("a,b\n1,\xC3\x28\n"); }, "d.csv:2: invalid UTF-8");
  expect_error([] { csv("a\n\xED\xA0\x80\n"); }, "invalid UTF-8");  // a UTF-16 surrogate
  expect_error([] { csv("a\n\xC0\xAF\n"); }, "invalid UTF-8");      // an overlong form
}

TEST(TextTable, JsonLinesAndListsOfRecords) {
  const TextTable t = parse_text_table(
      "{\"text\": \"good\", \"label\": 1}\n\n"
      "{\"label\": 0.5, \"text\": \"x\\ny\", \"extra\": true}\r\n"
      "{\"text\": null}\n",
      TableFormat::json_lines, "d.jsonl");
  ASSERT_EQ(t.columns(), (std::vector<std::string>{"text", "label", "extra"}));
  ASSERT_EQ(t.rows(), 3);
  EXPECT_EQ(t.kind(0, 1), CellKind::integer);
  EXPECT_EQ(t.kind(0, 2), CellKind::null);  // a key first met on a later row
  EXPECT_EQ(t.text(1, 0), "x\ny");
  EXPECT_EQ(t.kind(1, 1), CellKind::real);
  EXPECT_EQ(t.kind(1, 2), CellKind::boolean);
  EXPECT_EQ(t.kind(2, 0), CellKind::null);
  EXPECT_EQ(t.line(2), 4);
  const TextTable list =
      parse_text_table(R"([{"a": "x"}, {"a": "y", "b": 2}])", TableFormat::json_lines, "d.json");
  EXPECT_EQ(list.rows(), 2);
  EXPECT_EQ(list.text(1, 1), "2");
  expect_error([] { parse_text_table("{\"a\": 1}\n[1]\n", TableFormat::json_lines, "d.jsonl"); },
               "d.jsonl:2: a record must be a JSON object");
  expect_error(
      [] { parse_text_table("{\"a\": 1}\n{\"a\": \n", TableFormat::json_lines, "d.jsonl"); },
      "d.jsonl:2 is not valid JSON");
  expect_error([] { parse_text_table("{\"a\": [1]}\n", TableFormat::json_lines, "d.jsonl"); },
               "d.jsonl:1: \"a\" holds a list or object");
}

TEST(TextTable, TextFilesKeepEveryLine) {
  const TextTable t =
      parse_text_table("In the beginning\r\n\nGod created\n", TableFormat::text, "kjv.txt");
  ASSERT_EQ(t.rows(), 3);
  EXPECT_EQ(t.text(0, 0), "In the beginning");
  EXPECT_EQ(t.text(1, 0), "");
  EXPECT_EQ(t.text(2, 0), "God created");
  EXPECT_EQ(table_format_of("x/TRAIN.CSV"), TableFormat::csv);
  EXPECT_EQ(table_format_of("a.jsonl"), TableFormat::json_lines);
  expect_error([] { table_format_of("a.parquet"); }, "unknown data file type \".parquet\"");
  expect_error([] { read_text_table("/nonexistent/a.csv"); }, "cannot open data file");
  expect_error([] { read_text_table("/tmp", TableFormat::csv); },
               "data file '/tmp' is not a regular file (a folder)");
}

}  // namespace
}  // namespace brisk::testing
