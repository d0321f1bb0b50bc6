#include "mooncake/mcctl/format.h"

#include <algorithm>
#include <map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "mooncake/common/escape.h"
#include "mooncake/mcctl/table.h"

namespace mooncake::mcctl {
namespace {

using v1::Topology;

// Widths of columns whose text a client chose, once escaped.
constexpr std::size_t kMaxClientNameWidth = 48;
constexpr std::size_t kMaxHandleKindWidth = 32;

std::string YesNo(bool b) { return b ? "yes" : "no"; }

std::string OrDash(const std::string& s) { return s.empty() ? "-" : s; }

std::string NumaText(int32_t numa) { return numa < 0 ? "-" : absl::StrCat(numa); }

// The discovery note explains an empty list; discovery may also leave none.
std::string Because(const std::string& note) {
  return note.empty() ? "discovery found none" : note;
}

std::string NoGpusLine(const std::string& note) {
  return absl::StrCat("no GPUs (", Because(note), ")\n");
}
std::string NoNicsLine(const std::string& note) {
  return absl::StrCat("no RDMA NICs (", Because(note), ")\n");
}

// Aligned "key  value" lines; keys padded to the longest.
std::string KeyValues(const std::vector<std::pair<std::string, std::string>>& kv,
                      const std::string& indent) {
  std::size_t w = 0;
  for (const auto& [k, v] : kv) w = std::max(w, k.size());
  std::string out;
  for (const auto& [k, v] : kv) {
    absl::StrAppend(&out, indent, k, std::string(w - k.size() + 2, ' '),
                    EscapeForDisplay(v, std::string::npos), "\n");
  }
  return out;
}

std::string GpuLabel(int32_t index) { return absl::StrCat("GPU", index); }

}  // namespace

std::string FormatBytes(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 1024) return absl::StrCat(bytes, " B");
  double v = static_cast<double>(bytes);
  int unit = 0;
  while (v >= 1024.0 && unit < 6) {
    v /= 1024.0;
    ++unit;
  }
  return absl::StrFormat("%.1f %s", v, kUnits[unit]);
}

std::string FormatDurationMs(uint64_t ms) {
  if (ms < 1000) return absl::StrCat(ms, "ms");
  const uint64_t s = ms / 1000;
  if (s < 60) return absl::StrCat(s, "s");
  const uint64_t m = s / 60;
  if (m < 60) return absl::StrFormat("%dm%02ds", m, s % 60);
  const uint64_t h = m / 60;
  if (h < 24) return absl::StrFormat("%dh%02dm", h, m % 60);
  return absl::StrFormat("%dd%02dh", h / 24, h % 24);
}

std::string FormatCudaDriverVersion(int32_t version) {
  if (version <= 0) return "none";
  return absl::StrCat(version / 1000, ".", (version % 1000) / 10);
}

std::string FormatGpus(const Topology& topology) {
  if (topology.gpus().empty()) return NoGpusLine(topology.gpu_discovery_note());
  TextTable t({"IDX", "NAME", "PCI", "NUMA", "MEMORY", "CC", "SMS", "VMM", "POSIX_FD", "FABRIC",
               "DMABUF", "UUID"});
  for (std::size_t c : {0, 3, 4, 6}) t.SetAlignment(c, TextTable::Align::kRight);
  for (const auto& g : topology.gpus()) {
    t.AddRow({absl::StrCat(g.index()), OrDash(g.name()), OrDash(g.pci_bus_id()),
              NumaText(g.numa_node()), FormatBytes(g.total_memory_bytes()),
              absl::StrCat(g.compute_capability_major(), ".", g.compute_capability_minor()),
              absl::StrCat(g.multiprocessor_count()), YesNo(g.vmm_supported()),
              YesNo(g.posix_fd_handle_supported()), YesNo(g.fabric_handle_supported()),
              YesNo(g.dmabuf_supported()), OrDash(g.uuid())});
  }
  return t.Render();
}

