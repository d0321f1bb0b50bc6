// Node discovery for mooncaked: which GPUs and RDMA NICs this node has, how
// GPUs reach each other (P2P attributes) and which NIC is closest to each
// GPU on the PCIe tree.
//
//   mooncake::daemon::DiscoveryOptions options;      // real /sys, libcuda.so.1
//   mooncake::v1::Topology topo = mooncake::daemon::DiscoverTopology(options);
//   if (topo.gpus().empty()) MC_LOG(kInfo, "no GPU: ", topo.gpu_discovery_note());
//
// Sources: the CUDA driver API (mooncake::drivers::CudaDriver, loaded at run
// time; see gpu_discovery.h), sysfs
// (`<sysfs_root>/class/infiniband`, `<sysfs_root>/bus/pci/devices`) and,
// when built with rdma-core, libibverbs' device list as a cross-check.
// Pointing `sysfs_root` at a fake tree makes NIC and topology discovery
// testable without hardware, and so does passing a FakeCudaDriver as
// `cuda_driver` for GPU discovery. The lower-level pieces (DiscoverGpus,
// DiscoverNics, ResolvePciPath, ComputeGpuNicAffinity) are public in the
// headers next to this one.
//
// Thread-safety: no shared state; concurrent calls are fine. Each call
// re-reads the hardware state (cheap: sysfs reads and driver queries, no
// CUDA context, no verbs context).
#pragma once

#include <memory>
#include <string>

#include "mooncake/drivers/cuda_driver.h"
#include "mooncake/v1/node.pb.h"

namespace mooncake::daemon {

struct DiscoveryOptions {
  std::string sysfs_root = "/sys";            // tests point this at a fake tree
  std::string cuda_library = "libcuda.so.1";  // "" disables GPU discovery
  bool use_verbs = true;                      // also ask ibverbs (when built with it)
  // The CUDA driver to ask; null: LoadCudaDriver(cuda_library).
  std::shared_ptr<drivers::CudaDriver> cuda_driver;
};

// Never fails for "no GPU / no NIC / no driver": that is a normal state,
// reported in gpu_discovery_note / nic_discovery_note with words a user can
// act on. Partial problems (one attribute query failing, a NIC verbs cannot
// open) are reported there too, next to what was found. `affinity` has one
// entry per (GPU, NIC) when both lists are non-empty.
v1::Topology DiscoverTopology(const DiscoveryOptions& options);

}  // namespace mooncake::daemon
