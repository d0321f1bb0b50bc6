#include "mooncake/mcctl/cli.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <sstream>
#include <string_view>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "mooncake/common/escape.h"
#include "mooncake/common/fd_passing.h"
#include "mooncake/common/paths.h"
#include "mooncake/common/version.h"
#include "mooncake/mcctl/admin_client.h"
#include "mooncake/mcctl/format.h"
#include "mooncake/mcctl/json_output.h"
#include "mooncake/mcctl/selftest_rdma.h"
#include "mooncake/mcctl/watch.h"

namespace mooncake::mcctl {
namespace {

constexpr std::array<std::string_view, 13> kCommands = {
    "status", "gpus",  "nics",  "topo",   "sessions", "groups", "qps",
    "mrs",    "peers", "watch", "doctor", "selftest", "help"};
constexpr int kMaxTimeoutMs = 3600 * 1000;

// Signals that the daemon was not reached, as opposed to an answered error.
struct Failure {
  int exit_code;
  std::string line;
};

Failure FailureFrom(const AdminClient& client, absl::string_view rpc, const absl::Status& st) {
  if (absl::IsPermissionDenied(client.connect_status())) {
    return {kExitUnreachable, absl::StrCat("mcctl: ", client.connect_status().message())};
  }
  if (AdminClient::IsUnreachable(st)) {
    // gRPC reports a socket this user may not open as UNAVAILABLE; the
    // daemon is likely running, so say how to be let in instead.
    absl::Status access = ConnectUnix(client.socket_path()).status();
    if (absl::IsPermissionDenied(access)) {
      return {kExitUnreachable, absl::StrCat("mcctl: ", access.message())};
    }
    return {kExitUnreachable,
            absl::StrCat("mcctl: cannot reach mooncaked at ", client.socket_path(), " (",
                         client.UnreachableReason(st), "): is the service running?")};
  }
  std::string message = st.ToString();
  for (char& c : message) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  return {kExitError, absl::StrCat("mcctl: ", rpc, " failed: ", message)};
}

// Produces the command's output, or the failure to report.
absl::StatusOr<std::string> Render(const CliOptions& opt, AdminClient& client, Failure* failure) {
  auto fail = [&](absl::string_view rpc, const absl::Status& st) {
    *failure = FailureFrom(client, rpc, st);
    return st;
  };
  const std::string& cmd = opt.command;
  if (cmd == "sessions") {
    auto r = client.ListSessions();
    if (!r.ok()) return fail("ListSessions", r.status());
    return opt.json ? SessionsJson(*r) : FormatSessions(*r);
  }
  if (cmd == "groups") {
    auto r = client.ListGroups();
    if (!r.ok()) return fail("ListGroups", r.status());
    if (!opt.group.empty()) {
      // `groups NAME`: the same shapes, that group only (root may see one
      // per uid under the same name).
      v1::ListGroupsResponse one;
      for (const v1::GroupInfo& g : r->groups()) {
        if (g.name() == opt.group) *one.add_groups() = g;
      }
      if (one.groups().empty()) {
        *failure = {kExitError, absl::StrCat("mcctl: no group '", EscapeForDisplay(opt.group, 128),
                                             "' visible to this user")};
        return absl::NotFoundError("no such group");
      }
      *r = std::move(one);
    }
    return opt.json ? GroupsJson(*r) : FormatGroups(*r);
  }
  if (cmd == "qps") {
    auto r = client.ListQueuePairs();
    if (!r.ok()) return fail("ListQueuePairs", r.status());
    return opt.json ? QueuePairsJson(*r) : FormatQueuePairs(*r);
  }
  if (cmd == "peers") {
    auto r = client.ListPeers();
    if (!r.ok()) return fail("ListPeers", r.status());
    return opt.json ? PeersJson(*r) : FormatPeers(*r);
  }
  if (cmd == "mrs") {
    auto r = client.ListMemoryRegions();
    if (!r.ok()) return fail("ListMemoryRegions", r.status());
    return opt.json ? MemoryRegionsJson(*r) : FormatMemoryRegions(*r);
  }
  absl::StatusOr<v1::DaemonStatus> status;
  if (cmd == "status") {
    status = client.GetStatus();
    if (!status.ok()) return fail("GetStatus", status.status());
  }
  auto topo = client.GetTopology();
  if (!topo.ok()) return fail("GetTopology", topo.status());
  if (cmd == "status") return opt.json ? StatusJson(*status, *topo) : FormatStatus(*status, *topo);
  if (cmd == "gpus") return opt.json ? GpusJson(*topo) : FormatGpus(*topo);
  if (cmd == "nics") return opt.json ? NicsJson(*topo) : FormatNics(*topo);
  return opt.json ? TopologyJson(*topo) : FormatTopology(*topo);
}

}  // namespace

std::string VersionText() { return absl::StrCat("mcctl ", kMooncakeVersion, "\n"); }

std::string UsageText() {
  return absl::StrCat(
      "usage: mcctl [--socket PATH] [--timeout-ms N] [--json] COMMAND\n"
      "       mcctl --version | --help\n"
      "\n"
      "Queries the local mooncaked daemon, watches its groups, and checks the node.\n"
      "\n"
      "commands:\n"
      "  status    daemon identity, counters, GPUs and NICs\n"
      "  gpus      GPUs found by the daemon\n"
      "  nics      RDMA NICs, their ports and provider (mlx5, or mooncaked's softnic)\n"
      "  topo      GPU x GPU (P2P) and GPU x NIC (PCIe distance) matrices\n"
      "  sessions  client sessions (your own; all of them as root)\n"
      "  groups [NAME]  groups with their members (NAME: that group only)\n"
      "  qps       RDMA queue pairs: number, NIC, state, owner session, doorbell mode\n"
      "  peers     the cluster's live nodes in etcd (this one included)\n"
      "  mrs       registered memory regions: NIC, size, owner session, kind\n"
      "  watch     stream group events (joined, formed, ready, left, lost, ...) as they\n"
      "            happen, one line each (JSON lines with --json); until interrupted\n"
      "  selftest rdma [--nic NIC] [--gpu G]  run the RDMA route on this node through\n"
      "            mooncaked: a pair of ranks, WRITEs, atomics, a ring wrap, a bad key; pass\n"
      "            or fail per step with latency, rate and what to check; exit 0 when all\n"
      "            pass, 1 when not\n"
      "  selftest rdma --across GROUP --rank R [--nic NIC]  the same steps between two\n"
      "            nodes, both ways: run it with R 0 on one node and R 1 on the other (same\n"
      "            GROUP, same $MC_GROUP_SECRET); each prints the steps it ran\n"
      "  doctor    check this node for GPU-initiated transfers (driver, P2P, peermem,\n"
      "            dmabuf, regkey, ACS, IOMMU, limits, socket, NIC ports, daemon view);\n"
      "            exit 0 when ready, 1 when not\n"
      "  help      this text\n"
      "\n"
      "options:\n"
      "  --socket PATH     daemon socket (default: $",
      kSocketEnvVar, ", else ", kDefaultSocketPath,
      ")\n"
      "  --timeout-ms N    deadline per call in milliseconds (default ",
      kDefaultTimeoutMs,
      "); selftest: the ranks' rendezvous (default 30000, with --across 60000)\n"
      "  -j, --json        print JSON instead of tables (watch: one object per line)\n"
      "  --count N         watch: stop after N events\n"
      "  --root DIR        doctor: read sys/, proc/ and etc/ below DIR instead of /\n"
      "  --nic NIC         selftest: put the queue pairs on NIC (default: every NIC the\n"
      "                    daemon serves, a loopback pair each)\n"
      "  --gpu G           selftest: run the steps from CUDA kernels on GPU G, once per ring\n"
      "                    placement the node supports (host memory, GPU memory)\n"
      "  --across GROUP    selftest: be one rank of GROUP, a pair across nodes (with --rank)\n"
      "  --rank R          selftest --across: this node's rank, 0 or 1\n"
      "  --version         print the version and exit\n"
      "\n"
      "exit status: 0 ok, 1 error reported by the daemon (doctor: node not ready),\n"
      "             2 daemon unreachable (not running, or no permission on its socket;\n"
      "             watch: also when it stops), 64 usage (also a socket path too long)\n");
}

absl::StatusOr<CliOptions> ParseCommandLine(const std::vector<std::string>& args) {
  CliOptions opt;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    // "--name=value" and "--name value" are both accepted.
    auto value_of = [&](absl::string_view name, std::string* value) -> absl::StatusOr<bool> {
      if (a == name) {
        if (i + 1 >= args.size()) {
          return absl::InvalidArgumentError(absl::StrCat("option ", name, " needs a value"));
        }
        *value = args[++i];
        return true;
      }
      if (absl::StartsWith(a, absl::StrCat(name, "="))) {
        *value = a.substr(name.size() + 1);
        return true;
      }
      return false;
    };
    std::string value;
    absl::StatusOr<bool> matched = value_of("--socket", &value);
    if (!matched.ok()) return matched.status();
    if (*matched) {
      if (value.empty()) return absl::InvalidArgumentError("--socket needs a non-empty path");
      opt.socket = value;
      continue;
    }
    matched = value_of("--timeout-ms", &value);
    if (!matched.ok()) return matched.status();
    if (*matched) {
      int ms = 0;
      if (!absl::SimpleAtoi(value, &ms) || ms <= 0 || ms > kMaxTimeoutMs) {
        return absl::InvalidArgumentError(
            absl::StrCat("--timeout-ms wants milliseconds between 1 and ", kMaxTimeoutMs, ", got '",
                         value, "'"));
      }
      opt.timeout_ms = ms;
      opt.timeout_given = true;
      continue;
    }
    matched = value_of("--count", &value);
    if (!matched.ok()) return matched.status();
    if (*matched) {
      if (!absl::SimpleAtoi(value, &opt.count) || opt.count <= 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("--count wants a positive number of events, got '", value, "'"));
      }
      continue;
    }
    matched = value_of("--nic", &value);
    if (!matched.ok()) return matched.status();
    if (*matched) {
      if (value.empty() || value.size() > 64) {
        return absl::InvalidArgumentError("--nic needs a NIC name (at most 64 bytes)");
      }
      opt.nic = value;
      continue;
    }
    matched = value_of("--gpu", &value);
    if (!matched.ok()) return matched.status();
    if (*matched) {
      if (!absl::SimpleAtoi(value, &opt.gpu) || opt.gpu < 0 || opt.gpu > 1023) {
        return absl::InvalidArgumentError(
            absl::StrCat("--gpu wants a GPU index (0, 1, ...), got '", value, "'"));
      }
      continue;
    }
    matched = value_of("--across", &value);
    if (!matched.ok()) return matched.status();
    if (*matched) {
      const bool valid =
          !value.empty() && value.size() <= 64 &&
          value.find_first_not_of(
              "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._:-") ==
              std::string::npos;
      if (!valid) {
        return absl::InvalidArgumentError(
            "--across wants a group name of 1-64 characters of [A-Za-z0-9._:-]");
      }
      opt.across = value;
      continue;
    }
    matched = value_of("--rank", &value);
    if (!matched.ok()) return matched.status();
    if (*matched) {
      if (value != "0" && value != "1") {
        return absl::InvalidArgumentError(
            absl::StrCat("--rank wants 0 or 1 (a pair across nodes), got '", value, "'"));
      }
      opt.rank = value == "1" ? 1 : 0;
      continue;
    }
    matched = value_of("--root", &value);
    if (!matched.ok()) return matched.status();
    if (*matched) {
      if (value.empty()) return absl::InvalidArgumentError("--root needs a non-empty directory");
      opt.root = value;
      continue;
    }
    if (a == "--json" || a == "-j") {
      opt.json = true;
    } else if (a == "--help" || a == "-h") {
      opt.help = true;
    } else if (a == "--version" || a == "-V") {
      opt.version = true;
    } else if (absl::StartsWith(a, "-")) {
      return absl::InvalidArgumentError(absl::StrCat("unknown option '", a, "'"));
    } else if (opt.command == "help") {
      // `mcctl help status`: there is one usage text for every command.
      continue;
    } else if (opt.command == "groups" && opt.group.empty()) {
      opt.group = a;
    } else if (opt.command == "selftest" && opt.subject.empty()) {
      if (a != "rdma") {
        return absl::InvalidArgumentError(
            absl::StrCat("unknown selftest '", a, "': the one there is is rdma"));
      }
      opt.subject = a;
    } else if (!opt.command.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("unexpected argument '", a, "' after command '", opt.command, "'"));
    } else {
      bool known = false;
      for (auto c : kCommands) known = known || a == c;
      if (!known) return absl::InvalidArgumentError(absl::StrCat("unknown command '", a, "'"));
      opt.command = a;
    }
  }
  if (opt.command.empty() && !opt.help && !opt.version) {
    return absl::InvalidArgumentError("no command given");
  }
  if (opt.command == "selftest" && opt.subject.empty()) {
    return absl::InvalidArgumentError("selftest needs what to test: selftest rdma");
  }
  if (!opt.nic.empty() && opt.command != "selftest") {
    return absl::InvalidArgumentError("--nic is an option of selftest");
  }
  if (opt.gpu >= 0 && opt.command != "selftest") {
    return absl::InvalidArgumentError("--gpu is an option of selftest");
  }
  if ((!opt.across.empty() || opt.rank >= 0) && opt.command != "selftest") {
    return absl::InvalidArgumentError("--across and --rank are options of selftest");
  }
  if (opt.across.empty() != (opt.rank < 0)) {
    return absl::InvalidArgumentError(
        "--across GROUP and --rank R go together: R 0 on one node, 1 on the other");
  }
  if (!opt.across.empty() && opt.gpu >= 0) {
    return absl::InvalidArgumentError(
        "--across runs the steps from a CPU thread; --gpu G runs them on this node only");
  }
  return opt;
}