std::string FormatNics(const Topology& topology) {
  if (topology.nics().empty()) return NoNicsLine(topology.nic_discovery_note());
  TextTable t({"NIC", "PROVIDER", "PORT", "STATE", "PHYS", "LINK", "RATE", "LID", "GIDS", "PCI",
               "NUMA", "DRIVER", "FW", "GUID"});
  for (std::size_t c : {2, 7, 8, 10}) t.SetAlignment(c, TextTable::Align::kRight);
  for (const auto& n : topology.nics()) {
    if (n.ports().empty()) {
      t.AddRow({n.name(), OrDash(n.provider()), "-", "-", "-", "-", "-", "-", "-",
                OrDash(n.pci_bus_id()), NumaText(n.numa_node()), OrDash(n.driver()),
                OrDash(n.fw_ver()), OrDash(n.node_guid())});
      continue;
    }
    for (const auto& p : n.ports()) {
      // An InfiniBand port is addressed by LID; RoCE has none (LID 0).
      const std::string lid = p.lid() == 0 ? "-" : absl::StrCat(p.lid());
      t.AddRow({n.name(), OrDash(n.provider()), absl::StrCat(p.port()), OrDash(p.state()),
                OrDash(p.phys_state()), OrDash(p.link_layer()), OrDash(p.rate()), lid,
                absl::StrCat(p.gids_size()), OrDash(n.pci_bus_id()), NumaText(n.numa_node()),
                OrDash(n.driver()), OrDash(n.fw_ver()), OrDash(n.node_guid())});
    }
  }
  // Atomics in words below the table (too long for a column).
  std::string out = t.Render();
  for (const auto& n : topology.nics()) {
    if (!n.atomics().empty()) absl::StrAppend(&out, "atomics ", n.name(), ": ", n.atomics(), "\n");
  }
  return out;
}

std::string FormatQueuePairs(const v1::ListQueuePairsResponse& r) {
  if (r.qps().empty()) return "no queue pairs\n";
  // WQES: completions softnic counted; a NIC's are not seen ("-"). POSTED
  // and CQ-CI: the client's doorbell records as last written (they wrap);
  // "-" too where the rings are in GPU memory (RINGS gpu), which the daemon
  // cannot read.
  TextTable t({"QPN", "NIC", "STATE", "SESSION", "PID", "UID", "REMOTE", "DEPTH", "WQES", "POSTED",
               "CQ-CI", "RINGS", "DOORBELL", "ERROR"});
  for (std::size_t c : {0, 3, 4, 5, 6, 7, 8, 9, 10}) t.SetAlignment(c, TextTable::Align::kRight);
  for (const auto& q : r.qps()) {
    t.AddRow({absl::StrCat(q.qpn()), OrDash(q.nic()), OrDash(q.state()),
              absl::StrCat(q.session_id()), absl::StrCat(q.pid()), absl::StrCat(q.uid()),
              q.remote_qpn() == 0 ? "-" : absl::StrCat(q.remote_qpn()),
              absl::StrCat(q.sq_wqe_cnt()), q.wqes_counted() ? absl::StrCat(q.wqes_done()) : "-",
              q.ring_counters() ? absl::StrCat(q.sq_posted()) : "-",
              q.ring_counters() ? absl::StrCat(q.cq_consumed()) : "-", OrDash(q.ring_memory()),
              OrDash(q.doorbell_mode()), OrDash(q.last_error())});
  }
  return t.Render();
}

