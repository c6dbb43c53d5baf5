// CSV/TSV (RFC 4180 quoting), JSON Lines and plain-text tables, read with file:line messages.
#include "data/text_table.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "core/error.h"
#include "core/input_file.h"

namespace brisk {

namespace {
constexpr size_t kMaxColumns = 4096;
constexpr uint64_t kMaxFileBytes = uint64_t{16} << 30;  // tables are parsed into memory

// Where the first invalid UTF-8 sequence of `s` starts, or npos.
size_t invalid_utf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  for (size_t i = 0; i < n;) {
    const unsigned c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    int len = 0;
    unsigned min = 0;
    if (c >= 0xc2 && c <= 0xdf)
      len = 2, min = 0x80;
    else if (c >= 0xe0 && c <= 0xef)
      len = 3, min = 0x800;
    else if (c >= 0xf0 && c <= 0xf4)
      len = 4, min = 0x10000;
    else
      return i;
    if (i + len > n) return i;
    unsigned cp = c & (0xff >> (len + 1));
    for (int k = 1; k < len; ++k) {
      if ((p[i + k] & 0xc0) != 0x80) return i;
      cp = (cp << 6) | (p[i + k] & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return i;
    i += len;
  }
  return std::string_view::npos;
}

// What a CSV cell's text holds, as pandas would type it: empty -> missing, whole numbers (of any
// length: their digits are kept, and labels compare them exactly), reals, else text.
CellKind csv_kind(const std::string& s) {
  if (s.empty()) return CellKind::null;
  size_t i = (s[0] == '-' || s[0] == '+') ? 1 : 0;
  if (i < s.size() && s.find_first_not_of("0123456789", i) == std::string::npos)
    return CellKind::integer;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (end == s.c_str() + s.size() && std::isfinite(v) &&
      s.find_first_of("0123456789") != std::string::npos && s.find_first_of("xXpP") == s.npos)
    return CellKind::real;
  return CellKind::text;
}
}  // namespace

// A cell of a JSON record: its column, text and kind.
struct RecordCell {
  uint32_t col;
  CellKind kind;
  std::string text;
};

// Fills a table row by row; rows are checked against the header.
class TableBuilder {
 public:
  explicit TableBuilder(const std::string& origin) {
    t_.origin_ = origin;
    t_.row_begin_.push_back(0);
  }

  void set_columns(std::vector<std::string> names, int64_t line) {
    BRISK_CHECK(!names.empty(), at(line), "the header names no column");
    BRISK_CHECK(names.size() <= kMaxColumns, at(line), "more than ", kMaxColumns, " columns");
    for (size_t i = 0; i < names.size(); ++i) {
      // pandas' name for an unnamed column.
      if (names[i].empty()) names[i] = "Unnamed: " + std::to_string(i);
      BRISK_CHECK(by_name_.emplace(names[i], i).second, at(line), "column \"", excerpt(names[i]),
                  "\" appears twice");
    }
    t_.columns_ = std::move(names);
  }
  // A column for a JSON key met on `line` (rows before it lack the key: they read as missing).
  uint32_t column_for(const std::string& name, int64_t line) {
    const auto it = by_name_.find(name);
    if (it != by_name_.end()) return static_cast<uint32_t>(it->second);
    BRISK_CHECK(t_.columns_.size() < kMaxColumns, at(line), "more than ", kMaxColumns,
                " distinct keys");
    const size_t c = t_.columns_.size();
    by_name_.emplace(name, c);
    t_.columns_.push_back(name);
    return static_cast<uint32_t>(c);
  }

