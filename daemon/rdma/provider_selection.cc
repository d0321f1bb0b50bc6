#include "rdma/provider_selection.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace mooncake::daemon {

bool IsMlx5Nic(const v1::Nic& nic) {
  return nic.driver() == "mlx5_core" || absl::StartsWith(nic.name(), "mlx5_");
}

namespace {

uint32_t FirstActivePort(const v1::Nic& nic) {
  for (const v1::NicPort& p : nic.ports()) {
    if (p.state() == "ACTIVE") return p.port();
  }
  return nic.ports().empty() ? 1 : nic.ports(0).port();
}

}  // namespace

absl::StatusOr<ProviderChoice> ChooseRdmaProvider(const std::string& config,
                                                  const std::vector<v1::Nic>& nics,
                                                  const Mlx5Probe& probe) {
  if (config == "off") return ProviderChoice{"off", "", 1, "rdma_provider = off"};
  if (config == "softnic") return ProviderChoice{"softnic", "", 1, "rdma_provider = softnic"};
  if (config != "auto" && config != "mlx5") {
    return absl::InvalidArgumentError(
        absl::StrCat("rdma_provider = '", config, "': expected auto, mlx5, softnic or off"));
  }
  std::vector<std::string> refused;
  for (const v1::Nic& nic : nics) {
    if (!IsMlx5Nic(nic)) continue;
    const uint32_t port = FirstActivePort(nic);
    absl::Status s = probe(nic.name(), port);
    if (s.ok()) {
      return ProviderChoice{"mlx5", nic.name(), port,
                            absl::StrCat("rdma_provider = ", config, ": ", nic.name(), " port ",
                                         port, " opened with DevX")};
    }
    refused.push_back(absl::StrCat(nic.name(), ": ", s.message()));
  }
  const std::string why =
      refused.empty() ? "discovery found no mlx5 NIC (no /sys/class/infiniband/mlx5_* device with "
                        "driver mlx5_core)"
                      : absl::StrCat("no mlx5 NIC could be opened with DevX (",
                                     absl::StrJoin(refused, "; "), ")");
  if (config == "mlx5") {
    return absl::FailedPreconditionError(
        absl::StrCat("rdma_provider = mlx5, but ", why,
                     ": install the ConnectX NIC's driver and rdma-core (libibverbs, libmlx5), "
                     "or set rdma_provider = auto or softnic"));
  }
  return ProviderChoice{"softnic", "", 1, absl::StrCat("rdma_provider = auto: ", why)};
}

}  // namespace mooncake::daemon