int RunMcctl(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  return RunMcctl(args, out, err, McctlHooks{});
}

namespace {

int RunWatch(const CliOptions& opt, AdminClient& client, std::ostream& out, std::ostream& err) {
  int seen = 0;
  absl::Status st = client.WatchEvents([&](const v1::WatchEvent& ev) {
    out << (opt.json ? WatchEventJson(ev) : WatchEventText(ev)) << std::flush;
    // A reader that went away (closed pipe) ends the watch.
    if (!out.good()) return false;
    return opt.count == 0 || ++seen < opt.count;
  });
  if (st.ok()) return kExitOk;
  if (absl::IsResourceExhausted(st)) {
    err << "mcctl: watch refused: " << EscapeForDisplay(st.message(), 512) << "\n";
    return kExitError;
  }
  if (absl::IsUnavailable(st) && seen > 0) {
    err << "mcctl: mooncaked ended the watch: " << EscapeForDisplay(st.message(), 512) << "\n";
    return kExitUnreachable;
  }
  Failure failure = FailureFrom(client, "WatchEvents", st);
  err << failure.line << "\n";
  return failure.exit_code;
}

int RunDoctorCommand(const CliOptions& opt, const std::string& socket, const McctlHooks& hooks,
                     std::ostream& out) {
  DoctorOptions d;
  d.root = opt.root;
  d.socket = socket;
  d.cuda_driver = hooks.cuda_driver;
  DaemonFacts facts;
  if (hooks.daemon) {
    facts = *hooks.daemon;
  } else {
    AdminClient client(socket, opt.timeout_ms);
    auto explain = [&](const absl::Status& st) {
      if (!AdminClient::IsUnreachable(st) || !client.connect_status().ok()) return st;
      return absl::Status(st.code(), absl::StrCat("not reached at ", socket, " (",
                                                  client.UnreachableReason(st), ")"));
    };
    facts.status = client.GetStatus();
    if (!facts.status.ok()) facts.status = explain(facts.status.status());
    facts.topology = facts.status.ok() ? client.GetTopology() : facts.status.status();
    if (!facts.topology.ok()) facts.topology = explain(facts.topology.status());
  }
  DoctorReport report = RunDoctor(d, facts);
  if (opt.json) {
    out << PrettyJson(DoctorJson(report)) << "\n";
  } else {
    out << FormatDoctor(report);
  }
  out.flush();
  return report.ready() ? kExitOk : kExitError;
}

// `selftest rdma --gpu G`: mcctl carries no CUDA code; the steps from
// kernels are mcctl-selftest-gpu's, installed next to mcctl in CUDA builds.
// Its output is passed through, its exit code returned.
int RunGpuSelftest(const CliOptions& opt, const std::string& socket, std::ostream& out,
                   std::ostream& err) {
  std::string self(4096, '\0');
  const ssize_t n = ::readlink("/proc/self/exe", self.data(), self.size() - 1);
  self.resize(n > 0 ? static_cast<size_t>(n) : 0);
  const std::string helper = self.substr(0, self.rfind('/') + 1) + "mcctl-selftest-gpu";
  if (self.empty() || ::access(helper.c_str(), X_OK) != 0) {
    err << "selftest rdma --gpu: " << helper
        << " is not there: this mcctl was built without CUDA, or the package with the GPU "
           "selftest is not installed\n";
    return kExitError;
  }
  std::vector<std::string> args = {helper, "--socket", socket, "--gpu", std::to_string(opt.gpu)};
  if (!opt.nic.empty()) args.insert(args.end(), {"--nic", opt.nic});
  if (opt.json) args.push_back("--json");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    err << "selftest rdma --gpu: pipe: " << std::strerror(errno) << "\n";
    return kExitError;
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], 1);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, helper.c_str(), &actions, nullptr, argv.data(), ::environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(fds[1]);
  if (rc != 0) {
    ::close(fds[0]);
    err << "selftest rdma --gpu: starting " << helper << ": " << std::strerror(rc) << "\n";
    return kExitError;
  }
  char buf[4096];
  for (ssize_t got; (got = ::read(fds[0], buf, sizeof(buf))) != 0;) {
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) break;
    out.write(buf, got);
  }
  ::close(fds[0]);
  out.flush();
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  err << "selftest rdma --gpu: " << helper << " ended by signal " << WTERMSIG(status) << "\n";
  return kExitError;
}

