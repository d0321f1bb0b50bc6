#include "discovery/nic_discovery.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <set>
#include <system_error>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "discovery/sysfs_files.h"

#if MOONCAKE_HAVE_VERBS
#include <infiniband/verbs.h>
#endif

namespace mooncake::daemon {
namespace fs = std::filesystem;

std::string ParsePortState(absl::string_view text) {
  absl::string_view t = absl::StripAsciiWhitespace(text);
  size_t colon = t.find(':');
  int code = 0;
  if (colon != absl::string_view::npos && absl::SimpleAtoi(t.substr(0, colon), &code)) {
    t = absl::StripAsciiWhitespace(t.substr(colon + 1));
  }
  return std::string(t);
}

uint32_t ParseRateGbps(absl::string_view text) {
  absl::string_view t = absl::StripLeadingAsciiWhitespace(text);
  uint64_t value = 0;
  size_t i = 0;
  for (; i < t.size() && absl::ascii_isdigit(static_cast<unsigned char>(t[i])); ++i) {
    value = value * 10 + static_cast<uint64_t>(t[i] - '0');
    if (value > UINT32_MAX) return 0;
  }
  return i == 0 ? 0 : static_cast<uint32_t>(value);
}

bool IsZeroGid(absl::string_view gid) {
  bool any_digit = false;
  for (char c : gid) {
    if (c == ':') continue;
    if (c != '0') return false;
    any_digit = true;
  }
  return any_digit;
}

std::string GidTypeName(absl::string_view sysfs_type, absl::string_view link_layer) {
  absl::string_view t = absl::StripAsciiWhitespace(sysfs_type);
  // The kernel has one value for IB and RoCE v1 (they share a wire header
  // format); the link layer tells them apart.
  if (t == "IB/RoCE v1") return link_layer == "InfiniBand" ? "IB" : "RoCE v1";
  return std::string(t);
}

namespace {

std::string ReadOr(const std::string& path, absl::string_view fallback = "") {
  absl::StatusOr<std::string> v = ReadSysfsLine(path);
  return v.ok() ? *v : std::string(fallback);
}

v1::NicPort ReadPort(const std::string& port_dir, uint32_t port_num) {
  v1::NicPort port;
  port.set_port(port_num);
  port.set_state(ParsePortState(ReadOr(port_dir + "/state")));
  port.set_phys_state(ParsePortState(ReadOr(port_dir + "/phys_state")));
  port.set_link_layer(ReadOr(port_dir + "/link_layer"));
  std::string rate = ReadOr(port_dir + "/rate");
  port.set_rate_gbps(ParseRateGbps(rate));
  port.set_rate(std::move(rate));
  uint32_t lid = 0;
  // sysfs prints the LID in hex ("0x1a"); RoCE ports say 0x0.
  if (absl::SimpleHexAtoi(ReadOr(port_dir + "/lid"), &lid)) port.set_lid(lid);

  absl::StatusOr<std::vector<std::string>> gid_names = ListSysfsDir(port_dir + "/gids");
  if (!gid_names.ok()) return port;
  for (const std::string& name : *gid_names) {
    uint32_t index = 0;
    if (!absl::SimpleAtoi(name, &index)) continue;
    // Reading an unpopulated RoCE GID can fail (EINVAL); treat as unused.
    absl::StatusOr<std::string> gid = ReadSysfsLine(absl::StrCat(port_dir, "/gids/", name));
    if (!gid.ok() || gid->empty() || IsZeroGid(*gid)) continue;
    v1::Gid* g = port.add_gids();
    g->set_index(index);
    g->set_gid(absl::AsciiStrToLower(*gid));
    std::string type = ReadOr(absl::StrCat(port_dir, "/gid_attrs/types/", name));
    if (!type.empty()) g->set_type(GidTypeName(type, port.link_layer()));
    g->set_netdev(ReadOr(absl::StrCat(port_dir, "/gid_attrs/ndevs/", name)));
  }
  return port;
}

#if MOONCAKE_HAVE_VERBS
// Asks libibverbs which devices it can open and compares with sysfs.
std::vector<std::string> CrossCheckWithVerbs(const std::vector<v1::Nic>& nics) {
  int count = 0;
  ibv_device** list = ibv_get_device_list(&count);
  if (list == nullptr) {
    int err = errno;
    // With no RDMA device at all verbs may refuse to list (ENOSYS): that is
    // the "no NIC" case sysfs already reported, not a second problem.
    if (nics.empty()) return {};
    return {absl::StrCat("ibv_get_device_list failed: ", std::strerror(err),
                         "; load the ib_uverbs kernel module and check /dev/infiniband "
                         "permissions")};
  }
  std::vector<std::string> verbs_names;
  for (int i = 0; i < count; ++i) verbs_names.push_back(ibv_get_device_name(list[i]));
  ibv_free_device_list(list);
  return CompareWithVerbsDevices(nics, verbs_names);
}
#endif

}  // namespace

std::vector<std::string> CompareWithVerbsDevices(const std::vector<v1::Nic>& nics,
                                                 const std::vector<std::string>& verbs_names) {
  std::vector<std::string> problems;
  std::set<std::string> in_verbs(verbs_names.begin(), verbs_names.end());
  std::set<std::string> in_sysfs;
  for (const v1::Nic& nic : nics) {
    in_sysfs.insert(nic.name());
    if (in_verbs.count(nic.name()) == 0) {
      problems.push_back(
          absl::StrCat(nic.name(),
                       " is in sysfs but libibverbs cannot see it: install the rdma-core "
                       "user-space provider for driver '",
                       nic.driver(),
                       "' (ibverbs-providers) and load "
                       "ib_uverbs"));
    }
  }
  for (const std::string& name : in_verbs) {
    if (in_sysfs.count(name) == 0) {
      problems.push_back(absl::StrCat("libibverbs lists ", name,
                                      " but sysfs has no class/infiniband entry for it"));
    }
  }
  return problems;
}

absl::StatusOr<v1::Nic> ReadNic(absl::string_view sysfs_root, absl::string_view name) {
  std::string dir = absl::StrCat(sysfs_root, "/class/infiniband/", name);
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return absl::NotFoundError(absl::StrCat("RDMA device ", name, ": ", dir, " does not exist"));
  }
  v1::Nic nic;
  nic.set_name(std::string(name));
  fs::path pci = fs::canonical(dir + "/device", ec);
  // Soft devices (rxe, siw) have no PCI function of their own.
  if (!ec && IsPciBusId(pci.filename().string())) {
    nic.set_pci_bus_id(NormalizePciBusId(pci.filename().string()));
  }
  int numa = -1;
  if (!absl::SimpleAtoi(ReadOr(dir + "/device/numa_node"), &numa) || numa < 0) numa = -1;
  nic.set_numa_node(numa);
  nic.set_node_guid(ReadOr(dir + "/node_guid"));
  nic.set_fw_ver(ReadOr(dir + "/fw_ver"));
  absl::StatusOr<std::string> driver = ReadSymlinkBasename(dir + "/device/driver");
  if (driver.ok()) nic.set_driver(*driver);