  // A row holding every column.
  void add_row(std::vector<std::string>& cells, std::vector<CellKind>& kinds, int64_t line) {
    BRISK_CHECK(cells.size() == t_.columns_.size(), at(line), "a row of ", cells.size(),
                " fields where the header has ", t_.columns_.size());
    for (size_t i = 0; i < cells.size(); ++i) {
      t_.cells_.push_back(std::move(cells[i]));
      t_.kinds_.push_back(kinds[i]);
      t_.cols_.push_back(static_cast<uint32_t>(i));
    }
    end_row(line);
  }
  // A row holding the keys a record names; a key named twice keeps its last value, as JSON
  // readers do.
  void add_record(std::vector<RecordCell>& cells, int64_t line) {
    std::stable_sort(cells.begin(), cells.end(),
                     [](const RecordCell& a, const RecordCell& b) { return a.col < b.col; });
    for (size_t i = 0; i < cells.size(); ++i) {
      if (i + 1 < cells.size() && cells[i + 1].col == cells[i].col) continue;
      t_.cells_.push_back(std::move(cells[i].text));
      t_.kinds_.push_back(cells[i].kind);
      t_.cols_.push_back(cells[i].col);
    }
    end_row(line);
  }

  std::string at(int64_t line) const { return t_.origin_ + ":" + std::to_string(line) + ": "; }
  TextTable finish() { return std::move(t_); }

 private:
  void end_row(int64_t line) {
    t_.row_begin_.push_back(static_cast<int64_t>(t_.cells_.size()));
    t_.lines_.push_back(line);
  }
  TextTable t_;
  std::unordered_map<std::string, size_t> by_name_;
};

namespace {

void parse_delimited(std::string_view s, char delim, TableBuilder& out) {
  size_t i = 0;
  int64_t line = 1;
  bool header = true;
  std::vector<std::string> cells;
  std::vector<CellKind> kinds;
  auto at_end_of_line = [&](size_t j) { return j >= s.size() || s[j] == '\n' || s[j] == '\r'; };
  auto skip_newline = [&] {
    if (i < s.size() && s[i] == '\r') ++i;
    if (i < s.size() && s[i] == '\n') ++i;
    ++line;
  };
  while (i < s.size()) {
    if (at_end_of_line(i)) {  // blank lines are skipped, as pandas does
      skip_newline();
      continue;
    }
    const int64_t row_line = line;
    cells.clear();
    kinds.clear();
    for (;;) {
      std::string cell;
      if (i < s.size() && s[i] == '"') {
        const int64_t opened = line;
        ++i;
        for (;;) {
          BRISK_CHECK(i < s.size(), out.at(opened), "a quoted field is never closed");
          if (s[i] == '"') {
            if (i + 1 < s.size() && s[i + 1] == '"') {
              cell.push_back('"');
              i += 2;
              continue;
            }
            ++i;
            break;
          }
          if (s[i] == '\n') ++line;
          cell.push_back(s[i++]);
        }
        BRISK_CHECK(at_end_of_line(i) || s[i] == delim, out.at(line),
                    "text after the closing quote of a field");
      } else {
        const size_t start = i;
        while (!at_end_of_line(i) && s[i] != delim) ++i;
        cell.assign(s.substr(start, i - start));
      }
      BRISK_CHECK(cells.size() < kMaxColumns, out.at(row_line), "more than ", kMaxColumns,
                  " fields");
      // pandas types a quoted number as a number too: the kind comes from the text alone.
      kinds.push_back(csv_kind(cell));
      cells.push_back(std::move(cell));
      if (i < s.size() && s[i] == delim) {
        ++i;
        continue;
      }
      break;
    }
    if (header) {
      out.set_columns(cells, row_line);
      header = false;
    } else {
      out.add_row(cells, kinds, row_line);
    }
    if (i < s.size()) skip_newline();
  }
  BRISK_CHECK(!header, out.at(1), "the file is empty: a header row naming the columns is needed");
}

// Calls f(line number, text, whether a line break ended it) for each line (LF or CRLF; a last
// line without an end counts).
template <typename F>
void for_each_line(std::string_view s, F&& f) {
  int64_t line = 0;
  for (size_t i = 0; i < s.size();) {
    size_t end = s.find('\n', i);
    const bool ended = end != std::string_view::npos;
    if (!ended) end = s.size();
    std::string_view text = s.substr(i, end - i);
    if (!text.empty() && text.back() == '\r') text.remove_suffix(1);
    f(++line, text, ended);
    i = end + 1;
  }
}

// Reads JSON records straight into the table (nlohmann's SAX interface): no document is built,
// so time and memory stay linear in the text however many keys a record names.
class RecordReader {
 public:
  using Json = nlohmann::json;
  // list: the text is one JSON list of records, else one record.
  RecordReader(TableBuilder& out, bool list) : out_(out), record_depth_(list ? 2 : 1) {}