int RunSelftestCommand(const CliOptions& opt, const std::string& socket, std::ostream& out,
                       std::ostream& err) {
  // Unreachable is told apart from a failed step (exit 2, like every command).
  AdminClient client(socket, opt.timeout_ms);
  if (absl::StatusOr<v1::DaemonStatus> st = client.GetStatus(); !st.ok()) {
    Failure failure = FailureFrom(client, "GetStatus", st.status());
    err << failure.line << "\n";
    return failure.exit_code;
  }
  if (!opt.across.empty()) {
    // One rank of a pair across nodes, on the NIC --nic names or the
    // daemon's choice (one NIC: the pair of nodes is what is checked).
    SelftestOptions o;
    o.socket = socket;
    o.nic = opt.nic;
    o.timeout_ms = opt.timeout_given ? opt.timeout_ms : 60000;
    o.across_group = opt.across;
    o.across_rank = opt.rank;
    const SelftestReport report = RunRdmaSelftest(o);
    out << (opt.json ? PrettyJson(SelftestJson(report)) + "\n" : FormatSelftest(report));
    out.flush();
    return report.ok() ? kExitOk : kExitError;
  }
  // A loopback pair per NIC (issue 24 item 10): the one --nic names, else
  // every NIC the daemon serves. With none or one listed, the daemon's
  // choice, reported as before.
  std::vector<std::string> nics;
  if (!opt.nic.empty()) {
    nics.push_back(opt.nic);
  } else if (absl::StatusOr<v1::Topology> topo = client.GetTopology(); topo.ok()) {
    for (const auto& n : topo->nics()) {
      if (!n.provider().empty()) nics.push_back(n.name());
    }
  }
  if (nics.size() <= 1) nics.assign(1, opt.nic);
  bool all_ok = true;
  int worst = kExitOk;
  std::vector<std::string> jsons;
  for (const std::string& nic : nics) {
    std::ostringstream one;
    if (opt.gpu >= 0) {
      CliOptions on_nic = opt;
      on_nic.nic = nic;
      const int rc = RunGpuSelftest(on_nic, socket, one, err);
      all_ok = all_ok && rc == kExitOk;
      worst = std::max(worst, rc);
    } else {
      SelftestOptions o;
      o.socket = socket;
      o.nic = nic;
      // Setup is a group rendezvous and QP creation: more than one call's worth.
      o.timeout_ms = opt.timeout_given ? opt.timeout_ms : 30000;
      const SelftestReport report = RunRdmaSelftest(o);
      all_ok = all_ok && report.ok();
      worst = std::max(worst, report.ok() ? kExitOk : kExitError);
      one << (opt.json ? SelftestJson(report) : FormatSelftest(report));
    }
    if (opt.json) {
      jsons.push_back(one.str());
    } else {
      out << one.str();
    }
  }
  if (nics.size() == 1) {
    if (opt.json) out << (opt.gpu >= 0 ? jsons[0] : PrettyJson(jsons[0]) + "\n");
  } else if (opt.json) {
    out << PrettyJson(absl::StrCat("{\"ok\":", all_ok ? "true" : "false", ",\"nics\":[",
                                   absl::StrJoin(jsons, ","), "]}"))
        << "\n";
  } else {
    out << "selftest rdma on " << nics.size() << " NICs ("
        << EscapeForDisplay(absl::StrJoin(nics, ", "), 256)
        << "): " << (all_ok ? "every step passed on every NIC" : "some NIC failed a step (above)")
        << "\n";
  }
  out.flush();
  return worst;
}

}  // namespace

