#include "config/daemon_config.h"

#include <arpa/inet.h>
#include <sys/stat.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "mooncake/common/escape.h"
#include "mooncake/common/status.h"

namespace mooncake::daemon {
namespace {

absl::Status ParseU32(absl::string_view key, absl::string_view value, uint32_t lo, uint32_t hi,
                      uint32_t* out) {
  uint32_t v = 0;
  if (!absl::SimpleAtoi(value, &v) || v < lo || v > hi) {
    return absl::InvalidArgumentError(
        absl::StrCat(key, " = '", value, "': expected an integer in [", lo, ", ", hi, "]"));
  }
  *out = v;
  return absl::OkStatus();
}

absl::Status ParseU64(absl::string_view key, absl::string_view value, uint64_t lo, uint64_t hi,
                      uint64_t* out) {
  uint64_t v = 0;
  if (!absl::SimpleAtoi(value, &v) || v < lo || v > hi) {
    return absl::InvalidArgumentError(
        absl::StrCat(key, " = '", value, "': expected an integer in [", lo, ", ", hi, "]"));
  }
  *out = v;
  return absl::OkStatus();
}

absl::Status ParseMode(absl::string_view value, uint32_t* out) {
  uint32_t v = 0;
  if (value.empty() || value.size() > 4 ||
      !std::all_of(value.begin(), value.end(), [](char c) { return c >= '0' && c <= '7'; })) {
    return absl::InvalidArgumentError(
        absl::StrCat("socket_mode = '", value, "': expected an octal mode such as 0660"));
  }
  for (char c : value) v = v * 8 + static_cast<uint32_t>(c - '0');
  if (v > 0777) {
    return absl::InvalidArgumentError(absl::StrCat(
        "socket_mode = '", value, "': setuid, setgid and sticky bits make no sense on a socket"));
  }
  if ((v & 0600) != 0600) {
    return absl::InvalidArgumentError(absl::StrCat(
        "socket_mode = '", value, "': the owner needs read and write (0600) to serve the socket"));
  }
  *out = v;
  return absl::OkStatus();
}

// HOST:PORT or [IPv6]:PORT, checked here so that gRPC, which logs its own
// error lines for an address it cannot use, never sees a malformed one.
// Whether a host name resolves is left to the daemon's start.
// For peer_listen and metrics_listen (`key`).
absl::Status ParseListenAddress(absl::string_view key, absl::string_view value, std::string* out) {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat(key, " = '", value, "': ", why,
                     "; expected HOST:PORT or [IPv6]:PORT with PORT in 1..65535, e.g. "
                     "0.0.0.0:7450 or [::]:7450"));
  };
  if (value.empty()) {  // off
    out->clear();
    return absl::OkStatus();
  }
  absl::string_view rest = value, host, port;
  if (absl::ConsumePrefix(&rest, "[")) {
    const size_t close = rest.find("]:");
    if (close == absl::string_view::npos) return bad("no ']:' after the IPv6 address");
    host = rest.substr(0, close);
    port = rest.substr(close + 2);
    in6_addr addr;
    if (::inet_pton(AF_INET6, std::string(host).c_str(), &addr) != 1) {
      return bad(absl::StrCat("'", host, "' is not an IPv6 address"));
    }
  } else {
    const size_t colon = rest.rfind(':');
    if (colon == absl::string_view::npos) return bad("no port");
    host = rest.substr(0, colon);
    port = rest.substr(colon + 1);
    if (host.empty()) return bad("no host");
    if (host.find(':') != absl::string_view::npos) return bad("an IPv6 address needs brackets");
    const bool dotted = std::all_of(host.begin(), host.end(),
                                    [](char ch) { return absl::ascii_isdigit(ch) || ch == '.'; });
    in_addr addr;
    if (dotted && ::inet_pton(AF_INET, std::string(host).c_str(), &addr) != 1) {
      return bad(absl::StrCat("'", host, "' is not an IPv4 address"));
    }
    const bool name_chars = std::all_of(host.begin(), host.end(), [](char ch) {
      return absl::ascii_isalnum(ch) || ch == '-' || ch == '.';
    });
    if (!name_chars || host.size() > 253) {
      return bad(absl::StrCat("'", host, "' is neither an IPv4 address nor a host name"));
    }
  }
  uint32_t number = 0;
  if (port.empty() ||
      !std::all_of(port.begin(), port.end(), [](char ch) { return absl::ascii_isdigit(ch); }) ||
      !absl::SimpleAtoi(port, &number) || number < 1 || number > 65535) {
    return bad(absl::StrCat("port '", port, "' is not a number in 1..65535"));
  }
  *out = std::string(value);
  return absl::OkStatus();
}

