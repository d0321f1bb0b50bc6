#include "mooncake/mcctl/table.h"

#include <algorithm>
#include <utility>

#include "mooncake/common/escape.h"

namespace mooncake::mcctl {

TextTable::TextTable(std::vector<std::string> headers)
    : headers_(std::move(headers)),
      align_(headers_.size(), Align::kLeft),
      max_width_(headers_.size(), std::string::npos) {}

void TextTable::SetAlignment(std::size_t column, Align align) {
  if (column < align_.size()) align_[column] = align;
}

void TextTable::SetMaxWidth(std::size_t column, std::size_t bytes) {
  if (column < max_width_.size()) max_width_[column] = bytes;
}

void TextTable::AddRow(std::vector<std::string> cells) { rows_.push_back(std::move(cells)); }

std::string TextTable::Render() const {
  auto shown = [&](const std::vector<std::string>& cells) {
    std::vector<std::string> out;
    out.reserve(cells.size());
    for (std::size_t c = 0; c < cells.size(); ++c) {
      out.push_back(
          EscapeForDisplay(cells[c], c < max_width_.size() ? max_width_[c] : std::string::npos));
    }
    return out;
  };
  const std::vector<std::string> headers = shown(headers_);
  std::vector<std::vector<std::string>> rows;
  rows.reserve(rows_.size());
  for (const auto& row : rows_) rows.push_back(shown(row));

  std::size_t columns = headers.size();
  for (const auto& row : rows) columns = std::max(columns, row.size());

  std::vector<std::size_t> width(columns, 0);
  auto measure = [&](const std::vector<std::string>& cells) {
    for (std::size_t c = 0; c < cells.size(); ++c) width[c] = std::max(width[c], cells[c].size());
  };
  measure(headers);
  for (const auto& row : rows) measure(row);

  std::string out;
  auto emit = [&](const std::vector<std::string>& cells) {
    std::string line = indent_;
    for (std::size_t c = 0; c < columns; ++c) {
      const std::string empty;
      const std::string& cell = c < cells.size() ? cells[c] : empty;
      const std::size_t pad = width[c] - cell.size();
      const bool right = c < align_.size() && align_[c] == Align::kRight;
      if (c > 0) line += "  ";
      if (right) line.append(pad, ' ');
      line += cell;
      if (!right) line.append(pad, ' ');
    }
    // Padding of the last column(s) would leave trailing blanks.
    while (line.size() > indent_.size() && line.back() == ' ') line.pop_back();
    out += line;
    out += '\n';
  };
  emit(headers);
  for (const auto& row : rows) emit(row);
  return out;
}

}  // namespace mooncake::mcctl
