// mooncaked configuration: embedded defaults, an optional `key = value`
// file (deploy/mooncaked.conf.example documents every key), then flags.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "mooncake/common/log.h"

namespace mooncake::daemon {

// One tenant's socket (tenant_sockets): callers that connect through it
// belong to `name`, and see and join only that tenant's groups, sessions
// and exports (docs/architecture.md, "Tenants"). The fd channel is
// `<path>.fd`. `path` empty: <directory of socket>/tenants/<name>/mooncaked.sock
// (ResolveTenantSockets fills it in).
struct TenantSocket {
  std::string name;
  std::string path;
};

// The longest tenant name (a Kubernetes namespace is a DNS label of 63).
inline constexpr size_t kMaxTenantNameBytes = 63;
// 1..kMaxTenantNameBytes letters, digits, '-', '_' or '.', starting with a
// letter or digit.
bool ValidTenantName(absl::string_view name);
// The most tenant sockets one daemon serves.
inline constexpr size_t kMaxTenantSockets = 256;

struct DaemonConfig {
  std::string socket = "/run/mooncake/mooncaked.sock";
  // Extra sockets, one per tenant (tenant_sockets = NAME[:PATH],...). The
  // main socket serves the tenant "" (no tenant).
  std::vector<TenantSocket> tenant_sockets;
  uint32_t socket_mode = 0660;
  std::string socket_group;  // empty: leave the daemon's group
  std::string node_id;       // empty: hostname
  LogLevel log_level = LogLevel::kInfo;
  std::string peer_listen;  // host:port; empty: no peer server
  // Prometheus text at http://HOST:PORT/metrics (docs/metrics.md); empty: off.
  std::string metrics_listen;
  // What other nodes dial for this one's Peer service (etcd's NodeRecord):
  // empty = peer_listen, with a wildcard host replaced by the hostname.
  std::string peer_advertise;
  // mTLS on the peer port (peering/peer_tls.h): all three PEM files, or none.
  std::string peer_tls_ca_file, peer_tls_cert_file, peer_tls_key_file;
  // The CA's revocation list (PEM CRL), re-read when it changes; empty: none.
  std::string peer_tls_crl_file;
  // Which nodes each tenant's groups may span (broker/tenant_span_policy.h;
  // re-read on SIGHUP); empty: no policy, every node of the cluster.
  std::string tenant_policy_file;
  bool peer_insecure = false;  // plaintext serving every peer method (explicit; peering/peer_tls.h)
  // Cluster membership (etcd v3): client URLs, comma-separated in the file
  // and in --etcd; empty = this node alone, as before.
  std::string etcd_endpoints;
  std::string etcd_prefix = "/mooncake";
  std::string etcd_ca_file, etcd_cert_file, etcd_key_file;  // TLS (mTLS with cert + key)
  uint32_t etcd_lease_ttl_s = 5;  // a lost node is reported within about this
  std::string sysfs_root = "/sys";
  std::string cuda_library = "libcuda.so.1";
  uint32_t join_timeout_ms = 30000;  // JoinGroup default deadline
  uint32_t max_world_size = 65536;
  uint32_t ticket_ttl_ms = 30000;
  uint32_t max_sessions_per_uid = 4096;

  // What one user may make the daemon hold (see docs/limits.md). Root and
  // the daemon's own uid are never refused by these.
  uint32_t handshake_timeout_ms = 5000;  // no RPC within this of accept: closed
  uint32_t max_connections_per_uid = 256;
  uint32_t max_connections = 4096;  // main socket, all unprivileged users
  uint32_t fd_channel_connections_per_uid = 32;
  uint32_t fd_channel_connections = 256;
  uint32_t max_fds_per_uid = 4096;  // fds held for a user's sessions
  uint32_t max_fds = 8192;          // ... for all unprivileged users
  uint32_t max_ranks_per_uid = 8192;
  uint32_t max_waiting_joins_per_uid = 4096;
  uint32_t max_view_bytes_per_uid = 256u << 20;
  uint32_t max_join_timeout_ms = 600000;

  // RDMA (docs/limits.md, deploy/mooncaked.conf.example).
  std::string rdma_provider = "auto";  // auto | mlx5 | softnic | off
  // mlx5: the NICs that may serve RDMA (names, comma-separated in the
  // file); empty = every mlx5 NIC that opens.
  std::vector<std::string> rdma_devices;
  // mlx5: the local GID table index (0..255) of every session; unset
  // ("auto" in the file): chosen per port, RoCE v2 IPv4-mapped first
  // (ChooseGid, rdma/mlx5/session_params.h).
  std::optional<uint32_t> rdma_gid_index;
  // mlx5: every connection's traffic class (0..255; RoCE v2: DSCP << 2 |
  // ECN) and service level (InfiniBand SL 0..15; Ethernet 802.1p priority
  // 0..7, checked at start against each served port's link layer).
  uint32_t rdma_traffic_class = 0;
  uint32_t rdma_service_level = 0;
  uint32_t max_qps_per_session = 4096;
  uint32_t max_mrs_per_session = 256;
  uint64_t max_registered_bytes_per_session = 64ull << 30;
  uint32_t max_qps_per_uid = 32768;  // root and the daemon's uid: never refused
  uint32_t max_mrs_per_uid = 2048;
  uint64_t max_registered_bytes_per_uid = 512ull << 30;
  // Every unprivileged user together (root on the main socket exempt).
  uint64_t max_registered_bytes_total = 2ull << 40;
  uint32_t max_doorbell_handoffs_per_uid = 64;  // gpu-uar contexts held by one uid's sessions
  bool softnic_sink = false;                    // benchmarks: complete WQEs without moving data
  // How softnic runs NIC atomics (softnic/engine.h AtomicsModel): "device"
  // (real atomics of the target memory) or "hca" (a read, the add, a write,
  // as a ConnectX: atomic only against other NIC atomics), and in "hca" the
  // window between read and write and what a fence after an atomic waits.
  std::string softnic_atomics = "device";
  uint32_t softnic_hca_atomic_window_us = 0;
  uint32_t softnic_hca_round_trip_us = 0;
  // Threads that run softnic's WQEs touching GPU memory (softnic/
  // gpu_workers.h): one session's stalled GPU copies hold one of them, one
  // user's all but one.
  uint32_t softnic_gpu_workers = 4;
};

// Parses the text of a config file into `config` (keys not present keep
// their value). Errors name the line and the key.
absl::Status ParseConfigText(absl::string_view text, absl::string_view origin,
                             DaemonConfig* config);
absl::Status LoadConfigFile(const std::string& path, DaemonConfig* config);

// The tenant sockets with every path filled in (a bare name's default is
// <directory of config.socket>/tenants/<name>/mooncaked.sock), checked
// against each other and the main socket: InvalidArgument for two tenants
// on one path, a tenant on the main socket (or its .fd), or a path too long
// for a UNIX socket address (with its ".fd" suffix).
absl::StatusOr<std::vector<TenantSocket>> ResolveTenantSockets(const DaemonConfig& config);

// Parses argv: --config FILE is applied first, then the other flags
// (--socket, --node-id, --log-level, --peer-listen, --sysfs-root,
// --socket-mode, --cuda-library, --etcd, --metrics-listen, --tenant-sockets). Returns the
// usage text in an InvalidArgument on error; sets *show_help for --help
// and *show_version for --version.
absl::StatusOr<DaemonConfig> ParseCommandLine(int argc, char** argv, bool* show_help,
                                              bool* show_version);

std::string UsageText();

}  // namespace mooncake::daemon
