// Daemon: mooncaked's process-level object and composition root. It owns
// every piece of the daemon — the node's identity, the connection table,
// the session registry, the FdBroker (tickets and exports), the group
// broker, the SessionLifecycle that ends sessions in order, the sockets,
// the fd channel, the services and the gRPC server(s) — and hands each
// service only the pieces it uses. Runs until Shutdown().
//
// Ownership map (all members; destroyed in reverse order, servers first):
//   NodeIdentity      → LocalService, AdminService, PeerService (const)
//   AdmissionCounter  → ConnectionTable (gives back), GrpcAcceptor (takes)
//   ConnectionTable   → GrpcAcceptor (adds, sweeps), RpcInterceptor (marks
//                       calls), LocalService, AdminService (const: caller)
//   SessionRegistry   → LocalService, FdChannelServer (const), AdminService
//                       (const), FdBroker (const), GroupBroker
//   FdBroker          → LocalService, FdChannelServer, AdminService (const),
//                       GroupBroker (as FdTicketIssuer)
//   RdmaResources     → RdmaService, SessionLifecycle, AdminService (const)
//   GroupBroker       → LocalService, AdminService (const)
//   SessionLifecycle  → LocalService
//   Metrics           → GroupBroker, GrpcAcceptor, RpcInterceptor (count
//                       events); reads the others at scrape time
#pragma once

#include <grpcpp/server.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "admission/admission_counter.h"
#include "broker/group_broker.h"
#include "config/daemon_config.h"
#include "etcd/etcd_client.h"
#include "fdchannel/fd_broker.h"
#include "fdchannel/fd_channel_server.h"
#include "metrics/metrics.h"
#include "peering/etcd_group_directory.h"
#include "peering/node_registry.h"
#include "peering/peer_tls.h"
#include "peering/softnic_peer_link.h"
#include "rdma/rdma_resources.h"
#include "server/admin_service.h"
#include "server/connection_table.h"
#include "server/grpc_acceptor.h"
#include "server/heap_trimmer.h"
#include "server/local_service.h"
#include "server/node_identity.h"
#include "server/peer_service.h"
#include "server/rdma_service.h"
#include "server/session_lifecycle.h"
#include "session/session_registry.h"

namespace mooncake::daemon {

class Daemon {
 public:
  // Discovers the node and binds the sockets; nothing is served yet.
  static absl::StatusOr<std::unique_ptr<Daemon>> Create(DaemonConfig config);
  ~Daemon();

  // Starts serving (gRPC on the UNIX socket, the fd channel, the optional
  // peer TCP server) and tells systemd READY=1 when run under it.
  absl::Status Start();
  // Joins the cluster in etcd (Start does, when etcd_endpoints is set).
  absl::Status JoinCluster();
  // The Peer service on peer_listen, mTLS or plaintext (peering/peer_tls.h).
  absl::Status StartPeerServer();
  peering::PeerTlsFiles PeerTls() const;
  // Re-reads tenant_policy_file (SIGHUP; without one, only logs that
  // nothing changes). On an error the policy in force stays.
  absl::Status ReloadTenantPolicy();
  // Tells clients, stops serving, removes the sockets. Idempotent.
  void Shutdown(const std::string& reason);

  const NodeIdentity& node() const { return node_; }

 private:
  Daemon() = default;

  DaemonConfig config_;
  std::vector<TenantSocket> tenants_;  // tenant_sockets, paths resolved
  NodeIdentity node_;
  // metrics_listen set: the counters the components below record into
  // (declared first: destroyed last) and the /metrics server.
  std::unique_ptr<metrics::Metrics> metrics_;
  std::unique_ptr<AdmissionCounter> connection_admission_;  // main socket
  std::unique_ptr<ConnectionTable> connections_;
  std::unique_ptr<SessionRegistry> sessions_;
  std::unique_ptr<FdBroker> fds_;
  std::unique_ptr<RdmaResources> rdma_;        // null when rdma_provider = off
  softnic::Engine* softnic_engine_ = nullptr;  // rdma_'s, when its provider is softnic
  // The other nodes, each verified before it is sent anything (a cluster
  // member with a peer port); shared with rdma_'s RemoteConnections.
  std::shared_ptr<peering::TrustedPeers> trusted_peers_;
  // peer_tls_crl_file's list, shared by the peer port and the dialling side.
  std::shared_ptr<peering::PeerRevocations> peer_revocations_;
  // softnic's way to QPs on other nodes (a cluster member); destroyed before rdma_.
  std::shared_ptr<peering::SoftnicPeerLink> softnic_link_;
  std::unique_ptr<GroupBroker> broker_;
  std::unique_ptr<SessionLifecycle> lifecycle_;

  std::unique_ptr<HeapTrimmer> heap_trimmer_;
  std::unique_ptr<GrpcAcceptor> acceptor_;
  std::unique_ptr<FdChannelServer> fd_channel_;
  std::unique_ptr<LocalService> local_service_;
  std::unique_ptr<AdminService> admin_service_;
  std::unique_ptr<RdmaService> rdma_service_;
  std::unique_ptr<PeerService> peer_service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<grpc::Server> peer_server_;
  // Cluster membership (etcd_endpoints set): the client first, so that the
  // registry (which uses it) goes first.
  std::unique_ptr<etcd::EtcdClient> etcd_;
  std::unique_ptr<peering::NodeRegistry> nodes_;
  // Groups across nodes: after the registry (its lease), before nothing
  // that outlives it uses it (the broker is detached at shutdown).
  std::unique_ptr<peering::EtcdGroupDirectory> group_directory_;
  std::string peer_security_;  // DescribePeerSecurity's words; "" without a peer port
  std::atomic<bool> shut_down_{false};
  // Set once Create succeeded: a daemon that failed to start (its socket
  // may be another daemon's) must not unlink the sockets on destruction.
  bool created_ = false;
};

// sd_notify(3) without libsystemd: a datagram to $NOTIFY_SOCKET. No-op when
// not started by systemd.
void NotifySystemd(const std::string& message);

}  // namespace mooncake::daemon