// The longest socket path whose fd channel (<path>.fd) still fits a UNIX
// socket address (sun_path: 108 bytes with the terminating NUL).
constexpr size_t kMaxSocketPathBytes = 107 - 3;

// An absolute path without ".", ".." or empty components, so that two
// spellings of one file cannot pass as two tenants' sockets.
absl::Status CheckSocketPath(absl::string_view what, absl::string_view path) {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": socket path '", EscapeForDisplay(path, 128), "' ", why));
  };
  if (path.empty() || path.front() != '/') return bad("is not absolute");
  if (path.size() > kMaxSocketPathBytes) {
    return bad(absl::StrCat("is longer than ", kMaxSocketPathBytes,
                            " bytes (a UNIX socket address, with the fd channel's \".fd\")"));
  }
  if (path.back() == '/') return bad("ends with '/'");
  for (absl::string_view part : absl::StrSplit(path.substr(1), '/')) {
    if (part.empty() || part == "." || part == "..") {
      return bad("has an empty, '.' or '..' component");
    }
  }
  if (!std::all_of(path.begin(), path.end(), [](char ch) {
        return absl::ascii_isgraph(static_cast<unsigned char>(ch)) && ch != ',';
      })) {
    return bad("has spaces, control characters or ','");
  }
  return absl::OkStatus();
}

// tenant_sockets = NAME[:PATH][,NAME[:PATH]...]; empty: none.
absl::Status ParseTenantSockets(absl::string_view value, std::vector<TenantSocket>* out) {
  std::vector<TenantSocket> tenants;
  for (absl::string_view entry : absl::StrSplit(value, ',', absl::SkipWhitespace())) {
    entry = absl::StripAsciiWhitespace(entry);
    absl::string_view name = entry, path;
    if (size_t colon = entry.find(':'); colon != absl::string_view::npos) {
      name = entry.substr(0, colon);
      path = entry.substr(colon + 1);
      MC_RETURN_IF_ERROR(CheckSocketPath(
          absl::StrCat("tenant_sockets: tenant '", EscapeForDisplay(name, 64), "'"), path));
    }
    if (!ValidTenantName(name)) {
      return absl::InvalidArgumentError(
          absl::StrCat("tenant_sockets: '", EscapeForDisplay(name, 64),
                       "' is not a tenant name (1-", kMaxTenantNameBytes,
                       " letters, digits, '-', '_' or '.', starting with a letter or digit, e.g. a "
                       "Kubernetes namespace)"));
    }
    for (const TenantSocket& t : tenants) {
      if (t.name == name) {
        return absl::InvalidArgumentError(
            absl::StrCat("tenant_sockets: tenant '", name, "' is listed twice"));
      }
    }
    tenants.push_back(TenantSocket{std::string(name), std::string(path)});
  }
  if (tenants.size() > kMaxTenantSockets) {
    return absl::InvalidArgumentError(
        absl::StrCat("tenant_sockets: ", tenants.size(), " tenants; at most ", kMaxTenantSockets));
  }
  *out = std::move(tenants);
  return absl::OkStatus();
}

