// mooncaked's configuration parsing (daemon/config/daemon_config.h).
//
// Input: the text of a config file for ParseConfigText; or, when it starts
// with "--", a command line (words split at whitespace) for
// ParseCommandLine, leaving out --config, which would read a file.
// Invariants: a configuration that parses has every key within the range
// deploy/mooncaked.conf.example documents, and one from a file, written
// back as a file, parses to the same configuration.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "broker/tenant_span_policy.h"
#include "config/daemon_config.h"
#include "fuzz_support.h"

namespace mooncake::daemon {
namespace {

const char* LogLevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug: return "debug";
    case LogLevel::kInfo: return "info";
    case LogLevel::kWarning: return "warning";
    case LogLevel::kError: return "error";
  }
  return "?";
}

// Every key, as a config file would set it.
std::string ToText(const DaemonConfig& c) {
  std::string t;
  auto key = [&t](absl::string_view k, const auto& v) { absl::StrAppend(&t, k, " = ", v, "\n"); };
  key("socket", c.socket);
  key("socket_mode", absl::StrFormat("0%o", c.socket_mode));
  key("socket_group", c.socket_group);
  key("node_id", c.node_id);
  key("log_level", LogLevelName(c.log_level));
  key("peer_listen", c.peer_listen);
  key("sysfs_root", c.sysfs_root);
  key("cuda_library", c.cuda_library);
  key("join_timeout_ms", c.join_timeout_ms);
  key("max_world_size", c.max_world_size);
  key("ticket_ttl_ms", c.ticket_ttl_ms);
  key("max_sessions_per_uid", c.max_sessions_per_uid);
  key("handshake_timeout_ms", c.handshake_timeout_ms);
  key("max_connections_per_uid", c.max_connections_per_uid);
  key("max_connections", c.max_connections);
  key("fd_channel_connections_per_uid", c.fd_channel_connections_per_uid);
  key("fd_channel_connections", c.fd_channel_connections);
  key("max_fds_per_uid", c.max_fds_per_uid);
  key("max_fds", c.max_fds);
  key("max_ranks_per_uid", c.max_ranks_per_uid);
  key("max_waiting_joins_per_uid", c.max_waiting_joins_per_uid);
  key("max_view_bytes_per_uid", c.max_view_bytes_per_uid);
  key("max_join_timeout_ms", c.max_join_timeout_ms);
  key("rdma_gid_index", c.rdma_gid_index ? absl::StrCat(*c.rdma_gid_index) : "auto");
  key("rdma_traffic_class", c.rdma_traffic_class);
  key("rdma_service_level", c.rdma_service_level);
  std::vector<std::string> tenants;
  for (const TenantSocket& ts : c.tenant_sockets) {
    tenants.push_back(ts.path.empty() ? ts.name : absl::StrCat(ts.name, ":", ts.path));
  }
  key("tenant_sockets", absl::StrJoin(tenants, ","));
  key("tenant_policy_file", c.tenant_policy_file);
  key("max_doorbell_handoffs_per_uid", c.max_doorbell_handoffs_per_uid);
  key("softnic_atomics", c.softnic_atomics);
  key("softnic_hca_atomic_window_us", c.softnic_hca_atomic_window_us);
  key("softnic_hca_round_trip_us", c.softnic_hca_round_trip_us);
  return t;
}

void CheckRange(absl::string_view key, uint32_t v, uint32_t lo, uint32_t hi) {
  FUZZ_CHECK(v >= lo && v <= hi, key, " = ", v, " outside [", lo, ", ", hi, "]");
}

