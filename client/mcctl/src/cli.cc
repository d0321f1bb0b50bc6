#include "mooncake/mcctl/cli.h"

#include <array>
#include <string_view>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "mooncake/common/fd_passing.h"
#include "mooncake/common/paths.h"
#include "mooncake/common/version.h"
#include "mooncake/mcctl/admin_client.h"
#include "mooncake/mcctl/format.h"
#include "mooncake/mcctl/json_output.h"

namespace mooncake::mcctl {
namespace {

constexpr std::array<std::string_view, 10> kCommands = {
    "status", "gpus", "nics", "topo", "sessions", "groups", "qps", "mrs", "peers", "help"};
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
      "Queries the local mooncaked daemon.\n"
      "\n"
      "commands:\n"
      "  status    daemon identity, counters, GPUs and NICs\n"
      "  gpus      GPUs found by the daemon\n"
      "  nics      RDMA NICs, their ports and provider (mlx5, or mooncaked's softnic)\n"
      "  topo      GPU x GPU (P2P) and GPU x NIC (PCIe distance) matrices\n"
      "  sessions  client sessions (your own; all of them as root)\n"
      "  groups    groups with their members\n"
      "  qps       RDMA queue pairs: number, NIC, state, owner session, doorbell mode\n"
      "  peers     the cluster's live nodes in etcd (this one included)\n"
      "  mrs       registered memory regions: NIC, size, owner session, kind\n"
      "  help      this text\n"
      "\n"
      "options:\n"
      "  --socket PATH     daemon socket (default: $",
      kSocketEnvVar, ", else ", kDefaultSocketPath,
      ")\n"
      "  --timeout-ms N    deadline per call in milliseconds (default ",
      kDefaultTimeoutMs,
      ")\n"
      "  --json            print JSON instead of tables\n"
      "  --version         print the version and exit\n"
      "\n"
      "exit status: 0 ok, 1 error reported by the daemon, 2 daemon unreachable (not running,\n"
      "             or no permission on its socket), 64 usage (also a socket path too long)\n");
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
      continue;
    }
    if (a == "--json") {
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
  return opt;
}

int RunMcctl(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
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
  AdminClient client(socket, opt.timeout_ms);
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
