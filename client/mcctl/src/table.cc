#include "mooncake/mcctl/table.h"

#include <algorithm>
#include <utility>

namespace mooncake::mcctl {

TextTable::TextTable(std::vector<std::string> headers)
    : headers_(std::move(headers)), align_(headers_.size(), Align::kLeft) {}

void TextTable::SetAlignment(std::size_t column, Align align) {
  if (column < align_.size()) align_[column] = align;
}

void TextTable::AddRow(std::vector<std::string> cells) { rows_.push_back(std::move(cells)); }

std::string TextTable::Render() const {
  std::size_t columns = headers_.size();
  for (const auto& row : rows_) columns = std::max(columns, row.size());

  std::vector<std::size_t> width(columns, 0);
  auto measure = [&](const std::vector<std::string>& cells) {
    for (std::size_t c = 0; c < cells.size(); ++c) width[c] = std::max(width[c], cells[c].size());
  };
  measure(headers_);
  for (const auto& row : rows_) measure(row);

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
  emit(headers_);
  for (const auto& row : rows_) emit(row);
  return out;
}

}  // namespace mooncake::mcctl
