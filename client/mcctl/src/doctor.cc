#include "mooncake/mcctl/doctor.h"

#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "discovery/discovery.h"
#include "discovery/pci_topology.h"
#include "discovery/sysfs_files.h"
#include "mooncake/common/escape.h"
#include "mooncake/common/socket_access.h"

namespace mooncake::mcctl {
namespace {

using daemon::ListSysfsDir;
using daemon::ReadSysfsLine;

constexpr int64_t kMiB = int64_t{1} << 20;
constexpr int64_t kMinMemlock = 64 * kMiB;  // verbs queues and pinned control memory
constexpr int64_t kWantedNofile = 65536;    // an fd per peer and buffer in large groups
constexpr int kMinCudaForDmabuf = 11070;    // cuMemGetHandleForAddressRange (dmabuf)
constexpr uint16_t kAcsCapId = 0x000D;
constexpr uint16_t kAcsRequestRedirect = 1u << 2;
constexpr uint16_t kAcsCompletionRedirect = 1u << 3;

std::string Join(const std::string& root, absl::string_view rel) {
  std::string r = root;
  while (r.size() > 1 && r.back() == '/') r.pop_back();
  if (r == "/") r.clear();
  return absl::StrCat(r, "/", rel);
}

// The whole file (config space is binary), or NotFound/errno.
absl::StatusOr<std::string> ReadWhole(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool Exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

DoctorCheck Check(std::string name, CheckStatus status, std::string detail, std::string fix = "") {
  return DoctorCheck{std::move(name), status, std::move(detail), std::move(fix)};
}

// "570.86.15" from the NVRM version line; empty when absent.
std::string VersionToken(absl::string_view text) {
  for (absl::string_view tok : absl::StrSplit(text, absl::ByAnyChar(" \t\n"), absl::SkipEmpty())) {
    if (tok.empty() || !absl::ascii_isdigit(tok[0]) || !absl::StrContains(tok, '.')) continue;
    if (std::all_of(tok.begin(), tok.end(),
                    [](char c) { return absl::ascii_isdigit(c) || c == '.'; })) {
      return std::string(tok);
    }
  }
  return "";
}

std::string CudaVersionText(int v) {
  if (v <= 0) return "none";
  return absl::StrCat(v / 1000, ".", (v % 1000) / 10);
}

// Everything the checks share, read once.
struct Facts {
  std::string root;
  v1::Topology topo;
  bool have_module = false;  // /proc/driver/nvidia/version
  std::string module_version;
  bool open_module = false;
  bool peermem = false;
  std::string peermem_name;
  std::string kernel_release;
  int kernel_major = 0, kernel_minor = 0;
  std::vector<const v1::Nic*> hw_nics;  // not softnic
};

Facts Gather(const DoctorOptions& opt) {
  Facts f;
  f.root = opt.root;
  f.topo = LocalTopology(opt);
  for (const v1::Nic& n : f.topo.nics()) {
    if (n.provider() != "softnic") f.hw_nics.push_back(&n);
  }
  if (auto v = ReadWhole(Join(opt.root, "proc/driver/nvidia/version")); v.ok()) {
    f.have_module = true;
    std::string first = std::string(v->substr(0, v->find('\n')));
    f.module_version = VersionToken(first);
    f.open_module = absl::StrContains(first, "Open Kernel Module");
  } else if (auto mv = ReadSysfsLine(Join(opt.root, "sys/module/nvidia/version")); mv.ok()) {
    f.have_module = true;
    f.module_version = *mv;
  }
  for (const char* m : {"nvidia_peermem", "nv_peer_mem"}) {
    if (Exists(Join(opt.root, absl::StrCat("sys/module/", m)))) {
      f.peermem = true;
      f.peermem_name = m;
      break;
    }
  }
  if (!f.peermem) {
    if (auto mods = ReadWhole(Join(opt.root, "proc/modules")); mods.ok()) {
      for (absl::string_view line : absl::StrSplit(*mods, '\n')) {
        if (absl::StartsWith(line, "nvidia_peermem ") || absl::StartsWith(line, "nv_peer_mem ")) {
          f.peermem = true;
          f.peermem_name = std::string(line.substr(0, line.find(' ')));
        }
      }
    }
  }
  if (auto rel = ReadSysfsLine(Join(opt.root, "proc/sys/kernel/osrelease")); rel.ok()) {
    f.kernel_release = *rel;
    std::vector<std::string> parts = absl::StrSplit(*rel, absl::ByAnyChar(".-"));
    if (parts.size() >= 2) {
      (void)absl::SimpleAtoi(parts[0], &f.kernel_major);
      (void)absl::SimpleAtoi(parts[1], &f.kernel_minor);
    }
  }
  return f;
}

DoctorCheck DriverCheck(const Facts& f) {
  const int cuda = f.topo.cuda_driver_version();
  std::string module =
      f.have_module
          ? absl::StrCat("NVIDIA kernel module ",
                         f.module_version.empty() ? "(version unreadable)" : f.module_version,
                         f.open_module ? " (open)" : "")
          : "no NVIDIA kernel module (no /proc/driver/nvidia/version)";
  std::string detail = absl::StrCat(module, ", CUDA driver API ", CudaVersionText(cuda));
  if (cuda == 0) {
    return Check("driver", CheckStatus::kFail,
                 absl::StrCat(detail, ": ", f.topo.gpu_discovery_note()),
                 "install the NVIDIA driver (kernel module and libcuda.so.1), e.g. apt-get install "
                 "nvidia-open, or run on a GPU node");
  }
  if (cuda < kMinCudaForDmabuf) {
    return Check("driver", CheckStatus::kFail, detail,
                 "upgrade the NVIDIA driver: GPU-initiated RDMA needs CUDA 11.7 or newer (dmabuf "
                 "export of GPU memory)");
  }
  if (!f.have_module) {
    return Check("driver", CheckStatus::kWarn, detail,
                 "libcuda answers but the kernel module is not visible in /proc/driver/nvidia: "
                 "check that this is the host's driver (containers: mount /proc/driver/nvidia)");
  }
  return Check("driver", CheckStatus::kOk, detail);
}

DoctorCheck GpusCheck(const Facts& f) {
  const auto& gpus = f.topo.gpus();
  if (gpus.empty()) {
    return Check(
        "gpus", CheckStatus::kFail,
        absl::StrCat("no GPU: ", f.topo.gpu_discovery_note().empty() ? "the CUDA driver lists none"
                                                                     : f.topo.gpu_discovery_note()),
        "check nvidia-smi; in a container, expose the GPUs (--gpus all, or the NVIDIA "
        "device plugin)");
  }
  std::vector<std::string> names;
  for (const v1::Gpu& g : gpus)
    names.push_back(absl::StrCat(g.index(), ": ", g.name(), " ", g.pci_bus_id()));
  return Check("gpus", CheckStatus::kOk,
               absl::StrCat(gpus.size(), " GPU", gpus.size() == 1 ? "" : "s", " (",
                            absl::StrJoin(names, "; "), ")"));
}

DoctorCheck P2pCheck(const Facts& f) {
  const int n = f.topo.gpus_size();
  if (n == 0) return Check("p2p", CheckStatus::kSkip, "no GPU");
  if (n == 1) return Check("p2p", CheckStatus::kSkip, "one GPU: no pairs to check");
  std::map<std::pair<int, int>, const v1::GpuPair*> pairs;
  for (const v1::GpuPair& p : f.topo.gpu_pairs()) pairs[{p.src(), p.dst()}] = &p;
  std::vector<std::string> missing, asymmetric, no_access, no_atomics;
  for (const v1::Gpu& a : f.topo.gpus()) {
    for (const v1::Gpu& b : f.topo.gpus()) {
      if (a.index() == b.index()) continue;
      auto ab = pairs.find({a.index(), b.index()});
      auto ba = pairs.find({b.index(), a.index()});
      std::string name = absl::StrCat(a.index(), "->", b.index());
      if (ab == pairs.end()) {
        missing.push_back(name);
        continue;
      }
      if (ba != pairs.end() && ab->second->access_supported() != ba->second->access_supported() &&
          a.index() < b.index()) {
        asymmetric.push_back(absl::StrCat(a.index(), "<->", b.index()));
      }
      if (!ab->second->access_supported()) {
        no_access.push_back(name);
      } else if (!ab->second->native_atomics()) {
        no_atomics.push_back(name);
      }
    }
  }
  const int total = n * (n - 1);
  if (!asymmetric.empty()) {
    return Check("p2p", CheckStatus::kFail,
                 absl::StrCat("P2P access is one-way between GPUs ",
                              absl::StrJoin(asymmetric, ", "), ": the matrix is not sane"),
                 "check the PCIe/NVLink topology (nvidia-smi topo -m), ACS and IOMMU settings, and "
                 "the driver; a one-way pair points at a platform or driver fault");
  }
  std::vector<std::string> notes;
  if (!missing.empty())
    notes.push_back(absl::StrCat("not reported: ", absl::StrJoin(missing, ", ")));
  if (!no_access.empty())
    notes.push_back(absl::StrCat("no P2P access: ", absl::StrJoin(no_access, ", ")));
  if (!no_atomics.empty()) {
    notes.push_back(absl::StrCat("no native atomics: ", absl::StrJoin(no_atomics, ", ")));
  }
  if (!notes.empty()) {
    return Check("p2p", CheckStatus::kWarn,
                 absl::StrCat(total - static_cast<int>(no_access.size() + missing.size()), " of ",
                              total, " pairs with P2P access; ", absl::StrJoin(notes, "; ")),
                 "pairs without P2P use RDMA or the softnic instead; without native atomics "
                 "mc_red_add over P2P is emulated. Check nvidia-smi topo -m and ACS (pcie-acs)");
  }
  return Check("p2p", CheckStatus::kOk,
               absl::StrCat("all ", total, " GPU pairs have P2P access and native atomics"));
}

bool DmabufUsable(const Facts& f, std::vector<std::string>* why) {
  bool ok = true;
  if (f.kernel_release.empty()) {
    why->push_back("kernel release unknown (no proc/sys/kernel/osrelease)");
    ok = false;
  } else if (f.kernel_major < 5 || (f.kernel_major == 5 && f.kernel_minor < 12)) {
    why->push_back(absl::StrCat("kernel ", f.kernel_release, " predates 5.12 (ibv_reg_dmabuf_mr)"));
    ok = false;
  }
  if (f.have_module && !f.open_module) {
    why->push_back(
        "the NVIDIA kernel module is the proprietary one (dmabuf needs the open module)");
    ok = false;
  }
  std::vector<std::string> no;
  for (const v1::Gpu& g : f.topo.gpus()) {
    if (!g.dmabuf_supported()) no.push_back(absl::StrCat(g.index()));
  }
  if (!no.empty()) {
    why->push_back(absl::StrCat("GPU ", absl::StrJoin(no, ","), " without dmabuf support"));
    ok = false;
  }
  return ok;
}

DoctorCheck PeermemCheck(const Facts& f) {
  if (f.topo.gpus().empty()) return Check("peermem", CheckStatus::kSkip, "no GPU");
  if (f.peermem) return Check("peermem", CheckStatus::kOk, absl::StrCat(f.peermem_name, " loaded"));
  std::vector<std::string> why;
  if (DmabufUsable(f, &why)) {
    return Check("peermem", CheckStatus::kWarn,
                 "nvidia-peermem not loaded; dmabuf covers GPUDirect RDMA here",
                 "optional: modprobe nvidia-peermem (the fallback when dmabuf registration fails)");
  }
  return Check("peermem", f.hw_nics.empty() ? CheckStatus::kWarn : CheckStatus::kFail,
               "nvidia-peermem not loaded, and dmabuf is not usable: no GPUDirect RDMA",
               "modprobe nvidia-peermem (and list it in /etc/modules-load.d/), or enable dmabuf "
               "(see the dmabuf check)");
}

DoctorCheck DmabufCheck(const Facts& f) {
  if (f.topo.gpus().empty()) return Check("dmabuf", CheckStatus::kSkip, "no GPU");
  std::vector<std::string> why;
  if (DmabufUsable(f, &why)) {
    return Check(
        "dmabuf", CheckStatus::kOk,
        absl::StrCat("kernel ", f.kernel_release, ", ", f.have_module ? "open NVIDIA module, " : "",
                     "every GPU supports dmabuf"));
  }
  const std::string fix =
      "use kernel 5.12 or newer and the NVIDIA open kernel module (nvidia-open, driver 515+), "
      "on GPUs that support dmabuf (Turing and newer)";
  if (f.peermem) {
    return Check("dmabuf", CheckStatus::kWarn,
                 absl::StrCat(absl::StrJoin(why, "; "), "; nvidia-peermem is the fallback"), fix);
  }
  return Check("dmabuf", f.hw_nics.empty() ? CheckStatus::kWarn : CheckStatus::kFail,
               absl::StrJoin(why, "; "), fix);
}

DoctorCheck RegkeyCheck(const Facts& f) {
  const std::string name = "peer-mapping-regkey";
  if (f.topo.gpus().empty()) return Check(name, CheckStatus::kSkip, "no GPU");
  const std::string fix =
      "add 'options nvidia NVreg_RegistryDwords=\"PeerMappingOverride=1;\"' to "
      "/etc/modprobe.d/nvidia.conf, then reload the nvidia module (or reboot)";
  absl::StatusOr<std::string> params = ReadWhole(Join(f.root, "proc/driver/nvidia/params"));
  if (!params.ok()) {
    return Check(name, CheckStatus::kSkip,
                 "no /proc/driver/nvidia/params: the NVIDIA kernel module is not loaded here");
  }
  std::string dwords;
  for (absl::string_view line : absl::StrSplit(*params, '\n')) {
    if (absl::StartsWith(line, "RegistryDwords:")) dwords = std::string(line.substr(15));
  }
  if (absl::StrContains(absl::StrReplaceAll(dwords, {{" ", ""}}), "PeerMappingOverride=1")) {
    return Check(name, CheckStatus::kOk, "PeerMappingOverride=1 is active (RegistryDwords)");
  }
  // Configured but not active yet?
  std::string configured;
  if (auto files = ListSysfsDir(Join(f.root, "etc/modprobe.d")); files.ok()) {
    for (const std::string& file : *files) {
      auto text = ReadWhole(Join(f.root, absl::StrCat("etc/modprobe.d/", file)));
      if (text.ok() && absl::StrContains(*text, "PeerMappingOverride=1")) configured = file;
    }
  }
  std::string detail = "PeerMappingOverride=1 is not in the loaded module's RegistryDwords";
  if (!configured.empty()) {
    absl::StrAppend(&detail, " (set in /etc/modprobe.d/", configured,
                    " but the module was loaded before: reload it)");
  }
  return Check(name, f.hw_nics.empty() ? CheckStatus::kWarn : CheckStatus::kFail, detail, fix);
}

// The bridges on the PCIe path between two devices where P2P requests enter
// a switch: those below the deepest bridge both share.
std::vector<std::string> SwitchPortsBetween(const daemon::PciPath& a, const daemon::PciPath& b) {
  if (a.root_complex != b.root_complex) return {};
  size_t common = 0;
  while (common < a.bridges.size() && common < b.bridges.size() &&
         a.bridges[common] == b.bridges[common]) {
    ++common;
  }
  if (common == 0) return {};  // different root ports: through the root complex anyway
  std::vector<std::string> out;
  for (size_t i = common; i < a.bridges.size(); ++i) out.push_back(a.bridges[i]);
  for (size_t i = common; i < b.bridges.size(); ++i) out.push_back(b.bridges[i]);
  return out;
}

DoctorCheck AcsCheck(const Facts& f) {
  const std::string name = "pcie-acs";
  if (f.topo.gpus().empty()) return Check(name, CheckStatus::kSkip, "no GPU");
  if (f.hw_nics.empty()) return Check(name, CheckStatus::kSkip, "no RDMA NIC");
  const std::string sysfs = Join(f.root, "sys");
  std::map<std::string, const v1::Nic*> nics;
  for (const v1::Nic* n : f.hw_nics) nics[n->name()] = n;
  std::set<std::string> ports;
  std::vector<std::string> paths;
  for (const v1::GpuNicAffinity& a : f.topo.affinity()) {
    if (!a.closest() || nics.count(a.nic()) == 0 || a.gpu() < 0 || a.gpu() >= f.topo.gpus_size()) {
      continue;
    }
    auto gp = daemon::ResolvePciPath(sysfs, f.topo.gpus(a.gpu()).pci_bus_id());
    auto np = daemon::ResolvePciPath(sysfs, nics[a.nic()]->pci_bus_id());
    if (!gp.ok() || !np.ok()) continue;
    std::vector<std::string> between = SwitchPortsBetween(*gp, *np);
    if (!between.empty()) paths.push_back(absl::StrCat("GPU ", a.gpu(), "<->", a.nic()));
    ports.insert(between.begin(), between.end());
  }
  if (ports.empty()) {
    return Check(name, CheckStatus::kOk,
                 "no PCIe switch port between any GPU and its closest NIC (their traffic crosses "
                 "the root complex, where ACS does not redirect it)");
  }
  std::vector<std::string> redirecting, unreadable, without;
  for (const std::string& port : ports) {
    absl::StatusOr<std::string> config =
        ReadWhole(Join(sysfs, absl::StrCat("bus/pci/devices/", port, "/config")));
    absl::StatusOr<uint16_t> ctrl =
        config.ok() ? AcsControlFromConfig(*config) : absl::StatusOr<uint16_t>(config.status());
    if (ctrl.ok()) {
      if (*ctrl & (kAcsRequestRedirect | kAcsCompletionRedirect)) {
        redirecting.push_back(
            absl::StrCat(port, " (ACSCtl 0x", absl::Hex(*ctrl, absl::kZeroPad4), ")"));
      }
    } else if (absl::IsNotFound(ctrl.status()) && config.ok()) {
      without.push_back(port);
    } else {
      unreadable.push_back(port);
    }
  }
  if (!redirecting.empty()) {
    return Check(
        name, CheckStatus::kFail,
        absl::StrCat("ACS redirects P2P requests at ", absl::StrJoin(redirecting, ", "),
                     " (on the path of ", absl::StrJoin(paths, ", "), ")"),
        "disable ACS Request/Completion Redirect on those switch ports (BIOS setting, or "
        "setpci -s <port> ECAP_ACS+0x6.w=0000 at every boot); in VMs keep ACS and use ATS");
  }
  if (!unreadable.empty()) {
    return Check(name, CheckStatus::kSkip,
                 absl::StrCat("cannot read the extended config space of ",
                              absl::StrJoin(unreadable, ", "), " (needs root)"),
                 "run mcctl doctor as root to check ACS");
  }
  return Check(
      name, CheckStatus::kOk,
      absl::StrCat(ports.size(), " switch port(s) on the GPU-NIC paths, none redirects P2P"));
}

DoctorCheck IommuCheck(const Facts& f) {
  const std::string sysfs = Join(f.root, "sys");
  auto units = ListSysfsDir(Join(sysfs, "class/iommu"));
  std::string cmdline;
  if (auto c = ReadSysfsLine(Join(f.root, "proc/cmdline")); c.ok()) {
    for (absl::string_view w : absl::StrSplit(*c, ' ', absl::SkipEmpty())) {
      if (absl::StrContains(w, "iommu")) absl::StrAppend(&cmdline, cmdline.empty() ? "" : " ", w);
    }
  }
  std::string boot = cmdline.empty() ? "" : absl::StrCat(" (kernel command line: ", cmdline, ")");
  if (!units.ok() || units->empty()) {
    return Check("iommu", CheckStatus::kOk, absl::StrCat("no IOMMU enabled", boot));
  }
  std::vector<std::string> translated, passthrough;
  std::vector<std::string> devices;
  for (const v1::Gpu& g : f.topo.gpus())
    devices.push_back(daemon::NormalizePciBusId(g.pci_bus_id()));
  for (const v1::Nic* n : f.hw_nics) devices.push_back(daemon::NormalizePciBusId(n->pci_bus_id()));
  for (const std::string& bdf : devices) {
    auto type =
        ReadSysfsLine(Join(sysfs, absl::StrCat("bus/pci/devices/", bdf, "/iommu_group/type")));
    if (!type.ok()) continue;
    if (*type == "identity") {
      passthrough.push_back(bdf);
    } else {
      translated.push_back(absl::StrCat(bdf, " (", *type, ")"));
    }
  }
  if (!translated.empty()) {
    return Check(
        "iommu", CheckStatus::kWarn,
        absl::StrCat("IOMMU translates DMA for ", absl::StrJoin(translated, ", "), boot),
        "use passthrough for GPUDirect RDMA peer traffic: add iommu=pt (with intel_iommu=on "
        "or amd_iommu=on) to the kernel command line, or turn the IOMMU off");
  }
  return Check(
      "iommu", CheckStatus::kOk,
      absl::StrCat(
          "IOMMU on (", units->size(), " unit(s)), passthrough",
          passthrough.empty() ? "" : absl::StrCat(" for ", absl::StrJoin(passthrough, ", ")),
          boot));
}

std::string LimitText(int64_t v) {
  if (v < 0) return "unlimited";
  if (v >= kMiB && v % kMiB == 0) return absl::StrCat(v / kMiB, " MiB");
  return absl::StrCat(v);
}

DoctorCheck LimitCheck(const Facts& f, const DaemonFacts& daemon, const std::string& name,
                       const std::string& what, int64_t fail_below, int64_t want, bool can_fail,
                       const std::string& fix) {
  auto self_text = ReadWhole(Join(f.root, "proc/self/limits"));
  absl::StatusOr<int64_t> self = self_text.ok() ? SoftLimitFromProcLimits(*self_text, what)
                                                : absl::StatusOr<int64_t>(self_text.status());
  if (!self.ok()) {
    return Check(name, CheckStatus::kSkip,
                 absl::StrCat("cannot read ", what, " from /proc/self/limits"));
  }
  auto judge = [&](int64_t v) {
    if (v < 0 || v >= want) return CheckStatus::kOk;
    if (can_fail && v < fail_below) return CheckStatus::kFail;
    return CheckStatus::kWarn;
  };
  CheckStatus status = judge(*self);
  std::string detail = absl::StrCat("this shell's soft limit: ", LimitText(*self));
  if (daemon.status.ok() && daemon.status->pid() > 0) {
    auto dt = ReadWhole(Join(f.root, absl::StrCat("proc/", daemon.status->pid(), "/limits")));
    absl::StatusOr<int64_t> d =
        dt.ok() ? SoftLimitFromProcLimits(*dt, what) : absl::StatusOr<int64_t>(dt.status());
    if (d.ok()) {
      absl::StrAppend(&detail, "; mooncaked's: ", LimitText(*d));
      status = std::max(status, judge(*d), [](CheckStatus a, CheckStatus b) {
        return static_cast<int>(a) < static_cast<int>(b);
      });
    }
  }
  return Check(name, status, detail, status == CheckStatus::kOk ? "" : fix);
}

DoctorCheck SocketCheck(const DoctorOptions& opt, const DaemonFacts& daemon) {
  if (daemon.status.ok()) {
    return Check("socket-access", CheckStatus::kOk,
                 absl::StrCat("this user reaches mooncaked at ", opt.socket));
  }
  SocketAccessFacts facts = InspectSocketAccess(opt.socket);
  if (!facts.stat_ok) {
    return Check("socket-access", CheckStatus::kFail,
                 absl::StrCat("no socket at ", opt.socket, ": mooncaked is not running here"),
                 "start it (systemctl start mooncaked), or pass --socket / set MOONCAKE_SOCKET");
  }
  const bool others_may = (facts.mode & 0002) != 0;
  if (facts.uid == 0 || facts.in_group || others_may || facts.owner == facts.user) {
    return Check("socket-access", CheckStatus::kOk,
                 absl::StrCat("may open ", opt.socket, " (mode 0",
                              absl::StrFormat("%o", facts.mode), ", group '", facts.group, "')"));
  }
  return Check("socket-access", CheckStatus::kFail, SocketAccessDeniedMessage(opt.socket, facts),
               absl::StrCat("usermod -aG ", facts.group, " $USER, then log in again"));
}

DoctorCheck NicPortsCheck(const Facts& f) {
  if (f.hw_nics.empty()) {
    return Check(
        "nic-ports", CheckStatus::kWarn,
        absl::StrCat(f.topo.nic_discovery_note().empty() ? "no RDMA NIC in /sys/class/infiniband"
                                                         : f.topo.nic_discovery_note(),
                     ". GPU-initiated RDMA (IBGDA) is unavailable: groups use P2P within "
                     "the node and mooncaked's softnic across nodes"),
        "install the NIC driver (mlx5_core, rdma-core) if this node has a ConnectX NIC");
  }
  int good = 0, total = 0;
  std::vector<std::string> bad, fine;
  for (const v1::Nic* n : f.hw_nics) {
    for (const v1::NicPort& p : n->ports()) {
      ++total;
      const std::string where = absl::StrCat(n->name(), "/", p.port());
      std::vector<std::string> issues;
      if (!absl::StrContains(p.state(), "ACTIVE"))
        issues.push_back(absl::StrCat("state ", p.state()));
      if (!absl::StrContains(p.phys_state(), "LinkUp"))
        issues.push_back(absl::StrCat("phys ", p.phys_state()));
      if (p.link_layer() == "InfiniBand") {
        if (p.lid() == 0) issues.push_back("no LID (is a subnet manager running?)");
      } else {
        bool v2 = false;
        for (const v1::Gid& g : p.gids()) v2 |= (g.type() == "RoCE v2" && !g.netdev().empty());
        if (!v2) issues.push_back("no RoCE v2 GID with a netdev (is an IP address set?)");
      }
      if (issues.empty()) {
        ++good;
        fine.push_back(absl::StrCat(where, " ", p.link_layer(), " ", p.rate_gbps(), " Gb/s, ",
                                    p.gids_size(), " GID(s)"));
      } else {
        bad.push_back(absl::StrCat(where, ": ", absl::StrJoin(issues, ", ")));
      }
    }
  }
  const std::string fix =
      "bring the port up (cable, switch, subnet manager for InfiniBand: opensm; RoCE: an IP "
      "address on the netdev), check with ibv_devinfo";
  if (total == 0) {
    return Check("nic-ports", CheckStatus::kFail, "RDMA NICs without ports in sysfs", fix);
  }
  if (good == 0) return Check("nic-ports", CheckStatus::kFail, absl::StrJoin(bad, "; "), fix);
  if (!bad.empty()) {
    return Check("nic-ports", CheckStatus::kWarn,
                 absl::StrCat(good, " of ", total, " ports usable; ", absl::StrJoin(bad, "; ")),
                 fix);
  }
  return Check("nic-ports", CheckStatus::kOk, absl::StrJoin(fine, "; "));
}

DoctorCheck DaemonViewCheck(const Facts& f, const DaemonFacts& daemon) {
  const std::string name = "daemon-view";
  if (!daemon.topology.ok()) {
    return Check(name, CheckStatus::kFail,
                 absl::StrCat("cannot ask mooncaked: ", daemon.topology.status().message()),
                 "start mooncaked (systemctl start mooncaked) and check socket-access");
  }
  std::set<std::string> dg, lg, dn, ln;
  for (const v1::Gpu& g : daemon.topology->gpus()) dg.insert(g.uuid());
  for (const v1::Gpu& g : f.topo.gpus()) lg.insert(g.uuid());
  for (const v1::Nic& n : daemon.topology->nics()) {
    if (n.provider() != "softnic") dn.insert(n.name());
  }
  for (const v1::Nic* n : f.hw_nics) ln.insert(n->name());
  std::vector<std::string> diffs;
  auto diff = [&](const std::set<std::string>& d, const std::set<std::string>& l,
                  const char* what) {
    std::vector<std::string> only_d, only_l;
    std::set_difference(d.begin(), d.end(), l.begin(), l.end(), std::back_inserter(only_d));
    std::set_difference(l.begin(), l.end(), d.begin(), d.end(), std::back_inserter(only_l));
    if (!only_d.empty()) {
      diffs.push_back(
          absl::StrCat("mooncaked lists ", what, " not found here: ", absl::StrJoin(only_d, ", ")));
    }
    if (!only_l.empty()) {
      diffs.push_back(absl::StrCat("mooncaked does not know ", what,
                                   " found here: ", absl::StrJoin(only_l, ", ")));
    }
  };
  diff(dg, lg, "GPUs");
  diff(dn, ln, "NICs");
  if (daemon.topology->cuda_driver_version() != f.topo.cuda_driver_version()) {
    diffs.push_back(
        absl::StrCat("CUDA driver ", CudaVersionText(daemon.topology->cuda_driver_version()),
                     " in mooncaked, ", CudaVersionText(f.topo.cuda_driver_version()), " here"));
  }
  if (!diffs.empty()) {
    return Check(name, CheckStatus::kFail, absl::StrJoin(diffs, "; "),
                 "restart mooncaked (it discovers the node when it starts): systemctl restart "
                 "mooncaked; in a container, give it the same devices as the host");
  }
  std::string who = daemon.status.ok() ? absl::StrCat("mooncaked ", daemon.status->version(),
                                                      " (node ", daemon.status->node_id(), ")")
                                       : "mooncaked";
  return Check(
      name, CheckStatus::kOk,
      absl::StrCat(who, " sees the same ", lg.size(), " GPU(s) and ", ln.size(), " RDMA NIC(s)"));
}

}  // namespace

const char* CheckStatusName(CheckStatus s) {
  switch (s) {
    case CheckStatus::kOk: return "ok";
    case CheckStatus::kWarn: return "warn";
    case CheckStatus::kFail: return "fail";
    case CheckStatus::kSkip: return "skip";
  }
  return "?";
}

bool DoctorReport::ready() const {
  return std::none_of(checks.begin(), checks.end(),
                      [](const DoctorCheck& c) { return c.status == CheckStatus::kFail; });
}

absl::StatusOr<uint16_t> AcsControlFromConfig(const std::string& config) {
  if (config.size() < 0x104) {
    return absl::FailedPreconditionError(
        absl::StrCat("config space of ", config.size(),
                     " bytes has no extended capabilities (read it as root)"));
  }
  auto le32 = [&](size_t at) {
    return static_cast<uint32_t>(static_cast<uint8_t>(config[at])) |
           static_cast<uint32_t>(static_cast<uint8_t>(config[at + 1])) << 8 |
           static_cast<uint32_t>(static_cast<uint8_t>(config[at + 2])) << 16 |
           static_cast<uint32_t>(static_cast<uint8_t>(config[at + 3])) << 24;
  };
  size_t at = 0x100;
  // Bounded walk: a malformed list must not loop.
  for (int hops = 0; hops < 64 && at >= 0x100 && at + 8 <= config.size(); ++hops) {
    const uint32_t header = le32(at);
    if (header == 0 || header == 0xffffffffu) break;
    if ((header & 0xffff) == kAcsCapId) {
      return static_cast<uint16_t>(static_cast<uint8_t>(config[at + 6]) |
                                   static_cast<uint8_t>(config[at + 7]) << 8);
    }
    const size_t next = (header >> 20) & 0xffc;
    if (next <= at) break;
    at = next;
  }
  return absl::NotFoundError("no ACS capability");
}

absl::StatusOr<int64_t> SoftLimitFromProcLimits(const std::string& text, const std::string& what) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (!absl::StartsWith(line, what)) continue;
    std::vector<absl::string_view> cols =
        absl::StrSplit(line.substr(what.size()), ' ', absl::SkipEmpty());
    if (cols.empty()) break;
    if (cols[0] == "unlimited") return -1;
    int64_t v = 0;
    if (absl::SimpleAtoi(cols[0], &v)) return v;
    break;
  }
  return absl::NotFoundError(absl::StrCat("no '", what, "' line"));
}