std::string FormatPeers(const v1::ListPeersResponse& r) {
  std::string out;
  if (r.etcd_state() == "off") {
    out = "etcd: off (this node alone; set etcd_endpoints to form a cluster)\n";
  } else if (r.etcd_state() != "registered") {
    out = absl::StrCat("etcd: ", EscapeForDisplay(r.etcd_state(), 400), "\n");
  }
  TextTable t({"NODE", "", "PEER ADDRESS", "HOST", "GPUS", "NICS", "RDMA", "VERSION", "INSTANCE"});
  for (std::size_t c : {4, 5}) t.SetAlignment(c, TextTable::Align::kRight);
  for (const auto& n : r.nodes()) {
    t.AddRow({EscapeForDisplay(n.node_id(), 64), n.node_id() == r.self_node_id() ? "*" : "",
              OrDash(EscapeForDisplay(n.peer_address(), 80)),
              OrDash(EscapeForDisplay(n.hostname(), 64)), absl::StrCat(n.gpu_count()),
              absl::StrCat(n.nic_count()), OrDash(EscapeForDisplay(n.rdma_provider(), 16)),
              OrDash(EscapeForDisplay(n.daemon_version(), 32)),
              OrDash(EscapeForDisplay(n.instance_id(), 40))});
  }
  return absl::StrCat(out, r.nodes().empty() ? "no nodes\n" : t.Render());
}

std::string FormatMemoryRegions(const v1::ListMemoryRegionsResponse& r) {
  if (r.regions().empty()) return "no memory regions\n";
  TextTable t({"NIC", "SIZE", "KIND", "ACCESS", "SESSION", "PID", "UID"});
  for (std::size_t c : {1, 4, 5, 6}) t.SetAlignment(c, TextTable::Align::kRight);
  for (const auto& m : r.regions()) {
    t.AddRow({OrDash(m.nic()), absl::StrCat(m.size()), OrDash(m.kind()), OrDash(m.access()),
              absl::StrCat(m.session_id()), absl::StrCat(m.pid()), absl::StrCat(m.uid())});
  }
  return t.Render();
}

std::string FormatGpuMatrix(const Topology& topology) {
  if (topology.gpus().empty()) return NoGpusLine(topology.gpu_discovery_note());
  std::map<std::pair<int32_t, int32_t>, const v1::GpuPair*> pairs;
  for (const auto& p : topology.gpu_pairs()) pairs[{p.src(), p.dst()}] = &p;

  std::vector<std::string> header = {""};
  for (const auto& g : topology.gpus()) header.push_back(GpuLabel(g.index()));
  header.push_back("NUMA");
  TextTable t(std::move(header));
  for (const auto& src : topology.gpus()) {
    std::vector<std::string> row = {GpuLabel(src.index())};
    for (const auto& dst : topology.gpus()) {
      if (src.index() == dst.index()) {
        row.push_back("X");
        continue;
      }
      auto it = pairs.find({src.index(), dst.index()});
      if (it == pairs.end()) {
        row.push_back("?");
      } else if (!it->second->access_supported()) {
        row.push_back("-");
      } else {
        row.push_back(
            absl::StrCat(it->second->native_atomics() ? "A" : "P", it->second->performance_rank()));
      }
    }
    row.push_back(NumaText(src.numa_node()));
    t.AddRow(std::move(row));
  }
  return absl::StrCat(
      t.Render(),
      "\nLegend:\n"
      "  X     = self\n"
      "  A<r>  = P2P access with native atomics, performance rank r (lower is better)\n"
      "  P<r>  = P2P access without native atomics, performance rank r\n"
      "  -     = no P2P access\n"
      "  ?     = not reported by the daemon\n");
}