absl::Status Apply(absl::string_view key, absl::string_view value, DaemonConfig* c) {
  if (key == "socket") {
    if (value.empty()) return absl::InvalidArgumentError("socket: empty path");
    c->socket = std::string(value);
  } else if (key == "tenant_sockets") {
    return ParseTenantSockets(value, &c->tenant_sockets);
  } else if (key == "socket_mode") {
    return ParseMode(value, &c->socket_mode);
  } else if (key == "socket_group") {
    c->socket_group = std::string(value);
  } else if (key == "node_id") {
    c->node_id = std::string(value);
  } else if (key == "log_level") {
    if (!ParseLogLevel(value, &c->log_level)) {
      return absl::InvalidArgumentError(
          absl::StrCat("log_level = '", value, "': expected debug, info, warning or error"));
    }
  } else if (key == "peer_listen") {
    return ParseListenAddress(key, value, &c->peer_listen);
  } else if (key == "metrics_listen") {
    return ParseListenAddress(key, value, &c->metrics_listen);
  } else if (key == "sysfs_root") {
    c->sysfs_root = std::string(value);
  } else if (key == "cuda_library") {
    c->cuda_library = std::string(value);
  } else if (key == "join_timeout_ms") {
    return ParseU32(key, value, 1, 3600 * 1000, &c->join_timeout_ms);
  } else if (key == "max_world_size") {
    return ParseU32(key, value, 1, 1 << 20, &c->max_world_size);
  } else if (key == "ticket_ttl_ms") {
    return ParseU32(key, value, 100, 3600 * 1000, &c->ticket_ttl_ms);
  } else if (key == "max_sessions_per_uid") {
    return ParseU32(key, value, 1, 1 << 20, &c->max_sessions_per_uid);
  } else if (key == "handshake_timeout_ms") {
    return ParseU32(key, value, 100, 60000, &c->handshake_timeout_ms);
  } else if (key == "max_connections_per_uid") {
    return ParseU32(key, value, 1, 1 << 20, &c->max_connections_per_uid);
  } else if (key == "max_connections") {
    return ParseU32(key, value, 1, 1 << 20, &c->max_connections);
  } else if (key == "fd_channel_connections_per_uid") {
    return ParseU32(key, value, 1, 4096, &c->fd_channel_connections_per_uid);
  } else if (key == "fd_channel_connections") {
    return ParseU32(key, value, 1, 4096, &c->fd_channel_connections);
  } else if (key == "max_fds_per_uid") {
    return ParseU32(key, value, 1, 1 << 24, &c->max_fds_per_uid);
  } else if (key == "max_fds") {
    return ParseU32(key, value, 1, 1 << 24, &c->max_fds);
  } else if (key == "max_ranks_per_uid") {
    return ParseU32(key, value, 1, 1 << 24, &c->max_ranks_per_uid);
  } else if (key == "max_waiting_joins_per_uid") {
    return ParseU32(key, value, 1, 1 << 24, &c->max_waiting_joins_per_uid);
  } else if (key == "max_view_bytes_per_uid") {
    return ParseU32(key, value, 4096, 0xffffffffu, &c->max_view_bytes_per_uid);
  } else if (key == "max_join_timeout_ms") {
    return ParseU32(key, value, 1000, 24 * 3600 * 1000, &c->max_join_timeout_ms);
  } else if (key == "rdma_provider") {
    if (value != "auto" && value != "mlx5" && value != "softnic" && value != "off") {
      return absl::InvalidArgumentError(
          absl::StrCat("rdma_provider = '", value, "': expected auto, mlx5, softnic or off"));
    }
    c->rdma_provider = std::string(value);
  } else if (key == "peer_advertise") {
    if (value.size() > 256) return absl::InvalidArgumentError("peer_advertise: at most 256 bytes");
    c->peer_advertise = std::string(value);
  } else if (key == "peer_tls_ca_file") {
    c->peer_tls_ca_file = std::string(value);
  } else if (key == "peer_tls_cert_file") {
    c->peer_tls_cert_file = std::string(value);
  } else if (key == "peer_tls_key_file") {
    c->peer_tls_key_file = std::string(value);
  } else if (key == "peer_tls_crl_file") {
    c->peer_tls_crl_file = std::string(value);
  } else if (key == "tenant_policy_file") {
    if (!value.empty() && value.front() != '/') {
      return absl::InvalidArgumentError(absl::StrCat(
          "tenant_policy_file = '", EscapeForDisplay(value, 128), "': give an absolute path"));
    }
    c->tenant_policy_file = std::string(value);
  } else if (key == "peer_insecure") {
    if (value != "true" && value != "false") {
      return absl::InvalidArgumentError(absl::StrCat(
          "peer_insecure = '", EscapeForDisplay(value, 32), "': expected true or false"));
    }
    c->peer_insecure = value == "true";
  } else if (key == "etcd_endpoints") {
    if (value.size() > 4096)
      return absl::InvalidArgumentError("etcd_endpoints: at most 4096 bytes");
    c->etcd_endpoints = std::string(value);
  } else if (key == "etcd_prefix") {
    if (value.empty() || value.front() != '/' || value.back() == '/' || value.size() > 128) {
      return absl::InvalidArgumentError(absl::StrCat(
          "etcd_prefix = '", EscapeForDisplay(value, 128),
          "': start it with '/', do not end it with one, at most 128 bytes (e.g. /mooncake)"));
    }
    c->etcd_prefix = std::string(value);
  } else if (key == "etcd_ca_file") {
    c->etcd_ca_file = std::string(value);
  } else if (key == "etcd_cert_file") {
    c->etcd_cert_file = std::string(value);
  } else if (key == "etcd_key_file") {
    c->etcd_key_file = std::string(value);
  } else if (key == "etcd_lease_ttl_s") {
    return ParseU32(key, value, 2, 600, &c->etcd_lease_ttl_s);
  } else if (key == "rdma_devices") {
    c->rdma_devices.clear();
    for (absl::string_view name : absl::StrSplit(value, ',', absl::SkipWhitespace())) {
      name = absl::StripAsciiWhitespace(name);
      if (name.empty() || name.size() > 64 || !std::all_of(name.begin(), name.end(), [](char ch) {
            return absl::ascii_isalnum(static_cast<unsigned char>(ch)) || ch == '_' || ch == '-';
          })) {
        return absl::InvalidArgumentError(
            absl::StrCat("rdma_devices: '", EscapeForDisplay(name, 64),
                         "' is not a NIC name (letters, digits, '_' and '-', e.g. mlx5_0)"));
      }
      c->rdma_devices.emplace_back(name);
    }
    if (c->rdma_devices.size() > 64) {
      return absl::InvalidArgumentError("rdma_devices: at most 64 NICs");
    }
  } else if (key == "rdma_gid_index") {
    if (value == "auto") {
      c->rdma_gid_index.reset();
      return absl::OkStatus();
    }
    uint32_t v = 0;
    if (!absl::SimpleAtoi(value, &v) || v > 255) {
      return absl::InvalidArgumentError(
          absl::StrCat("rdma_gid_index = '", EscapeForDisplay(value, 32),
                       "': expected auto or a GID table index in [0, 255] (see `ibv_devinfo -v` "
                       "or show_gids)"));
    }
    c->rdma_gid_index = v;
  } else if (key == "rdma_traffic_class") {
    return ParseU32(key, value, 0, 255, &c->rdma_traffic_class);
  } else if (key == "rdma_service_level") {
    // 0..15 for InfiniBand; an Ethernet port allows 0..7 (checked at start).
    return ParseU32(key, value, 0, 15, &c->rdma_service_level);
  } else if (key == "max_qps_per_session") {
    return ParseU32(key, value, 1, 1 << 20, &c->max_qps_per_session);
  } else if (key == "max_mrs_per_session") {
    return ParseU32(key, value, 1, 1 << 16, &c->max_mrs_per_session);
  } else if (key == "max_registered_bytes_per_session") {
    return ParseU64(key, value, 4096, 1ull << 46, &c->max_registered_bytes_per_session);
  } else if (key == "max_qps_per_uid") {
    return ParseU32(key, value, 1, 1 << 24, &c->max_qps_per_uid);
  } else if (key == "max_mrs_per_uid") {
    return ParseU32(key, value, 1, 1 << 20, &c->max_mrs_per_uid);
  } else if (key == "max_registered_bytes_per_uid") {
    return ParseU64(key, value, 4096, 1ull << 46, &c->max_registered_bytes_per_uid);
  } else if (key == "max_doorbell_handoffs_per_uid") {
    return ParseU32(key, value, 1, 4096, &c->max_doorbell_handoffs_per_uid);
  } else if (key == "max_registered_bytes_total") {
    return ParseU64(key, value, 4096, 1ull << 50, &c->max_registered_bytes_total);
  } else if (key == "softnic_sink") {
    if (value != "true" && value != "false") {
      return absl::InvalidArgumentError(
          absl::StrCat("softnic_sink = '", value, "': expected true or false"));
    }
    c->softnic_sink = value == "true";
  } else if (key == "softnic_atomics") {
    if (value != "device" && value != "hca") {
      return absl::InvalidArgumentError(
          absl::StrCat("softnic_atomics = '", value, "': expected device or hca"));
    }
    c->softnic_atomics = std::string(value);
  } else if (key == "softnic_hca_atomic_window_us") {
    return ParseU32(key, value, 0, 1000000, &c->softnic_hca_atomic_window_us);
  } else if (key == "softnic_hca_round_trip_us") {
    return ParseU32(key, value, 0, 1000000, &c->softnic_hca_round_trip_us);
  } else if (key == "softnic_gpu_workers") {
    return ParseU32(key, value, 1, 64, &c->softnic_gpu_workers);
  } else {
    return absl::InvalidArgumentError(absl::StrCat("unknown key '", key, "'"));
  }
  return absl::OkStatus();
}

}  // namespace