  absl::StatusOr<std::vector<std::string>> ports = ListSysfsDir(dir + "/ports");
  if (ports.ok()) {
    for (const std::string& p : *ports) {
      uint32_t num = 0;
      if (!absl::SimpleAtoi(p, &num)) continue;
      *nic.add_ports() = ReadPort(absl::StrCat(dir, "/ports/", p), num);
    }
  }
  return nic;
}

NicDiscoveryResult DiscoverNics(const NicDiscoveryOptions& options) {
  NicDiscoveryResult result;
  std::error_code ec;
  if (!fs::is_directory(options.sysfs_root, ec)) {
    result.note = absl::StrCat("sysfs root '", options.sysfs_root,
                               "' does not exist: point the sysfs root option at the mounted "
                               "sysfs (normally /sys)");
    return result;
  }
  std::string class_dir = options.sysfs_root + "/class/infiniband";
  absl::StatusOr<std::vector<std::string>> names = ListSysfsDir(class_dir);
  std::vector<std::string> problems;
  if (!names.ok() || names->empty()) {
    problems.push_back(absl::StrCat(
        "no RDMA NIC: ", class_dir, names.ok() ? " is empty" : " does not exist",
        " (no RDMA-capable NIC, or its kernel driver, e.g. mlx5_ib, is not loaded); GPU "
        "transfers within this node (NVLink or PCIe P2P) do not need one"));
  } else {
    for (const std::string& name : *names) {
      absl::StatusOr<v1::Nic> nic = ReadNic(options.sysfs_root, name);
      if (!nic.ok()) {
        problems.push_back(std::string(nic.status().message()));
        continue;
      }
      if (nic->ports_size() == 0) {
        problems.push_back(
            absl::StrCat(name, " has no readable ports under ", class_dir, "/", name, "/ports"));
      }
      result.nics.push_back(*std::move(nic));
    }
  }
#if MOONCAKE_HAVE_VERBS
  // libibverbs always reads the real sysfs, so comparing it with a fake
  // tree would only report differences the test tree made up.
  std::string root = fs::path(options.sysfs_root).lexically_normal().string();
  while (root.size() > 1 && root.back() == '/') root.pop_back();
  if (options.use_verbs && root == "/sys") {
    std::vector<std::string> verbs_problems = CrossCheckWithVerbs(result.nics);
    problems.insert(problems.end(), verbs_problems.begin(), verbs_problems.end());
  }
#endif
  result.note = absl::StrJoin(problems, "; ");
  return result;
}

}  // namespace mooncake::daemon
