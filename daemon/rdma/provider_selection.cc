#include "rdma/provider_selection.h"

#include <algorithm>

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
                                                  const Mlx5Probe& probe,
                                                  const std::vector<std::string>& only) {
  if (config == "off") return ProviderChoice{"off", "", 1, {}, "rdma_provider = off"};
  if (config == "softnic") return ProviderChoice{"softnic", "", 1, {}, "rdma_provider = softnic"};
  if (config != "auto" && config != "mlx5") {
    return absl::InvalidArgumentError(
        absl::StrCat("rdma_provider = '", config, "': expected auto, mlx5, softnic or off"));
  }
  for (const std::string& name : only) {
    const bool found =
        std::any_of(nics.begin(), nics.end(), [&](const v1::Nic& n) { return n.name() == name; });
    if (!found) {
      std::vector<std::string> names;
      for (const v1::Nic& n : nics) names.push_back(n.name());
      return absl::InvalidArgumentError(
          absl::StrCat("rdma_devices names ", name, ", which discovery did not find (found: ",
                       names.empty() ? "no NIC" : absl::StrJoin(names, ", "), ")"));
    }
  }
  std::vector<std::string> refused;
  ProviderChoice choice;
  for (const v1::Nic& nic : nics) {
    if (!IsMlx5Nic(nic)) continue;
    if (!only.empty() && std::find(only.begin(), only.end(), nic.name()) == only.end()) continue;
    const uint32_t port = FirstActivePort(nic);
    absl::Status s = probe(nic.name(), port);
    if (s.ok()) {
      choice.devices.push_back(Mlx5Device{nic.name(), port});
    } else {
      refused.push_back(absl::StrCat(nic.name(), ": ", s.message()));
    }
  }
  if (!choice.devices.empty()) {
    choice.provider = "mlx5";
    choice.device = choice.devices.front().device;
    choice.port = choice.devices.front().port;
    std::vector<std::string> opened;
    for (const Mlx5Device& d : choice.devices) {
      opened.push_back(absl::StrCat(d.device, " port ", d.port));
    }
    choice.reason = absl::StrCat("rdma_provider = ", config, ": ", absl::StrJoin(opened, ", "),
                                 " opened with DevX");
    if (!refused.empty()) {
      absl::StrAppend(&choice.reason, " (not used: ", absl::StrJoin(refused, "; "), ")");
    }
    return choice;
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
  return ProviderChoice{"softnic", "", 1, {}, absl::StrCat("rdma_provider = auto: ", why)};
}

}  // namespace mooncake::daemon