std::string FormatGpuNicMatrix(const Topology& topology) {
  if (topology.nics().empty()) return NoNicsLine(topology.nic_discovery_note());
  if (topology.gpus().empty()) return NoGpusLine(topology.gpu_discovery_note());
  std::map<std::pair<int32_t, std::string>, const v1::GpuNicAffinity*> affinity;
  for (const auto& a : topology.affinity()) affinity[{a.gpu(), a.nic()}] = &a;

  std::vector<std::string> header = {""};
  for (const auto& n : topology.nics()) header.push_back(n.name());
  header.push_back("CLOSEST");
  TextTable t(std::move(header));
  for (const auto& g : topology.gpus()) {
    std::vector<std::string> row = {GpuLabel(g.index())};
    std::vector<std::string> closest;
    for (const auto& n : topology.nics()) {
      auto it = affinity.find({g.index(), n.name()});
      if (it == affinity.end()) {
        row.push_back("?");
        continue;
      }
      const auto& a = *it->second;
      row.push_back(
          absl::StrCat(a.distance().empty() ? "UNKNOWN" : a.distance(), a.closest() ? "*" : ""));
      if (a.closest()) closest.push_back(n.name());
    }
    row.push_back(closest.empty() ? "-" : absl::StrJoin(closest, ","));
    t.AddRow(std::move(row));
  }
  return absl::StrCat(t.Render(),
                      "\nLegend:\n"
                      "  PIX   = behind the same PCIe switch\n"
                      "  PXB   = across several PCIe switches, not the host bridge\n"
                      "  PHB   = through the same PCIe host bridge\n"
                      "  NODE  = across host bridges within one NUMA node\n"
                      "  SYS   = across NUMA nodes (SMP interconnect)\n"
                      "  *     = closest NIC(s) for this GPU\n"
                      "  ?     = not reported by the daemon\n");
}

std::string FormatTopology(const Topology& topology) {
  return absl::StrCat("GPU to GPU:\n", FormatGpuMatrix(topology), "\nGPU to NIC:\n",
                      FormatGpuNicMatrix(topology));
}

std::string FormatStatus(const v1::DaemonStatus& s, const Topology& topology) {
  const std::string gpu_note = topology.gpu_discovery_note().empty()
                                   ? s.gpu_discovery_note()
                                   : topology.gpu_discovery_note();
  const std::string nic_note = topology.nic_discovery_note().empty()
                                   ? s.nic_discovery_note()
                                   : topology.nic_discovery_note();
  std::string out =
      absl::StrCat("mooncaked ", OrDash(s.version()), " (protocol ", s.protocol_version(), ")\n");
  absl::StrAppend(
      &out,
      KeyValues({{"node", OrDash(s.node_id())},
                 {"hostname", OrDash(s.hostname())},
                 {"instance", OrDash(s.instance_id())},
                 {"pid", absl::StrCat(s.pid())},
                 {"uptime", FormatDurationMs(s.uptime_ms())},
                 {"socket", OrDash(s.socket_path())},
                 {"fd socket", OrDash(s.fd_socket_path())},
                 {"peer listen", s.peer_listen().empty()
                                     ? "off"
                                     : absl::StrCat(s.peer_listen(), ", ",
                                                    EscapeForDisplay(s.peer_security(), 200))},
                 {"etcd", s.etcd_state().empty() || s.etcd_state() == "off"
                              ? "off"
                              : absl::StrCat(EscapeForDisplay(s.etcd_state(), 400), " (",
                                             EscapeForDisplay(s.etcd_endpoints(), 400), ")")},
                 {"sessions", absl::StrCat(s.sessions())},
                 {"groups", absl::StrCat(s.groups())},
                 {"cuda driver", FormatCudaDriverVersion(s.cuda_driver_version())},
                 {"gpus", absl::StrCat(s.gpu_count())},
                 {"nics", absl::StrCat(s.nic_count())}},
                "  "));
  // Show the discovery notes from the status too when the topology carried
  // none, so a user sees why a list is empty.
  Topology annotated = topology;
  annotated.set_gpu_discovery_note(gpu_note);
  annotated.set_nic_discovery_note(nic_note);
  absl::StrAppend(&out, "\nGPUs:\n", FormatGpus(annotated), "\nNICs:\n", FormatNics(annotated));
  return out;
}