v1::Topology LocalTopology(const DoctorOptions& opt) {
  daemon::DiscoveryOptions d;
  d.sysfs_root = Join(opt.root, "sys");
  d.use_verbs = opt.use_verbs && (opt.root.empty() || opt.root == "/");
  d.cuda_driver = opt.cuda_driver;
  return daemon::DiscoverTopology(d);
}

DoctorReport RunDoctor(const DoctorOptions& opt, const DaemonFacts& daemon) {
  const Facts f = Gather(opt);
  DoctorReport r;
  r.checks.push_back(DriverCheck(f));
  r.checks.push_back(GpusCheck(f));
  r.checks.push_back(P2pCheck(f));
  r.checks.push_back(PeermemCheck(f));
  r.checks.push_back(DmabufCheck(f));
  r.checks.push_back(RegkeyCheck(f));
  r.checks.push_back(AcsCheck(f));
  r.checks.push_back(IommuCheck(f));
  r.checks.push_back(LimitCheck(
      f, daemon, "memlock", "Max locked memory", kMinMemlock,
      /*want=*/std::numeric_limits<int64_t>::max(), !f.hw_nics.empty(),
      "raise the locked-memory limit: LimitMEMLOCK=infinity in the unit (mooncaked's ships it), "
      "'* - memlock unlimited' in /etc/security/limits.d/, or --ulimit memlock=-1 for a "
      "container"));
  r.checks.push_back(LimitCheck(
      f, daemon, "nofile", "Max open files", 0, kWantedNofile, false,
      absl::StrCat("raise the open-files limit to ", kWantedNofile,
                   " or more (ulimit -n, LimitNOFILE=, /etc/security/limits.d/): every peer's "
                   "buffer arrives as a file descriptor")));
  r.checks.push_back(SocketCheck(opt, daemon));
  r.checks.push_back(NicPortsCheck(f));
  r.checks.push_back(DaemonViewCheck(f, daemon));
  return r;
}

