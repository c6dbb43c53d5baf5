// Tables of text from the files the example scripts take (--train_file and friends): CSV, TSV,
// JSON Lines (or a JSON list of records) and plain text (one row per line, column "text"), chosen
// by extension. Cells keep their text and what kind of value they held, so that labels can be
// told apart as run_glue does (text -> classes, whole numbers -> class ids, reals -> regression).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace brisk {

enum class TableFormat { csv, tsv, json_lines, text };
enum class CellKind : uint8_t { null, integer, real, boolean, text };

class TextTable {
 public:
  const std::string& origin() const { return origin_; }
  const std::vector<std::string>& columns() const { return columns_; }
  int64_t rows() const { return static_cast<int64_t>(lines_.size()); }
  // -1 when there is no such column.
  int64_t column(std::string_view name) const;
  // A cell a row lacks (a JSON record without the key) reads as "" of kind null.
  const std::string& text(int64_t row, int64_t col) const;
  CellKind kind(int64_t row, int64_t col) const;
  // The file's line the row starts on (1-based), for messages.
  int64_t line(int64_t row) const { return lines_[static_cast<size_t>(row)]; }
  // "file:line" of a row.
  std::string where(int64_t row) const;

 private:
  friend class TableBuilder;
  // Where (row, col) lies in cells_, or -1 when the row lacks it.
  int64_t find(int64_t row, int64_t col) const;
  std::string origin_;
  std::vector<std::string> columns_;
  // The cells rows hold, row by row and by column within a row: a row of JSON Lines holds the
  // keys its record names only, so a file of many keys over many rows stays as large as its text.
  std::vector<std::string> cells_;
  std::vector<CellKind> kinds_;
  std::vector<uint32_t> cols_;      // each cell's column
  std::vector<int64_t> row_begin_;  // row r's cells: [row_begin_[r], row_begin_[r + 1])
  std::vector<int64_t> lines_;
};

// The format a file's extension names (.csv, .tsv, .json/.jsonl, .txt); fails naming the file
// when it names none.
TableFormat table_format_of(const std::string& path);

// Reads a whole file (mapped, not copied: the table holds the cells only). Malformed content —
// an unterminated quote, a row with another number of fields than the header, a line that is not
// a JSON object, invalid UTF-8 — fails with "file:line: what". keep_linebreaks: the lines of a
// plain-text file keep their line break ("\n"; a last line without one stays without), as the
// datasets library's text loader gives them to run_clm by default.
TextTable read_text_table(const std::string& path, bool keep_linebreaks = false);
TextTable read_text_table(const std::string& path, TableFormat format,
                          bool keep_linebreaks = false);

// The same on text in memory; `origin` names it in messages.
TextTable parse_text_table(std::string_view text, TableFormat format, const std::string& origin,
                           bool keep_linebreaks = false);

}  // namespace brisk
