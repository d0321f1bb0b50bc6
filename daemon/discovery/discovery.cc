#include "discovery/discovery.h"

#include "discovery/affinity.h"
#include "discovery/gpu_discovery.h"
#include "discovery/nic_discovery.h"

namespace mooncake::daemon {

v1::Topology DiscoverTopology(const DiscoveryOptions& options) {
  v1::Topology topology;

  GpuDiscoveryResult gpus = DiscoverGpus({.cuda_library = options.cuda_library,
                                          .sysfs_root = options.sysfs_root,
                                          .driver = options.cuda_driver});
  topology.set_cuda_driver_version(gpus.driver_version);
  topology.set_gpu_discovery_note(gpus.note);

  NicDiscoveryResult nics =
      DiscoverNics({.sysfs_root = options.sysfs_root, .use_verbs = options.use_verbs});
  topology.set_nic_discovery_note(nics.note);

  std::vector<GpuLocation> gpu_locations;
  for (const v1::Gpu& gpu : gpus.gpus) gpu_locations.push_back({gpu.index(), gpu.pci_bus_id()});
  std::vector<NicLocation> nic_locations;
  for (const v1::Nic& nic : nics.nics) nic_locations.push_back({nic.name(), nic.pci_bus_id()});
  for (v1::GpuNicAffinity& entry :
       ComputeGpuNicAffinity(options.sysfs_root, gpu_locations, nic_locations)) {
    *topology.add_affinity() = std::move(entry);
  }

  for (v1::Gpu& gpu : gpus.gpus) *topology.add_gpus() = std::move(gpu);
  for (v1::GpuPair& pair : gpus.pairs) *topology.add_gpu_pairs() = std::move(pair);
  for (v1::Nic& nic : nics.nics) *topology.add_nics() = std::move(nic);
  return topology;
}

}  // namespace mooncake::daemon
