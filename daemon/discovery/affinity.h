// GPU <-> NIC affinity: for each GPU, the PCI distance class to every NIC
// and which NICs are the closest, so the daemon can pick the NIC a GPU's
// RDMA traffic should use.
//
// Works from PCI bus ids alone, so it can be computed (and tested) without
// a CUDA driver: the placement of every device is read from
// `<sysfs_root>/bus/pci/devices/<bdf>`. Stateless and thread-safe.
#pragma once

#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "mooncake/v1/node.pb.h"

namespace mooncake::daemon {

struct GpuLocation {
  int index = 0;           // CUDA driver ordinal
  std::string pci_bus_id;  // any case, 4- or 8-digit domain
};

struct NicLocation {
  std::string name;        // "mlx5_0"
  std::string pci_bus_id;  // "" when the NIC is not a PCI device (soft RoCE)
};

// One entry per (GPU, NIC), GPUs in the given order and NICs in the given
// order within each GPU. `distance` is a PciDistanceName(); `closest` is true
// on every NIC that has the best known class for that GPU (ties are all
// closest). A NIC whose distance is UNKNOWN is never closest: with no
// placement there is nothing to prefer it on. Never fails: a device that
// cannot be placed gets UNKNOWN.
std::vector<v1::GpuNicAffinity> ComputeGpuNicAffinity(absl::string_view sysfs_root,
                                                      const std::vector<GpuLocation>& gpus,
                                                      const std::vector<NicLocation>& nics);

}  // namespace mooncake::daemon