bool ValidTenantName(absl::string_view name) {
  if (name.empty() || name.size() > kMaxTenantNameBytes) return false;
  if (!absl::ascii_isalnum(static_cast<unsigned char>(name.front()))) return false;
  return std::all_of(name.begin(), name.end(), [](char ch) {
    return absl::ascii_isalnum(static_cast<unsigned char>(ch)) || ch == '-' || ch == '_' ||
           ch == '.';
  });
}

absl::Status ParseConfigText(absl::string_view text, absl::string_view origin,
                             DaemonConfig* config) {
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    if (size_t hash = line.find('#'); hash != absl::string_view::npos) line = line.substr(0, hash);
    line = absl::StripAsciiWhitespace(line);
    if (line.empty()) continue;
    size_t eq = line.find('=');
    if (eq == absl::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat(origin, ":", line_no, ": expected 'key = value', got '", line, "'"));
    }
    absl::string_view key = absl::StripAsciiWhitespace(line.substr(0, eq));
    absl::string_view value = absl::StripAsciiWhitespace(line.substr(eq + 1));
    if (absl::Status s = Apply(key, value, config); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(origin, ":", line_no, ": ", s.message()));
    }
  }
  return absl::OkStatus();
}

absl::Status LoadConfigFile(const std::string& path, DaemonConfig* config) {
  // An ifstream opens a directory without complaint and reads nothing, which
  // would start the daemon on its defaults.
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat("config file ", path, " is a directory; --config wants a file such as ",
                     "/etc/mooncake/mooncaked.conf"));
  }
  std::ifstream in(path);
  if (!in) return ErrnoStatus(errno, absl::StrCat("cannot read config file ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return ParseConfigText(ss.str(), path, config);
}

absl::StatusOr<std::vector<TenantSocket>> ResolveTenantSockets(const DaemonConfig& config) {
  std::vector<TenantSocket> out = config.tenant_sockets;
  std::string dir = config.socket.substr(0, config.socket.rfind('/') + 1);
  if (dir.empty()) dir = "./";
  for (TenantSocket& t : out) {
    if (t.path.empty()) {
      t.path = absl::StrCat(dir, "tenants/", t.name, "/mooncaked.sock");
      MC_RETURN_IF_ERROR(
          CheckSocketPath(absl::StrCat("tenant_sockets: tenant '", t.name, "'"), t.path));
    }
  }
  const std::string main_fd = config.socket + ".fd";
  for (size_t i = 0; i < out.size(); ++i) {
    const std::string fd = out[i].path + ".fd";
    if (out[i].path == config.socket || out[i].path == main_fd || fd == config.socket) {
      return absl::InvalidArgumentError(
          absl::StrCat("tenant_sockets: tenant '", out[i].name, "' would share ", out[i].path,
                       " with the main socket (", config.socket, "); give it a path of its own"));
    }
    for (size_t j = 0; j < i; ++j) {
      const std::string other_fd = out[j].path + ".fd";
      if (out[i].path == out[j].path || out[i].path == other_fd || fd == out[j].path) {
        return absl::InvalidArgumentError(absl::StrCat("tenant_sockets: tenants '", out[j].name,
                                                       "' and '", out[i].name,
                                                       "' would share the socket ", out[i].path));
      }
    }
  }
  return out;
}

std::string UsageText() {
  return "usage: mooncaked [--config FILE] [--socket PATH] [--node-id ID]\n"
         "                 [--log-level debug|info|warning|error] [--peer-listen HOST:PORT]\n"
         "                 [--sysfs-root DIR] [--socket-mode MODE] [--cuda-library NAME]\n"
         "                 [--etcd URL[,URL...]] [--metrics-listen HOST:PORT]\n"
         "                 [--tenant-sockets NAME[:PATH][,...]]\n"
         "                 [--version] [--help]\n"
         "Runs with embedded defaults when no config file is given; flags override the file.\n"
         "Default socket: /run/mooncake/mooncaked.sock (fd channel: <socket>.fd).\n";
}

absl::StatusOr<DaemonConfig> ParseCommandLine(int argc, char** argv, bool* show_help,
                                              bool* show_version) {
  *show_help = false;
  *show_version = false;
  DaemonConfig config;
  std::vector<std::pair<std::string, std::string>> flags;
  std::string config_path;
  static const std::pair<const char*, const char*> kFlagKeys[] = {
      {"--socket", "socket"},
      {"--node-id", "node_id"},
      {"--log-level", "log_level"},
      {"--peer-listen", "peer_listen"},
      {"--metrics-listen", "metrics_listen"},
      {"--sysfs-root", "sysfs_root"},
      {"--socket-mode", "socket_mode"},
      {"--cuda-library", "cuda_library"},
      {"--etcd", "etcd_endpoints"},
      {"--tenant-sockets", "tenant_sockets"},
      {"--config", ""}};
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      *show_help = true;
      return config;
    }
    if (arg == "--version") {
      *show_version = true;
      return config;
    }
    std::string value;
    std::string name = arg;
    if (size_t eq = arg.find('='); eq != std::string::npos) {
      name = arg.substr(0, eq);
      value = arg.substr(eq + 1);
    }
    const char* key = nullptr;
    for (const auto& [flag, k] : kFlagKeys) {
      if (name == flag) key = k;
    }
    if (key == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown argument '", arg, "'\n", UsageText()));
    }
    if (name == arg) {
      if (i + 1 >= argc) {
        return absl::InvalidArgumentError(absl::StrCat(name, " needs a value\n", UsageText()));
      }
      value = argv[++i];
    }
    if (*key == '\0') {
      config_path = value;
    } else {
      flags.emplace_back(key, value);
    }
  }
  if (!config_path.empty()) MC_RETURN_IF_ERROR(LoadConfigFile(config_path, &config));
  for (const auto& [key, value] : flags) {
    if (absl::Status s = Apply(key, value, &config); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("flag: ", s.message()));
    }
  }
  return config;
}

}  // namespace mooncake::daemon