// What deploy/mooncaked.conf.example promises of a configuration that loads.
void CheckRanges(const DaemonConfig& c) {
  FUZZ_CHECK(!c.socket.empty(), "empty socket path");
  FUZZ_CHECK((c.socket_mode & 0600) == 0600 && c.socket_mode <= 0777,
             absl::StrFormat("socket_mode 0%o", c.socket_mode));
  CheckRange("join_timeout_ms", c.join_timeout_ms, 1, 3600 * 1000);
  CheckRange("max_world_size", c.max_world_size, 1, 1 << 20);
  CheckRange("ticket_ttl_ms", c.ticket_ttl_ms, 100, 3600 * 1000);
  CheckRange("max_sessions_per_uid", c.max_sessions_per_uid, 1, 1 << 20);
  CheckRange("handshake_timeout_ms", c.handshake_timeout_ms, 100, 60000);
  CheckRange("max_connections_per_uid", c.max_connections_per_uid, 1, 1 << 20);
  CheckRange("max_connections", c.max_connections, 1, 1 << 20);
  CheckRange("fd_channel_connections_per_uid", c.fd_channel_connections_per_uid, 1, 4096);
  CheckRange("fd_channel_connections", c.fd_channel_connections, 1, 4096);
  CheckRange("max_fds_per_uid", c.max_fds_per_uid, 1, 1 << 24);
  CheckRange("max_fds", c.max_fds, 1, 1 << 24);
  CheckRange("max_ranks_per_uid", c.max_ranks_per_uid, 1, 1 << 24);
  CheckRange("max_waiting_joins_per_uid", c.max_waiting_joins_per_uid, 1, 1 << 24);
  CheckRange("max_view_bytes_per_uid", c.max_view_bytes_per_uid, 4096, 0xffffffffu);
  CheckRange("max_join_timeout_ms", c.max_join_timeout_ms, 1000, 24 * 3600 * 1000);
  if (c.rdma_gid_index) CheckRange("rdma_gid_index", *c.rdma_gid_index, 0, 255);
  CheckRange("rdma_traffic_class", c.rdma_traffic_class, 0, 255);
  CheckRange("rdma_service_level", c.rdma_service_level, 0, 15);
  CheckRange("max_doorbell_handoffs_per_uid", c.max_doorbell_handoffs_per_uid, 1, 4096);
  FUZZ_CHECK(c.softnic_atomics == "device" || c.softnic_atomics == "hca", "softnic_atomics '",
             c.softnic_atomics, "'");
  CheckRange("softnic_hca_atomic_window_us", c.softnic_hca_atomic_window_us, 0, 1000000);
  CheckRange("softnic_hca_round_trip_us", c.softnic_hca_round_trip_us, 0, 1000000);
  FUZZ_CHECK(c.tenant_policy_file.empty() || c.tenant_policy_file.front() == '/',
             "tenant_policy_file '", c.tenant_policy_file, "' is not absolute");
  FUZZ_CHECK(c.tenant_sockets.size() <= kMaxTenantSockets, c.tenant_sockets.size(), " tenants");
  for (size_t i = 0; i < c.tenant_sockets.size(); ++i) {
    const TenantSocket& ts = c.tenant_sockets[i];
    FUZZ_CHECK(!ts.name.empty() && ts.name.size() <= kMaxTenantNameBytes &&
                   absl::ascii_isalnum(static_cast<unsigned char>(ts.name[0])),
               "tenant name '", ts.name, "'");
    FUZZ_CHECK(ts.name.find_first_of(":,/ ") == std::string::npos, "tenant name '", ts.name, "'");
    // No "." or ".." component ("/run/..x/s" is a fine path: "..x" is a name).
    bool clean_components = true;
    if (!ts.path.empty()) {
      for (absl::string_view part : absl::StrSplit(absl::string_view(ts.path).substr(1), '/')) {
        clean_components = clean_components && !part.empty() && part != "." && part != "..";
      }
    }
    FUZZ_CHECK(ts.path.empty() || (ts.path[0] == '/' && ts.path.size() <= 104 && clean_components &&
                                   ts.path.find(',') == std::string::npos),
               "tenant socket path '", ts.path, "'");
    for (size_t j = 0; j < i; ++j) {
      FUZZ_CHECK(c.tenant_sockets[j].name != ts.name, "tenant '", ts.name, "' twice");
    }
  }
  // A parsed list always resolves or fails with InvalidArgument, never worse.
  if (absl::StatusOr<std::vector<TenantSocket>> r = ResolveTenantSockets(c); !r.ok()) {
    FUZZ_CHECK(r.status().code() == absl::StatusCode::kInvalidArgument, r.status());
  } else {
    FUZZ_CHECK(r->size() == c.tenant_sockets.size(), "resolve changed the tenant count");
    for (const TenantSocket& ts : *r) FUZZ_CHECK(!ts.path.empty(), "unresolved tenant path");
  }
  if (!c.peer_listen.empty()) {
    FUZZ_CHECK(c.peer_listen.find(':') != std::string::npos, "peer_listen '", c.peer_listen,
               "' has no port");
  }
}

