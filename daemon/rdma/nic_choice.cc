#include "rdma/nic_choice.h"

#include <algorithm>
#include <climits>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "mooncake/common/escape.h"

namespace mooncake::daemon {

int DistanceRank(const std::string& distance) {
  static constexpr const char* kOrder[] = {"PIX", "PXB", "PHB", "NODE", "SYS"};
  for (int i = 0; i < 5; ++i) {
    if (distance == kOrder[i]) return i;
  }
  return 5;
}

namespace {

bool SameBusId(const std::string& a, const std::string& b) {
  // sysfs writes lower case and CUDA upper case; CUDA's domain may be
  // 8 digits ("00000000:1B:00.0") where sysfs has 4.
  auto norm = [](std::string s) {
    s = absl::AsciiStrToLower(s);
    const size_t colon = s.find(':');
    if (colon != std::string::npos && colon > 4) s = s.substr(colon - 4);
    return s;
  };
  return !a.empty() && norm(a) == norm(b);
}

}  // namespace

absl::StatusOr<NicChoice> ChooseSessionNic(const v1::Topology& topology,
                                           const std::vector<std::string>& served,
                                           const NicRequest& request) {
  if (served.empty()) return absl::FailedPreconditionError("the RDMA provider serves no NIC");
  if (request.allowed.size() > 64) {
    return absl::InvalidArgumentError("at most 64 NIC names may be allowed");
  }
  if (request.gpu_pci_bus_id.size() > 32) {
    return absl::InvalidArgumentError("gpu_pci_bus_id is longer than a PCI address");
  }
  std::vector<std::string> candidates;
  for (const std::string& name : request.allowed) {
    if (name.size() > 64) return absl::InvalidArgumentError("a NIC name is longer than 64 bytes");
    if (std::find(served.begin(), served.end(), name) == served.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "NIC \"", EscapeForDisplay(name, 64), "\" is not served by mooncaked here (it serves ",
          absl::StrJoin(served, ", "), ")"));
    }
    if (std::find(candidates.begin(), candidates.end(), name) == candidates.end()) {
      candidates.push_back(name);
    }
  }
  if (candidates.empty()) candidates = served;

  int gpu = -1;
  for (const v1::Gpu& g : topology.gpus()) {
    if (SameBusId(g.pci_bus_id(), request.gpu_pci_bus_id)) gpu = g.index();
  }
  if (gpu >= 0) {
    std::string best;
    int best_rank = INT_MAX;
    std::string best_distance;
    // Candidates in order, so a tie keeps the caller's (or the provider's)
    // order.
    for (const std::string& nic : candidates) {
      for (const v1::GpuNicAffinity& a : topology.affinity()) {
        if (a.gpu() != gpu || a.nic() != nic) continue;
        const int rank = DistanceRank(a.distance());
        if (rank < best_rank) {
          best_rank = rank;
          best = nic;
          best_distance = a.distance();
        }
      }
    }
    if (!best.empty()) {
      return NicChoice{
          best, absl::StrCat(best, " is the closest to GPU ", gpu, " (", best_distance, ") of ",
                             candidates.size(), candidates.size() == 1 ? " NIC" : " NICs")};
    }
    return NicChoice{candidates.front(),
                     absl::StrCat("discovery knows no path from GPU ", gpu, " to ",
                                  absl::StrJoin(candidates, ", "), "; the first")};
  }
  if (!request.gpu_pci_bus_id.empty()) {
    return NicChoice{candidates.front(),
                     absl::StrCat("GPU ", EscapeForDisplay(request.gpu_pci_bus_id, 32),
                                  " is not one discovery found; the first allowed NIC")};
  }
  return NicChoice{candidates.front(), "no GPU given; the first allowed NIC"};
}

}  // namespace mooncake::daemon
