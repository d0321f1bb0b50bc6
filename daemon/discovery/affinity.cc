#include "discovery/affinity.h"

#include <algorithm>

#include "absl/status/statusor.h"
#include "discovery/pci_topology.h"

namespace mooncake::daemon {

namespace {
absl::StatusOr<PciPath> PlaceDevice(absl::string_view sysfs_root, const std::string& bus_id) {
  if (bus_id.empty()) return absl::NotFoundError("device has no PCI bus id");
  return ResolvePciPath(sysfs_root, bus_id);
}
}  // namespace

std::vector<v1::GpuNicAffinity> ComputeGpuNicAffinity(absl::string_view sysfs_root,
                                                      const std::vector<GpuLocation>& gpus,
                                                      const std::vector<NicLocation>& nics) {
  std::vector<absl::StatusOr<PciPath>> nic_paths;
  nic_paths.reserve(nics.size());
  for (const NicLocation& nic : nics) nic_paths.push_back(PlaceDevice(sysfs_root, nic.pci_bus_id));

  std::vector<v1::GpuNicAffinity> out;
  out.reserve(gpus.size() * nics.size());
  std::vector<PciDistance> distances(nics.size());
  for (const GpuLocation& gpu : gpus) {
    absl::StatusOr<PciPath> gpu_path = PlaceDevice(sysfs_root, gpu.pci_bus_id);
    for (size_t i = 0; i < nics.size(); ++i) {
      distances[i] = ClassifyPciDistance(gpu_path, nic_paths[i]);
    }
    PciDistance best = distances.empty() ? PciDistance::kUnknown
                                         : *std::min_element(distances.begin(), distances.end());
    for (size_t i = 0; i < nics.size(); ++i) {
      v1::GpuNicAffinity& entry = out.emplace_back();
      entry.set_gpu(gpu.index);
      entry.set_nic(nics[i].name);
      entry.set_distance(std::string(PciDistanceName(distances[i])));
      entry.set_closest(distances[i] == best && best != PciDistance::kUnknown);
    }
  }
  return out;
}

}  // namespace mooncake::daemon
