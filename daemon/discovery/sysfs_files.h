// Small readers for sysfs attribute files, shared by the discovery units.
//
// sysfs attributes are one short line of text; a missing file is a normal
// answer ("this kernel or device does not expose it"), so every reader
// returns absl::StatusOr and callers decide what a default means. All
// functions are stateless and thread-safe; paths are plain strings so tests
// can point them at a fake tree under a temporary directory.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace mooncake::daemon {

// The content of `path` with trailing whitespace/newlines removed.
// NotFound when the file does not exist; other errno codes as ErrnoStatus.
absl::StatusOr<std::string> ReadSysfsLine(const std::string& path);

// The last component of the target of symlink `path` ("../../mlx5_core"
// -> "mlx5_core"). NotFound when `path` does not exist or is no symlink.
absl::StatusOr<std::string> ReadSymlinkBasename(const std::string& path);

// Entry names in directory `path` (no "." / ".."), sorted so that numeric
// names come in numeric order ("2" before "10") and the rest lexically.
// NotFound when the directory does not exist.
absl::StatusOr<std::vector<std::string>> ListSysfsDir(const std::string& path);

// `<sysfs_root>/bus/pci/devices/<bdf>/numa_node`, or -1 when the file is
// missing, unreadable or says -1 (kernels without NUMA report -1).
int ReadPciNumaNode(absl::string_view sysfs_root, absl::string_view bdf);

// True for "dddd:bb:dd.f" with hex digits (4 or more for the domain, as VMD
// domains have 5), case-insensitive.
bool IsPciBusId(absl::string_view text);

// Lowercases a PCI bus id and shortens a zero-padded 8-digit domain to the
// 4 digits sysfs uses ("00000000:1B:00.0" -> "0000:1b:00.0"). Returns the
// input lowercased when it does not look like a bus id.
std::string NormalizePciBusId(absl::string_view bus_id);

}  // namespace mooncake::daemon