std::string FormatDoctor(const DoctorReport& report) {
  std::string out;
  size_t width = 0;
  for (const DoctorCheck& c : report.checks) width = std::max(width, c.name.size());
  int fails = 0, warns = 0;
  for (const DoctorCheck& c : report.checks) {
    fails += c.status == CheckStatus::kFail;
    warns += c.status == CheckStatus::kWarn;
    std::string status = CheckStatusName(c.status);
    status.resize(5, ' ');
    std::string name = c.name;
    name.resize(width, ' ');
    absl::StrAppend(&out, status, name, "  ", EscapeForDisplay(c.detail, 1024), "\n");
    if (!c.fix.empty() && c.status != CheckStatus::kOk) {
      absl::StrAppend(&out, std::string(5 + width + 2, ' '), "fix: ", EscapeForDisplay(c.fix, 1024),
                      "\n");
    }
  }
  if (report.ready()) {
    absl::StrAppend(
        &out, "ready for GPU-initiated transfers",
        warns > 0 ? absl::StrCat(" (", warns, " warning", warns == 1 ? "" : "s", ")") : "", "\n");
  } else {
    absl::StrAppend(&out, "not ready: ", fails, " check", fails == 1 ? "" : "s", " failed", "\n");
  }
  return out;
}

std::string DoctorJson(const DoctorReport& report) {
  std::string out = absl::StrCat("{\"ready\":", report.ready() ? "true" : "false", ",\"checks\":[");
  bool first = true;
  for (const DoctorCheck& c : report.checks) {
    absl::StrAppend(&out, first ? "" : ",", "{\"name\":", EscapeForJson(c.name),
                    ",\"status\":", EscapeForJson(CheckStatusName(c.status)),
                    ",\"detail\":", EscapeForJson(c.detail), ",\"fix\":", EscapeForJson(c.fix),
                    "}");
    first = false;
  }
  absl::StrAppend(&out, "]}");
  return out;
}

}  // namespace mooncake::mcctl