int RunMcctl(const std::vector<std::string>& args, std::ostream& out, std::ostream& err,
             const McctlHooks& hooks) {
  auto parsed = ParseCommandLine(args);
  if (!parsed.ok()) {
    err << "mcctl: " << parsed.status().message() << "\n" << UsageText();
    return kExitUsage;
  }
  const CliOptions& opt = *parsed;
  if (opt.help || opt.command == "help") {
    out << UsageText();
    return kExitOk;
  }
  if (opt.version) {
    out << VersionText();
    return kExitOk;
  }

  const std::string socket = ResolveSocketPath(opt.socket);
  // Before any channel exists: one line of ours, not gRPC's parse errors.
  if (absl::Status path = AdminClient::CheckSocketPath(socket); !path.ok()) {
    err << "mcctl: " << path.message() << "\n";
    return kExitUsage;
  }
  if (opt.command == "doctor") return RunDoctorCommand(opt, socket, hooks, out);
  if (opt.command == "selftest") return RunSelftestCommand(opt, socket, out, err);
  AdminClient client(socket, opt.timeout_ms);
  if (opt.command == "watch") return RunWatch(opt, client, out, err);
  Failure failure{kExitError, ""};
  absl::StatusOr<std::string> text = Render(opt, client, &failure);
  if (!text.ok()) {
    if (failure.line.empty()) {
      failure.line = absl::StrCat("mcctl: ", opt.command, ": ", text.status().ToString());
    }
    err << failure.line << "\n";
    return failure.exit_code;
  }
  if (opt.json) {
    out << PrettyJson(*text) << "\n";
  } else {
    out << *text;
  }
  out.flush();
  return kExitOk;
}

}  // namespace mooncake::mcctl
