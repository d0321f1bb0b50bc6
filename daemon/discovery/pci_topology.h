// Where a PCI device sits in the PCIe tree, and how far apart two devices
// are, in the classes nvidia-smi topo and NCCL use.
//
// A device's place comes from the real path of
// `<sysfs_root>/bus/pci/devices/<bdf>`, e.g.
//   /sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0/0000:03:00.0
//                ^root complex ^root port   ^switch up   ^switch down ^device
// so it works the same on a fake tree under a temporary directory.
// Stateless and thread-safe.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace mooncake::daemon {

struct PciPath {
  std::string bus_id;                // the device, "0000:03:00.0"
  std::string root_complex;          // its host bridge, "pci0000:00"
  std::vector<std::string> bridges;  // bus ids from the root port down, device excluded
  int numa_node = -1;                // -1 when the kernel does not say
};

// Resolves `bus_id` (any case, 4- or 8-digit domain) under `sysfs_root`.
// Errors: NotFound when `<sysfs_root>/bus/pci/devices/<bdf>` does not exist
// (wrong root, or the device is gone); FailedPrecondition when its real path
// has no `pciDDDD:BB` host-bridge component or does not end in the device
// (not a PCI tree this code understands).
absl::StatusOr<PciPath> ResolvePciPath(absl::string_view sysfs_root, absl::string_view bus_id);

// Ordered from closest to farthest; kUnknown sorts last.
enum class PciDistance {
  kPix,      // both at most one bridge below the deepest bridge they share
             // (the same PCIe switch, or functions of one device)
  kPxb,      // they share a bridge below the host bridge but cross several
  kPhb,      // same host bridge (root complex), different root ports
  kNode,     // different host bridges on the same NUMA node
  kSys,      // different NUMA nodes (crosses the SMP interconnect)
  kUnknown,  // the place of either device is unknown
};

// "PIX", "PXB", "PHB", "NODE", "SYS", "UNKNOWN" (the proto's strings).
absl::string_view PciDistanceName(PciDistance distance);

// The class between two resolved devices. Two devices on different host
// bridges that both report NUMA node -1 count as NODE: such a kernel (or
// machine) has a single memory node.
PciDistance ClassifyPciDistance(const PciPath& a, const PciPath& b);

// As above, kUnknown when either lookup failed.
PciDistance ClassifyPciDistance(const absl::StatusOr<PciPath>& a, const absl::StatusOr<PciPath>& b);

}  // namespace mooncake::daemon