void FuzzCommandLine(absl::string_view text) {
  std::vector<std::string> words =
      absl::StrSplit(text, absl::ByAnyChar(" \t\n\r\v\f"), absl::SkipEmpty());
  std::vector<char*> argv;
  std::string argv0 = "mooncaked";
  argv.push_back(argv0.data());
  for (std::string& w : words) {
    if (absl::StartsWith(w, "--config")) return;  // would read a file
    argv.push_back(w.data());
  }
  argv.push_back(nullptr);
  bool help = false, version = false;
  absl::StatusOr<DaemonConfig> c =
      ParseCommandLine(static_cast<int>(argv.size() - 1), argv.data(), &help, &version);
  if (!c.ok()) {
    FUZZ_CHECK(c.status().code() == absl::StatusCode::kInvalidArgument, c.status());
    return;
  }
  CheckRanges(*c);
}

// The same bytes as a tenant span policy file (broker/tenant_span_policy.h):
// refused with InvalidArgument naming "fuzz.policy:LINE", or a policy whose
// answers do not depend on anything but its lines.
void FuzzTenantPolicy(absl::string_view text) {
  absl::StatusOr<std::shared_ptr<const TenantSpanPolicy>> p =
      TenantSpanPolicy::Parse(std::string(text), "fuzz.policy");
  if (!p.ok()) {
    FUZZ_CHECK(p.status().code() == absl::StatusCode::kInvalidArgument, p.status());
    FUZZ_CHECK(absl::StartsWith(p.status().message(), "fuzz.policy"), p.status());
    return;
  }
  FUZZ_CHECK((*p)->tenant_count() <= kMaxTenantPolicyLines, (*p)->tenant_count(), " lines");
  for (const char* tenant : {"", "team-a", "t"}) {
    for (const char* node : {"node-a", "gpu-b-01", ""}) {
      const bool a = (*p)->MaySpan(tenant, node);
      FUZZ_CHECK(a == (*p)->MaySpan(tenant, node), "MaySpan is not a function of its input");
      FUZZ_CHECK((*p)->MayMeet(tenant, node, node), "a node cannot meet itself");
    }
  }
}

void FuzzConfigText(absl::string_view text) {
  FuzzTenantPolicy(text);
  DaemonConfig c;
  absl::Status s = ParseConfigText(text, "fuzz.conf", &c);
  if (!s.ok()) {
    FUZZ_CHECK(s.code() == absl::StatusCode::kInvalidArgument, s);
    FUZZ_CHECK(absl::StartsWith(s.message(), "fuzz.conf:"), "error without the origin: ", s);
    return;
  }
  CheckRanges(c);
  const std::string text2 = ToText(c);
  DaemonConfig again;
  absl::Status s2 = ParseConfigText(text2, "again.conf", &again);
  FUZZ_CHECK(s2.ok(), "written back, the configuration does not parse: ", s2, "\n", text2);
  FUZZ_CHECK(ToText(again) == text2, "round trip changed the configuration:\n", text2, "---\n",
             ToText(again));
}

}  // namespace
}  // namespace mooncake::daemon

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  mooncake::fuzz::QuietLogs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::string_view text(reinterpret_cast<const char*>(data), size);
  if (absl::StartsWith(text, "--")) {
    mooncake::daemon::FuzzCommandLine(text);
  } else {
    mooncake::daemon::FuzzConfigText(text);
  }
  return 0;
}