  void read(std::string_view text, int64_t line) {
    line_ = line;
    depth_ = 0;
    where_ = out_.at(line).substr(0, out_.at(line).size() - 2);
    Json::sax_parse(text.data(), text.data() + text.size(), this);
  }

  bool null() { return value(CellKind::null, std::string()); }
  bool boolean(bool b) { return value(CellKind::boolean, b ? "true" : "false"); }
  bool number_integer(int64_t v) { return value(CellKind::integer, std::to_string(v)); }
  bool number_unsigned(uint64_t v) { return value(CellKind::integer, std::to_string(v)); }
  // A whole number beyond 64 bits keeps its digits (and stays a whole number): labels that
  // differ stay distinct.
  bool number_float(double v, const std::string& literal) {
    if (literal.find_first_of(".eE") == std::string::npos) return value(CellKind::integer, literal);
    return value(CellKind::real, std::isfinite(v) ? Json(v).dump() : literal);
  }
  bool string(std::string& s) { return value(CellKind::text, std::move(s)); }
  bool binary(Json::binary_t&) { return value(CellKind::text, std::string()); }
  bool key(std::string& k) {
    key_ = std::move(k);
    col_ = out_.column_for(key_, line_);
    return true;
  }
  bool start_object(size_t) {
    BRISK_CHECK(depth_ != record_depth_, out_.at(line_), "\"", excerpt(key_), kNested);
    BRISK_CHECK(depth_ == record_depth_ - 1, out_.at(line_), misplaced());
    if (++depth_ == record_depth_) cells_.clear();
    return true;
  }
  bool end_object() {
    if (depth_-- == record_depth_) out_.add_record(cells_, line_);
    return true;
  }
  bool start_array(size_t) {
    BRISK_CHECK(depth_ != record_depth_, out_.at(line_), "\"", excerpt(key_), kNested);
    BRISK_CHECK(depth_ == 0 && record_depth_ == 2, out_.at(line_), misplaced());
    ++depth_;
    return true;
  }
  bool end_array() {
    --depth_;
    return true;
  }
  bool parse_error(size_t, const std::string&, const nlohmann::detail::exception& e) {
    // The parser's message quotes the offending token: keep the line short.
    BRISK_FAIL(where_, " is not valid JSON: ", excerpt(e.what(), 160));
  }

 private:
  static constexpr const char* kNested =
      "\" holds a list or object; a cell must be text, a number, true/false or null";
  const char* misplaced() const {
    return record_depth_ == 2 && depth_ == 0 ? "not a list of records"
                                             : "a record must be a JSON object";
  }
  bool value(CellKind kind, std::string text) {
    BRISK_CHECK(depth_ == record_depth_, out_.at(line_), misplaced());
    cells_.push_back({col_, kind, std::move(text)});
    return true;
  }

