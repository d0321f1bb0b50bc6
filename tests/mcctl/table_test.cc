#include "mooncake/mcctl/table.h"

#include <gtest/gtest.h>

namespace mooncake::mcctl {
namespace {

TEST(TextTableTest, WidthsComeFromTheWidestCell) {
  TextTable t({"IDX", "NAME"});
  t.AddRow({"0", "NVIDIA H200"});
  t.AddRow({"10", "x"});
  EXPECT_EQ(t.Render(),
            "IDX  NAME\n"
            "0    NVIDIA H200\n"
            "10   x\n");
  EXPECT_EQ(t.rows(), 2u);
}

TEST(TextTableTest, RightAlignmentAndNoTrailingBlanks) {
  TextTable t({"N", "LONG HEADER", "S"});
  t.SetAlignment(0, TextTable::Align::kRight);
  t.AddRow({"7", "a", ""});
  t.AddRow({"123", "", ""});
  EXPECT_EQ(t.Render(),
            "  N  LONG HEADER  S\n"
            "  7  a\n"
            "123\n");
}

TEST(TextTableTest, ShortAndLongRowsAndIndent) {
  TextTable t({"A", "B"});
  t.SetIndent("  ");
  t.SetAlignment(9, TextTable::Align::kRight);  // ignored: no such column
  t.AddRow({"x"});
  t.AddRow({"y", "z", "extra"});
  EXPECT_EQ(t.Render(),
            "  A  B\n"
            "  x\n"
            "  y  z  extra\n");
}

// A cell some client chose cannot start a new row or reach the terminal
// as control codes; a width limit cuts it with "...".
TEST(TextTableTest, CellsAreEscapedAndCanBeCapped) {
  TextTable t({"ID", "CLIENT", "AGE"});
  t.SetMaxWidth(1, 12);
  t.SetMaxWidth(7, 1);  // ignored: no such column
  t.AddRow({"1", "x\n2  root  0s", "1s"});
  t.AddRow({"3", "\x1b[31mred\a", "2s"});
  t.AddRow({"4", "ok", "3s"});
  EXPECT_EQ(t.Render(),
            "ID  CLIENT        AGE\n"
            "1   x\\n2  roo...  1s\n"
            "3   \\x1b[31mr...  2s\n"
            "4   ok            3s\n");
}

}  // namespace
}  // namespace mooncake::mcctl