std::string FormatSessions(const v1::ListSessionsResponse& r) {
  if (r.sessions().empty()) return "no sessions\n";
  TextTable t({"ID", "UID", "GID", "PID", "CLIENT", "AGE", "FDS", "TICKETS", "GROUPS"});
  for (std::size_t c : {0, 1, 2, 3, 5, 6, 7}) t.SetAlignment(c, TextTable::Align::kRight);
  // Any client picks its name (up to 256 bytes); keep the table readable.
  t.SetMaxWidth(4, kMaxClientNameWidth);
  for (const auto& s : r.sessions()) {
    t.AddRow({absl::StrCat(s.session_id()), absl::StrCat(s.uid()), absl::StrCat(s.gid()),
              absl::StrCat(s.pid()), OrDash(s.client_name()), FormatDurationMs(s.age_ms()),
              absl::StrCat(s.fd_exports()), absl::StrCat(s.pending_tickets()),
              s.groups().empty() ? "-" : absl::StrJoin(s.groups(), ",")});
  }
  return t.Render();
}

std::string FormatGroups(const v1::ListGroupsResponse& r) {
  if (r.groups().empty()) return "no groups\n";
  // Root on the main socket sees every tenant's groups, one name possibly
  // in several: then each says whose ("-": the main socket's).
  const bool tenants = std::any_of(r.groups().begin(), r.groups().end(),
                                   [](const auto& g) { return !g.tenant().empty(); });
  std::vector<std::string> header = {"NAME", "UID", "SIZE", "JOINED", "STATE", "EPOCH", "AGE"};
  if (tenants) header.push_back("TENANT");
  TextTable t(std::move(header));
  for (std::size_t c : {1, 2, 3, 5, 6}) t.SetAlignment(c, TextTable::Align::kRight);
  for (const auto& g : r.groups()) {
    std::vector<std::string> row = {g.name(),
                                    absl::StrCat(g.uid()),
                                    absl::StrCat(g.world_size()),
                                    absl::StrCat(g.joined()),
                                    OrDash(g.state()),
                                    absl::StrCat(g.epoch()),
                                    FormatDurationMs(g.age_ms())};
    if (tenants) row.push_back(OrDash(g.tenant()));
    t.AddRow(std::move(row));
  }
  std::string out = t.Render();
  for (const auto& g : r.groups()) {
    absl::StrAppend(
        &out, "\nmembers of ", EscapeForDisplay(g.name(), std::string::npos),
        g.tenant().empty() ? "" : absl::StrCat(" (tenant ", EscapeForDisplay(g.tenant(), 64), ")"),
        ":\n");
    if (g.members().empty()) {
      absl::StrAppend(&out, "  none\n");
      continue;
    }
    // A group across nodes names each rank's node ("local": this one).
    const bool cross_node = std::any_of(g.members().begin(), g.members().end(),
                                        [](const auto& mem) { return !mem.node_id().empty(); });
    std::vector<std::string> header = {"RANK", "STATE", "PID", "GPU", "HANDLE", "SIZE", "SESSION"};
    if (cross_node) header.push_back("NODE");
    TextTable m(std::move(header));
    m.SetIndent("  ");
    for (std::size_t c : {0, 2, 3, 5, 6}) m.SetAlignment(c, TextTable::Align::kRight);
    m.SetMaxWidth(4, kMaxHandleKindWidth);  // the joining client's words
    for (const auto& mem : g.members()) {
      // gpu_index -1 is the host platform (CPU threads over shared memory).
      std::vector<std::string> row = {absl::StrCat(mem.rank()),
                                      OrDash(mem.state()),
                                      absl::StrCat(mem.pid()),
                                      mem.gpu_index() < 0 ? "host" : absl::StrCat(mem.gpu_index()),
                                      OrDash(mem.handle_kind()),
                                      FormatBytes(mem.handle_size()),
                                      absl::StrCat(mem.session_id())};
      if (cross_node) row.push_back(mem.node_id().empty() ? "local" : mem.node_id());
      m.AddRow(std::move(row));
    }
    absl::StrAppend(&out, m.Render());
  }
  return out;
}

}  // namespace mooncake::mcctl