  TableBuilder& out_;
  int record_depth_;
  int depth_ = 0;
  int64_t line_ = 1;
  std::string where_, key_;
  uint32_t col_ = 0;
  std::vector<RecordCell> cells_;
};

void parse_json_lines(std::string_view s, TableBuilder& out) {
  const size_t first = s.find_first_not_of(" \t\r\n");
  if (first != std::string_view::npos && s[first] == '[') {
    // A JSON list of records (what the datasets library also reads from a .json file).
    RecordReader(out, true).read(s, 1);
    return;
  }
  RecordReader reader(out, false);
  for_each_line(s, [&](int64_t line, std::string_view text, bool) {
    if (text.find_first_not_of(" \t") == std::string_view::npos) return;
    reader.read(text, line);
  });
}

void parse_lines(std::string_view s, TableBuilder& out, bool keep_linebreaks) {
  out.set_columns({"text"}, 1);
  std::vector<std::string> cells(1);
  std::vector<CellKind> kinds(1, CellKind::text);
  for_each_line(s, [&](int64_t line, std::string_view text, bool ended) {
    cells[0].assign(text);
    if (keep_linebreaks && ended) cells[0] += '\n';
    out.add_row(cells, kinds, line);
  });
}

struct Mapping {
  void* data = nullptr;
  size_t size = 0;
  ~Mapping() {
    if (data && data != MAP_FAILED) ::munmap(data, size);
  }
};
}  // namespace

int64_t TextTable::column(std::string_view name) const {
  for (size_t i = 0; i < columns_.size(); ++i)
    if (columns_[i] == name) return static_cast<int64_t>(i);
  return -1;
}

int64_t TextTable::find(int64_t row, int64_t col) const {
  const auto r = static_cast<size_t>(row);
  const int64_t begin = row_begin_[r], end = row_begin_[r + 1];
  if (end - begin == static_cast<int64_t>(columns_.size())) return begin + col;  // a whole row
  const auto first = cols_.begin() + begin, last = cols_.begin() + end;
  const auto it = std::lower_bound(first, last, static_cast<uint32_t>(col));
  return it != last && *it == static_cast<uint32_t>(col) ? begin + (it - first) : -1;
}

const std::string& TextTable::text(int64_t row, int64_t col) const {
  static const std::string kMissing;
  const int64_t i = find(row, col);
  return i < 0 ? kMissing : cells_[static_cast<size_t>(i)];
}

CellKind TextTable::kind(int64_t row, int64_t col) const {
  const int64_t i = find(row, col);
  return i < 0 ? CellKind::null : kinds_[static_cast<size_t>(i)];
}

std::string TextTable::where(int64_t row) const {
  return origin_ + ":" + std::to_string(line(row));
}

TableFormat table_format_of(const std::string& path) {
  std::string ext = std::filesystem::path(path).extension().string();
  for (char& c : ext) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (ext == ".csv") return TableFormat::csv;
  if (ext == ".tsv") return TableFormat::tsv;
  if (ext == ".json" || ext == ".jsonl") return TableFormat::json_lines;
  if (ext == ".txt" || ext == ".text") return TableFormat::text;
  BRISK_FAIL("'", path, "': unknown data file type \"", excerpt(ext),
             "\" (valid: .csv, .tsv, .json, .jsonl, .txt)");
}

TextTable read_text_table(const std::string& path, bool keep_linebreaks) {
  return read_text_table(path, table_format_of(path), keep_linebreaks);
}

TextTable read_text_table(const std::string& path, TableFormat format, bool keep_linebreaks) {
  const InputFile file(path, "data file");
  Mapping m;
  m.size = file.size();
  if (m.size > 0 && m.size <= kMaxFileBytes)
    m.data = ::mmap(nullptr, m.size, PROT_READ, MAP_PRIVATE, file.fd(), 0);
  BRISK_CHECK(m.size <= kMaxFileBytes, "data file '", path, "' is larger than 16 GiB");
  BRISK_CHECK(m.size == 0 || m.data != MAP_FAILED, "cannot map data file '", path, "'");
  const std::string_view text(static_cast<const char*>(m.size ? m.data : ""), m.size);
  return parse_text_table(text, format, path, keep_linebreaks);
}

TextTable parse_text_table(std::string_view text, TableFormat format, const std::string& origin,
                           bool keep_linebreaks) {
  if (text.substr(0, 3) == "\xEF\xBB\xBF") text.remove_prefix(3);  // a UTF-8 byte-order mark
  const size_t bad = invalid_utf8(text);
  if (bad != std::string_view::npos) {
    const int64_t line =
        1 + static_cast<int64_t>(std::count(text.begin(), text.begin() + bad, '\n'));
    BRISK_FAIL(origin, ":", line, ": invalid UTF-8 (byte ", bad, ")");
  }
  TableBuilder out(origin);
  switch (format) {
    case TableFormat::csv:
      parse_delimited(text, ',', out);
      break;
    case TableFormat::tsv:
      parse_delimited(text, '\t', out);
      break;
    case TableFormat::json_lines:
      parse_json_lines(text, out);
      break;
    case TableFormat::text:
      parse_lines(text, out, keep_linebreaks);
      break;
  }
  return out.finish();
}

}  // namespace brisk
