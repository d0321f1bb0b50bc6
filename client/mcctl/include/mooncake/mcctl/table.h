// A plain-text table whose column widths come from its content, for mcctl's
// human-readable output.
//
// Usage:
//   TextTable t({"IDX", "NAME"});
//   t.SetAlignment(0, TextTable::Align::kRight);
//   t.AddRow({"0", "NVIDIA H200"});
//   std::cout << t.Render();
//
// Columns are separated by two spaces; lines carry no trailing blanks. Every
// cell is shown through EscapeForDisplay (mooncake/common/escape.h), so a
// value chosen by some client (a session's name, a handle kind) cannot break
// a row, forge one, or send control sequences to the terminal. Cells are
// measured in bytes, so non-ASCII text may misalign (the daemon's strings
// are ASCII). A value type: copyable, not thread-safe.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace mooncake::mcctl {

class TextTable {
 public:
  enum class Align { kLeft, kRight };

  explicit TextTable(std::vector<std::string> headers);

  // Right-aligns numbers, for instance. Out-of-range columns are ignored.
  void SetAlignment(std::size_t column, Align align);
  // Cuts the column's cells to `bytes` once escaped, ending them in "...".
  // Out-of-range columns are ignored.
  void SetMaxWidth(std::size_t column, std::size_t bytes);
  // Prefix for every rendered line (e.g. two spaces for a nested table).
  void SetIndent(std::string indent) { indent_ = std::move(indent); }

  // A row with fewer cells than headers is padded with empty cells; extra
  // cells widen the table (their header is empty).
  void AddRow(std::vector<std::string> cells);

  std::size_t rows() const { return rows_.size(); }

  // The header line, then one line per row, each ending in '\n'.
  std::string Render() const;

 private:
  std::vector<std::string> headers_;
  std::vector<Align> align_;
  std::vector<std::size_t> max_width_;  // std::string::npos: no limit
  std::vector<std::vector<std::string>> rows_;
  std::string indent_;
};

}  // namespace mooncake::mcctl
