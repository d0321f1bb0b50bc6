// Which RDMA provider serves this node, from the rdma_provider config key
// and what discovery found:
//   off      none (the Rdma service is not offered)
//   softnic  mooncaked's software NIC
//   auto     mlx5 on every discovered mlx5 NIC that a DevX session can
//            open (each probed once: opened, then closed), else softnic;
//            sessions then pick theirs by GPU affinity (nic_choice.h)
//   mlx5     the same, but FailedPrecondition when no mlx5 NIC is usable,
//            naming what is missing for each (the daemon does not start)
// Pure apart from `probe`, which the daemon points at Mlx5Session::Open and
// tests replace. Thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "mooncake/v1/node.pb.h"

namespace mooncake::daemon {

struct Mlx5Device {
  std::string device;  // the verbs device, e.g. "mlx5_0"
  uint32_t port = 1;   // its first ACTIVE port (else 1)
};

struct ProviderChoice {
  std::string provider;  // "off", "softnic" or "mlx5"
  std::string device;    // mlx5: the default NIC (devices.front())
  uint32_t port = 1;
  std::vector<Mlx5Device> devices;  // mlx5: every NIC that opened, in discovery order
  // Why this provider, in words for the startup log ("no mlx5 NIC found",
  // "mlx5_0: <why it could not be opened>").
  std::string reason;
};

// Opens and closes a DevX session on `device` port `port`.
using Mlx5Probe = std::function<absl::Status(const std::string& device, uint32_t port)>;

// True for a NIC the mlx5 provider may drive (kernel driver mlx5_core, or
// a name mlx5_*: sysfs without the driver link).
bool IsMlx5Nic(const v1::Nic& nic);

// InvalidArgument for an unknown `config`; FailedPrecondition for "mlx5"
// without a usable NIC. `only` (config rdma_devices): the NICs that may be
// used; empty = all. A name in it that discovery did not find is an error
// (InvalidArgument), so a typo does not silently fall back.
absl::StatusOr<ProviderChoice> ChooseRdmaProvider(const std::string& config,
                                                  const std::vector<v1::Nic>& nics,
                                                  const Mlx5Probe& probe,
                                                  const std::vector<std::string>& only = {});

}  // namespace mooncake::daemon
