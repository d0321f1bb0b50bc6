// A fake sysfs tree in a temporary directory, shaped like the real one:
//   <root>/devices/pci0000:00/0000:00:01.0/0000:01:00.0/...   PCI functions
//   <root>/bus/pci/devices/<bdf> -> ../../../devices/...      one per function
//   <root>/bus/pci/drivers/<driver>/                           driver symlinks point here
//   <root>/devices/.../<bdf>/infiniband/<ib>/                  RDMA device attributes
//   <root>/class/infiniband/<ib> -> ../../devices/.../infiniband/<ib>
// so discovery code follows the same symlinks it follows on a real node.
// Test-only; not thread-safe; removes the tree on destruction.
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"

namespace mooncake::daemon::test_support {

class FakeSysfs {
 public:
  FakeSysfs() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "mc-fake-sysfs-XXXXXX").string();
    char* dir = ::mkdtemp(tmpl.data());
    EXPECT_NE(dir, nullptr) << "mkdtemp " << tmpl;
    base_ = tmpl;
    root_ = base_ + "/sys";
    std::filesystem::create_directories(root_ + "/devices");
    std::filesystem::create_directories(root_ + "/bus/pci/devices");
  }
  ~FakeSysfs() {
    std::error_code ec;
    std::filesystem::remove_all(base_, ec);
  }
  FakeSysfs(const FakeSysfs&) = delete;
  FakeSysfs& operator=(const FakeSysfs&) = delete;

  const std::string& root() const { return root_; }

  // `chain` is "pci0000:00/0000:00:01.0/0000:01:00.0": a host bridge then
  // bus ids from the root port down to the device. Every function on the
  // way gets a directory, a numa_node file and a bus/pci/devices link.
  void AddPciDevice(const std::string& chain, int numa_node = -1, const std::string& driver = "") {
    std::vector<std::string> parts = absl::StrSplit(chain, '/');
    std::string dir = root_ + "/devices/" + parts[0];
    for (size_t i = 1; i < parts.size(); ++i) {
      dir += "/" + parts[i];
      std::filesystem::create_directories(dir);
      WriteAbsolute(dir + "/numa_node", absl::StrCat(numa_node, "\n"));
      Symlink(dir, root_ + "/bus/pci/devices/" + parts[i]);
    }
    if (!driver.empty()) {
      std::string driver_dir = root_ + "/bus/pci/drivers/" + driver;
      std::filesystem::create_directories(driver_dir);
      Symlink(driver_dir, dir + "/driver");
    }
  }

  // An RDMA device below the PCI function `bdf` (added before).
  void AddRdmaDevice(const std::string& name, const std::string& bdf,
                     const std::string& node_guid = "0c42:a103:0065:ef30",
                     const std::string& fw_ver = "28.39.1002") {
    std::filesystem::path pci = std::filesystem::canonical(root_ + "/bus/pci/devices/" + bdf);
    std::string dir = (pci / "infiniband" / name).string();
    std::filesystem::create_directories(dir + "/ports");
    Symlink(pci.string(), dir + "/device");
    WriteAbsolute(dir + "/node_guid", node_guid + "\n");
    WriteAbsolute(dir + "/fw_ver", fw_ver + "\n");
    std::filesystem::create_directories(root_ + "/class/infiniband");
    Symlink(dir, root_ + "/class/infiniband/" + name);
  }

  // An RDMA device with no PCI function (rxe/siw style): `device` points to
  // a virtual netdev directory.
  void AddSoftRdmaDevice(const std::string& name) {
    std::string netdev = root_ + "/devices/virtual/net/eth0";
    std::string dir = root_ + "/devices/virtual/infiniband/" + name;
    std::filesystem::create_directories(netdev);
    std::filesystem::create_directories(dir + "/ports");
    Symlink(netdev, dir + "/device");
    std::filesystem::create_directories(root_ + "/class/infiniband");
    Symlink(dir, root_ + "/class/infiniband/" + name);
  }

  void AddPort(const std::string& ib, int port, const std::string& state,
               const std::string& phys_state, const std::string& link_layer,
               const std::string& rate, const std::string& lid) {
    std::string dir = PortDir(ib, port);
    std::filesystem::create_directories(dir + "/gids");
    std::filesystem::create_directories(dir + "/gid_attrs/types");
    std::filesystem::create_directories(dir + "/gid_attrs/ndevs");
    WriteAbsolute(dir + "/state", state + "\n");
    WriteAbsolute(dir + "/phys_state", phys_state + "\n");
    WriteAbsolute(dir + "/link_layer", link_layer + "\n");
    WriteAbsolute(dir + "/rate", rate + "\n");
    WriteAbsolute(dir + "/lid", lid + "\n");
  }

  // type/ndev "" leaves that attribute file out (as the kernel does for
  // unused slots, where reading fails).
  void AddGid(const std::string& ib, int port, int index, const std::string& gid,
              const std::string& type = "", const std::string& ndev = "") {
    std::string dir = PortDir(ib, port);
    WriteAbsolute(absl::StrCat(dir, "/gids/", index), gid + "\n");
    if (!type.empty()) WriteAbsolute(absl::StrCat(dir, "/gid_attrs/types/", index), type + "\n");
    if (!ndev.empty()) WriteAbsolute(absl::StrCat(dir, "/gid_attrs/ndevs/", index), ndev + "\n");
  }

  // Writes `<root>/<relative>`, creating directories.
  void Write(const std::string& relative, const std::string& content) {
    WriteAbsolute(root_ + "/" + relative, content);
  }

 private:
  std::string PortDir(const std::string& ib, int port) const {
    return absl::StrCat(std::filesystem::canonical(root_ + "/class/infiniband/" + ib).string(),
                        "/ports/", port);
  }

  static void WriteAbsolute(const std::string& path, const std::string& content) {
    std::filesystem::create_directories(std::filesystem::path(path).parent_path());
    std::ofstream out(path, std::ios::trunc);
    out << content;
    EXPECT_TRUE(out.good()) << "write " << path;
  }

  // Relative targets, like the kernel's, so the tree also works when moved.
  static void Symlink(const std::string& target, const std::string& link) {
    std::filesystem::path link_path(link);
    std::filesystem::create_directories(link_path.parent_path());
    std::error_code ec;
    std::filesystem::remove(link_path, ec);
    std::filesystem::create_symlink(std::filesystem::relative(target, link_path.parent_path()),
                                    link_path);
  }

  std::string base_;
  std::string root_;
};

