#include "discovery/sysfs_files.h"

#include "fake_sysfs.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace mooncake::daemon {
namespace {

using test_support::FakeSysfs;
using ::testing::ElementsAre;

TEST(SysfsFilesTest, ReadLineStripsTrailingNewline) {
  FakeSysfs sys;
  sys.Write("class/x/fw_ver", "28.39.1002\n");
  absl::StatusOr<std::string> v = ReadSysfsLine(sys.root() + "/class/x/fw_ver");
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, "28.39.1002");
}

TEST(SysfsFilesTest, MissingFileIsNotFoundAndNamesThePath) {
  absl::StatusOr<std::string> v = ReadSysfsLine("/nonexistent/mooncake/attr");
  EXPECT_EQ(v.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(v.status().message()),
              ::testing::HasSubstr("/nonexistent/mooncake/attr"));
}

TEST(SysfsFilesTest, UnreadableFileIsAnError) {
  // A directory opens but read() fails with EISDIR, like sysfs attributes
  // that fail on read: the error must surface, not read as "".
  FakeSysfs sys;
  EXPECT_FALSE(ReadSysfsLine(sys.root() + "/devices").ok());
}

TEST(SysfsFilesTest, ListsNumericNamesInNumericOrder) {
  FakeSysfs sys;
  for (const char* name : {"10", "2", "1", "0", "abc"}) sys.Write(std::string("gids/") + name, "x");
  absl::StatusOr<std::vector<std::string>> names = ListSysfsDir(sys.root() + "/gids");
  ASSERT_TRUE(names.ok()) << names.status();
  EXPECT_THAT(*names, ElementsAre("0", "1", "2", "10", "abc"));
  EXPECT_EQ(ListSysfsDir(sys.root() + "/nope").status().code(), absl::StatusCode::kNotFound);
}

TEST(SysfsFilesTest, SymlinkBasenameIsTheDriverName) {
  FakeSysfs sys;
  sys.AddPciDevice("pci0000:00/0000:00:01.0/0000:01:00.0", 0, "mlx5_core");
  absl::StatusOr<std::string> driver =
      ReadSymlinkBasename(sys.root() + "/bus/pci/devices/0000:01:00.0/driver");
  ASSERT_TRUE(driver.ok()) << driver.status();
  EXPECT_EQ(*driver, "mlx5_core");
  EXPECT_FALSE(ReadSymlinkBasename(sys.root() + "/bus/pci/devices/0000:01:00.0/numa_node").ok());
}

TEST(SysfsFilesTest, NumaNode) {
  FakeSysfs sys;
  sys.AddPciDevice("pci0000:00/0000:00:01.0/0000:01:00.0", 3);
  sys.AddPciDevice("pci0000:00/0000:00:02.0/0000:02:00.0", -1);
  EXPECT_EQ(ReadPciNumaNode(sys.root(), "0000:01:00.0"), 3);
  EXPECT_EQ(ReadPciNumaNode(sys.root(), "0000:02:00.0"), -1);
  EXPECT_EQ(ReadPciNumaNode(sys.root(), "0000:09:00.0"), -1);
}

TEST(SysfsFilesTest, PciBusIds) {
  EXPECT_TRUE(IsPciBusId("0000:1b:00.0"));
  EXPECT_TRUE(IsPciBusId("0000:1B:00.7"));
  EXPECT_TRUE(IsPciBusId("10000:e1:00.0"));  // VMD domain
  EXPECT_FALSE(IsPciBusId("pci0000:00"));
  EXPECT_FALSE(IsPciBusId("1b:00.0"));
  EXPECT_FALSE(IsPciBusId("0000:1b:00"));
  EXPECT_FALSE(IsPciBusId("0000:1g:00.0"));
  EXPECT_FALSE(IsPciBusId("mlx5_0"));

  EXPECT_EQ(NormalizePciBusId("0000:1B:00.0"), "0000:1b:00.0");
  EXPECT_EQ(NormalizePciBusId("00000000:1B:00.0"), "0000:1b:00.0");
  EXPECT_EQ(NormalizePciBusId("00010000:E1:00.0"), "10000:e1:00.0");
  EXPECT_EQ(NormalizePciBusId("0001:02:03.4"), "0001:02:03.4");
  EXPECT_EQ(NormalizePciBusId("Not-A-Bus-Id"), "not-a-bus-id");
}

}  // namespace
}  // namespace mooncake::daemon
