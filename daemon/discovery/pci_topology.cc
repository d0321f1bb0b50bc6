#include "discovery/pci_topology.h"

#include <algorithm>
#include <filesystem>
#include <system_error>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "discovery/sysfs_files.h"
#include "mooncake/common/status.h"

namespace mooncake::daemon {
namespace fs = std::filesystem;

namespace {
// "pci0000:00" (or "pci10000:e0" for a VMD domain): a host bridge directory.
bool IsHostBridgeDir(absl::string_view name) {
  if (!absl::StartsWith(name, "pci")) return false;
  absl::string_view rest = name.substr(3);
  size_t colon = rest.find(':');
  return colon != absl::string_view::npos && colon >= 4 && rest.size() - colon - 1 == 2;
}
}  // namespace

absl::StatusOr<PciPath> ResolvePciPath(absl::string_view sysfs_root, absl::string_view bus_id) {
  std::string bdf = NormalizePciBusId(bus_id);
  std::string link = absl::StrCat(sysfs_root, "/bus/pci/devices/", bdf);
  std::error_code ec;
  fs::path real = fs::canonical(link, ec);
  if (ec) {
    return ErrnoStatus(ec.value(),
                       absl::StrCat("resolve PCI device ", bdf, " (", link,
                                    "); is the device present and the sysfs root right?"));
  }
  PciPath path;
  path.bus_id = bdf;
  std::vector<std::string> chain;
  for (const fs::path& part : real) {
    std::string name = part.string();
    if (path.root_complex.empty()) {
      if (IsHostBridgeDir(name)) path.root_complex = name;
      continue;
    }
    // A VMD domain shows up as a nested "pci10000:e0" directory between
    // bus ids; the devices on either side of it are still one chain.
    if (IsPciBusId(name)) chain.push_back(NormalizePciBusId(name));
  }
  if (path.root_complex.empty() || chain.empty() || chain.back() != bdf) {
    return absl::FailedPreconditionError(
        absl::StrCat("PCI device ", bdf, " resolves to ", real.string(),
                     ", which is not under a pciDDDD:BB host bridge ending in the device; "
                     "cannot place it in the PCIe tree"));
  }
  chain.pop_back();
  path.bridges = std::move(chain);
  path.numa_node = ReadPciNumaNode(sysfs_root, bdf);
  return path;
}

absl::string_view PciDistanceName(PciDistance distance) {
  switch (distance) {
    case PciDistance::kPix: return "PIX";
    case PciDistance::kPxb: return "PXB";
    case PciDistance::kPhb: return "PHB";
    case PciDistance::kNode: return "NODE";
    case PciDistance::kSys: return "SYS";
    case PciDistance::kUnknown: break;
  }
  return "UNKNOWN";
}

PciDistance ClassifyPciDistance(const PciPath& a, const PciPath& b) {
  if (a.root_complex != b.root_complex) {
    return a.numa_node == b.numa_node ? PciDistance::kNode : PciDistance::kSys;
  }
  auto [a_end, b_end] =
      std::mismatch(a.bridges.begin(), a.bridges.end(), b.bridges.begin(), b.bridges.end());
  size_t shared = static_cast<size_t>(a_end - a.bridges.begin());
  if (shared == 0) return PciDistance::kPhb;
  // A PCIe switch is an upstream port with one downstream port per slot;
  // two devices on one switch are each a single bridge (their downstream
  // port) below the shared upstream port. Anything deeper on either side
  // means another switch is crossed.
  size_t a_below = a.bridges.size() - shared;
  size_t b_below = b.bridges.size() - shared;
  return (a_below <= 1 && b_below <= 1) ? PciDistance::kPix : PciDistance::kPxb;
}

PciDistance ClassifyPciDistance(const absl::StatusOr<PciPath>& a,
                                const absl::StatusOr<PciPath>& b) {
  if (!a.ok() || !b.ok()) return PciDistance::kUnknown;
  return ClassifyPciDistance(*a, *b);
}

}  // namespace mooncake::daemon
