// RDMA NIC discovery from sysfs (`<sysfs_root>/class/infiniband`), with an
// optional cross-check against libibverbs' own device list.
//
// For each device: its PCI function (the `device` symlink), NUMA node,
// node GUID, firmware, kernel driver, and per port the state, physical
// state, link layer, rate, LID and the populated GIDs with their type and
// (RoCE) bound netdev. Reads files only; opens no verbs context.
// Thread-safe: no shared state.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "mooncake/v1/node.pb.h"

namespace mooncake::daemon {

struct NicDiscoveryOptions {
  std::string sysfs_root = "/sys";
  // Also ask libibverbs which devices it can open, when built with rdma-core
  // and only for the real "/sys" (verbs always reads the real sysfs). A
  // device sysfs has but verbs lacks means a missing user-space provider.
  bool use_verbs = true;
};

struct NicDiscoveryResult {
  std::vector<v1::Nic> nics;  // sorted by name
  // Why `nics` is empty, or what is wrong with the NICs found, in words a
  // user can act on; empty when everything was found and readable.
  std::string note;
};

// Never fails: no sysfs root, no RDMA class, no devices are normal answers
// reported in `note`.
NicDiscoveryResult DiscoverNics(const NicDiscoveryOptions& options);

// One device, `<sysfs_root>/class/infiniband/<name>`. Attributes the kernel
// does not expose are left empty (or -1 for numa_node).
// Errors: NotFound when the device directory does not exist.
absl::StatusOr<v1::Nic> ReadNic(absl::string_view sysfs_root, absl::string_view name);

// The verbs cross-check: one problem line per device that sysfs lists and
// libibverbs does not (its user-space provider is missing) and per device
// only libibverbs lists. Empty when the two agree.
std::vector<std::string> CompareWithVerbsDevices(const std::vector<v1::Nic>& nics,
                                                 const std::vector<std::string>& verbs_names);

// "4: ACTIVE" -> "ACTIVE", "5: LinkUp" -> "LinkUp"; text without a
// "<number>: " prefix is returned trimmed as it is.
std::string ParsePortState(absl::string_view text);

// "400 Gb/sec (4X NDR)" -> 400, "2.5 Gb/sec (1X SDR)" -> 2 (whole Gb/s,
// rounded down); 0 when the text has no leading number.
uint32_t ParseRateGbps(absl::string_view text);

// True when every hex digit of a GID string is zero (an unused table slot).
bool IsZeroGid(absl::string_view gid);

// sysfs `gid_attrs/types/<i>` to the proto's names: "IB/RoCE v1" means IB on
// an InfiniBand link and RoCE v1 on Ethernet; "RoCE v2" stays.
std::string GidTypeName(absl::string_view sysfs_type, absl::string_view link_layer);

}  // namespace mooncake::daemon