// A two-socket node used by several tests (numa 0: pci0000:00, pci0000:20;
// numa 1: pci0000:80):
//   pci0000:00 ─ 00:01.0 (root port) ─ 01:00.0 (switch A up)
//                 ├ 02:00.0 (down) ─ 03:00.0  GPU "0000:03:00.0"
//                 ├ 02:01.0 (down) ─ 04:00.0  NIC mlx5_0, 04:00.1 NIC mlx5_1
//                 └ 02:02.0 (down) ─ 05:00.0 (switch B up) ─ 06:00.0 (down) ─ 07:00.0  GPU
//              ─ 00:02.0 (root port) ─ 08:00.0  NIC mlx5_2
//   pci0000:20 ─ 20:01.0 ─ 21:00.0  GPU           (same NUMA node as pci0000:00)
//   pci0000:80 ─ 80:01.0 ─ 81:00.0  NIC mlx5_3
//              ─ 80:02.0 ─ 82:00.0  GPU
inline void BuildTwoSocketNode(FakeSysfs& sys) {
  sys.AddPciDevice("pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0/0000:03:00.0", 0, "nvidia");
  sys.AddPciDevice("pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:01.0/0000:04:00.0", 0,
                   "mlx5_core");
  sys.AddPciDevice("pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:01.0/0000:04:00.1", 0,
                   "mlx5_core");
  sys.AddPciDevice(
      "pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:02.0/0000:05:00.0/0000:06:00.0/0000:07:00.0", 0,
      "nvidia");
  sys.AddPciDevice("pci0000:00/0000:00:02.0/0000:08:00.0", 0, "mlx5_core");
  sys.AddPciDevice("pci0000:20/0000:20:01.0/0000:21:00.0", 0, "nvidia");
  sys.AddPciDevice("pci0000:80/0000:80:01.0/0000:81:00.0", 1, "mlx5_core");
  sys.AddPciDevice("pci0000:80/0000:80:02.0/0000:82:00.0", 1, "nvidia");
  sys.AddRdmaDevice("mlx5_0", "0000:04:00.0");
  sys.AddRdmaDevice("mlx5_1", "0000:04:00.1");
  sys.AddRdmaDevice("mlx5_2", "0000:08:00.0");
  sys.AddRdmaDevice("mlx5_3", "0000:81:00.0");
  for (const char* ib : {"mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"}) {
    sys.AddPort(ib, 1, "4: ACTIVE", "5: LinkUp", "InfiniBand", "400 Gb/sec (4X NDR)", "0x1");
  }
}

}  // namespace mooncake::daemon::test_support
