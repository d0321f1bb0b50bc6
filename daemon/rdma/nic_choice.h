// Which NIC a session's QPs go on, when the provider serves several (an
// H200 node has one ConnectX per GPU): the one closest to the caller's GPU
// by discovery's GPU-NIC affinity (PIX before PXB, PHB, NODE, SYS), among
// the NICs the caller allows (upstream's createIbgdaDeviceTransport(filter)
// semantics: empty = any). Without a GPU, or when affinity knows nothing of
// it, the first allowed NIC the provider serves. Pure; thread-safe.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "mooncake/v1/node.pb.h"

namespace mooncake::daemon {

struct NicRequest {
  std::vector<std::string> allowed;  // NIC names; empty = any served NIC
  std::string gpu_pci_bus_id;        // the caller's GPU ("0000:1b:00.0"); empty = none
};

struct NicChoice {
  std::string nic;
  std::string reason;  // for the caller and the log: why this NIC
};

// InvalidArgument when an allowed name is not served (naming those that
// are), when nothing served is allowed, or for a malformed name.
absl::StatusOr<NicChoice> ChooseSessionNic(const v1::Topology& topology,
                                           const std::vector<std::string>& served,
                                           const NicRequest& request);

// Lower is closer: PIX 0, PXB 1, PHB 2, NODE 3, SYS 4, anything else 5.
int DistanceRank(const std::string& distance);

}  // namespace mooncake::daemon
